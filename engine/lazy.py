"""Names a package exports without importing their modules until first use (PEP 562): the
engine's API and the host utilities stay torch-free to import."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any


def lazy_getattr(package: str, table: Mapping[str, str],
                 namespace: MutableMapping[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: `table` maps a name to "module:attribute",
    imported on first access and then kept in `namespace` (the module's globals)."""
    def getattr_(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = table[name].split(":")
        value = getattr(importlib.import_module(module), attr)
        namespace[name] = value
        return value
    return getattr_
