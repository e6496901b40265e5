"""Messages' Markdown rendered off the event loop, once per text.

Markdown and Pygments are pure Python: one imported conversation of a megabyte takes
seconds to render, and on the event loop that held every other request (the API's streams,
`/healthz`) as long. So the routes call render_ahead() with the texts a page will show: it
renders them in one worker process (one page at a time, so a crowd of viewers costs one core
at most; a text already being rendered for another viewer is waited for, not rendered again)
into a cache keyed by the text itself, which is a message version's identity here
(editing or regenerating makes a new text). A process, not a thread: a thread rendering for
seconds holds the GIL against the engine's thread, whose every step between two native calls
waits for it (a running stream's tokens came several times slower). The templates'
markdown() then reads the cache; a text it does not hold (evicted, or a path that did not
render ahead) is rendered in place, bounded per message by web.pages.markdown's limits.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from markupsafe import Markup

from engine.host import start_job_below

MAX_CACHED_CHARS = 16 * 1024 * 1024  # source characters held (the HTML is ~2-3x that)
MAX_CACHED = 20_000  # texts held

_lock = threading.Lock()
_cache: OrderedDict[str, Markup] = OrderedDict()
_cached_chars = 0
_worker: ProcessPoolExecutor | None = None  # started on first use, for every app in the process
# texts being rendered now -> done (set, never failed) once their render ends, whatever its
# outcome; a concurrent future: the apps of one process may run on several event loops
_rendering: dict[str, concurrent.futures.Future[None]] = {}
# renders handed to the worker and not yet done, and the end of the one job below the
# engine's priority they count as while there are any (the worker renders one at a time)
_submitted = 0
_end_job: Callable[[], None] | None = None
ROUNDS = 3  # a viewer waits for another's render, then renders what is still missing


def markdown(text: str) -> Markup:
    """The HTML of `text`: from the cache, else rendered now (and kept)."""
    with _lock:
        html = _cache.get(text)
        if html is not None:
            _cache.move_to_end(text)
            return html
    # imported here: markdown-it and Pygments (~1.5 MB held for the process's life) stay
    # out of a server no one opens a page of
    from web.pages.markdown import render

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


def _render_many(texts: list[str]) -> list[str]:
    """In the worker process."""
    from web.pages.markdown import render

    return [str(render(text)) for text in texts]


def _worker_setup() -> None:
    """In the worker process: Ctrl+C in a terminal reaches the whole process group; the
    server shuts the worker down itself (at exit), without a traceback from it. The worker
    runs at a lower priority: on a machine with few cores a long page waits for the
    engine's rounds, not the other way round. A server killed outright cannot shut it down:
    the worker ends itself when its server is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):  # no nice() on Windows
        os.nice(10)
    threading.Thread(target=_end_with, args=(os.getppid(),), name="ferry-render-watch",
                     daemon=True).start()


def _end_with(server: int) -> None:
    """In the worker: exit once the server that started it is gone (the worker is then
    handed to another parent: POSIX; Windows keeps the old id, and the worker its wait)."""
    while os.getppid() == server:
        time.sleep(1.0)
    os._exit(0)


def _pool() -> ProcessPoolExecutor:
    global _worker
    with _lock:
        if _worker is None:
            # spawn: a fork would copy the model and the engine's threads' locks
            _worker = ProcessPoolExecutor(max_workers=1,
                                          mp_context=multiprocessing.get_context("spawn"),
                                          initializer=_worker_setup)
        return _worker


def _submit(pool: ProcessPoolExecutor, todo: list[str]) -> concurrent.futures.Future[list[str]]:
    """`todo` rendered in the worker; while it renders, the engine runs its rounds on one core
    fewer (engine.priority), until the worker is done with it, even if its viewer left."""
    global _submitted, _end_job
    with _lock:
        _submitted += 1
        if _end_job is None:
            _end_job = start_job_below()

    def ended(_: object) -> None:
        global _submitted, _end_job
        with _lock:
            _submitted -= 1
            end, _end_job = (_end_job, None) if _submitted == 0 else (None, _end_job)
        if end is not None:
            end()
    try:
        future = pool.submit(_render_many, todo)
    except BaseException:
        ended(None)
        raise
    future.add_done_callback(ended)
    return future


async def render_ahead(texts: Iterable[str | None]) -> None:
    """Render (and cache) every non-empty text in the worker process, before a template
    shows them. A text another viewer's render holds is waited for, not rendered twice (three
    tabs opening one long conversation cost one render); one still missing after that (the
    other viewer left and its render was cancelled) is rendered by this viewer."""
    wanted = [t for t in dict.fromkeys(texts) if t]
    for _ in range(ROUNDS):
        with _lock:
            todo = [t for t in wanted if t not in _cache]
            waits = {id(f): f for t in todo if (f := _rendering.get(t)) is not None}
            mine = [t for t in todo if t not in _rendering]
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            for text in mine:
                _rendering[text] = done
        if not todo:
            return
        try:
            if mine:
                await _render_into_cache(mine)
        finally:
            with _lock:
                for text in mine:
                    if _rendering.get(text) is done:
                        del _rendering[text]
            done.set_result(None)
        for other in waits.values():
            # shielded: this viewer leaving must not cancel the others' wait
            await asyncio.shield(asyncio.wrap_future(other))
        wanted = todo


async def _render_into_cache(todo: list[str]) -> None:
    global _worker
    for _ in range(2):  # a worker that died (killed, out of memory) is replaced once
        pool = _pool()
        try:
            done = await asyncio.wrap_future(_submit(pool, todo))
            break
        except BrokenProcessPool:
            with _lock:
                if _worker is pool:
                    _worker = None
    else:
        return  # the template renders what it must in place, bounded per message
    for text, html in zip(todo, done, strict=True):
        _keep(text, Markup(html))
