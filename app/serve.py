"""Launching the server: engine + web app + uvicorn. (Placeholder until engine/web land.)"""
from __future__ import annotations

from app.banner import banner, local_url, open_browser
from app.models import ModelRef
from app.paths import Paths
from app.settings import Settings, engine_config


def run(settings: Settings, paths: Paths, model: ModelRef) -> int:
    """Serve until interrupted; returns the exit code. TODO(lead): replace with the real wiring."""
    engine_config(settings)  # surfaces engine-level config errors before anything heavy
    print(banner(settings, model.name, settings.device, settings.dtype))
    if settings.open:
        open_browser(local_url(settings))
    raise NotImplementedError("app.serve.run: engine and web wiring not written yet")
