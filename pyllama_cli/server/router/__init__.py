"""Router mode of `pyllama serve`: many models behind one server (routed.py), their per-model
settings from a presets file (presets.py), models added and removed while serving (changes.py: POST
and DELETE /models, /models/sse), and the start of such a server (start.py)."""
