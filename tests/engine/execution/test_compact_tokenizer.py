"""A BPE tokenizer folder is served from Ferry's compact tables (csrc/bpe.c) where they were
checked to encode and decode as the Rust tokenizer does: the default model's byte-level BPE,
the same vocabulary behind Llama 3's and Qwen2's pre-tokenizers, and a SentencePiece-style
BPE with byte fallback (Gemma's shape). Other shapes, tables that
disagree and a process without the C library keep the Rust tokenizer."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.execution.text.compact_bpe import (
    SPLITS,
    TABLES,
    TABLES_DATA,
    CompactBPE,
    _random_text,
    write_compact,
)
from engine.execution.text.plain import PlainTokenizer
from engine.execution.text.tokenizer import SAME_TEXTS, Tokenizer, gguf_tokenizer_dir
from engine.kernels import native
from tests.tools.synthetic_gguf import default_gguf

pytestmark = pytest.mark.skipif(native.library() is None, reason=native.status())

ROOT = Path(__file__).resolve().parents[3]
SPM_CORPUS = ("The ferry crosses the river at dawn. Passengers wait on the pier, and the "
              "captain counts them twice before the engines start. " * 3 +
              "Numbers: 12 345 6789. Quotes 'like this' and \"that\". Tabs\tand\nlines.")


def rust_of(folder: Path) -> Any:
    from tokenizers import Tokenizer as RustTokenizer

    return RustTokenizer.from_file(str(folder / "tokenizer.json"))


def texts_for(spec: dict[str, Any], seed: int, count: int) -> list[str]:
    """Random texts other than the check's own (another seed), a long one among them."""
    added = [str(t["content"]) for t in spec.get("added_tokens") or []]
    rng = random.Random(seed)
    texts = [_random_text(rng, added) for _ in range(count)]
    return [*texts, "".join(texts) * 3, (ROOT / "README.md").read_text()]


def assert_same(rust: Any, compact: CompactBPE, texts: list[str]) -> None:
    for text in texts:
        for special in (True, False):
            want = list(rust.encode(text, add_special_tokens=special).ids)
            assert compact.encode(text, special).ids == want, text[:80]
            for skip in (True, False):
                assert compact.decode(want, skip) == rust.decode(want, skip_special_tokens=skip)


def test_the_default_models_folder_serves_from_the_tables(tmp_path: Path) -> None:
    folder = gguf_tokenizer_dir(default_gguf(), tmp_path)
    assert (folder / TABLES).is_file() and (folder / TABLES_DATA).is_file()
    tok = Tokenizer(folder)
    assert isinstance(tok.hf, PlainTokenizer)
    compact = tok.hf.backend_tokenizer
    assert isinstance(compact, CompactBPE) and compact.byte_level
    spec = json.loads((folder / "tokenizer.json").read_text())
    rust = rust_of(folder)
    assert_same(rust, compact, texts_for(spec, 7, 300))
    assert compact.get_vocab() == rust.get_vocab(with_added_tokens=True)
    assert compact.token_to_id("<|im_start|>") == rust.token_to_id("<|im_start|>")
    assert compact.token_to_id("not a token at all") is None
    # what serving calls goes through the tables: a chat's prompt, a stream's text
    ids = tok.apply_chat_template([{"role": "user", "content": "Hi there 🚢"}])
    assert ids == list(rust.encode(tok.render_chat([{"role": "user", "content": "Hi there 🚢"}]),
                                   add_special_tokens=False).ids)
    detok = tok.detokenizer()
    assert "".join(detok.push(i) for i in ids) + detok.flush() == rust.decode(ids)
    assert compact._rust is None  # the Rust tokenizer was never opened


@pytest.mark.parametrize(("digits", "nfc", "ignore_merges"), [(3, False, True), (1, True, False)],
                         ids=["llama3", "qwen2"])
def test_regex_pre_tokenizers_serve_from_the_tables(tmp_path: Path, digits: int, nfc: bool,
                                                    ignore_merges: bool) -> None:
    """The default model's vocabulary behind the pre-tokenizer transformers writes for a
    Llama 3 GGUF (digits in threes; a word that is a token taken whole) or a Qwen2 one
    (digits one by one, NFC text)."""
    spec = json.loads((gguf_tokenizer_dir(default_gguf(), tmp_path) / "tokenizer.json")
                      .read_text())
    pattern = next(p for p, d in SPLITS.items() if d == digits)
    spec["normalizer"] = {"type": "NFC"} if nfc else None
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    spec["model"]["ignore_merges"] = ignore_merges
    spec["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True,
                              "trim_offsets": False, "use_regex": True}
    folder = tmp_path / "regex"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    rust = rust_of(folder)
    assert write_compact(folder, rust, SAME_TEXTS)
    compact = CompactBPE.open(folder)
    assert compact is not None and compact.byte_level
    edge = ["I'M SURE YOU'LL SEE 1234567 ſ'ſ", "x\r\n\r\n  y", "a!!\n\nb", "e\u0301 NFD"]
    assert_same(rust, compact, [*texts_for(spec, 13, 200), *edge])
    assert compact._rust is None or nfc  # text not in NFC is the Rust tokenizer's


