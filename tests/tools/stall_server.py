"""A shared-mode Ferry with the default model on loopback, in a process of its own:
`python -m tests.tools.stall_server MODEL DATA_DIR PORT`.

For tests that measure a server from outside (its event loop and engine thread do not share
a GIL with the test's clients) and that send inputs which may crash it. Shared mode on
loopback, which `ferry serve` cannot be (it derives the mode from the address): the users
are in DATA_DIR's users file, written by the test.
"""
from __future__ import annotations

import sys
from pathlib import Path


def main(model: str, data_dir: str, port: str) -> None:
    import uvicorn

    from engine.config import EngineConfig
    from engine.execution.executor import ModelExecutor
    from engine.execution.text.tokenizer import Tokenizer
    from engine.runtime.engine import Engine
    from web.app import create_app
    from web.config import WebConfig

    model_dir = Path(model)
    # shared mode's scheduling defaults (app.settings derives them from a LAN address)
    config = EngineConfig(kv_tokens=8192, max_context=2048, policy="interleave",
                          admission="fair", prefix_cache_per_owner=True,
                          grammars_at_start=True)
    # the model as `ferry serve` runs it (its GGUF blocks, the C kernels): a request's
    # prefill round costs the others what it costs them in use
    executor = ModelExecutor.from_pretrained(model_dir, config, progress=False,
                                             cache_dir=Path(data_dir) / "models")
    tokenizer = Tokenizer(model_dir)
    engine = Engine(config, executor, tokenizer)
    app = create_app(engine, tokenizer, WebConfig(data_dir=Path(data_dir), shared=True))
    uvicorn.run(app, host="127.0.0.1", port=int(port), log_level="warning",
                timeout_graceful_shutdown=2)


if __name__ == "__main__":
    main(*sys.argv[1:4])
