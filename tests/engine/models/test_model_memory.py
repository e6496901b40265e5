"""A loaded model's resident memory by part, and a model set giving an unloaded model's memory
back. Each is measured in a fresh process, so that this one's models and caches do not
skew the resident size."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models import Budget

ROOT = Path(__file__).resolve().parents[3]
MB = 1 << 20
pytestmark = [pytest.mark.model,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

# the default model, one chat, then the floor plus the parts against the resident size
PARTS = """
import json, sys
from engine.execution.residency import rollup, trim
import transformers.models.auto.tokenization_auto, web.app
trim()
floor = rollup()["rss"]
from engine import Engine, EngineConfig, ModelExecutor, Tokenizer
from engine.scheduling.request import SamplingParams
config = EngineConfig(kv_tokens=1024, max_context=1024, max_running=2)
ex = ModelExecutor.from_pretrained(None, config, cache_dir=sys.argv[1], progress=False)
tok = Tokenizer(ex.tokenizer_path)
engine = Engine(config, ex, tok).start()
engine.grammars()
ids = tok.apply_chat_template([{"role": "user", "content": "Name three rivers."}])
handle = engine.submit(ids, SamplingParams(max_tokens=16, ignore_eos=True))
list(handle.events(timeout=300))
assert engine.wait_idle(60)
trim()
parts = engine.footprint().as_dict()
print(json.dumps({"floor": floor, "rss": rollup()["rss"], "parts": parts}))
engine.stop()
"""

# two copies of the default model in a set: the second loads, answers, unloads
UNLOAD = """
import json, sys, time
from pathlib import Path
from engine.config import EngineConfig
from engine.execution.residency import rollup, trim
from engine.models import Budget, ModelSet
from engine.scheduling.request import SamplingParams
from tests.tools.model_sources import gguf_source
config = EngineConfig(kv_tokens=2048, max_context=1024, max_running=2)
cache = Path(sys.argv[1])
files = {n: Path(sys.argv[2]) / f"{n}.gguf" for n in ("alpha", "beta")}
sources = [gguf_source(n, files[n], config, cache) for n in files]
first = sources[0]
models = ModelSet(sources, config, Budget(2, 8 << 30),
                  preloaded={"alpha": (first.load(), first.open_tokenizer())}, poll=0.05).start()
def chat(model):
    ids = models.tokenizer(model).encode("The capital of France is")
    list(models.submit(ids, SamplingParams(max_tokens=8, ignore_eos=True),
                       model=model).events(timeout=300))
chat("alpha")
# as a server holds it (web.app's lifespan): the heap settled, so an unload must collect the
# settled objects too
from engine.models.memory import settled_heap
settled_heap().__enter__()
models.tokenizer("beta")  # opened before, kept after: the tokenizer is not the model's load
trim()
before = rollup()["rss"]
chat("beta")
state = lambda: next(m for m in models.models() if m.name == "beta")
info = state()
loaded, size = rollup()["rss"], info.size
assert models.wait_idle(30) and models.unload("beta")
deadline = time.monotonic() + 60
while state().state != "unloaded" and time.monotonic() < deadline:
    time.sleep(0.05)
trim()
print(json.dumps({"before": before, "loaded": loaded, "after": rollup()["rss"],
                  "size": size, "memory": info.memory}))
models.stop()
"""


def run(script: str, *args: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=env,
                         check=True, capture_output=True, text=True, timeout=900).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def test_parts_add_up_to_the_resident_size(tmp_path: Path) -> None:
    got = run(PARTS, str(tmp_path))
    parts, rss, floor = got["parts"], got["rss"], got["floor"]
    assert isinstance(parts, dict) and isinstance(rss, int) and isinstance(floor, int)
    # every part measured: the file's blocks (about 98 MB, some in place), a KV pool of
    # 1,024 positions, a tokenizer and the grammar compiler's vocabulary tables
    assert 80 * MB < parts["weights"] < 160 * MB, parts
    assert 0 < parts["kv"] <= 1024 * 23_040 + 4096, parts
    assert parts["tokenizer"] > MB and parts["vocabulary"] > MB, parts
    accounted = floor + parts["total"]
    assert abs(accounted - rss) <= rss // 10, (floor, parts, rss)


def test_an_unloaded_model_gives_its_memory_back(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("alpha", "beta"):
        shutil.copyfile(model_dir, folder / f"{name}.gguf")
    got = run(UNLOAD, str(tmp_path / "cache"), str(folder))
    before, loaded, after = (int(str(got[k])) for k in ("before", "loaded", "after"))
    assert loaded - before > 60 * MB, got  # it did load (weights, KV)
    assert after - before < 50 * MB, got  # and went back within 50 MB
    memory = got["memory"]
    assert isinstance(memory, dict) and memory["weights"] > 60 * MB, got
    # what the budget counted (measured after the load, every weight and KV page in use)
    # against what it held after a chat (the file's header pages aside)
    in_use = memory["weights"] + memory["kv"]
    assert 0.9 * in_use <= int(str(got["size"])) <= 1.5 * in_use, got


def test_the_budget_refuses_a_model_larger_than_all_of_it() -> None:
    budget = Budget(max_loaded=2, max_memory=1000)
    assert budget.refusal("small", 1000, measured=True) is None
    reason = budget.refusal("big", 5000, measured=False)
    assert reason is not None and "big needs" in reason and "--max-memory" in reason
    assert "file's size" in reason
    assert "measured" in (budget.refusal("big", 5000, measured=True) or "")


def test_a_model_over_the_budget_is_refused_with_the_reason(model_dir: Path,
                                                            tmp_path: Path) -> None:
    import shutil

    from engine.config import EngineConfig
    from engine.models import ModelSet
    from engine.runtime.events import FinalEvent
    from engine.scheduling.request import SamplingParams
    from tests.tools.model_sources import gguf_source

    config = EngineConfig(kv_tokens=1024, max_context=1024, max_running=2)
    files = {}
    for name in ("alpha", "beta"):
        files[name] = tmp_path / f"{name}.gguf"
        shutil.copyfile(model_dir, files[name])
    sources = [gguf_source(n, files[n], config, tmp_path / "cache") for n in files]
    first = sources[0]
    budget = Budget(2, files["beta"].stat().st_size // 2)  # less than beta's file alone
    models = ModelSet(sources, config, budget, poll=0.05,
                      preloaded={"alpha": (first.load(), first.open_tokenizer())}).start()
    try:
        ids = models.tokenizer("beta").encode("Hello")
        handle = models.submit(ids, SamplingParams(max_tokens=4), model="beta")
        final = list(handle.events(timeout=60))[-1]
        assert isinstance(final, FinalEvent) and final.finish_reason == "error", final
        assert "beta needs" in str(final.error) and "--max-memory" in str(final.error)
        beta = next(m for m in models.models() if m.name == "beta")
        assert beta.state == "unloaded" and "--max-memory" in str(beta.error)
    finally:
        models.stop()
