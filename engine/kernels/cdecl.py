"""The C declarations of csrc/*.h read into ctypes: one place declares each kernel signature.

A header's non-static `ferry_*` prototypes become (restype, argtypes) for native.py to bind,
and its `typedef struct { ... } ferry_*;` become ctypes Structures with the same fields
(other names are internal to the C files and skipped), so C and
Python cannot disagree on an argument list or a struct layout. Only the few C types the
kernels use are understood (pointers of any kind, fixed-width integers, int, float, double,
size_t, structs declared earlier); anything else is an error naming the header, never a guess.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CType = Any  # a ctypes type (c_int, c_void_p, a Structure subclass, an array of them)

SCALARS: dict[str, CType] = {
    "int": ctypes.c_int, "int8_t": ctypes.c_int8, "uint8_t": ctypes.c_uint8,
    "int16_t": ctypes.c_int16, "uint16_t": ctypes.c_uint16, "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t, "float": ctypes.c_float, "double": ctypes.c_double,
}
_QUALIFIERS = {"const", "volatile", "struct", "unsigned", "signed", "restrict"}
_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
_STRUCT = re.compile(r"typedef\s+struct\s*\w*\s*\{(?P<body>[^{}]*)\}\s*(?P<name>\w+)\s*;")
_PROTO = re.compile(r"(?:^|(?<=[;}]))\s*(?P<ret>[\w\s\*]*?)\b(?P<name>ferry_\w+)\s*"
                    r"\((?P<args>[^()]*)\)\s*;")


@dataclass(frozen=True, slots=True)
class Function:
    name: str
    restype: CType | None  # None: void
    argtypes: list[CType]


@dataclass(frozen=True, slots=True)
class Declarations:
    functions: dict[str, Function]
    structs: dict[str, type[ctypes.Structure]]


def _strip(text: str) -> str:
    text = _COMMENTS.sub(" ", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _outside_braces(text: str) -> str:
    """`text` with every {...} block (function bodies, enums, structs) replaced by ';', so
    calls inside bodies never read as prototypes."""
    out, depth = [], 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                out.append(";")
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _ctype(decl: str, structs: dict[str, type[ctypes.Structure]], where: str,
           named: bool = True) -> tuple[str, CType | None]:
    """One declarator ("const float *x", "int64_t rows") -> (name, ctypes type); void -> None."""
    pointer = "*" in decl
    words = [w for w in re.findall(r"\w+", decl) if w not in _QUALIFIERS]
    name = words.pop() if named and len(words) > 1 else ""
    base = " ".join(words)
    if pointer:
        return name, ctypes.c_void_p  # every pointer travels as an address
    if base == "void":
        return name, None
    if base in SCALARS:
        return name, SCALARS[base]
    if base in structs:
        return name, structs[base]
    raise ValueError(f"{where}: C type {base!r} in {decl.strip()!r} is not one cdecl knows")


def _struct(name: str, body: str, structs: dict[str, type[ctypes.Structure]],
            where: str) -> type[ctypes.Structure]:
    fields: list[tuple[str, CType]] = []
    for statement in filter(str.strip, body.split(";")):
        first, *more = statement.split(",")
        base = re.sub(r"[\*\s]*\w+\s*(\[\s*\d+\s*\])?\s*$", "", first)  # the shared type words
        for declarator in [first, *(base + " " + d for d in more)]:
            size = re.search(r"\[\s*(\d+)\s*\]", declarator)
            field, ctype = _ctype(re.sub(r"\[.*\]", "", declarator), structs, where)
            if ctype is None or not field:
                raise ValueError(f"{where}: bad field {declarator.strip()!r} in {name}")
            fields.append((field, ctype * int(size.group(1)) if size else ctype))
    return type(name, (ctypes.Structure,), {"_fields_": fields})


def _include_order(headers: list[Path]) -> list[Path]:
    """`headers` with each one after the headers it #includes (their structs come first)."""
    by_name = {p.name: p for p in headers}
    done: list[Path] = []

    def visit(path: Path, seen: tuple[str, ...]) -> None:
        if path in done or path.name in seen:
            return
        for inc in re.findall(r'#\s*include\s*"([^"]+)"', path.read_text()):
            if inc in by_name:
                visit(by_name[inc], (*seen, path.name))
        done.append(path)

    for path in headers:
        visit(path, ())
    return done


def parse(headers: list[Path]) -> Declarations:
    """Every struct and prototype of `headers` (read after the headers they include)."""
    structs: dict[str, type[ctypes.Structure]] = {}
    functions: dict[str, Function] = {}
    for path in _include_order(headers):
        text = _strip(path.read_text())
        for m in _STRUCT.finditer(text):
            if not m["name"].startswith("ferry_"):
                continue  # internal to the C files
            structs[m["name"]] = _struct(m["name"], m["body"], structs, path.name)
        for m in _PROTO.finditer(_outside_braces(text)):
            if "static" in m["ret"].split() or not m["ret"].strip():
                continue
            _, restype = _ctype(m["ret"], structs, path.name, named=False)
            args = [a for a in m["args"].split(",") if a.strip() and a.strip() != "void"]
            argtypes: list[CType] = []
            for a in args:
                _, t = _ctype(a, structs, path.name)
                if t is None:
                    raise ValueError(f"{path.name}: void argument in {m['name']}")
                argtypes.append(t)
            if m["name"] in functions:
                raise ValueError(f"{path.name}: {m['name']} is declared twice")
            functions[m["name"]] = Function(m["name"], restype, argtypes)
    return Declarations(functions, structs)
