"""Tokenizer glue: prompts to ids, chat templates, EOS ids, and streaming text out.

Streaming needs two small state machines, used off the scheduler thread:
* IncrementalDetokenizer turns one token at a time into text deltas. Several byte-level
  tokens may form one character; while the decoded text ends in U+FFFD (an incomplete UTF-8
  sequence) it holds the text back. A few earlier ids are re-decoded each time so
  tokenizers that drop a leading space when decoding a lone token still space correctly.
* engine.text.stops.StopMatcher finds stop strings that may span tokens: it holds back any
  suffix that could start a stop string and, on a match, returns the text before it.

A file without a chat template (a base model, such as Gemma 3 270M) still chats, through
engine.text.chat_template.FALLBACK_TEMPLATE.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from engine.execution.loading.model_files import is_gguf
from engine.execution.text.compact_bpe import write_compact
from engine.execution.text.plain import (
    PLAIN_MARK,
    PlainTokenizer,
    cut_pair,
    drop_construction_tables,
    is_plain,
)
from engine.text.chat_template import (
    FALLBACK_STOPS,
    FALLBACK_TEMPLATE,
    chat_template_name,
)
from engine.text.reasoning import CLOSE, OPEN, Reasoning

GGUF_TOKENIZERS = "tokenizers"  # folder under the model cache: one per GGUF file version
# the folders' format, in their names: 2 loads with the generic class where it is the same,
# 3 says where the plain load (no transformers) is the same too, 4 checks its pair cuts too,
# 5 adds the compact tables (compact_bpe) where they encode and decode alike
FOLDER_FORMAT = "t5"
# folders (gguf_tokenizer_dir's keys) whose GGUF's tokenizer a child could not read -> why
_UNREADABLE: dict[str, str] = {}
GENERIC_TOKENIZER = "TokenizersBackend"  # transformers' class for a plain tokenizer.json
# classes that rebuild a SentencePiece (Metaspace) pipeline whatever tokenizer.json says
SENTENCEPIECE_CLASSES = ("GemmaTokenizer", "GemmaTokenizerFast", "LlamaTokenizer",
                         "LlamaTokenizerFast")
# texts on which the Rust backend's encode must equal transformers' before Ferry uses it:
# spaces at either end, several lines, digits, accents and CJK, emoji, markup, a lone space
ENCODE_PROBES = (" Hello, world!  How are you?\n\nFine.\t", "x = [1, 2, 3]  # 4567 89",
                 "Ünïcödé 日本語 🙂 <b>bold</b> ", " ", "")


def _reads_parts_only(hf: Any, template: str) -> bool:
    """Whether `template` drops a string content but renders the same text as a part."""
    probe = "ferry-content-probe"

    def render(content: Any) -> str:
        try:
            return str(hf.apply_chat_template([{"role": "user", "content": content}],
                                              tokenize=False, add_generation_prompt=True,
                                              chat_template=template))
        except Exception:  # a template may raise anything on a shape it does not take
            return ""

    return probe not in render(probe) and probe in render([{"type": "text", "text": probe}])


def gguf_tokenizer_dir(gguf: Path, cache_dir: str | Path) -> Path:
    """The tokenizer (and chat template) of a GGUF file as a folder AutoTokenizer loads fast:
    built once from the file by transformers (seconds) and kept under `cache_dir`, keyed by
    the file's name, size and mtime (a changed file gets a fresh folder). Only tokenizer
    files and the EOS ids go there, never weights. Written to a temp folder and renamed into
    place, so a crash or a parallel start never leaves a half-written one. Built in a child
    process (tokenizer_build): transformers' GGUF reading imports modules serving never uses
    (sympy among them, ~65 MB that would stay); a frozen bundle builds it in process."""
    gguf = Path(gguf)
    st = gguf.stat()
    key = f"{gguf.stem}-{st.st_size}-{st.st_mtime_ns}"
    out = Path(cache_dir) / GGUF_TOKENIZERS / f"{key}-{FOLDER_FORMAT}"
    if (out / "tokenizer_config.json").is_file():
        return out
    # an earlier Ferry's folders of the same file: rebuilt in this format, so they go
    for old in (key, *(f"{key}-t{n}" for n in range(2, int(FOLDER_FORMAT[1:])))):
        shutil.rmtree(out.parent / old, ignore_errors=True)
    if str(out) in _UNREADABLE:  # a child said so already: not seconds again per request
        raise ValueError(_UNREADABLE[str(out)])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if getattr(sys, "frozen", False):
            write_tokenizer_dir(gguf, tmp)
        else:
            try:
                _build_in_child(gguf, tmp)
            except ValueError as exc:  # the file's tokenizer is unreadable: said once
                _UNREADABLE[str(out)] = str(exc)
                raise
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first
            if not (out / "tokenizer_config.json").is_file():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def write_tokenizer_dir(gguf: Path, folder: Path) -> None:
    """The GGUF's tokenizer files and EOS ids written into `folder` (gguf_tokenizer_dir's)."""
    tok = _from_gguf(gguf)
    tok.save_pretrained(str(folder))
    _generic_for_bpe(gguf, folder)
    _generic_where_same(folder)
    mark_plain_where_same(folder)
    if is_plain(folder):
        from tokenizers import Tokenizer as RustTokenizer

        write_compact(folder, RustTokenizer.from_file(str(folder / "tokenizer.json")),
                      SAME_TEXTS)
    if tok.eos_token_id is not None:
        (folder / "generation_config.json").write_text(
            json.dumps({"eos_token_id": int(tok.eos_token_id)}))


def _build_in_child(gguf: Path, folder: Path) -> None:
    root = str(Path(__file__).resolve().parents[3])  # the folder holding `engine`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, "-m", "engine.execution.text.tokenizer_build",
                           str(gguf), str(folder)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise ValueError(f"{gguf}: its tokenizer could not be read: "
                         f"{lines[-1] if lines else f'exit status {done.returncode}'}")


def _from_gguf(gguf: Path) -> Any:
    """The file's tokenizer through transformers; a WordPiece or Unigram vocabulary (a
    `bert` file's), which transformers does not read from a GGUF, rebuilt from it."""
    from transformers import AutoTokenizer

    from engine.execution.loading.gguf_file import gguf_tokenizer_model

    kind = gguf_tokenizer_model(gguf)
    if kind == "bert":
        from engine.execution.text.wordpiece_gguf import wordpiece_tokenizer

        return wordpiece_tokenizer(gguf)
    if kind == "t5":  # an XLM-RoBERTa encoder's SentencePiece Unigram
        from engine.execution.text.unigram_gguf import unigram_tokenizer

        return unigram_tokenizer(gguf)
    with _text_architecture_alias():
        return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


