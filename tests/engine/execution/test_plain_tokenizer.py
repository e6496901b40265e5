"""A GGUF's tokenizer folder is served without transformers where the plain load (the Rust
tokenizer and Ferry's template rendering) was checked to serve as transformers' load does;
a feature the plain load lacks still gets transformers' tokenizer, opened then."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.execution.text.plain import PLAIN_MARK, PlainTokenizer, is_plain
from engine.execution.text.tokenizer import (
    Tokenizer,
    gguf_tokenizer_dir,
    mark_plain_where_same,
    same_plain,
)
from tests.tools.synthetic_gguf import default_gguf

pytestmark = pytest.mark.model

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name three rivers, with  spaces & <tags>."}]


def test_the_default_models_folder_serves_plain(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = gguf_tokenizer_dir(default_gguf(), tmp_path)
    assert is_plain(folder)
    ours = Tokenizer(folder)
    assert isinstance(ours.hf, PlainTokenizer)
    full = AutoTokenizer.from_pretrained(str(folder))
    assert same_plain(full, ours.hf)
    want = full.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ours.apply_chat_template(CHAT) == list(want)
    assert ours.eos_ids == {full.eos_token_id} and ours.vocab_size == len(full)
    assert ours.hf.all_special_tokens == full.all_special_tokens
    ids = full.encode("A ferry 🚢 crosses.", add_special_tokens=False)
    detok = ours.detokenizer()
    assert "".join(detok.push(i) for i in ids) + detok.flush() == full.decode(ids)


def test_a_folder_that_renders_otherwise_is_not_marked(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = gguf_tokenizer_dir(default_gguf(), tmp_path)
    (folder / PLAIN_MARK).unlink()
    render = PlainTokenizer.apply_chat_template
    monkeypatch.setattr(PlainTokenizer, "apply_chat_template",
                        lambda self, *a, **kw: render(self, *a, **kw) + " ")
    mark_plain_where_same(folder)
    assert not is_plain(folder)
    assert Tokenizer(folder).hf.__class__.__name__ == "TokenizersBackend"
    monkeypatch.undo()
    mark_plain_where_same(folder)
    assert is_plain(folder)
    (folder / PLAIN_MARK).write_text(json.dumps({"plain": False}))
    assert not is_plain(folder)


@pytest.mark.parametrize("extra", [["<repo_name>", "<file_sep>"],
                                   {"repo": "<repo_name>", "file": "<file_sep>"}])
def test_extra_special_tokens_come_in_transformers_order(tmp_path: Path, extra: object) -> None:
    """A tool format strips the special tokens from a reply: the named ones, then the extra
    ones, each once, as transformers lists them (a list or, in transformers 5, named)."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path / "extra"
    shutil.copytree(gguf_tokenizer_dir(default_gguf(), tmp_path), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["extra_special_tokens"] = extra
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    want = AutoTokenizer.from_pretrained(str(folder)).all_special_tokens
    assert "<repo_name>" in want
    assert PlainTokenizer(folder).all_special_tokens == want


def test_a_bert_files_inputs_are_cut_as_transformers_cuts(embedding_dir: Path,
                                                          tmp_path: Path) -> None:
    """An embedding input over the model's length is cut when asked (Ollama's default): the
    text's end goes, [CLS] and [SEP] stay, as transformers' truncation=True does."""
    from transformers import AutoTokenizer

    from tests.tools.bert_gguf import write_bert_gguf

    gguf = write_bert_gguf(embedding_dir, tmp_path / "minilm.gguf")
    folder = gguf_tokenizer_dir(gguf, tmp_path / "cache")
    ours, full = Tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert isinstance(ours.hf, PlainTokenizer)
    text = "A ferry crosses the river at dawn, " * 20
    for length in (3, 7, 16, 512):
        want = list(full(text, truncation=True, max_length=length)["input_ids"])
        assert ours.encode_truncated(text, length) == want
        assert want[0] == full.cls_token_id and want[-1] == full.sep_token_id
        assert len(want) == min(length, len(full.encode(text)))
    # a cross-encoder's (query, document) pairs: the document's end goes
    query = "where does the ferry go?"
    for length in (12, 16, 40, 512):
        want = list(full(query, text, truncation="only_second", max_length=length)["input_ids"])
        assert ours.encode_pair_truncated(query, text, length) == want
        assert len(want) == min(length, len(full(query, text)["input_ids"]))
    # a query that leaves no room for the document: transformers refuses to cut, Ferry
    # gives the pair uncut (longer than the length: the API refuses it with a 400)
    with pytest.raises(Exception, match="too short"):
        full(text, query, truncation="only_second", max_length=16)
    assert ours.encode_pair_truncated(text, query, 16) == list(full(text, query)["input_ids"])


def test_serving_a_chat_imports_no_transformers(tmp_path: Path) -> None:
    """Opening the tokenizer, rendering, encoding, streaming text out and cutting a
    (query, document) pair import none of transformers; a call the plain load does not serve
    (transformers' own call interface) opens transformers' tokenizer of the same folder,
    which agrees."""
    folder = gguf_tokenizer_dir(default_gguf(), tmp_path)
    code = f"""
import sys
from engine.execution.text.tokenizer import Tokenizer
tok = Tokenizer({str(folder)!r})
ids = tok.apply_chat_template({CHAT!r})
detok = tok.detokenizer(ids)
text = "".join(detok.push(i) for i in tok.encode("Hello there", add_special_tokens=False))
assert "<|im_end|>" in tok.hf.all_special_tokens  # a tool format's clean-up
assert len(tok.encode_pair_truncated("a query", "a document " * 40, 16)) == 16
print(text, len(ids), "transformers" in sys.modules, "huggingface_hub" in sys.modules)
cut = tok.hf("one two three four five six", truncation=True, max_length=3)["input_ids"]
print(len(cut), "transformers" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first.endswith(" False False") and first.startswith("Hello there ")
    assert second == "3 True"
