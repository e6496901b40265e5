"""FERRY_CPU (engine/kernels/cpu_level.py): which level a CPU has, what a cap takes away, and
that a capped process really runs the smaller CPU's kernels (Ferry's and torch's)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.kernels import cpu_level

REPO = Path(__file__).resolve().parents[3]
FLAGS = {
    "": "sse4_2 avx",
    "avx2": "avx avx2 fma f16c",
    "avx-vnni": "avx avx2 fma f16c avx_vnni",
    "avx512": "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni",
    "amx": "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 amx_tile amx_bf16",
}


@pytest.fixture
def cpu(monkeypatch: pytest.MonkeyPatch) -> object:
    """Pretend to run on a CPU with the given flags: cpu(name) sets them."""
    def use(name: str) -> None:
        monkeypatch.setattr(cpu_level.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(cpu_level, "cpu_flags", lambda: set(FLAGS[name].split()))
        cpu_level.detected.cache_clear()

    yield use
    cpu_level.detected.cache_clear()


@pytest.mark.parametrize("name", list(FLAGS))
def test_detected_level(cpu: object, name: str) -> None:
    cpu(name)  # type: ignore[operator]
    assert cpu_level.detected() == name


def test_not_x86_has_no_level(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_level.platform, "machine", lambda: "arm64")
    cpu_level.detected.cache_clear()
    try:
        assert cpu_level.detected() is None
        env = {"FERRY_CPU": "avx2"}
        assert cpu_level.march(env) == ("-march=native",)  # never a target this CPU lacks
        assert cpu_level.max_path(env) == 1  # the run-time cap still holds
    finally:
        cpu_level.detected.cache_clear()


def test_cap_below_the_cpu_takes_away(cpu: object) -> None:
    cpu("amx")  # type: ignore[operator]
    env = {"FERRY_CPU": "avx2"}
    assert cpu_level.march(env) == ("-march=x86-64-v3",)
    assert cpu_level.c_defines(env) == ("-DFERRY_PATH_MASK=3", "-DFERRY_CPU_BF16=0")
    assert cpu_level.max_path(env) == 1 and not cpu_level.allows_bf16(env)
    assert "capped to avx2" in cpu_level.describe(env)
    vnni = {"FERRY_CPU": "avx-vnni"}
    assert cpu_level.max_path(vnni) == 2 and "-mavxvnni" in cpu_level.march(vnni)
    wide = {"FERRY_CPU": "avx512"}
    assert cpu_level.max_path(wide) == 3 and not cpu_level.allows_bf16(wide)


@pytest.mark.parametrize("asked", ["avx2", "avx512", "amx", "AMX "])
def test_cap_at_or_above_the_cpu_changes_nothing(cpu: object, asked: str) -> None:
    cpu("avx2")  # type: ignore[operator]
    env = {"FERRY_CPU": asked}
    assert cpu_level.cap(env) is None
    assert cpu_level.march(env) == ("-march=native",) and cpu_level.c_defines(env) == ()
    assert cpu_level.max_path(env) == 3 and cpu_level.allows_bf16(env)
    assert cpu_level.apply_torch_env(env) == () and env == {"FERRY_CPU": asked}


def test_no_cap_is_the_default(cpu: object) -> None:
    cpu("amx")  # type: ignore[operator]
    assert cpu_level.cap({}) is None and cpu_level.max_path({}) == 3
    assert "all of it in use" in cpu_level.describe({})


def test_bad_name_is_refused_with_the_choices() -> None:
    with pytest.raises(cpu_level.CpuLevelError, match="avx2, avx-vnni, avx512, amx"):
        cpu_level.requested({"FERRY_CPU": "sse"})


def test_torch_env_keeps_what_the_user_set(cpu: object) -> None:
    cpu("amx")  # type: ignore[operator]
    env = {"FERRY_CPU": "avx-vnni", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert cpu_level.apply_torch_env(env) == ("ATEN_CPU_CAPABILITY=avx2",
                                              "MKL_ENABLE_INSTRUCTIONS=AVX2")
    assert env["ONEDNN_MAX_CPU_ISA"] == "AVX2"


# A process pretending its CPU is an AMX Xeon, capped to AVX2: the kernels build for x86-64-v3
# with the path mask, run AVX2 dot products at most, no bf16 tiles nor AMX, and torch
# dispatches AVX2 kernels (rows in lanes from 8 rows on, the K-quants' too). The products
# still match the float reference.
CAPPED = textwrap.dedent("""
    import json, sys
    from engine.kernels import cpu_level
    from engine.kernels.cpu_level import detected
    real = detected()
    if real in ("avx512", "amx"):
        pass  # a real wide CPU: the cap below takes real things away
    else:
        cpu_level.detected = lambda: "amx"  # pretend, to build and run the capped kernels
    set_env = cpu_level.apply_torch_env()
    import torch
    from engine.kernels import native, quant
    from engine.execution.cpu import cpu_has_native_bf16
    native.set_build_dir(sys.argv[1])
    w = quant.quantize(torch.randn(64, 256, generator=torch.Generator().manual_seed(0)),
                       quant.Q8_0)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1))
    y = quant.quant_matmul(x, w)
    ref = x @ quant.dequantize(w).T
    x32 = torch.randn(32, 256, generator=torch.Generator().manual_seed(2))  # a 32-chat round
    y32, ref32 = quant.quant_matmul(x32, w), x32 @ quant.dequantize(w).T
    # K-quant weights of random blocks (f16 scales 0.01) in lanes too: each of the 32 rows the
    # bits of that row alone
    import numpy as np
    blocks = np.random.default_rng(3).integers(0, 256, (64, 210), dtype=np.uint8)
    k_alone, k_err = [], []
    for qt, scales in ((quant.Q4_K, (0, 2)), (quant.Q6_K, (208,))):
        raw = blocks[:, :quant._TYPES[qt][2]].copy()
        for at in scales:
            raw[:, at:at + 2] = np.full((64, 1), 0.01, np.float16).view(np.uint8)
        wk = quant.QuantWeight(qt, torch.from_numpy(raw), 256, 64)
        yk, refk = quant.quant_matmul(x32, wk), x32 @ quant.dequantize(wk).T
        k_alone.append(quant.uses_lanes(qt) and all(
            torch.equal(quant.quant_matmul(x32[r:r + 1], wk)[0], yk[r]) for r in range(32)))
        k_err.append(float((yk - refk).abs().max() / refk.abs().max()))
    print(json.dumps({
        "flags": native._flags(native._torch_lib_dir())[0], "path": quant.kernel_path(),
        "tiles": str(quant.tile_dtype()), "amx": quant.uses_amx(w),
        "bf16": cpu_has_native_bf16(), "torch": torch.backends.cpu.get_cpu_capability(),
        "set": list(set_env), "err": float((y - ref).abs().max() / ref.abs().max()),
        "status": native.status(), "lanes": quant.uses_lanes(w.qtype),
        "err32": float((y32 - ref32).abs().max() / ref32.abs().max()),
        "k_alone": k_alone, "k_err": max(k_err)}))