# GGUF architectures transformers does not read, whose tokenizer is another's: a vision
# model's text GGUF (llama.cpp writes Qwen2.5-VL's as "qwen2vl", Mistral 3's as "mistral3"),
# EmbeddingGemma's
TEXT_ARCHITECTURE_ALIASES = {"qwen2vl": "qwen2", "gemma-embedding": "gemma3",
                             "mistral3": "llama"}


@contextlib.contextmanager
def _text_architecture_alias() -> Iterator[None]:
    """While reading a tokenizer, transformers' GGUF reader sees a file of an aliased
    architecture as one of the architecture it knows: `general.architecture` and the
    `<arch>.*` keys renamed (the tokenizer's own fields carry no architecture)."""
    import gguf
    import numpy as np

    module: Any = gguf  # its reader class is swapped for the duration
    base = module.GGUFReader

    class Aliased(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            fields: Any = getattr(self, "fields")  # noqa: B009 (mypy cannot type it)
            field = fields.get("general.architecture")
            arch = bytes(field.parts[field.data[0]]).decode() if field is not None else ""
            alias = TEXT_ARCHITECTURE_ALIASES.get(arch)
            if field is None or alias is None:
                return
            renamed = {}
            for key, f in fields.items():
                if key == "general.architecture":
                    f = module.ReaderField(f.offset, key,
                                           [np.frombuffer(alias.encode(), np.uint8)], [0],
                                           [module.GGUFValueType.STRING])
                elif key.startswith(arch + "."):
                    key = alias + key[len(arch):]
                    f = module.ReaderField(f.offset, key, f.parts, f.data, f.types)
                renamed[key] = f
            self.fields = type(fields)(renamed)

    module.GGUFReader = Aliased
    try:
        yield
    finally:
        module.GGUFReader = base


def _generic_for_bpe(gguf: Path, folder: Path) -> None:
    """transformers names the tokenizer class after the architecture (GemmaTokenizer for
    gemma3), and that class rebuilds a SentencePiece pipeline over tokenizer.json: a
    byte-level BPE vocabulary (tokenizer.ggml.model "gpt2") would then read every space as
    unknown. Such a file's folder loads with the generic class, as llama.cpp reads it."""
    from engine.execution.loading.gguf_file import gguf_tokenizer_model

    config = folder / "tokenizer_config.json"
    if gguf_tokenizer_model(gguf) != "gpt2" or not config.is_file():
        return
    fields = json.loads(config.read_text())
    if fields.get("tokenizer_class") in SENTENCEPIECE_CLASSES:
        fields["tokenizer_class"] = GENERIC_TOKENIZER
        config.write_text(json.dumps(fields, indent=2))


def _generic_where_same(folder: Path) -> None:
    """transformers' classes for SentencePiece and BPE vocabularies (Gemma's, Llama's,
    Qwen2's) build their Rust tokenizer from Python tables of the vocabulary and merges: for
    Gemma 3's 262k tokens a 0.46 GB peak at every start and ~25 MB of allocator holes that
    stay. The folder's tokenizer.json is what that class built, so the generic class reads
    the same tokenizer from it directly; with the added tokens listed in tokenizer_config.json
    it does not parse tokenizer.json in Python too (a 0.56 GB peak without them, 0.37 GB
    with). The folder is written so where the two loads agree on ids, text, special tokens,
    template and padding side (it stays as it was otherwise)."""
    from transformers import AutoTokenizer

    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return
    original = config.read_text()
    named = AutoTokenizer.from_pretrained(str(folder))
    fields = json.loads(original)
    fields["tokenizer_class"] = GENERIC_TOKENIZER
    # a class's own defaults (Gemma's pads on the left), which the generic class lacks
    fields["padding_side"], fields["truncation_side"] = named.padding_side, named.truncation_side
    fields["added_tokens_decoder"] = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "rstrip": t.rstrip,
                 "normalized": t.normalized, "single_word": t.single_word, "special": t.special}
        for i, t in sorted(named.added_tokens_decoder.items())}
    config.write_text(json.dumps(fields, indent=2))
    if not same_tokenizer(named, AutoTokenizer.from_pretrained(str(folder))):
        config.write_text(original)


