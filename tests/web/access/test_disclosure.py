"""What a user may see of the server's files (web/access/disclosure.py): admins the detail,
normal users of a shared server the model's name and no path."""
from __future__ import annotations

import pytest

from engine import FinalEvent, ModelInfo
from engine.runtime.events import Timings, Usage
from web.access.disclosure import final_error, hide_paths, model_info
from web.access.users import LOCAL_USER, User

ADMIN, BOB = User("ann", is_admin=True), User("bob")
GONE = "FileNotFoundError: [Errno 2] No such file or directory: '/srv/models/extra.gguf'"


@pytest.mark.parametrize(("text", "shown"), [
    (GONE, "FileNotFoundError: [Errno 2] No such file or directory: '<path>'"),
    ("/home/ann/.ollama/models/blobs/sha256-ab: bad header", "<path>: bad header"),
    (r"C:\Users\ann\m.gguf holds no tokenizer", "<path> holds no tokenizer"),
    ("at ~/models/x.gguf", "at <path>"),
    # not paths: an org/name id, a URL, a ratio, kernels, a lone slash
    ("org/name at https://example.org/a/b, 3/4 avx2/fma 1 / 2",
     "org/name at https://example.org/a/b, 3/4 avx2/fma 1 / 2"),
])
def test_hide_paths(text: str, shown: str) -> None:
    assert hide_paths(text) == shown


def failed(error: str, extra: dict[str, object]) -> FinalEvent:
    return FinalEvent("error", Usage(3, 0), Timings(0.1, None, None, 0.1), error, extra)


def test_a_load_failure_names_the_model_for_normal_users() -> None:
    final = failed(f"loading extra failed: {GONE}", {"model_unavailable": "extra"})
    assert final_error(final, BOB) == ("the model extra could not be loaded", True)
    assert final_error(final, ADMIN) == (f"loading extra failed: {GONE}", True)
    assert final_error(final, LOCAL_USER)[0] == final.error  # a local server's one user
    other = failed(f"generation failed: {GONE}", {})
    assert final_error(other, BOB) == (f"generation failed: {hide_paths(GONE)}", False)


def test_a_models_entry_without_paths() -> None:
    info = ModelInfo("weights", False, "unloaded", 10, "cannot run: /srv/w.gguf holds no "
                     "tokenizer", None, 0, {"path": "/srv/w.gguf", "source": "lm studio"},
                     GONE)
    seen = model_info(info, BOB)
    assert seen.details == {"source": "lm studio"} and "/srv" not in seen.runs
    assert seen.error == "the model weights could not be loaded"
    assert model_info(info, ADMIN) is info
