"""llama-server's reranking API: POST /rerank, /reranking, /v1/rerank and /v1/reranking."""