# what two tokenizers must agree on to be one: texts with spaces, lines and tabs, digits,
# accents, CJK, emoji and markup, each with and without the special tokens; spaces before
# punctuation and contractions (which transformers' clean-up of decoded text removes, where
# a tokenizer asks for it); their specials
SAME_TEXTS = (*ENCODE_PROBES, "  lead and trail  ", "a\u00a0b\u200bc\u3000d",
              "def f(x):\n\treturn x ** 2  # square\n", "1234567890" * 3 + " 3.14159",
              "<|im_start|>user\nhi<|im_end|><start_of_turn>model\n<bos><eos>",
              "so , it is . is it ? yes ! it ' s , I 'm , we 've , they 're , don n't")
SAME_ATTRIBUTES = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
                   "all_special_tokens", "chat_template", "clean_up_tokenization_spaces",
                   "model_max_length", "padding_side", "truncation_side")


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether transformers tokenizers `a` and `b` encode, decode and describe alike."""
    if len(a) != len(b) or a.get_added_vocab() != b.get_added_vocab():
        return False
    if any(getattr(a, name, None) != getattr(b, name, None) for name in SAME_ATTRIBUTES):
        return False
    return same_texts(a, b)


def same_texts(a: Any, b: Any) -> bool:
    """Whether `a` and `b` encode SAME_TEXTS to the same ids, with and without the special
    tokens, and decode those ids to the same text, skipping them or not."""
    for text in SAME_TEXTS:
        for special in (True, False):
            ids = a.encode(text, add_special_tokens=special)
            if b.encode(text, add_special_tokens=special) != ids:
                return False
            for skip in (True, False):
                if a.decode(ids, skip_special_tokens=skip) != \
                        b.decode(ids, skip_special_tokens=skip):
                    return False
    return True


# conversations the plain load must render as transformers does: turns with a system
# message, text parts, reasoning, tool calls and results (with tools), each with and
# without the generation prompt and, where the template takes it, enable_thinking
PLAIN_TOOLS = ({"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}},)
PLAIN_CONVERSATIONS: tuple[tuple[dict[str, Any], ...], ...] = (
    ({"role": "user", "content": "Hello <b>there</b> & \"you\" 🙂"},),
    ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again"}),
    ({"role": "user", "content": [{"type": "text", "text": "In parts"}]},),
    ({"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
     {"role": "user", "content": "And 3+3?"}),
    ({"role": "user", "content": "Weather in Oslo?"},
     {"role": "assistant", "content": None, "tool_calls": [
         {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
     {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
      "content": "{\"temp\": 3}"}),
)


def transformers_pair(hf: Any, first: str, second: str, max_length: int) -> list[int]:
    """transformers' truncation="only_second" cut of the pair; the pair uncut where it
    refuses to cut (plain.cut_pair's contract)."""
    try:
        return list(hf(first, second, truncation="only_second",
                       max_length=max_length)["input_ids"])
    except Exception:  # the Rust backend's "sequence to truncate too short"
        return list(hf(first, second)["input_ids"])


def same_pairs(full: Any, plain: PlainTokenizer) -> bool:
    """Whether the plain load cuts (query, document) pairs as transformers does: the
    document cut to the length, or the pair uncut where transformers refuses to cut."""
    for first, second in zip(SAME_TEXTS, SAME_TEXTS[1:] + SAME_TEXTS[:1], strict=True):
        for length in (8, 24, 512):
            if plain.encode_pair_truncated(first, second, length) != \
                    transformers_pair(full, first, second, length):
                return False
    return True


def _render_or_error(render: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    try:
        return f"ok:{render(*args, **kwargs)}"
    except Exception as exc:  # a template may refuse a shape: both loads must refuse it
        return f"error:{type(exc).__name__}"


def same_plain(full: Any, plain: PlainTokenizer) -> bool:
    """Whether the plain load of a folder serves as transformers' load of it does."""
    if len(full) != len(plain) or full.get_vocab() != plain.get_vocab():
        return False
    if full.special_tokens_map != plain.special_tokens_map or \
            full.all_special_tokens != plain.all_special_tokens or \
            full.chat_template != plain.chat_template or \
            (full.eos_token_id, full.bos_token_id) != (plain.eos_token_id, plain.bos_token_id):
        return False
    if not same_texts(full, plain):
        return False
    for text in SAME_TEXTS:
        ids = full.encode(text)
        if full.convert_ids_to_tokens(ids) != plain.convert_ids_to_tokens(ids):
            return False
        for length in (4, 12, 512):
            if plain.encode_truncated(text, length) != \
                    list(full(text, truncation=True, max_length=length)["input_ids"]):
                return False
    if not same_pairs(full, plain):
        return False
    template = full.chat_template
    if not isinstance(template, str):
        return template is None
    thinking: tuple[dict[str, Any], ...] = ({},)
    if "enable_thinking" in template:
        thinking = ({}, {"enable_thinking": True}, {"enable_thinking": False})
    for messages in PLAIN_CONVERSATIONS:
        for prompt in (True, False):
            for tools in (None, list(PLAIN_TOOLS)):
                for extra in thinking:
                    outcomes = {_render_or_error(
                        t.apply_chat_template, [dict(m) for m in messages], tokenize=False,
                        add_generation_prompt=prompt, tools=tools, chat_template=template,
                        **extra) for t in (full, plain)}
                    if len(outcomes) > 1:
                        return False
    return True


def mark_plain_where_same(folder: Path) -> None:
    """Mark a generic-class folder (PLAIN_MARK) where its plain load serves as transformers'
    does: the server then opens it without importing transformers."""
    from transformers import AutoTokenizer

    config = folder / "tokenizer_config.json"
    if not config.is_file() or \
            json.loads(config.read_text()).get("tokenizer_class") != GENERIC_TOKENIZER:
        return
    full = AutoTokenizer.from_pretrained(str(folder))
    if same_plain(full, PlainTokenizer(folder)):
        (folder / PLAIN_MARK).write_text(json.dumps({"plain": True}))


def read_eos_ids(path: Path) -> frozenset[int]:
    """EOS ids from config.json and generation_config.json (int or list in either), or from
    a GGUF file's metadata."""
    if is_gguf(path):
        from engine.execution.loading.gguf_file import gguf_eos_ids

        return gguf_eos_ids(path)
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        f = Path(path) / name
        if f.is_file():
            value = json.loads(f.read_text()).get("eos_token_id")
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


THINK_WINDOW = 16  # prompt tokens read to see whether the prompt opened a think block

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 4  # prompt ids kept as decode context for the first output token


def backend_encoder(backend: Any) -> Callable[..., list[int]]:
    """One text's ids from a Rust tokenizer, through encode_batch_fast where the tokenizers
    package has it (else encode_batch). Both release Python's lock while they work, where
    encode holds it. The fast one tracks no offsets: for a megabyte prompt the offsets
    tables are tens of megabytes, freed with the lock held when the result is dropped (the
    worker tokenizing it runs below the engine's priority, so on a busy machine every other
    thread waited 100-200 ms for the lock), and it tokenizes twice as fast."""
    batch = getattr(backend, "encode_batch_fast", None) or backend.encode_batch

    def encode(text: str, add_special_tokens: bool = True) -> list[int]:
        return list(batch([text], add_special_tokens=add_special_tokens)[0].ids)
    return encode


class Tokenizer:
    """From a model folder, or a GGUF file (with `cache_dir`: through gguf_tokenizer_dir;
    without: rebuilt from the file, which takes seconds)."""

    def __init__(self, path: str | Path, cache_dir: str | Path | None = None) -> None:
        from engine.execution.residency import Measured

        self.path = Path(path)
        if is_gguf(self.path) and cache_dir is not None:
            self.path = gguf_tokenizer_dir(self.path, cache_dir)
        plain = is_plain(self.path)
        if not plain:
            from transformers import AutoTokenizer  # noqa: F401 (imported before measuring)
        with Measured() as grew:
            self._open(plain)
        self.resident = grew.bytes  # what it holds (Rust tokenizer, wrapper, template)

    def _open(self, plain: bool) -> None:
        # hf: transformers' tokenizer, or the plain load that serves as it does (PLAIN_MARK)
        self.hf: Any
        if plain:
            self.hf = PlainTokenizer(self.path)
        elif is_gguf(self.path):
            self.hf = _from_gguf(self.path)
        else:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(str(self.path))
        drop_construction_tables(self.hf)
        eos = set(read_eos_ids(self.path))
        if self.hf.eos_token_id is not None:
            eos.add(int(self.hf.eos_token_id))
        self.eos_ids: frozenset[int] = frozenset(eos)
        self._think_tokens = self._has_token(OPEN) and self._has_token(CLOSE)
        self._parts: bool | None = None  # content_as_parts, probed on first use
        # transformers' decode is the Rust backend's plus a space clean-up and argument
        # checks; a streamed token is decoded twice, so the backend's own where the
        # clean-up is off (the same text)
        backend = getattr(self.hf, "backend_tokenizer", None)
        self._backend_decode: Callable[..., str] | None = backend.decode if (
            backend is not None and not getattr(self.hf, "clean_up_tokenization_spaces", True)) \
            else None
        # transformers' encode of one text is the Rust backend's ids behind ~0.4 ms of
        # argument handling, which was a tenth of a short embedding request's time: the
        # backend's own where it gives the same ids on probe texts. Its encode_batch, as
        # transformers calls it: the backend's plain encode holds Python's lock (a megabyte
        # prompt held every other request 0.4 s), encode_batch lets go of it. transformers
        # turns the backend's padding and truncation (a tokenizer.json may set them) off for
        # such a call, and on for a call that asks: encode() checks they are off.
        self._backend: Any = None
        self._fast_encode: Callable[..., list[int]] | None = None
        if backend is not None:
            backend.no_truncation()
            backend.no_padding()
            fast = backend_encoder(backend)
            if self._same_ids(fast):
                self._backend, self._fast_encode = backend, fast

    def _has_token(self, text: str) -> bool:
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is not None:  # not the whole vocabulary as a dict (262k entries)
            return backend.token_to_id(text) is not None
        return text in self.hf.get_vocab()

    def _same_ids(self, encode: Callable[..., list[int]]) -> bool:
        try:
            return all(encode(text, add_special_tokens=special)
                       == list(self.hf.encode(text, add_special_tokens=special))
                       for text in ENCODE_PROBES for special in (True, False))
        except (TypeError, ValueError, AttributeError):  # keep transformers' encode
            return False

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        """The model brings its own (else chats use FALLBACK_TEMPLATE)."""
        return bool(getattr(self.hf, "chat_template", None))

    @property
    def chat_template(self) -> str:
        return self.hf.chat_template if self.has_chat_template else FALLBACK_TEMPLATE

    @property
    def chat_template_name(self) -> str:
        return chat_template_name(self.has_chat_template, self.thinks)

    @property
    def chat_stops(self) -> tuple[str, ...]:
        """Stop strings every chat needs (the fallback's next "User:" turn)."""
        return () if self.has_chat_template else FALLBACK_STOPS

    @property
    def thinks(self) -> bool:
        """A thinking model: its vocabulary or its template has the think tags. Only then
        are chat replies split into reasoning and answer (no cost for the others)."""
        template = self.chat_template if self.has_chat_template else ""
        return self._think_tokens or (OPEN in template and CLOSE in template)

    @property
    def takes_enable_thinking(self) -> bool:
        return self.has_chat_template and "enable_thinking" in self.chat_template

    @property
    def content_as_parts(self) -> bool:
        """The template reads a message's content only as a list of parts (SmolVLM's loops
        over `message['content']`): a string content is then given to it as one text part,
        which it would otherwise render as nothing. Probed once, by rendering."""
        if self._parts is None:
            self._parts = self.has_chat_template and _reads_parts_only(self.hf,
                                                                       self.chat_template)
        return self._parts

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        b, fast = self._backend, self._fast_encode
        if fast is not None and b.truncation is None and b.padding is None:
            return fast(text, add_special_tokens)
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def encode_truncated(self, text: str, max_length: int) -> list[int]:
        """`text`'s ids with the special tokens, at most `max_length` of them (the text's
        end cut, as transformers' truncation=True cuts it)."""
        if isinstance(self.hf, PlainTokenizer):
            return self.hf.encode_truncated(text, max_length)
        return list(self.hf(text, truncation=True, max_length=max_length)["input_ids"])

    def encode_pair_truncated(self, first: str, second: str, max_length: int) -> list[int]:
        """A pair's ids with the special tokens, the second text cut to fit `max_length` (as
        transformers' truncation="only_second"); longer than `max_length` where the first
        text alone leaves no room (plain.cut_pair)."""
        if isinstance(self.hf, PlainTokenizer):
            return self.hf.encode_pair_truncated(first, second, max_length)
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is not None and backend.truncation is None and backend.padding is None:
            return cut_pair(backend, first, second, max_length)
        # transformers sets the backend's truncation for its call (or it has no backend)
        return transformers_pair(self.hf, first, second, max_length)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if self._backend_decode is not None:
            return self._backend_decode(list(ids), skip_special_tokens=skip_special_tokens)
        text = self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)
        if not isinstance(text, str):  # one sequence of ids decodes to one str
            raise TypeError(f"tokenizer decode gave {type(text).__name__}, not str")
        return text

    def apply_chat_template(self, messages: Sequence[dict[str, Any]],
                            add_generation_prompt: bool = True,
                            tools: Sequence[dict[str, Any]] | None = None,
                            enable_thinking: bool | None = None,
                            image_text: tuple[str, str] | None = None,
                            image_ids: tuple[str, int] | None = None) -> list[int]:
        """[{role, content}, ...] -> prompt ids (the template supplies BOS and markers);
        `tools` (OpenAI's function specs) go to templates that render them; `enable_thinking`
        reaches the templates that take it (None: the template's default); `image_text`
        (placeholder, text): each placeholder the template wrote becomes the text, as a
        vision family's processor rewrites the rendered prompt (Gemma 3's); `image_ids`
        (placeholder, id): the text between placeholders is encoded piece by piece, each
        placeholder becoming the id (a vocabulary without the placeholder's token)."""
        text = self.render_chat(messages, add_generation_prompt, tools, enable_thinking)
        if image_text is not None:
            text = text.replace(*image_text)
        if image_ids is None:
            return self.encode(text, add_special_tokens=False)
        placeholder, image_id = image_ids
        ids: list[int] = []
        for i, piece in enumerate(text.split(placeholder)):
            if i:
                ids.append(image_id)
            if piece:
                ids += self.encode(piece, add_special_tokens=False)
        return ids

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: Sequence[dict[str, Any]] | None = None,
                    enable_thinking: bool | None = None) -> str:
        """The chat template's text for `messages` (what apply_chat_template encodes): the
        model's own template, or the plain fallback for a model without one."""
        extra: dict[str, Any] = {"enable_thinking": enable_thinking} \
            if enable_thinking is not None and self.takes_enable_thinking else {}
        if self.content_as_parts:
            messages = [{**m, "content": [{"type": "text", "text": m["content"]}]}
                        if isinstance(m.get("content"), str) else m for m in messages]
        text = self.hf.apply_chat_template(list(messages), tokenize=False,
                                           add_generation_prompt=add_generation_prompt,
                                           tools=list(tools) if tools else None,
                                           chat_template=self.chat_template, **extra)
        if not isinstance(text, str):  # tokenize=False renders one conversation to one str
            raise TypeError(f"chat template gave {type(text).__name__}, not str")
        return text

    def reasoning_for(self, prompt_ids: Sequence[int]) -> Reasoning | None:
        """How a chat reply to `prompt_ids` carries reasoning (None: not a thinking model).
        The prompt opened the block when its last think tag is an opening one."""
        if not self.thinks:
            return None
        tail = self.decode(prompt_ids[-THINK_WINDOW:], skip_special_tokens=False)
        return Reasoning(started=tail.rfind(OPEN) > tail.rfind(CLOSE))

    def detokenizer(self, prompt_ids: Sequence[int] = (),
                    skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, prompt_ids, skip_special_tokens)


class IncrementalDetokenizer:
    """push(token) -> new text (possibly ""); flush() -> whatever was held back at the end."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (),
                 skip_special_tokens: bool = True) -> None:
        self._decode = tokenizer.decode
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix = 0  # first id of the decode window
        self._read = len(self._ids)  # ids before this were already emitted

    def _delta(self, final: bool) -> str:
        if self._read == len(self._ids):
            return ""  # nothing new (a flush after the last token's text, an embedding)
        before = self._decode(self._ids[self._prefix:self._read], self._skip)
        now = self._decode(self._ids[self._prefix:], self._skip)
        if not final and now.endswith(REPLACEMENT):
            return ""  # mid-character: wait for the next token
        if len(now) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return now[len(before):]

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)
