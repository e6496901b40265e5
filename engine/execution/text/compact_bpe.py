"""A BPE tokenizer folder served from compact tables by Ferry's C (csrc/bpe.c).

The Rust tokenizer keeps each token as a string in a map and in its reverse, and each merge
in a third map: about 113 MB for Gemma 3's 262k tokens and 515k merges, 18 MB for the
default model's 49k, held for the server's life. The same tables as byte strings in one
block, merges and vocabulary as open-addressed arrays, take about a fifth of that. They are
written next to `tokenizer.json` when the folder is built (`write_compact`), only for the
two shapes served here:

- byte-level BPE: the `ByteLevel` decoder, and GPT-2's pre-tokenizer (SmolLM2's: the
  `ByteLevel` pre-tokenizer with its regex, no prefix space) or Llama 3's or Qwen2's (a
  regex `Split`, then `ByteLevel` without its own), no normalizer or NFC;
- SentencePiece-style BPE (Gemma's): spaces replaced by U+2581, the text one word, byte
  fallback, the `Replace`, `ByteFallback`, `Fuse` decoders;

with added tokens matched as written (no stripping, not normalized) and a post-processor that
adds fixed special tokens around one text. They are kept only where they encode and decode
`same_as_rust`'s texts (the probe texts, every added token, random text in many scripts, a
long text, random id sequences) exactly as the Rust tokenizer does. Anything else is served
by the Rust tokenizer, and so is what a compact table does not do (a pair's post-processing):
`rust()` opens it on first need.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import operator
import random
import re
import threading
import unicodedata
import weakref
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES = "ferry-bpe.json"  # the layout and settings; the arrays in TABLES_DATA
TABLES_DATA = "ferry-bpe.tables"  # (not .bin: a name weights have)
BYTE_LEVEL, SENTENCEPIECE = 0, 1
SPECIAL, RAW_BYTE = 1, 2  # csrc/bpe.c's token flags
SPACE_MARK = "\u2581"
SECTIONS = ("blob", "offsets", "pieces", "piece_offsets", "flags", "merges", "ranges")
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map of byte-level vocabularies."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs, extra = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _letter_number_ranges() -> list[int]:
    """(first, last, class) triples of code points, class 1 a letter (L*) and 2 a number
    (N*), as GPT-2's \\p{L} and \\p{N} read them."""
    out: list[int] = []
    for cp in range(0x110000):
        cat = unicodedata.category(chr(cp))[0]
        cls = 1 if cat == "L" else 2 if cat == "N" else 0
        if cls and out and out[-2] == cp - 1 and out[-1] == cls:
            out[-2] = cp
        elif cls:
            out += [cp, cp, cls]
    return out


# the regex pre-tokenizers served (a Split before a ByteLevel without its own regex), by the
# longest run of digits they keep together; transformers writes them so for GGUF files
SPLITS = {
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": 3,  # Llama 3's
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": 1,  # Qwen2's
}


def _regex_split(pre: dict[str, Any] | None) -> int:
    """The digits of a served regex pre-tokenizer (SPLITS), else 0."""
    if pre is None or pre.get("type") != "Sequence":
        return 0
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return 0
    split, byte_level = steps
    if split.get("type") != "Split" or split.get("invert") or \
            str(split.get("behavior")).lower() != "isolated" or \
            byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space") or \
            byte_level.get("use_regex"):
        return 0
    return SPLITS.get((split.get("pattern") or {}).get("Regex", ""), 0)


@dataclass(frozen=True, slots=True)
class Shape:
    """What of a tokenizer.json the tables hold beside the arrays."""
    mode: int
    digits: int  # byte-level: 0 GPT-2's pre-tokenizer, else a SPLITS one's
    nfc: bool  # the text is NFC-normalized first
    ignore_merges: bool
    unk_id: int
    fuse_unk: bool
    byte_ids: list[int]
    added: list[int]  # matched in the text, in this order of preference
    prefix: list[int]  # the post-processor's special tokens before one text
    suffix: list[int]


