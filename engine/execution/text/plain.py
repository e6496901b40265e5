"""A tokenizer folder served by the Rust tokenizer and jinja2 alone: no transformers.

A GGUF's tokenizer folder (engine.execution.text.tokenizer.gguf_tokenizer_dir) is a
`tokenizer.json`, a chat template and the special tokens, read by transformers' generic class
(`TokenizersBackend`), which adds argument handling and nothing else to the Rust tokenizer.
Importing transformers costs a serving process ~20 MB for its life (its own modules,
huggingface_hub, an HTTP client) and its wrapper more per model. Where the folder was checked
to encode, decode and render alike (`PLAIN_MARK`, written by the folder's builder), it is
opened as `PlainTokenizer`; what it does not do itself (a rare feature's call, such as a
cross-encoder's query and document cut as a pair) goes to the transformers tokenizer,
opened on first use.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.execution.text.chat_render import render_chat
from engine.execution.text.compact_bpe import CompactBPE

# a folder's mark: this file, saying the plain load was compared with transformers' and agreed
PLAIN_MARK = "ferry-plain.json"
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")  # transformers' named special tokens


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


CONSTRUCTION_TABLES = ("_vocab", "_merges")


def drop_construction_tables(hf: Any) -> None:
    """transformers' BPE tokenizer classes (Gemma, Llama, Qwen2, GPT-2) keep the Python
    vocabulary and merge list they built the Rust tokenizer from: Python objects per token
    (about 150 MB for Gemma 3's 262k tokens and 515k merges) that nothing reads again, as
    encoding, decoding and get_vocab go to the Rust tokenizer. Empty them."""
    for name in CONSTRUCTION_TABLES:
        value = getattr(hf, name, None)
        if isinstance(value, (dict, list)) and value:
            setattr(hf, name, type(value)())


def is_plain(folder: Path) -> bool:
    mark = folder / PLAIN_MARK
    try:
        return bool(json.loads(mark.read_text()).get("plain"))
    except (OSError, ValueError, AttributeError):
        return False


def cut_pair(backend: Any, first: str, second: str, max_length: int) -> list[int]:
    """The pair's ids with the special tokens (a cross-encoder's `[CLS] first [SEP] second
    [SEP]`), the second text's end cut so that they fit `max_length`: transformers'
    truncation="only_second" on the Rust tokenizer `backend` (its truncation and padding
    off). Where the first text leaves no room for any of the second, the pair uncut (longer
    than `max_length`: the caller refuses it) where transformers raises; an empty second
    text is no pair to transformers. Encoded by encode_batch, which lets go of Python's lock
    while it works."""
    a, b = backend.encode_batch([first, second], add_special_tokens=False)
    if not second:
        return list(backend.post_process(a).ids)
    over = len(a.ids) + len(b.ids) + backend.num_special_tokens_to_add(True) - max_length
    if 0 < over < len(b.ids):
        b.truncate(len(b.ids) - over)
    return list(backend.post_process(a, b).ids)


class PlainTokenizer:
    """The part of transformers' tokenizer interface Ferry serves with."""

    def __init__(self, folder: str | Path) -> None:
        self.name_or_path = str(folder)
        folder = Path(folder)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        # the compact tables where the folder has them (a fifth of the Rust tokenizer's
        # memory), else the Rust tokenizer
        self.backend_tokenizer: Any = CompactBPE.open(folder)
        if self.backend_tokenizer is None:  # (the tokenizers package: ~3 MB imported)
            from tokenizers import Tokenizer as RustTokenizer

            self.backend_tokenizer = RustTokenizer.from_file(str(folder / "tokenizer.json"))
        # transformers turns a tokenizer.json's own truncation and padding off for a call
        # that does not ask for them (every call serving makes)
        self.backend_tokenizer.no_truncation()
        self.backend_tokenizer.no_padding()
        self.clean_up_tokenization_spaces = bool(config.get("clean_up_tokenization_spaces",
                                                            False))
        self.special_tokens_map: dict[str, str] = {
            name: text for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text(config.get(name))) is not None}
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens")
        extra = list(extra.values()) if isinstance(extra, Mapping) else extra
        self._extra_special = [text for value in (extra if isinstance(extra, list) else ())
                               if (text := _token_text(value)) is not None]
        template = config.get("chat_template")
        jinja = folder / "chat_template.jinja"
        if template is None and jinja.is_file():
            template = jinja.read_text()
        self.chat_template: str | None = template if isinstance(template, str) else None
        self._full: Any = None
        self._full_lock = threading.Lock()

    # -- what serving calls --------------------------------------------------------------
    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token")

    def _token_id(self, name: str) -> int | None:
        text = self.special_tokens_map.get(name)
        return None if text is None else self.backend_tokenizer.token_to_id(text)

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then the extra ones, each once (transformers' order)."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self._extra_special]))

    def __len__(self) -> int:
        return int(self.backend_tokenizer.get_vocab_size(with_added_tokens=True))

    def get_vocab(self) -> dict[str, int]:
        return dict(self.backend_tokenizer.get_vocab(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend_tokenizer.decode(list(ids),
                                                 skip_special_tokens=skip_special_tokens))

    def encode_truncated(self, text: str, max_length: int) -> list[int]:
        """`text`'s ids with the special tokens, cut to `max_length` as transformers cuts
        (`truncation=True`): the text's ids end early, the special tokens stay."""
        backend = self.backend_tokenizer
        room = max_length - backend.num_special_tokens_to_add(False)
        if room < 1:  # no room for any text: transformers' own rules
            return list(self.full()(text, truncation=True, max_length=max_length)["input_ids"])
        if isinstance(backend, CompactBPE):
            return backend.with_special_tokens(backend.encode(text, False).ids[:room])
        encoding = backend.encode(text, add_special_tokens=False)
        encoding.truncate(room)
        return list(backend.post_process(encoding).ids)

    def encode_pair_truncated(self, first: str, second: str, max_length: int) -> list[int]:
        """cut_pair on this tokenizer (the Rust tokenizer's post-processing of a pair)."""
        backend = self.backend_tokenizer
        if isinstance(backend, CompactBPE):
            backend = backend.rust()
        return cut_pair(backend, first, second, max_length)

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> Any:
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(i) for i in ids]

    def apply_chat_template(self, conversation: Sequence[Mapping[str, Any]],
                            tokenize: bool = False, add_generation_prompt: bool = False,
                            tools: Sequence[Mapping[str, Any]] | None = None,
                            chat_template: str | None = None, **variables: Any) -> str:
        """The rendered text (transformers' tokenize=False call)."""
        if tokenize:
            raise TypeError("PlainTokenizer renders text only (tokenize=False)")
        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError("this tokenizer has no chat template")
        return render_chat(template, conversation, add_generation_prompt=add_generation_prompt,
                           tools=tools, special_tokens=self.special_tokens_map, **variables)

    # -- everything else: transformers' tokenizer of the same folder ------------------------
    def full(self) -> Any:
        """transformers' tokenizer of this folder, opened once, on first need."""
        with self._full_lock:
            if self._full is None:
                from transformers import AutoTokenizer

                self._full = AutoTokenizer.from_pretrained(self.name_or_path)
                drop_construction_tables(self._full)
            return self._full

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.full()(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # not ours and not to forward (copy, pickle probes)
            raise AttributeError(name)
        return getattr(self.full(), name)
