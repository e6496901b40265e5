"""Ollama's API (/api/*) over the chat path: schemas (request bodies), options (sampling and
format), models (tags, show, ps), translate (replies and stream lines), errors
(`{"error": "..."}`), routes. /api/embed is registered by the embeddings module (its
controller passed to routes.ollama_router in web/app.py)."""