""")


@pytest.mark.skipif(cpu_level.detected() is None, reason="FERRY_CPU caps x86 CPUs only")
def test_capped_process_runs_the_smaller_cpu(tmp_path: Path) -> None:
    env = dict(os.environ, FERRY_CPU="avx2")
    for key in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-c", CAPPED, str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["status"].startswith("native"), got["status"]
    assert "-march=x86-64-v3" in got["flags"] and "-DFERRY_PATH_MASK=3" in got["flags"]
    assert got["path"] == "avx2" and got["tiles"] == "torch.float32"
    assert not got["amx"] and not got["bf16"]
    assert got["torch"] in ("AVX2", "DEFAULT") and "ATEN_CPU_CAPABILITY=avx2" in got["set"]
    assert got["err"] < 0.02  # int8 activations: about 1% of the largest output
    assert got["lanes"] and got["err32"] < 0.02  # 32 rows: AVX2's rows in lanes
    assert got["k_alone"] == [True, True] and got["k_err"] < 0.02  # and the K-quants'


def test_cli_refuses_a_bad_level() -> None:
    env = dict(os.environ, FERRY_CPU="avx9")
    done = subprocess.run([str(Path(sys.executable).parent / "ferry"), "doctor"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "FERRY_CPU='avx9' is not a CPU level" in done.stderr


def test_amd_cores_prefetch_weights_into_l2(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefetch locality measured per maker reaches the kernels' build flags."""
    vendors = {"vendor_id": "AuthenticAMD"}
    monkeypatch.setattr(cpu_level, "_cpuinfo", lambda field: vendors.get(field))
    assert cpu_level.tuning() == ("-DQ_PREFETCH_LOCALITY=2",)
    vendors["vendor_id"] = "GenuineIntel"
    assert cpu_level.tuning() == ()
    vendors.clear()  # no /proc/cpuinfo (not Linux, not x86)
    assert cpu_level.tuning() == ()
