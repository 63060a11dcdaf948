"""`pyllama serve`'s HTTP layer: an OpenAI-compatible API over a core `Engine`.

`create_app(engine, settings)` in app.py builds the FastAPI application; run.py binds the socket,
starts the engine and runs uvicorn with a clean shutdown (`pyllama serve`). `anthropic/` and
`openai_responses/` add Anthropic's Messages API and OpenAI's Responses API over the same engine.
Nothing here holds module-level state or calls llama.cpp, and importing the package (or run.py) loads
no web framework.
"""
