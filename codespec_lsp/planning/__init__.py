"""Planning: the VRAM and speed planner, the draft/target pairing rule, the doctor, the catalog."""
