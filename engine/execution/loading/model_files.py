"""What a model path is: a GGUF file or a Hugging Face folder (torch-free, cheap to ask).

A GGUF file is known by its `.gguf` suffix or, for files stored without one (Ollama keeps
each model as a blob named by its digest), by the four bytes every GGUF file starts with.
"""
from __future__ import annotations

from pathlib import Path

GGUF_MAGIC = b"GGUF"


def is_gguf(path: str | Path) -> bool:
    """A GGUF file by its suffix (existing or not: the loader says it is missing) or, when it
    exists without the suffix, by its magic."""
    path = Path(path)
    if path.suffix == ".gguf":
        return True
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:  # a folder, missing, unreadable: not a GGUF file
        return False


def is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))
