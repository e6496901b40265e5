"""An embedding or reranking model served for real in this process: its EncoderExecutor, an
Engine and the web app behind uvicorn (the `in_thread_server` fixture runs it)."""
from __future__ import annotations

from pathlib import Path
from typing import Any


def serve_encoder(in_thread_server: Any, model: Path, data: Path, name: str, *,
                  max_prefill_tokens: int = 512, cache_dir: Path | None = None,
                  **web: Any) -> Any:
    """Serve the encoder at `model` (a folder, or a GGUF whose tokenizer folder goes under
    `cache_dir`) as `name`; `web`: more WebConfig fields. Returns the running server."""
    from engine import EncoderExecutor, Engine, EngineConfig, Tokenizer
    from web.app import create_app
    from web.config import WebConfig

    executor = EncoderExecutor.from_pretrained(model, threads=2, cache_dir=cache_dir)
    config = EngineConfig(max_context=executor.max_context,
                          max_prefill_tokens=max_prefill_tokens)
    tokenizer = Tokenizer(executor.tokenizer_path or model)
    engine = Engine(config, executor, tokenizer)
    app = create_app(engine, tokenizer, WebConfig(data_dir=data, model_name=name, **web))
    return in_thread_server(app, engine, f"uvicorn-{name}", 60)
