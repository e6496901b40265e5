"""Models found on disk in a real server built as `ferry serve` builds it (app.serve), over an
Ollama store and an LM Studio folder made in the test: the picker lists the runnable ones
under "On disk" and picking one loads it; /v1/models says where each came from; export and
import carry the conversation's model; the Thinking switch follows the conversation's model.
"""
from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.app.test_discovery import weights_only_gguf
from tests.app.test_model_stores import add_ollama

pytestmark = [pytest.mark.model, pytest.mark.browser]


@pytest.fixture(scope="module")
def server(model_dir: Path, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory,
           in_thread_server: Any) -> Iterator[Any]:
    from app.discovery import found_models
    from app.models import resolve_model
    from app.paths import get_paths
    from app.serve import build_several
    from app.settings import Settings
    from engine import ModelSource, Tokenizer, gguf_tokenizer_dir
    from tests.tools.thinking import THINKING_TEMPLATE, with_template

    root = tmp_path_factory.mktemp("disk")
    blob = add_ollama(root / "ollama", "registry.ollama.ai/library/smol", "135m", b"x")
    blob.unlink()
    shutil.copyfile(model_dir, blob)  # its own file: not the configured default's path
    lms = root / "home/.lmstudio/models/pub/repo"
    lms.mkdir(parents=True)
    weights_only_gguf(lms / "weights.gguf")  # found, but Ferry cannot chat with it
    env = {"OLLAMA_MODELS": str(root / "ollama"), "HOME": str(root / "home")}
    refs = [resolve_model("default")]
    found = found_models([], refs, env)
    assert [f.name for f in found] == ["smol:135m", "weights"]
    settings = Settings(kv_tokens=4096, default_max_tokens=24, chat_temperature=0.0,
                        keep_alive="10m")
    app, *_ = build_several(settings, get_paths({"FERRY_HOME": str(root / "ferry")}), refs,
                            progress=False, found=found)
    running = in_thread_server(app, None, "uvicorn-disk", 120)
    running.engine = models = running.services.engine  # the ModelSet the lifespan started
    thinker = with_template(tokenizer, root / "thinker-tok", THINKING_TEMPLATE)
    models.add(ModelSource("thinker", lambda: thinker, _no_load, 1, {"source": "configured"}))
    # a model whose tokenizer does not open: transformers reads the weights-only GGUF for real
    broken = lms / "weights.gguf"
    models.add(ModelSource("broken", lambda: Tokenizer(gguf_tokenizer_dir(broken, root / "tc")),
                           _no_load, 1, {"source": "configured"}))
    yield running
    running.stop()


def _no_load() -> Any:
    raise RuntimeError("the thinker is only opened (its template), never loaded here")


@pytest.fixture
def page(csp_page: Any, browser: Any) -> Iterator[Any]:
    with csp_page(browser) as page:
        page.set_default_timeout(60_000)
        yield page


def cards(server: Any) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in httpx.get(server.url + "/v1/models").json()["data"]}


def import_file(server: Any, model: str | None) -> httpx.Response:
    data: dict[str, Any] = {"format": "ferry-conversation", "version": 1, "title": "Moved",
                            "messages": [{"role": "user", "content": "Hello"}]}
    if model is not None:
        data["model"] = model
    return httpx.post(server.url + "/import", follow_redirects=True,
                      files={"file": ("c.json", json.dumps(data).encode(), "application/json")})


def conversation_id(response: httpx.Response) -> int:
    return int(re.search(r"/c/(\d+)", str(response.url)).group(1))  # type: ignore[union-attr]


def test_v1_models_lists_the_runnable_ones_found_on_disk(server: Any, waiter: Any) -> None:
    waiter(lambda: "smol:135m" in cards(server), 60, message="discovery added smol:135m")
    found = cards(server)
    assert found["smol:135m"]["source"] == "ollama"
    assert found["smol:135m"]["state"] == "unloaded"
    assert found["SmolLM2-135M-Instruct"]["source"] == "configured"
    assert "weights" not in found  # no tokenizer: only `ferry models` lists it, with why


def test_picking_a_model_on_disk_loads_it_and_it_answers(server: Any, page: Any,
                                                        waiter: Any, idle_check: Any) -> None:
    waiter(lambda: "smol:135m" in cards(server), 60, message="discovery added smol:135m")
    page.goto(server.url + "/")
    on_disk = page.locator("select.model-pick optgroup[label='On disk'] option")
    assert on_disk.all_inner_texts() == ["smol:135m (ollama, not loaded)"]
    page.locator("select.model-pick").select_option("smol:135m")
    page.fill("#composer textarea", "What is the capital of Germany?")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile(r"/c/\d+$"))
    reply = page.locator("article.msg.assistant").last
    waiter(lambda: "loading smol:135m" in reply.inner_text()
           or cards(server)["smol:135m"]["state"] == "loaded", 60, message="loading shown")
    waiter(lambda: "by smol:135m" in reply.inner_text(), 90, message="smol's reply")
    assert "Berlin" in reply.inner_text()
    assert page.locator(".model-pick select").input_value() == "smol:135m"
    # the export carries the model; importing it back keeps it
    cid = int(page.url.rsplit("/", 1)[1])
    exported = httpx.get(f"{server.url}/c/{cid}/export.json").json()
    assert exported["model"] == "smol:135m"
    assert exported["messages"][-1]["model"] == "smol:135m"  # the reply's writer too
    assert "> Model: smol:135m" in httpx.get(f"{server.url}/c/{cid}/export.md").text
    back = httpx.post(server.url + "/import", follow_redirects=True, files={
        "file": ("c.json", json.dumps(exported).encode(), "application/json")})
    assert back.status_code == 200 and "does not serve" not in back.text
    again = httpx.get(f"{server.url}/c/{conversation_id(back)}/export.json").json()
    assert again["model"] == "smol:135m" and again["messages"][-1]["model"] == "smol:135m"
    assert "by smol:135m" in back.text  # the imported reply still says who wrote it
    idle_check(server.engine)


def test_import_of_an_unknown_model_falls_back_with_a_note(server: Any) -> None:
    r = import_file(server, "nowhere:1b")
    assert r.status_code == 200
    assert "written with nowhere:1b, which this server does not serve" in r.text
    cid = conversation_id(r)
    assert httpx.get(f"{server.url}/c/{cid}/export.json").json()["model"] == \
        "SmolLM2-135M-Instruct"
    r = import_file(server, 42)  # type: ignore[arg-type]
    assert r.status_code == 400 and "model" in r.text


def test_thinking_switch_follows_the_conversations_model(server: Any) -> None:
    plain = import_file(server, None)
    assert 'name="enable_thinking"' not in plain.text  # SmolLM2's template takes none
    thinking = import_file(server, "thinker")
    assert thinking.status_code == 200 and 'name="enable_thinking"' in thinking.text
    assert "thinker" in cards(server)  # listed; never loaded by opening the page
    assert cards(server)["thinker"]["state"] == "unloaded"


def test_a_model_whose_tokenizer_fails_is_refused_with_a_notice(server: Any) -> None:
    store = server.services.store
    before = store.conversations("local")
    # the tokenizer is read in a child process (seconds on a busy machine), then remembered
    r = httpx.post(server.url + "/c", data={"content": "Hello", "model": "broken"}, timeout=120)
    assert r.status_code == 503 and "the model broken cannot be used" in r.text
    assert store.conversations("local") == before  # nothing left behind
    page = import_file(server, "broken")  # its page still opens
    assert page.status_code == 200 and "Moved" in page.text
