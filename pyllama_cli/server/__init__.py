"""`pyllama serve`'s HTTP layer: OpenAI's, llama-server's and Anthropic's APIs over a core `Engine`.

app.py builds the FastAPI application (`create_app(models, settings)`); run.py binds the socket,
starts the engine and runs uvicorn with a clean shutdown. spine.py is the one path every generation
route takes (find the model, check it, prepare the job inline or in a thread, stream or answer
whole), job_rules.py the rules every API's request fields follow. Each API is a sibling package
with one `add_routes(app, models)`: openai/, llama_server/, anthropic/, responses_api/, webui/.
Nothing here holds module-level state or calls llama.cpp, and importing the package (or run.py)
loads no web framework.
"""
