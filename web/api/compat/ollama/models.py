"""/api/tags, /api/ps and /api/show: the /v1/models ids, `:latest`-tagged, in Ollama's shape
(a normal user of a shared server sees no paths, as on /v1/models)."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

from web.access.disclosure import model_info
from web.access.identity import User
from web.api.compat.ollama.options import tagged
from web.api.completions import _served
from web.services import Services

STARTED = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass(frozen=True, slots=True)
class Listed:
    name: str
    size: int
    loaded: bool
    keep_alive: float | None
    family: str


def listed(s: Services, user: User) -> list[Listed]:
    """Every model served: several (loaded or not), the upstreams', or the one."""
    served = _served(s)
    if served:
        return [Listed(m.id, 0, True, None, "") for m in served]
    if s.catalog is None:
        runs = s.config.model_runs or ""
        return [Listed(s.config.model_name, 0, True, None, runs.split(":", 1)[0])]
    return [Listed(m.name, m.size, m.loaded, m.keep_alive, (m.runs or "").split(":", 1)[0])
            for m in (model_info(m, user) for m in s.catalog.models())]


def _details(m: Listed) -> dict[str, Any]:
    return {"parent_model": "", "format": "", "family": m.family,
            "families": [m.family] if m.family else None, "parameter_size": "",
            "quantization_level": ""}


def _entry(m: Listed) -> dict[str, Any]:
    return {"name": tagged(m.name), "model": tagged(m.name), "modified_at": STARTED,
            "size": m.size, "digest": hashlib.sha256(m.name.encode()).hexdigest(),
            "details": _details(m)}


def tags(s: Services, user: User) -> dict[str, Any]:
    return {"models": [_entry(m) for m in listed(s, user)]}


def ps(s: Services, user: User) -> dict[str, Any]:
    """The loaded models; `expires_at` from keep_alive (a model that stays: far ahead)."""
    out = []
    for m in listed(s, user):
        if not m.loaded:
            continue
        expires = time.time() + (m.keep_alive if m.keep_alive is not None else 10 * 365 * 86400)
        out.append({**_entry(m), "size_vram": m.size, "context_length": s.context_limit,
                    "expires_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))})
    return {"models": out}


def show(s: Services, m: Listed) -> dict[str, Any]:
    """One model: its details, chat template name and what it can do."""
    thinks = bool(getattr(s.tokenizer, "thinks", False))
    capabilities = ["completion", "tools"] + (["thinking"] if thinks else [])
    return {"modelfile": "", "parameters": "", "license": "",
            "template": getattr(s.tokenizer, "chat_template_name", None) or "",
            "details": _details(m), "modified_at": STARTED,
            "model_info": {"general.architecture": m.family,
                           f"{m.family or 'model'}.context_length": s.context_limit},
            "capabilities": capabilities}