def _shape(spec: dict[str, Any]) -> Shape | None:
    """The tables' settings where tokenizer.json is a shape they serve, else None."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") or \
            model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    normalizer, pre, decoder = spec.get("normalizer"), spec.get("pre_tokenizer"), \
        spec.get("decoder")
    vocab: dict[str, int] = model.get("vocab") or {}
    gpt2 = pre is not None and pre.get("type") == "ByteLevel" and pre.get("use_regex") and \
        not pre.get("add_prefix_space")
    digits = _regex_split(pre)
    nfc = normalizer == {"type": "NFC"}
    if (normalizer is None or nfc) and (gpt2 or digits) and \
            (decoder or {}).get("type") == "ByteLevel" and not model.get("byte_fallback"):
        mode = BYTE_LEVEL
        table = bytes_to_unicode()
        byte_ids = [vocab.get(table[b], -1) for b in range(256)]
    elif normalizer == {"type": "Replace", "pattern": {"String": " "}, "content": SPACE_MARK} \
            and (pre is None or (pre.get("type") == "Split" and
                                 pre.get("pattern") == {"String": " "} and not pre.get("invert"))) \
            and decoder == {"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": SPACE_MARK}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]}:
        mode = SENTENCEPIECE  # (the Split on " " finds none: the spaces are U+2581 by then)
        byte_ids = [vocab.get(f"<0x{b:02X}>", -1) for b in range(256)] \
            if model.get("byte_fallback") else [-1] * 256
    else:
        return None
    if model.get("ignore_merges") and mode != BYTE_LEVEL:
        return None
    unk = model.get("unk_token")
    unk_id = vocab.get(unk, -1) if isinstance(unk, str) else -1
    added = spec.get("added_tokens") or []
    for token in added:
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word") or \
                (token.get("normalized") and normalizer is not None) or \
                vocab.get(token.get("content")) != token.get("id") or not token.get("content"):
            return None
    prefix: list[int] = []
    suffix: list[int] = []
    post = spec.get("post_processor")
    steps = post.get("processors") or [] if post and post.get("type") == "Sequence" else [post]
    steps = [p for p in steps if p is not None and p.get("type") != "ByteLevel"]
    if len(steps) > 1:
        return None
    post = steps[0] if steps else None
    if post is not None and post.get("type") == "TemplateProcessing":
        specials = post.get("special_tokens") or {}
        seen_text = False
        for item in post.get("single") or []:
            if "Sequence" in item:
                seen_text = True
                continue
            ids = (specials.get(item.get("SpecialToken", {}).get("id")) or {}).get("ids")
            if not isinstance(ids, list):
                return None
            (suffix if seen_text else prefix).extend(int(i) for i in ids)
    elif post is not None:
        return None
    # the Rust tokenizer's added vocabulary prefers the longest match, then the first
    order = sorted(added, key=lambda t: -len(t["content"].encode()))
    return Shape(mode, digits, nfc, bool(model.get("ignore_merges")), unk_id,
                 bool(model.get("fuse_unk")), byte_ids,
                 [int(t["id"]) for t in order], prefix, suffix)


def _merge_pair(merge: Any) -> tuple[str, str]:
    if isinstance(merge, str):
        left, right = merge.split(" ", 1)
        return left, right
    return str(merge[0]), str(merge[1])


def write_compact(folder: Path, rust: Any, probes: Sequence[str]) -> bool:
    """The compact tables of `folder`'s tokenizer.json written beside it, where they serve
    its shape and agree with `rust` (the Rust tokenizer of that file) on same_as_rust's
    texts; else nothing written. Whether they were."""
    from engine.kernels import native

    if native.library() is None:
        return False
    spec = json.loads((folder / "tokenizer.json").read_text())
    shape = _shape(spec)
    if shape is None:
        return False
    vocab: dict[str, int] = spec["model"]["vocab"]
    n = max(vocab.values(), default=-1) + 1
    if sorted(vocab.values()) != list(range(n)):
        return False
    texts = [""] * n
    for text, i in vocab.items():
        texts[i] = text
    special = {int(t["id"]) for t in spec.get("added_tokens") or [] if t.get("special")}
    byte_map = {c: b for b, c in bytes_to_unicode().items()}
    blob, pieces = bytearray(), bytearray()
    offsets, piece_offsets, flags = array("I", [0]), array("I", [0]), bytearray(n)
    for i, text in enumerate(texts):
        blob += text.encode()
        offsets.append(len(blob))
        if shape.mode == BYTE_LEVEL:
            piece = bytes(byte_map[c] for c in text) if all(c in byte_map for c in text) \
                else text.encode()
        elif _BYTE_TOKEN.fullmatch(text):
            piece, flags[i] = bytes([int(text[3:5], 16)]), RAW_BYTE
        else:
            piece = text.replace(SPACE_MARK, " ").encode()
        pieces += piece
        piece_offsets.append(len(pieces))
        if i in special:
            flags[i] |= SPECIAL
    merges = array("i")
    try:
        for merge in spec["model"].get("merges") or []:
            left, right = _merge_pair(merge)
            merges.extend((vocab[left], vocab[right], vocab[left + right]))
    except (KeyError, ValueError):  # a merge whose token is not in the vocabulary
        return False
    ranges = array("I", _letter_number_ranges() if shape.mode == BYTE_LEVEL else [])
    data = {"blob": bytes(blob), "offsets": offsets.tobytes(), "pieces": bytes(pieces),
            "piece_offsets": piece_offsets.tobytes(), "flags": bytes(flags),
            "merges": merges.tobytes(), "ranges": ranges.tobytes()}
    layout, at = {}, 0
    for name in SECTIONS:
        layout[name] = [at, len(data[name])]
        at += len(data[name])
    (folder / TABLES_DATA).write_bytes(b"".join(data[name] for name in SECTIONS))
    (folder / TABLES).write_text(json.dumps({
        "format": 1, "mode": shape.mode, "digits": shape.digits, "nfc": shape.nfc,
        "ignore_merges": shape.ignore_merges, "tokens": n, "unk_id": shape.unk_id,
        "fuse_unk": shape.fuse_unk, "byte_ids": shape.byte_ids, "added": shape.added,
        "prefix": shape.prefix, "suffix": shape.suffix, "layout": layout}))
    compact = CompactBPE.open(folder)
    if compact is not None and same_as_rust(rust, compact, spec, probes):
        return True
    for name in (TABLES, TABLES_DATA):
        (folder / name).unlink(missing_ok=True)
    return False


def _whole(settings: dict[str, Any], data: bytes) -> bool:
    """Whether the tables are as their settings say: sections filling the file one after
    another, offsets rising within their blocks, ids within the vocabulary. The C trusts
    what it is given; a damaged file is left to the Rust tokenizer."""
    try:
        n, layout = int(settings["tokens"]), settings["layout"]
        part: dict[str, bytes] = {}
        at = 0
        for name in SECTIONS:
            start, length = int(layout[name][0]), int(layout[name][1])
            if start != at or length < 0 or start + length > len(data):
                return False
            part[name], at = data[start:start + length], start + length
        if at != len(data) or len(part["flags"]) != n or len(part["merges"]) % 12 or \
                len(part["ranges"]) % 12:
            return False
        for blob, name in (("blob", "offsets"), ("pieces", "piece_offsets")):
            offsets = array("I", part[name])
            if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(part[blob]) or \
                    not all(map(operator.le, offsets, itertools.islice(offsets, 1, None))):
                return False
        merges = array("i", part["merges"])
        ids = [int(i) for i in [*settings["added"], *settings["prefix"], *settings["suffix"]]]
        byte_ids = [int(i) for i in settings["byte_ids"]]
        return len(byte_ids) == 256 and (not merges or 0 <= min(merges) <= max(merges) < n) \
            and all(0 <= i < n for i in ids) and \
            all(-1 <= i < n for i in [*byte_ids, int(settings["unk_id"])])
    except (KeyError, TypeError, ValueError):
        return False


class Encoded:
    """An encoding's ids (the part of the Rust tokenizer's Encoding serving reads)."""
    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class CompactBPE:
    """The Rust tokenizer's interface as PlainTokenizer and Tokenizer call it, over the
    compact tables; the calls it does not serve go to `rust()`."""

    truncation = None  # never set: encoding is never cut or padded here
    padding = None

    def __init__(self, folder: Path, lib: ctypes.CDLL, settings: dict[str, Any],
                 data: bytes) -> None:
        self.folder = folder
        self.byte_level = settings["mode"] == BYTE_LEVEL
        self._lib = lib
        self._n = int(settings["tokens"])
        self._prefix: list[int] = list(settings["prefix"])
        self._suffix: list[int] = list(settings["suffix"])
        view = memoryview(data)
        part = {name: view[a:a + n] for name, (a, n) in settings["layout"].items()}
        added = array("i", settings["added"])
        byte_ids = array("i", settings["byte_ids"])

        self._nfc = bool(settings["nfc"])
        handle = lib.ferry_bpe_new(
            settings["mode"], int(settings["digits"] > 0), int(settings["digits"]),
            int(settings["ignore_merges"]), self._n, bytes(part["blob"]), bytes(part["offsets"]),
            bytes(part["pieces"]), bytes(part["piece_offsets"]), bytes(part["flags"]),
            len(part["merges"]) // 12, bytes(part["merges"]), byte_ids.tobytes(),
            settings["unk_id"], int(settings["fuse_unk"]), len(added), added.tobytes(),
            len(part["ranges"]) // 12, bytes(part["ranges"]))
        if not handle:
            raise MemoryError("no memory for the tokenizer's tables")
        self._handle = handle
        weakref.finalize(self, lib.ferry_bpe_free, handle)
        self._rust: Any = None
        self._rust_lock = threading.Lock()

    @classmethod
    def open(cls, folder: Path) -> CompactBPE | None:
        """The folder's compact tables, or None where it has none or no C library loads."""
        from engine.kernels import native

        try:
            settings = json.loads((folder / TABLES).read_text())
            data = (folder / TABLES_DATA).read_bytes()
        except (OSError, ValueError):
            return None
        lib = native.library()
        if lib is None or settings.get("format") != 1 or not _whole(settings, data):
            return None
        return cls(folder, lib, settings, data)

    # -- encoding and decoding -------------------------------------------------------------
    def _ids(self, text: str) -> list[int]:
        if self._nfc and not unicodedata.is_normalized("NFC", text):
            # the tables take text NFC already is (the usual case, checked fast); the Rust
            # tokenizer normalizes the rest
            return list(self.rust().encode(text, add_special_tokens=False).ids)
        raw = text.encode()
        if not raw:
            return []
        out = (ctypes.c_int32 * len(raw))()
        n = self._lib.ferry_bpe_encode(self._handle, raw, len(raw), out)
        if n < 0:
            raise MemoryError("no memory to tokenize the text")
        return out[:n]

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoded:
        ids = self._ids(text)
        return Encoded([*self._prefix, *ids, *self._suffix] if add_special_tokens else ids)

    def encode_batch(self, texts: Iterable[str], add_special_tokens: bool = True) -> list[Encoded]:
        return [self.encode(text, add_special_tokens) for text in texts]

    encode_batch_fast = encode_batch  # the C lets go of Python's lock while it works

    def num_special_tokens_to_add(self, is_pair: bool) -> int:
        if is_pair:
            return int(self.rust().num_special_tokens_to_add(True))
        return len(self._prefix) + len(self._suffix)

    def with_special_tokens(self, ids: list[int]) -> list[int]:
        """One text's ids with the post-processor's special tokens around them."""
        return [*self._prefix, *ids, *self._suffix]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        given = array("i", ids)
        raw = given.tobytes()
        room = max(64, 8 * len(given))
        while True:
            out = ctypes.create_string_buffer(room)
            n = self._lib.ferry_bpe_decode(self._handle, raw, len(given),
                                           int(skip_special_tokens), out, room)
            if n <= room:
                return out.raw[:n].decode("utf-8", errors="replace")
            room = n

    # -- the vocabulary --------------------------------------------------------------------
    def token_to_id(self, token: str) -> int | None:
        raw = token.encode()
        found = self._lib.ferry_bpe_token_id(self._handle, raw, len(raw))
        return None if found < 0 else int(found)

    def id_to_token(self, token_id: int) -> str | None:
        room = 64
        while True:
            out = ctypes.create_string_buffer(room)
            n = self._lib.ferry_bpe_token(self._handle, int(token_id), out, room)
            if n < 0:
                return None
            if n <= room:
                return out.raw[:n].decode("utf-8", errors="replace")
            room = n

    def get_vocab_size(self, with_added_tokens: bool = True) -> int:
        return self._n

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        return {str(self.id_to_token(i)): i for i in range(self._n)}

    # -- what the tables do not hold -------------------------------------------------------
    def no_truncation(self) -> None:
        pass

    def no_padding(self) -> None:
        pass

    def to_str(self) -> str:
        return (self.folder / "tokenizer.json").read_text()

    def __copy__(self) -> CompactBPE:
        return self  # nothing in it changes

    def rust(self) -> Any:
        """The Rust tokenizer of the same file, opened once, on first need."""
        with self._rust_lock:
            if self._rust is None:
                from tokenizers import Tokenizer as RustTokenizer

                self._rust = RustTokenizer.from_file(str(self.folder / "tokenizer.json"))
                self._rust.no_truncation()
                self._rust.no_padding()
            return self._rust

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.rust(), name)


