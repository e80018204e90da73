"""The protocol layer: the pygls server, its transports and hardening, documents, and the scheduler
that decides what runs when. Never touches tensors; talks to a backend through completion/."""
