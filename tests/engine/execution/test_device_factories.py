"""Every torch tensor factory in the code a CUDA round runs names its device.

A factory without `device=` makes a CPU tensor; beside CUDA tensors that is a device mismatch
(the first sampled chat on a GPU once failed so) or a hidden copy. The host is named too
(`device="cpu"`), so a reader sees which side each tensor is meant for."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# the modules of a round: packing, attention, the layers, rotary, the MoE, sampling, verifying
ROUND = ["engine/execution/executor.py", "engine/execution/host.py",
         "engine/execution/kv_pool.py", "engine/execution/attention",
         "engine/execution/model/decoder.py", "engine/execution/model/layers",
         "engine/execution/sampling"]
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand",
             "randn", "randint", "randperm", "linspace", "eye", "empty_strided", "scalar_tensor"}


def files() -> list[Path]:
    out: list[Path] = []
    for name in ROUND:
        path = ROOT / name
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def undeviced(source: str) -> list[int]:
    """Lines of torch.<factory>(...) calls without a device= keyword."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"
                and node.func.attr in FACTORIES
                and not any(k.arg == "device" for k in node.keywords)):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_a_factory_without_device() -> None:
    assert undeviced("import torch\nx = torch.arange(4)\ny = torch.zeros(2, device=d)\n") == [2]
    assert undeviced("z = torch.tensor([1], dtype=torch.int32, device='cpu')\n") == []


@pytest.mark.parametrize("path", files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_factory_names_its_device(path: Path) -> None:
    lines = undeviced(path.read_text())
    assert not lines, f"{path.relative_to(ROOT)}: factories without device= at lines {lines}"
