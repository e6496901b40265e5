"""The objects every handler shares, kept on `app.state.services` by create_app."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jinja2
from litestar.connection import ASGIConnection

from engine import KEEP, ImageInput, Reasoning, RequestHandle, SamplingParams, Tokenizer
from web.access.identity import User
from web.config import WebConfig
from web.serving import ModelCatalog, Serving
from web.storage.store import Store
from web.tracker import RequestTracker


class EngineUnavailable(RuntimeError):
    """The engine thread is not running (stopped, or failed to start): answer 503."""

    retry_after = 5


@dataclass(slots=True)
class Services:
    engine: Serving
    tokenizer: Tokenizer
    config: WebConfig
    store: Store
    tracker: RequestTracker
    templates: jinja2.Environment
    started: float = 0.0  # wall-clock time the app started
    # several models (engine.ModelSet): the catalog, and the model one request was routed to
    catalog: ModelCatalog | None = None
    model: str | None = None

    @property
    def model_name(self) -> str:
        """The model this request's services serve (the default one's name when not routed)."""
        return self.model or self.config.model_name

    def for_model(self, model: str | None, keep_alive: object = KEEP,
                  user: User | None = None) -> Services:
        """These services as a request for `model` sees them: its engine (one model of the
        set), its tokenizer and chat template. With `user`, the request is announced first:
        listed as waiting for its model (and the load started) while the tokenizer opens,
        until submitted or `leave()`. Raises engine.UnknownModel, LoadRefused, QueueFull;
        opening a model's tokenizer the first time takes seconds (call it off the event
        loop)."""
        if self.catalog is None:
            return self
        name = self.catalog.resolve(model)
        view = self.catalog.serving(name, keep_alive, user.is_admin if user else True)
        if user is not None:
            view.arrive(user.name, self.config.per_user_limit if self.config.shared else None)
        try:
            tokenizer = self.catalog.tokenizer(name)
        except BaseException:
            view.leave()
            raise
        return dataclasses.replace(self, engine=view, tokenizer=tokenizer, model=name)

    def leave(self) -> None:
        """A request announced by for_model that was not submitted (refused, or its client
        left) is no longer listed; nothing once it was submitted."""
        leave = getattr(self.engine, "leave", None)  # one model of a set only
        if leave is not None:
            leave()

    @property
    def context_limit(self) -> int:
        """Most prompt + output tokens one request may ask for (context and KV pool)."""
        cfg = self.engine.config
        return int(min(cfg.max_context, cfg.kv_tokens - cfg.page_size + 1))

    def submit(self, user: User, prompt_ids: list[int], params: SamplingParams, kind: str,
               label: str | None = None, link: str | None = None,
               reasoning: Reasoning | None = None,
               endpoint: str | None = None,
               images: tuple[ImageInput, ...] = ()) -> RequestHandle:
        """Submit for `user` and remember it (raises RequestError, QueueFull or
        EngineUnavailable); `reasoning`: split a thinking model's reasoning out;
        `endpoint`: the API route it came through (the dashboard and /v1/requests say);
        `images`: a vision model's images, placed in the prompt (web/api/vision)."""
        if not self.engine.alive:
            raise EngineUnavailable("the engine is not running")
        limit = self.config.per_user_limit if self.config.shared else None
        extra: dict[str, Any] = {"reasoning": reasoning} if reasoning else {}  # gateway: none
        if images:  # only engines that take images are given them (web/api/vision)
            extra["images"] = images
        handle: RequestHandle = self.engine.submit(prompt_ids, params, owner=user.name,
                                                   owner_limit=limit, **extra)
        item = self.tracker.add(handle, kind, label, link)
        item.constraint = params.constraint.kind if params.constraint else None
        item.endpoint = endpoint
        return handle

    def render(self, template: str, **context: Any) -> str:
        """A template rendered to a string (fragments pushed over SSE)."""
        return self.templates.get_template(template).render(**context)


def services(request: ASGIConnection[Any, Any, Any, Any]) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]
