"""Which chat template a model's files hold, in words (engine.text.chat_template names
them): `describe_chat_template` reads a model's files without loading its tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

from engine.execution.loading.model_files import is_gguf
from engine.text.chat_template import chat_template_name
from engine.text.reasoning import CLOSE, OPEN

TOKEN_SCAN_BYTES = 64 << 20  # a GGUF's metadata (tokens included) fits in its first 64 MiB


def _folder_template(folder: Path) -> tuple[str, str]:
    """(template, added tokens' text) of a Hugging Face folder."""
    template = ""
    jinja = folder / "chat_template.jinja"
    config = folder / "tokenizer_config.json"
    if jinja.is_file():
        template = jinja.read_text()
    elif (folder / "chat_template.json").is_file():
        template = str(json.loads((folder / "chat_template.json").read_text())
                       .get("chat_template") or "")
    data = json.loads(config.read_text()) if config.is_file() else {}
    if not template:
        value = data.get("chat_template") or ""
        template = value if isinstance(value, str) else json.dumps(value)
    # added tokens: tokenizer.json's list (what transformers writes now) or the config's map
    added = list((data.get("added_tokens_decoder") or {}).values())
    fast = folder / "tokenizer.json"
    if fast.is_file():
        added += json.loads(fast.read_text()).get("added_tokens") or []
    return template, " ".join(str(t.get("content", "")) for t in added if isinstance(t, dict))


def _gguf_template(path: Path) -> tuple[str, str]:
    """(template, the think tags found among its tokens) of a GGUF file, from its metadata
    (the token strings are found as GGUF writes them: a little-endian uint64 length, then
    the bytes; they lie in the metadata, before the tensors)."""
    from engine.execution.loading.gguf_file import _open_reader, _value

    reader = _open_reader(path)
    field = reader.fields.get("tokenizer.chat_template")
    template = _value(field) if field is not None else None
    head = bytes(reader.data[:TOKEN_SCAN_BYTES])
    tags = [t for t in (OPEN, CLOSE) if len(t).to_bytes(8, "little") + t.encode() in head]
    return template if isinstance(template, str) else "", " ".join(tags)


def describe_chat_template(path: str | Path) -> str:
    """The chat template a model file or folder would chat with, in words."""
    path = Path(path)
    if is_gguf(path):
        template, tokens = _gguf_template(path)
    else:
        template, tokens = _folder_template(path)
    thinks = (OPEN in tokens and CLOSE in tokens) or (OPEN in template and CLOSE in template)
    return chat_template_name(bool(template), thinks)
