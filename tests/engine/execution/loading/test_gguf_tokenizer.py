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


def test_the_tokenizer_folder_is_built_in_a_child_process(tmp_path: Path) -> None:
    """transformers' GGUF reading imports what serving never uses (sympy among them): the
    folder is built by a child, so none of it stays in the server's process; a file with no
    readable tokenizer is a ValueError saying so."""
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
