"""Ferry's web layer: Litestar pages, SSE streams, the OpenAI-compatible API, metrics."""