# what the tables must encode and decode as the Rust tokenizer does, beside the probe texts
# and the added tokens: random text from these code point ranges (ASCII weighted up)
SCRIPTS = ((0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E), (0x00, 0x1F), (0x80, 0x24F),
           (0x300, 0x36F), (0x370, 0x52F), (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F),
           (0x1100, 0x11FF),
           (0x2000, 0x206F), (0x2580, 0x25FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF),
           (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xFE00, 0xFFFD), (0x1F300, 0x1FAFF),
           (0x10000, 0x1007F), (0x20000, 0x2A6DF), (0xE0000, 0xE007F))
SPACES = (" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "\u00a0", "\u3000", "\u2009",
          "\x0b", "\x1c", "\u0085", "\u200b", "'s", "'re", "'ll", "'S", "'d ", "' ")
CORPUS = 1500  # random texts
RANDOM_IDS = 1500  # random id sequences to decode


def _random_text(rng: random.Random, added: Sequence[str]) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.15:
            parts.append(rng.choice(SPACES))
        elif roll < 0.2 and added:
            parts.append(rng.choice(added))
        elif roll < 0.3:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
        else:
            lo, hi = rng.choice(SCRIPTS)
            chars = (chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 10)))
            parts.append("".join(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF))
    return "".join(parts)


