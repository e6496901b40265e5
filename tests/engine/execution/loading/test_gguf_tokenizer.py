"""A GGUF's tokenizer follows its vocabulary kind, not its architecture: a gemma3 file with a
byte-level BPE vocabulary (tokenizer.ggml.model "gpt2", as the synthetic benchmark files
have) encodes text as the default model does, spaces included, as llama.cpp reads it."""
from __future__ import annotations

from pathlib import Path

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
