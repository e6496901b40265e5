"""A GGUF's tokenizer follows its vocabulary kind, not its architecture: a gemma3 file with a
byte-level BPE vocabulary (tokenizer.ggml.model "gpt2", as the synthetic benchmark files
have) encodes text as the default model does, spaces included, as llama.cpp reads it."""
from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from engine.execution.text.tokenizer import Tokenizer, gguf_tokenizer_dir
from tests.tools import synthetic_gguf

TEXT = "hello world, this is a test of spaces"


def test_gemma3_file_with_a_bpe_vocabulary_keeps_its_spaces(tmp_path: Path) -> None:
    path = tmp_path / "gemma3-bpe.gguf"
    synthetic_gguf.write(path, hidden=64, layers=2, ff=128, heads=4, kv_heads=1,
                         qtype=GGMLQuantizationType.F16, untied=False, arch="gemma3",
                         head_dim=16, window=16)
    default = synthetic_gguf.default_gguf()
    want = Tokenizer(gguf_tokenizer_dir(default, tmp_path / "a")).encode(TEXT)
    got = Tokenizer(gguf_tokenizer_dir(path, tmp_path / "b")).encode(TEXT)
    assert got == want and len(got) < len(TEXT.split()) * 2


def test_the_tokenizer_folder_is_built_in_a_child_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' GGUF reading imports what serving never uses (sympy among them): the
    folder is built by a child, so none of it stays in the server's process; a file with no
    readable tokenizer is a ValueError saying so, and asking again says it without another
    child."""
    import subprocess
    import sys

    code = ("import sys; from engine.execution.text.tokenizer import gguf_tokenizer_dir; "
            f"gguf_tokenizer_dir({str(synthetic_gguf.default_gguf())!r}, {str(tmp_path)!r}); "
            "print('sympy' in sys.modules, 'transformers.modeling_gguf_pytorch_utils' in "
            "sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["False", "False"]
    folder = next((tmp_path / "tokenizers").iterdir())
    assert Tokenizer(folder).encode(TEXT) == Tokenizer(synthetic_gguf.default_gguf()).encode(TEXT)
    from tests.app.test_discovery import weights_only_gguf

    broken = weights_only_gguf(tmp_path / "weights.gguf")
    with pytest.raises(ValueError, match="its tokenizer could not be read"):
        gguf_tokenizer_dir(broken, tmp_path / "other")
    assert not list((tmp_path / "other" / "tokenizers").iterdir())  # no half-written folder
    from engine.execution.text import tokenizer as tokenizer_module

    def no_child(*args: object) -> None:
        raise AssertionError("a second child for a file already found unreadable")
    monkeypatch.setattr(tokenizer_module, "_build_in_child", no_child)
    with pytest.raises(ValueError, match="its tokenizer could not be read"):
        gguf_tokenizer_dir(broken, tmp_path / "other")


SENTENCEPIECE_WORDS = ("▁", "e", "t", "a", "o", "n", "h", "s", "r", "l", "d", "i", "w", "f",
                       "c", "T", "th", "▁t", "▁th", "▁the", "he", "er", "an", "▁a", "▁an", "▁and",
                       "on", "in", "▁w", "▁wo", "or", "▁f", "▁fe", "rr", "▁fer", "▁ferr", "y",
                       "▁ferry", "ll", "o,", "▁T", "▁Th", "▁The", "s.", "H", "▁H", "el", "ell",
                       "▁Hell", "▁Hello")
SENTENCEPIECE_TEXTS = ("Hello, the ferry and the T", "  two  spaces\tand a tab\n\nlines",
                       "émoji 🚢 ferry", "The ferry<s></s>", "")


def sentencepiece_gguf(path: Path) -> Path:
    """A gemma3 file of no weights whose vocabulary is SentencePiece's (tokenizer.ggml.model
    "llama": scored pieces and byte fallback), which transformers reads as GemmaTokenizer."""
    import gguf

    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(16)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-6)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)),
              *SENTENCEPIECE_WORDS]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(SENTENCEPIECE_WORDS))])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(SENTENCEPIECE_WORDS))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_sentencepiece_folder_loads_with_the_generic_class(tmp_path: Path) -> None:
    """The folder of a file transformers reads as GemmaTokenizer (a class that rebuilds its
    Rust tokenizer from Python tables at every load) is marked for the generic class, which
    reads the same tokenizer from tokenizer.json: the ids and text are transformers' own."""
    import json

    from transformers import AutoTokenizer

    path = sentencepiece_gguf(tmp_path / "sp.gguf")
    truth = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    assert type(truth).__name__ == "GemmaTokenizer"
    folder = gguf_tokenizer_dir(path, tmp_path / "cache")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "TokenizersBackend"
    # listed, so that loading does not parse tokenizer.json in Python as well
    assert config["added_tokens_decoder"]["2"]["content"] == "</s>"
    ours = Tokenizer(folder)
    # served plain (no transformers), and where transformers is needed, the generic class
    assert type(ours.hf).__name__ == "PlainTokenizer"
    assert type(ours.hf.full()).__name__ == "TokenizersBackend"
    for text in SENTENCEPIECE_TEXTS:
        for special in (True, False):
            ids = truth.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids
            assert ours.decode(ids) == truth.decode(ids, skip_special_tokens=True)
    assert ours.eos_ids == {2} and ours.vocab_size == len(truth)
    # the class's own defaults come along (Gemma's pads on the left)
    assert (ours.hf.padding_side, ours.hf.truncation_side) == \
        (truth.padding_side, truth.truncation_side) == ("left", "right")


