"""The embedding APIs: OpenAI's /v1/embeddings, the /v1/rerank of llama.cpp and vLLM (Jina and
Cohere's shape) and Ollama's /api/embed, all views over the engine's embedding requests."""
from web.api.embeddings.ollama import ollama_embed
from web.api.embeddings.openai import EmbeddingsController
from web.api.embeddings.run import refuse_embedding_model

__all__ = ["EmbeddingsController", "ollama_embed", "refuse_embedding_model"]
