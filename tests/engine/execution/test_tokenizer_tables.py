"""An open tokenizer keeps no Python copy of its vocabulary or merges (the Rust tokenizer
holds them), and still encodes, decodes and renders chats as it did with them."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.execution.text.tokenizer import CONSTRUCTION_TABLES, drop_construction_tables

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