def test_the_named_class_stays_where_the_generic_one_differs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tokenizer.json the generic class reads otherwise than the named class (here its
    normalizer gone, which GemmaTokenizer puts back) is no match; where the loads differ,
    the folder's config stays as the named class wrote it."""
    import json
    import shutil

    from transformers import GemmaTokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    from engine.execution.text import tokenizer as tokenizer_module
    from engine.execution.text.tokenizer import same_tokenizer, write_tokenizer_dir

    path = sentencepiece_gguf(tmp_path / "sp.gguf")
    kept = tmp_path / "kept"
    kept.mkdir()
    monkeypatch.setattr(tokenizer_module, "same_tokenizer", lambda a, b: False)
    write_tokenizer_dir(path, kept)
    monkeypatch.undo()
    config = json.loads((kept / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "GemmaTokenizer" and "added_tokens_decoder" not in config
    folder = tmp_path / "folder"
    folder.mkdir()
    write_tokenizer_dir(path, folder)
    named = GemmaTokenizer.from_pretrained(str(folder))
    assert same_tokenizer(named, TokenizersBackend.from_pretrained(str(folder)))
    changed = tmp_path / "changed"
    shutil.copytree(folder, changed)
    spec = json.loads((changed / "tokenizer.json").read_text())
    spec["normalizer"] = None
    (changed / "tokenizer.json").write_text(json.dumps(spec))
    assert not same_tokenizer(named, TokenizersBackend.from_pretrained(str(changed)))


def test_an_earlier_format_folder_is_rebuilt_and_removed(tmp_path: Path) -> None:
    path = sentencepiece_gguf(tmp_path / "sp.gguf")
    st = path.stat()
    old = tmp_path / "cache" / "tokenizers" / f"sp-{st.st_size}-{st.st_mtime_ns}"
    older = [old, old.with_name(old.name + "-t2")]  # before format names, and format 2
    for folder in older:
        folder.mkdir(parents=True)
        (folder / "tokenizer_config.json").write_text('{"tokenizer_class": "GemmaTokenizer"}')
    folder = gguf_tokenizer_dir(path, tmp_path / "cache")
    assert folder not in older and not any(f.exists() for f in older)
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


# llama.cpp's split for tokenizer.ggml.pre "tekken" (Mistral's Tekken vocabularies, as its
# converter writes Mistral 3's and Pixtral's files): cased words apart, each digit alone
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_TEXTS = ["helloWorld and CamelCaseWords, JSONParser", "it's 2026-12-07, isn't it? 12345",
               "path/to/file\n\n  next line", "naïve café ÉCOLE Straße"]


def test_a_mistral3_file_with_the_tekken_split_tokenizes_as_it_says(tmp_path: Path) -> None:
    """Ferry reads a `mistral3` file's tokenizer as a llama one's; the split its
    tokenizer.ggml.pre names must survive that, and no compact table may take its place."""
    from tokenizers import Regex, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer

    path = tmp_path / "mistral3-tekken.gguf"
    synthetic_gguf.write(path, hidden=64, layers=2, ff=128, heads=4, kv_heads=1,
                         qtype=GGMLQuantizationType.F16, untied=False, arch="mistral3",
                         pre="tekken")
    default = gguf_tokenizer_dir(synthetic_gguf.default_gguf(), tmp_path / "a")
    reference = RustTokenizer.from_file(str(default / "tokenizer.json"))
    reference.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    want = [reference.encode(t, add_special_tokens=False).ids for t in SPLIT_TEXTS]
    tekken = Tokenizer(gguf_tokenizer_dir(path, tmp_path / "b"))
    assert [tekken.encode(t) for t in SPLIT_TEXTS] == want
    assert [Tokenizer(default).encode(t) for t in SPLIT_TEXTS] != want  # the split matters
    assert [tekken.decode(ids) for ids in want] == SPLIT_TEXTS
