"""Model resolution, loading and the engines every command shares.

Only this package imports llama_cpp and huggingface_hub, and only in the modules that need them,
so that `pyllama --help` stays fast.
"""
