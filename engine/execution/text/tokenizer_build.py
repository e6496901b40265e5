"""`python -m engine.execution.text.tokenizer_build GGUF FOLDER`: a GGUF file's tokenizer
written as a folder (tokenizer.write_tokenizer_dir), in a process of its own, so that what
transformers imports to read it never stays in the server (tokenizer.gguf_tokenizer_dir)."""
from __future__ import annotations

import sys
from pathlib import Path

from engine.execution.text.tokenizer import write_tokenizer_dir


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m engine.execution.text.tokenizer_build GGUF FOLDER",
              file=sys.stderr)
        return 2
    write_tokenizer_dir(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
