"""The GPU block kernels compile for real GPUs, without one: Triton's compiler (with the
ptxas its wheel carries) lowers every block type's product, in both tile shapes, to a Hopper
cubin, and the other activation dtypes and the embedding lookup to an Ampere one. The
interpreter tests check the numbers; this checks what the interpreter cannot: that the same
source passes the GPU compiler's type and layout rules (constexpr globals, tl.dot operands).

It runs in a child process: the interpreter tests set TRITON_INTERPRET=1 before the kernels
are imported, and an interpreted kernel cannot be compiled.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

# found, not imported: importing Triton here, before test_gpu_quant_kernels sets
# TRITON_INTERPRET, would leave that module's kernels half interpreted in the same process
if importlib.util.find_spec("triton") is None:
    pytest.skip("the gpu_quant kernels need Triton (the dev extra)", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels.gpu_quant import layouts
from engine.kernels.gpu_quant.matmul_kernel import qmatmul_kernel
from engine.kernels.gpu_quant.rows_kernel import rows_kernel

def product(qtype, dtype, dot, arch):
    _, qk, nbytes = layouts.LAYOUTS[qtype]
    ptr = "*" + dtype
    sig = {"x_ptr": ptr, "w_ptr": "*u8", "bias_ptr": ptr, "out_ptr": ptr, "M": "i32",
           "N": "i32", "K": "i32", "stride_xm": "i32", "stride_om": "i32", "row_bytes": "i32"}
    consts = {"QTYPE": qtype, "QK": qk, "BLOCK_BYTES": nbytes, "HAS_BIAS": True,
              "USE_DOT": dot, "DOT_F32": False, "BLOCK_M": 64 if dot else 1, "BLOCK_N": 64,
              "BLOCK_K": 32}
    sig.update({name: "constexpr" for name in consts})
    target = GPUTarget("cuda", arch, 32)
    done = triton.compile(ASTSource(qmatmul_kernel, sig, consts), target=target)
    assert done.asm["cubin"], (qtype, dtype, dot)

for qtype in layouts.LAYOUTS:
    for dot in (False, True):
        product(qtype, "bf16", dot, 90)
for dtype in ("fp16", "fp32"):
    product(layouts.Q4_K, dtype, True, 80)
_, qk, nbytes = layouts.LAYOUTS[layouts.Q6_K]
consts = {"QTYPE": layouts.Q6_K, "QK": qk, "BLOCK_BYTES": nbytes, "BLOCK_K": 256}
sig = {"ids_ptr": "*i64", "w_ptr": "*u8", "out_ptr": "*bf16", "K": "i32", "row_bytes": "i32"}
sig.update({name: "constexpr" for name in consts})
rows = triton.compile(ASTSource(rows_kernel, sig, consts), target=GPUTarget("cuda", 80, 32))
assert rows.asm["cubin"]
print("compiled")
"""


def test_kernels_compile_for_hopper_and_ampere(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, not found in a cache
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, timeout=240,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]
