"""Work a request asks for that takes a core is counted as a job below the engine's priority
while it runs, wherever it runs (engine.priority): the engine's rounds meanwhile leave it a
core. A worker thread's job, a page render in the worker process (until the worker is done,
whoever waits), a grammar compile; none is left counted after."""
from __future__ import annotations

import asyncio

from engine.priority import jobs_below
from engine.structured.threads import THREADS
from web.pages import rendered
from web.worker import below_engine


def test_a_worker_threads_job_is_counted_while_it_runs() -> None:
    before = jobs_below()
    assert asyncio.run(below_engine(jobs_below)) == before + 1
    assert jobs_below() == before


def test_a_grammar_compile_is_counted_while_it_runs() -> None:
    before = jobs_below()
    assert THREADS.run(jobs_below) == before + 1
    assert jobs_below() == before


def test_renders_in_the_worker_count_as_one_job_until_they_end() -> None:
    before = jobs_below()
    seen: list[int] = []
    texts = [f"# Part {i}\n\n" + "Some *text* and `code`.\n\n" * 2000 for i in range(3)]

    async def viewers() -> None:
        first = asyncio.create_task(rendered.render_ahead(texts[:1]))
        second = asyncio.create_task(rendered.render_ahead(texts[1:]))
        await asyncio.sleep(0)  # both handed to the worker, which renders one at a time
        await asyncio.sleep(0)
        seen.append(jobs_below())
        await asyncio.gather(first, second)

    asyncio.run(viewers())
    assert seen == [before + 1]
    assert jobs_below() == before