def spm_folder(root: Path, tamper: bool = False) -> Path:
    """A SentencePiece-style BPE tokenizer.json as Gemma's is written: spaces as U+2581, byte
    fallback to <0xXX> tokens, a <bos> put before one text, special and plain added tokens.
    `tamper`: its merges in the reverse order of rank."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import decoders, models, normalizers, trainers

    trained = RustTokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    trained.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<eos>", "<bos>",
                                                                  "<unk>"])
    trained.train_from_iterator([SPM_CORPUS] * 4, trainer)
    spec = json.loads(trained.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    extra = {"<start_of_turn>": True, "<end_of_turn>": True, "<b>": False}
    for content in extra:
        vocab.setdefault(content, len(vocab))
    merges = spec["model"]["merges"]
    if tamper:
        merges.reverse()
    spec["added_tokens"] = [
        {"id": vocab[c], "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special}
        for c, special in [("<pad>", True), ("<eos>", True), ("<bos>", True), ("<unk>", True),
                           *extra.items()]]
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "},
                             "behavior": "MergedWithPrevious", "invert": False}
    spec["decoder"] = json.loads(decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]).__getstate__())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<bos>": {"id": "<bos>", "ids": [vocab["<bos>"]],
                                     "tokens": ["<bos>"]}}}
    folder = root / ("tampered" if tamper else "spm")
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    return folder


def test_a_sentencepiece_style_bpe_serves_from_the_tables(tmp_path: Path) -> None:
    folder = spm_folder(tmp_path)
    rust = rust_of(folder)
    assert write_compact(folder, rust, SAME_TEXTS)
    compact = CompactBPE.open(folder)
    assert compact is not None and not compact.byte_level
    spec = json.loads((folder / "tokenizer.json").read_text())
    texts = texts_for(spec, 11, 300)
    # characters outside the vocabulary fall back to their bytes; decoding invalid UTF-8 byte
    # runs gives U+FFFD as the Rust tokenizer's ByteFallback does
    assert any(i >= 300 for i in rust.encode("漢字 🚢").ids)
    assert_same(rust, compact, [*texts, "漢字 🚢", "<start_of_turn>user\nhi<end_of_turn>"])
    byte_ids = [rust.token_to_id(f"<0x{b:02X}>") for b in (0xE6, 0xBC, 0x41, 0xFF)]
    assert compact.decode(byte_ids, False) == rust.decode(byte_ids, skip_special_tokens=False)
    assert "\ufffd" in compact.decode(byte_ids, False)
    assert compact.encode("a b").ids[0] == rust.token_to_id("<bos>")


def test_tables_that_disagree_are_not_kept(tmp_path: Path) -> None:
    """The tables of a file with its merges reordered against the Rust tokenizer of the
    original: text merges otherwise, so nothing is written and the folder keeps the
    Rust tokenizer."""
    folder = spm_folder(tmp_path, tamper=True)
    original = rust_of(spm_folder(tmp_path))
    assert not write_compact(folder, original, SAME_TEXTS)
    assert not (folder / TABLES).exists() and not (folder / TABLES_DATA).exists()
    assert CompactBPE.open(folder) is None
    assert write_compact(folder, rust_of(folder), SAME_TEXTS)  # against its own: kept


def test_other_shapes_keep_the_rust_tokenizer(tmp_path: Path) -> None:
    """A Metaspace pre-tokenizer (Llama 2's shape) is not one the tables serve."""
    folder = spm_folder(tmp_path)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                             "prepend_scheme": "first", "split": False}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    assert not write_compact(folder, rust_of(folder), SAME_TEXTS)
    assert not (folder / TABLES).exists()


def test_without_the_c_library_the_rust_tokenizer_serves(tmp_path: Path) -> None:
    folder = gguf_tokenizer_dir(default_gguf(), tmp_path)
    code = f"""
import sys
from engine.execution.text.plain import PlainTokenizer
plain = PlainTokenizer({str(folder)!r})
print(type(plain.backend_tokenizer).__name__, plain.encode("Hi there", False))
"""
    env = {"FERRY_NATIVE_KERNELS": "0", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    name, ids = done.stdout.strip().split(" ", 1)
    assert name == "Tokenizer"
    assert ids == str(rust_of(folder).encode("Hi there", add_special_tokens=False).ids)


def test_damaged_tables_are_not_opened(tmp_path: Path) -> None:
    """The C trusts the offsets and ids it is given: a cut file, or an offset or merge that
    points outside its block, leaves the folder to the Rust tokenizer, never to a crash."""
    import shutil

    built = gguf_tokenizer_dir(default_gguf(), tmp_path)
    settings = json.loads((built / TABLES).read_text())
    data = (built / TABLES_DATA).read_bytes()
    at = settings["layout"]
    n = settings["tokens"]

    def patched(section: str, index: int, value: int, width: int = 4) -> bytes:
        spot = at[section][0] + index * width
        return data[:spot] + value.to_bytes(width, "little", signed=True) + data[spot + width:]

    damaged = {"cut": data[:-1],
               "offset past its block": patched("offsets", n, 1 << 30),
               "offsets falling": patched("offsets", 1, 1 << 20),
               "merge past the vocabulary": patched("merges", 0, n + 5)}
    for name, content in damaged.items():
        folder = tmp_path / name.replace(" ", "-")
        shutil.copytree(built, folder)
        (folder / TABLES_DATA).write_bytes(content)
        assert CompactBPE.open(folder) is None, name
        plain = PlainTokenizer(folder)
        assert not isinstance(plain.backend_tokenizer, CompactBPE), name
        assert plain.encode("Hi there", False) == rust_of(folder).encode(
            "Hi there", add_special_tokens=False).ids
    assert CompactBPE.open(built) is not None
