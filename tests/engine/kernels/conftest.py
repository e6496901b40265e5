"""The kernel tests use the model tests' fixtures (tiny models, harnesses, the native-kernels
skip): load that conftest once under its own name and re-export them, so there is one copy."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "execution" / "conftest.py"
_NAME = "ferry_tests_execution_conftest"
if _NAME not in sys.modules:
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    assert _spec is not None and _spec.loader is not None
    sys.modules[_NAME] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules[_NAME])
_shared = sys.modules[_NAME]

tiny_models = _shared.tiny_models
make_harness = _shared.make_harness
native_kernels = _shared.native_kernels
_restore_torch_threads = _shared._restore_torch_threads
