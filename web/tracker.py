"""What the web layer knows about the requests it submitted: kind, label, handle.

The engine forgets a request once it finishes; the tracker keeps the last few hundred so
`GET /v1/requests/{id}` can still report how one ended, and the dashboard can label a
viewer's own requests (a chat's title) without the engine carrying any text.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from engine import RequestHandle


@dataclass(slots=True)
class Tracked:
    handle: RequestHandle
    kind: str  # chat | api
    label: str | None = None  # shown to the owner only
    link: str | None = None
    created: float = field(default_factory=time.time)
    # "alice (admin)" when someone other than the owner cancelled it from the dashboard
    cancelled_by: str | None = None
    constraint: str | None = None  # what its output is constrained by (json_schema, tool_call...)
    endpoint: str | None = None  # the API route it came through (None: the chat page)

    @property
    def id(self) -> str:
        return self.handle.id

    @property
    def owner(self) -> str:
        return self.handle.owner


class RequestTracker:
    def __init__(self, keep: int = 512) -> None:
        self.keep = keep
        self._items: OrderedDict[str, Tracked] = OrderedDict()

    def add(self, handle: RequestHandle, kind: str, label: str | None = None,
            link: str | None = None) -> Tracked:
        item = Tracked(handle, kind, label, link)
        self._items[handle.id] = item
        while len(self._items) > self.keep:
            self._items.popitem(last=False)
        return item

    def get(self, request_id: str) -> Tracked | None:
        return self._items.get(request_id)
