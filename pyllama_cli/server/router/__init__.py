"""Router mode of `pyllama serve`: many models behind one server (routed.py), their per-model
settings from a presets file (presets.py), and the start of such a server (start.py)."""
