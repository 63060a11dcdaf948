"""llama-server's LoRA API: GET and POST /lora-adapters (the global scales) and a request's `lora` field."""
