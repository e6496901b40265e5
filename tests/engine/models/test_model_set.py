"""The model set with real models (copies of the default SmolLM2 GGUF): loading on demand
with the `loading` wait reason, streams that keep flowing during a load, the budget (LRU idle
unload, `memory` while busy), keep_alive, and memory given back."""
from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from engine.models import Budget, ModelSet, UnknownModel, rss_bytes
from engine.runtime.events import FinalEvent
from engine.runtime.handle import TextDelta
from engine.scheduling.request import SamplingParams
from tests.tools.model_sources import copy_model, gguf_source

pytestmark = pytest.mark.model
CONFIG = EngineConfig(kv_tokens=2048, max_context=1024, max_running=4)
GB = 1 << 30


@pytest.fixture(scope="module")
def files(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("models")
    return {n: copy_model(model_dir, folder, n) for n in ("alpha", "beta", "gamma")}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def make_set(files: dict[str, Path], cache: Path, names: tuple[str, ...],
             budget: Budget, loads: list[str] | None = None, **kw: Any) -> ModelSet:
    sources = [gguf_source(n, files[n], CONFIG, cache, loads) for n in names]
    preload = sources[0]
    preloaded = {preload.name: (preload.load(), preload.open_tokenizer())}
    return ModelSet(sources, CONFIG, budget, preloaded=preloaded, poll=0.05, **kw).start()


def ask(models: ModelSet, model: str | None, text: str = "The capital of France is",
        tokens: int = 8, **kw: Any) -> Any:
    ids = models.tokenizer(model).encode(text)
    return models.submit(ids, SamplingParams(max_tokens=tokens, ignore_eos=True),
                         model=model, **kw)


def finish(handle: Any) -> tuple[str, FinalEvent]:
    events = list(handle.events(timeout=120))
    assert isinstance(events[-1], FinalEvent), events[-1]
    return "".join(e.text for e in events if isinstance(e, TextDelta)), events[-1]


def state(models: ModelSet, name: str) -> str:
    return next(m.state for m in models.models() if m.name == name)


def wait_for(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def all_free(models: ModelSet) -> None:
    assert models.wait_idle(30)
    for _, snap in models.model_snapshots():
        if snap is not None:
            assert snap.kv.used == 0 and snap.free_slots == snap.max_running


def test_unloaded_model_waits_loading_then_answers_while_default_streams(
        files: dict[str, Path], cache: Path) -> None:
    loads: list[str] = []
    models = make_set(files, cache, ("alpha", "beta"), Budget(2, 8 * GB), loads)
    try:
        assert state(models, "beta") == "unloaded" and loads == ["alpha"]
        models.tokenizer("beta")  # its tokenizer is opened once, before the first request
        # the default model streams a long reply; its token gaps are measured during the load
        long = ask(models, None, "Once upon a time", tokens=400)
        first = next(e for e in long.events(timeout=60) if isinstance(e, TextDelta))
        assert first.text is not None
        late = ask(models, "beta")
        view = models.snapshot().find(late.id)
        assert view is not None and view.model == "beta" and view.reason is not None
        assert view.reason.code == "loading" and view.reason.text.startswith("loading beta, ")
        # the default's token times from beta's submit until beta is loaded, plus the first
        # token after it: every gap that overlaps the load
        times = [time.monotonic()]
        for event in long.events(timeout=60):
            if not isinstance(event, TextDelta):
                continue
            times.append(time.monotonic())
            if state(models, "beta") == "loaded":
                models.cancel(long.id)
                break
        gaps = [b - a for a, b in itertools.pairwise(times)]
        finish(long)
        text, final = finish(late)
        assert final.finish_reason == "length" and final.usage.completion_tokens == 8 and text
        assert loads == ["alpha", "beta"]
        assert len(gaps) >= 2, "the default model stalled while beta loaded"
        # relative to the load, not to a clock: on a busy machine both slow down together, while
        # a default held up by the load shows one gap as long as most of the load
        span = times[-1] - times[0]
        assert max(gaps) < span / 2, f"the default stalled {max(gaps):.2f} s of a {span:.2f} s load"
        # the same prompt on both copies of one model: the same greedy answer
        alpha_text, _ = finish(ask(models, "alpha"))
        assert alpha_text == text
        with pytest.raises(UnknownModel) as err:
            ask(models, "nope")
        assert "alpha" in str(err.value) and "beta" in str(err.value)
        all_free(models)
        kinds = [(e.model, e.kind) for e in models.events]
        assert ("beta", "loading") in kinds and ("beta", "loaded") in kinds
    finally:
        models.stop()


def test_keep_alive_zero_unloads_and_gives_memory_back(files: dict[str, Path],
                                                      cache: Path) -> None:
    models = make_set(files, cache, ("alpha", "beta"), Budget(2, 8 * GB))
    try:
        before = rss_bytes()
        finish(ask(models, "beta", keep_alive=None))  # stays loaded (forever) for now
        assert state(models, "beta") == "loaded"
        loaded = rss_bytes()
        assert loaded - before > files["beta"].stat().st_size // 2
        _text, _ = finish(ask(models, "beta", keep_alive=0.0))
        wait_for(lambda: state(models, "beta") == "unloaded")
        after = rss_bytes()
        # the weights (about the file's size) went back to the system
        assert loaded - after > files["beta"].stat().st_size // 2, (before, loaded, after)
        assert any(e.kind == "unloaded" and "keep_alive" in e.text for e in models.events)
        all_free(models)
    finally:
        models.stop()


def test_budget_unloads_lru_idle_and_busy_models_make_loads_wait(
        files: dict[str, Path], cache: Path) -> None:
    models = make_set(files, cache, ("alpha", "beta", "gamma"), Budget(2, 8 * GB))
    try:
        finish(ask(models, "beta"))
        finish(ask(models, "alpha"))  # alpha used last: beta is the least recently used
        finish(ask(models, "gamma"))
        assert (state(models, "alpha"), state(models, "beta"), state(models, "gamma")) == \
            ("loaded", "unloaded", "loaded")
        assert any(e.kind == "unloaded" and e.model == "beta" and "room for gamma" in e.text
                   for e in models.events)
        # both resident models busy: a request for beta waits for memory, never unloading them
        busy = [ask(models, n, tokens=300) for n in ("alpha", "gamma")]
        waiting = ask(models, "beta")
        wait_for(lambda: (v := models.snapshot().find(waiting.id)) is not None
                 and v.reason is not None and v.reason.code == "memory")
        assert state(models, "alpha") == "loaded" and state(models, "gamma") == "loaded"
        models.cancel(busy[1].id)  # gamma goes idle: it gives way, beta loads and runs
        _, final = finish(waiting)
        assert final.finish_reason == "length"
        assert state(models, "gamma") == "unloaded"
        models.cancel(busy[0].id)
        for h in busy:
            finish(h)
        all_free(models)
    finally:
        models.stop()


def test_cancel_while_loading_and_admin_unload(files: dict[str, Path], cache: Path) -> None:
    models = make_set(files, cache, ("alpha", "beta"), Budget(2, 8 * GB))
    try:
        handle = ask(models, "beta")
        assert models.cancel(handle.id)
        _, final = finish(handle)
        assert final.finish_reason == "cancelled"
        models.load("beta")
        wait_for(lambda: state(models, "beta") == "loaded")
        assert models.unload("beta") and state(models, "beta") == "unloaded"
        assert not models.unload("beta")
        all_free(models)
    finally:
        models.stop()


def test_per_user_limit_counts_requests_waiting_for_a_load(files: dict[str, Path],
                                                           cache: Path) -> None:
    """A user's requests waiting for a model (`memory` here: the only slot in the budget is
    held by a busy model) count toward owner_limit, as queued and running ones do."""
    from engine.runtime.engine import QueueFull

    models = make_set(files, cache, ("alpha", "beta"), Budget(1, 8 * GB))
    try:
        running = ask(models, "alpha", "Once upon a time", tokens=400, owner="bob",
                      owner_limit=2)
        waiting = ask(models, "beta", owner="bob", owner_limit=2)
        wait_for(lambda: (v := models.snapshot().find(waiting.id)) is not None
                 and v.reason is not None and v.reason.code == "memory")
        with pytest.raises(QueueFull, match="bob already has 2 requests"):
            ask(models, "beta", owner="bob", owner_limit=2)
        with pytest.raises(QueueFull, match="bob already has 2 requests"):
            ask(models, "alpha", owner="bob", owner_limit=2)
        other = ask(models, "beta", owner="carol", owner_limit=2)  # others are not held
        models.cancel(running.id)
        finish(waiting)
        finish(other)
        all_free(models)
    finally:
        models.stop()


def test_normal_users_loads_keep_the_default_and_follow_the_rules(
        files: dict[str, Path], cache: Path) -> None:
    """Requests of normal users (admin=False): a load that only the default's memory would
    make room for is refused at once; one that waits for a busy model waits (`memory`, the
    default staying) and then evicts that model, never the default; with loading on demand
    kept for admins, a normal user's request for a model not loaded is refused."""
    from engine.models import LoadRefused, SharingRules

    models = make_set(files, cache, ("alpha", "beta", "gamma"), Budget(2, 8 * GB))
    try:
        busy = ask(models, "beta", "Once upon a time", tokens=300, owner="bob", admin=False)
        late = ask(models, "gamma", owner="cat", admin=False)
        wait_for(lambda: (v := models.snapshot().find(late.id)) is not None
                 and v.reason is not None and v.reason.code == "memory")
        view = models.snapshot().find(late.id)
        assert view is not None and view.reason is not None
        assert "the default alpha stays" in view.reason.text
        assert state(models, "alpha") == "loaded"
        models.cancel(busy.id)  # beta goes idle: it gives way to gamma, alpha stays
        finish(busy)
        finish(late)
        assert (state(models, "alpha"), state(models, "beta"), state(models, "gamma")) == \
            ("loaded", "unloaded", "loaded")
    finally:
        models.stop()
    models = make_set(files, cache, ("alpha", "beta"), Budget(1, 8 * GB))
    try:
        with pytest.raises(LoadRefused, match="'beta' cannot be loaded now") as err:
            ask(models, "beta", owner="bob", admin=False)
        assert err.value.kind == "no_room" and state(models, "alpha") == "loaded"
        assert models.arrive("alpha", "bob", admin=False) is None  # loaded: nothing to wait
        finish(ask(models, "beta", owner="ann"))  # an admin's load may evict the default
        assert (state(models, "alpha"), state(models, "beta")) == ("unloaded", "loaded")
        all_free(models)
    finally:
        models.stop()
    models = make_set(files, cache, ("alpha", "beta"), Budget(2, 8 * GB),
                      rules=SharingRules(users_load=False))
    try:
        with pytest.raises(LoadRefused, match="only an admin loads models") as err:
            ask(models, "beta", owner="bob", admin=False)
        assert err.value.kind == "not_loaded" and state(models, "beta") == "unloaded"
        with pytest.raises(LoadRefused):
            models.arrive("beta", "bob", admin=False)
        arrival = models.arrive("beta", "ann")  # an admin's announced request starts the load
        assert arrival is not None and state(models, "beta") in ("loading", "loaded")
        finish(ask(models, "beta", owner="bob", admin=False))  # joining it is fine
        models.withdraw(arrival)
        all_free(models)
    finally:
        models.stop()