def same_as_rust(rust: Any, compact: CompactBPE, spec: dict[str, Any],
                 probes: Sequence[str]) -> bool:
    """Whether the tables encode, decode and name tokens exactly as the Rust tokenizer
    `rust` of the same file does, on the probe texts, each added token, random text, a long
    text and random id sequences."""
    rust.no_truncation()
    rust.no_padding()
    n = compact.get_vocab_size()
    if rust.get_vocab_size(with_added_tokens=True) != n:
        return False
    if any(rust.id_to_token(i) != compact.id_to_token(i) for i in range(n)):
        return False
    added = [str(t["content"]) for t in spec.get("added_tokens") or []]
    rng = random.Random(20261206)
    texts = [*probes, *added, *(_random_text(rng, added) for _ in range(CORPUS))]
    texts.append("".join(texts[len(probes):]) * 2)  # one long text: many merges queued
    for text in texts:
        for special in (True, False):
            ids = compact.encode(text, special).ids
            if list(rust.encode(text, add_special_tokens=special).ids) != ids:
                return False
            for skip in (True, False):
                if rust.decode(ids, skip_special_tokens=skip) != compact.decode(ids, skip):
                    return False
    singles = [[i] for i in range(n)]
    sequences = [[rng.randrange(n) for _ in range(rng.randint(1, 24))] for _ in range(RANDOM_IDS)]
    for ids in singles + sequences:
        for skip in (True, False):
            if rust.decode(ids, skip_special_tokens=skip) != compact.decode(ids, skip):
                return False
    return True
