"""Switches that make this CPU run the code a CUDA machine runs (for tests).

`fake_flashinfer`: `import flashinfer` finds the stand-in in tests/fakes/flashinfer, and the
FlashInfer backend accepts CPU pools. `kernels_off`: Ferry's C kernels are treated as absent,
so attention, the MoE, sampling and the layers take their torch paths: the ones CUDA takes.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import pytest

FAKES = Path(__file__).parent
BACKEND = "engine.execution.attention.flashinfer_backend"


@contextmanager
def fake_flashinfer(mp: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    from engine.execution.attention import choice
    from engine.execution.attention import flashinfer_plan as fp

    saved = {name: sys.modules.pop(name) for name in ("flashinfer", BACKEND)
             if name in sys.modules}
    mp.syspath_prepend(str(FAKES))
    mp.setattr(fp, "DEVICES", ("cuda", "cpu"))
    mp.setattr(choice, "_tested", {})
    import flashinfer

    assert getattr(flashinfer, "FAKE", False), flashinfer.__file__
    flashinfer.calls.clear()
    try:
        yield flashinfer
    finally:
        for name in ("flashinfer", BACKEND):
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def kernels_off(mp: pytest.MonkeyPatch) -> None:
    from engine.kernels import native, ops

    mp.setattr(native, "library", lambda: None)
    mp.setattr(ops, "usable", lambda t: False)
    mp.setattr(ops, "usable_pool", lambda t: False)
