"""Messages' Markdown rendered off the event loop, once per text.

Markdown and Pygments are pure Python: one imported conversation of a megabyte takes
seconds to render, and on the event loop that held every other request (the API's streams,
`/healthz`) as long. So the routes call render_ahead() with the texts a page will show: it
renders them on one worker thread (one page at a time, so a crowd of viewers costs one
core at most) into a cache keyed by the text itself, which is a message version's identity here
(editing or regenerating makes a new text). The templates' markdown() then reads the cache;
a text it does not hold (evicted, or a path that did not render ahead) is rendered in place,
bounded per message by web.pages.markdown's limits.
"""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from markupsafe import Markup

from web.pages.markdown import render

MAX_CACHED_CHARS = 16 * 1024 * 1024  # source characters held (the HTML is ~2-3x that)
MAX_CACHED = 20_000  # texts held

_lock = threading.Lock()
_cache: OrderedDict[str, Markup] = OrderedDict()
_cached_chars = 0
# one thread for every app in the process (tests run several, each on its own event loop)
_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-markdown")


def markdown(text: str) -> Markup:
    """The HTML of `text`: from the cache, else rendered now (and kept)."""
    with _lock:
        html = _cache.get(text)
        if html is not None:
            _cache.move_to_end(text)
            return html
    html = render(text)
    _keep(text, html)
    return html


def _keep(text: str, html: Markup) -> None:
    global _cached_chars
    if len(text) > MAX_CACHED_CHARS // 4:
        return
    with _lock:
        if text in _cache:
            return
        _cache[text] = html
        _cached_chars += len(text)
        while _cached_chars > MAX_CACHED_CHARS or len(_cache) > MAX_CACHED:
            old, _ = _cache.popitem(last=False)
            _cached_chars -= len(old)


def _render_all(texts: list[str]) -> None:
    for text in texts:
        markdown(text)


async def render_ahead(texts: Iterable[str | None]) -> None:
    """Render (and cache) every non-empty text on the worker thread, before a template
    shows them."""
    todo = [t for t in dict.fromkeys(texts) if t]
    with _lock:
        todo = [t for t in todo if t not in _cache]
    if not todo:
        return
    await asyncio.wrap_future(_worker.submit(_render_all, todo))
