"""Planning: the VRAM and speed planner, the doctor, the catalog. The draft/target pairing rule and the
speedup model live in the engine (engine/pairing.py, engine/speedup.py), which enforces and applies
them; planning reads them from there."""
