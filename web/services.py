"""The objects every handler shares, kept on `app.state.services` by create_app."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jinja2
from litestar.connection import ASGIConnection

from engine import Engine, Reasoning, RequestHandle, SamplingParams, Tokenizer
from web.access.identity import User
from web.config import WebConfig
from web.storage.store import Store
from web.tracker import RequestTracker

if TYPE_CHECKING:
    from web.pages.chat.replies import Replies


class EngineUnavailable(RuntimeError):
    """The engine thread is not running (stopped, or failed to start): answer 503."""

    retry_after = 5


@dataclass(slots=True)
class Services:
    engine: Engine
    tokenizer: Tokenizer
    config: WebConfig
    store: Store
    tracker: RequestTracker
    replies: Replies
    templates: jinja2.Environment
    started: float = 0.0  # wall-clock time the app started

    @property
    def context_limit(self) -> int:
        """Most prompt + output tokens one request may ask for (context and KV pool)."""
        cfg = self.engine.config
        return min(cfg.max_context, cfg.kv_tokens - cfg.page_size + 1)

    def submit(self, user: User, prompt_ids: list[int], params: SamplingParams, kind: str,
               label: str | None = None, link: str | None = None,
               reasoning: Reasoning | None = None) -> RequestHandle:
        """Submit for `user` and remember it (raises RequestError, QueueFull or
        EngineUnavailable); `reasoning`: split a thinking model's reasoning out."""
        if not self.engine.alive:
            raise EngineUnavailable("the engine is not running")
        limit = self.config.per_user_limit if self.config.shared else None
        extra: dict[str, Any] = {"reasoning": reasoning} if reasoning else {}  # gateway: none
        handle = self.engine.submit(prompt_ids, params, owner=user.name, owner_limit=limit,
                                    **extra)
        item = self.tracker.add(handle, kind, label, link)
        item.constraint = params.constraint.kind if params.constraint else None
        return handle

    def render(self, template: str, **context: Any) -> str:
        """A template rendered to a string (fragments pushed over SSE)."""
        return self.templates.get_template(template).render(**context)


def services(request: ASGIConnection[Any, Any, Any, Any]) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]
