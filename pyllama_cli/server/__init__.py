"""`pyllama serve`'s HTTP layer: an OpenAI-compatible API over a core `Engine`.

`create_app(engine, settings)` in app.py builds the FastAPI application; nothing here holds
module-level state or calls llama.cpp.
"""
