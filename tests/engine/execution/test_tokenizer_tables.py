"""An open tokenizer keeps no Python copy of its vocabulary or merges (the Rust tokenizer
holds them), and still encodes, decodes and renders chats as it did with them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.execution.text.plain import CONSTRUCTION_TABLES, drop_construction_tables

pytestmark = pytest.mark.model

TEXTS = ("The capital of France is", " two  spaces\tand a tab\n\nlines", "émoji 🚢 ferry",
         "<|im_start|>user\nhi<|im_end|>")


def test_the_construction_tables_are_emptied_and_nothing_changes(model_dir: Path,
                                                                  tmp_path: Path) -> None:
    from transformers import GPT2Tokenizer

    from engine.execution.text.tokenizer import Tokenizer, gguf_tokenizer_dir

    folder = gguf_tokenizer_dir(model_dir, tmp_path)
    # a BPE class that builds its Rust tokenizer from Python tables, as Gemma's and Qwen2's
    kept, dropped = (GPT2Tokenizer.from_pretrained(str(folder)) for _ in range(2))
    assert all(len(getattr(kept, name)) > 1000 for name in CONSTRUCTION_TABLES)
    drop_construction_tables(dropped)
    assert not any(getattr(dropped, name) for name in CONSTRUCTION_TABLES)
    ours = Tokenizer(folder)
    assert not any(getattr(ours.hf, name, None) for name in CONSTRUCTION_TABLES)
    assert len(dropped) == len(kept) and dropped.get_vocab() == kept.get_vocab()
    for text in TEXTS:
        for special in (True, False):
            ids = kept.encode(text, add_special_tokens=special)
            assert dropped.encode(text, add_special_tokens=special) == ids
            assert ours.encode(text, add_special_tokens=special) == ids
            assert dropped.decode(ids) == kept.decode(ids)
    chat = [{"role": "user", "content": "Name three rivers."}]
    assert dropped.apply_chat_template(chat, tokenize=False, chat_template=ours.chat_template) \
        == kept.apply_chat_template(chat, tokenize=False, chat_template=ours.chat_template)


@pytest.mark.parametrize("which", ["default", "wordpiece"])
def test_encode_is_the_rust_backends_where_it_agrees(which: str, model_dir: Path,
                                                     embedding_dir: Path,
                                                     tmp_path: Path) -> None:
    """Ferry encodes through the Rust backend (transformers' wrapper costs ~0.4 ms a text)
    once it gave transformers' ids on the probe texts; the ids stay transformers'."""
    from engine.execution.text.tokenizer import Tokenizer, gguf_tokenizer_dir

    folder = gguf_tokenizer_dir(model_dir, tmp_path) if which == "default" else embedding_dir
    ours = Tokenizer(folder)
    assert ours._backend is not None
    for text in (*TEXTS, "  leading and trailing  ", "a\u00a0b\u200bc", "1234567890" * 30):
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == \
                list(ours.hf.encode(text, add_special_tokens=special))
    # a call through transformers that truncates leaves the backend truncating: encode()
    # then goes through transformers, which turns it off again
    long = "word " * 600
    assert len(ours.hf(long, truncation=True, max_length=8)["input_ids"]) == 8
    assert ours.encode(long) == list(ours.hf.encode(long)) and len(ours.encode(long)) > 600


def test_a_backend_that_disagrees_is_not_used(model_dir: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.execution.text import tokenizer as tokenizer_module

    folder = tokenizer_module.gguf_tokenizer_dir(model_dir, tmp_path)
    # a probe the backend and transformers are made to disagree on: transformers' ids of
    # it are taken as the truth, the backend's differ (an extra id)
    real = tokenizer_module.Tokenizer._same_ids

    def skewed(self: Any, encode: Any) -> bool:
        return real(self, lambda text, **kw: [*encode(text, **kw), 0])
    monkeypatch.setattr(tokenizer_module.Tokenizer, "_same_ids", skewed)
    ours = tokenizer_module.Tokenizer(folder)
    assert ours._backend is None
    assert ours.encode("Hello there") == list(ours.hf.encode("Hello there"))


class _Backend:
    """A Rust tokenizer's batch calls, recording which one ran."""

    def __init__(self, fast: bool) -> None:
        self.calls: list[str] = []
        if fast:
            self.encode_batch_fast = lambda texts, **kw: self._encode("fast", texts)

    def encode_batch(self, texts: list[str], **kw: Any) -> list[Any]:
        return self._encode("plain", texts)

    def _encode(self, name: str, texts: list[str]) -> list[Any]:
        self.calls.append(name)
        return [type("Encoding", (), {"ids": [len(t) for t in texts]})()]


@pytest.mark.parametrize("fast", [True, False])
def test_the_backend_encoder_tracks_no_offsets_where_it_can(fast: bool) -> None:
    """A megabyte prompt's offsets tables are freed with Python's lock held, on a worker below
    the engine's priority: encode_batch_fast keeps none; a package without it still works."""
    from engine.execution.text.tokenizer import backend_encoder

    backend = _Backend(fast)
    assert backend_encoder(backend)("four") == [4]
    assert backend.calls == ["fast" if fast else "plain"]
