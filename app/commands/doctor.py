"""`ferry doctor`: one line per check, green when fine, red when serve would fail."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from app.commands.lock import find_lock, lock_platform, normalize, read_pins
from app.commands.users import users_exist
from app.models import ModelError, folder_size, human_size, resolve_model
from app.paths import Paths
from app.preflight import port_problem
from app.settings import Settings
from web.access.users import UserError

Status = Literal["ok", "info", "warn", "fail"]
# what serving runs on: a version other than the lock's is what a broken install looks like
KEY_DEPENDENCIES = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub",
                    "gguf", "llguidance", "numpy", "litestar", "uvicorn", "jinja2")
MARKS = {"ok": ("\u2713", "ok", "32"), "info": ("-", "-", "36"),
         "warn": ("!", "!", "33"), "fail": ("\u2717", "FAIL", "31")}


@dataclass(frozen=True, slots=True)
class Check:
    status: Status
    label: str
    detail: str


def torch_is_cuda_build() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None


def torch_checks(settings: Settings) -> Iterator[Check]:
    try:
        import torch
    except ImportError as exc:
        yield Check("fail", "torch", f"cannot import torch: {exc}")
        return
    from engine.host import pick_device, torch_build

    yield Check("ok", "torch", torch_build())
    try:
        picked = pick_device(settings.device)
    except ValueError as exc:
        yield Check("fail", "device", str(exc))
        return
    device = picked.device
    if device.startswith("cuda"):
        yield Check("ok", "device", f"{device} ({picked.why})")
    else:
        detail = (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} "
                  f"threads, {torch.backends.cpu.get_cpu_capability()}")
        gpu_lost = picked.why not in ("requested", "no NVIDIA GPU found")
        yield Check("warn" if gpu_lost else "ok", "device",
                    f"cpu ({detail}){'' if picked.why == 'requested' else '; ' + picked.why}")
    if not device.startswith("cuda"):
        from engine.host import describe_cpu_level

        yield Check("ok", "cpu level", describe_cpu_level())
    if device.startswith("cuda"):
        bf16 = torch.cuda.is_bf16_supported()
        status: Status = "ok" if bf16 else ("fail" if settings.dtype == "bfloat16" else "warn")
        yield Check(status, "bfloat16", "supported" if bf16 else "not supported; use float16")
        yield from attention_checks()
        return
    from engine.host import cpu_has_native_bf16, onednn_works

    if cpu_has_native_bf16():
        yield Check("ok", "bfloat16", "native (auto picks bfloat16)")
    else:
        yield Check("info", "bfloat16", "emulated (auto picks float32; with the fused "
                                        "kernels below, --dtype bfloat16 decodes a few "
                                        "chats faster and many as fast)")
    yield Check("ok" if onednn_works() else "info", "cpu kernels",
                "float32 weights packed for oneDNN" if onednn_works()
                else "oneDNN linear unavailable: plain torch matmuls")
    from engine.host import kernel_status

    state = kernel_status()
    yield Check("ok" if state.startswith("native") else "info", "fused kernels",
                state if state.startswith(("native", "off")) else
                f"{state}; plain torch ops instead (slower small-batch decode)")
    yield Check("info", "flashinfer", "not needed here (CUDA only)")
    yield Check("ok", "attention", "torch backend with Ferry's CPU kernels")


def attention_checks() -> Iterator[Check]:
    """On CUDA: FlashInfer, its kernels, and the backend a model will get (FlashInfer only
    after its self-test at load; the torch backend otherwise, with the reason)."""
    from engine.host import flashinfer_kernels, flashinfer_missing, flashinfer_version

    missing = flashinfer_missing()
    if missing:
        yield Check("warn", "flashinfer", missing)
        yield Check("warn", "attention", f"torch backend: {missing}")
        return
    yield Check("ok", "flashinfer", f"{flashinfer_version()} importable")
    ok, how = flashinfer_kernels()
    yield Check("ok" if ok else "warn", "kernels", how)
    yield Check("ok" if ok else "warn", "attention",
                "flashinfer once its self-test passes at load (else torch, with the reason "
                "in the banner)" if ok else "torch backend: FlashInfer has no kernels")


def dependency_checks(cuda_build: bool) -> Iterator[Check]:
    """Each key dependency's installed version, against the lock Ferry was tested with."""
    name = lock_platform(cuda_build)
    lock = find_lock(name)
    pins = read_pins(lock) if lock else {}
    if lock:
        yield Check("ok", "lock", str(lock))
    else:
        yield Check("info", "lock", f"none for {name}: versions below are not checked")
    for dist in KEY_DEPENDENCIES:
        try:
            have = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            yield Check("fail", dist, "not installed")
            continue
        locked = pins.get(normalize(dist))
        if not lock:
            yield Check("info", dist, have)
        elif locked == have:
            yield Check("ok", dist, f"{have} (as locked)")
        else:
            yield Check("warn", dist, f"{have}, but the lock has {locked or 'none'}: "
                                      "reinstall from the lock (make install, install.sh)")


def model_checks(settings: Settings, paths: Paths) -> Iterator[Check]:
    try:
        model = resolve_model(settings.model)
    except ModelError as exc:
        yield Check("fail", "model", str(exc))
        return
    where = f" {model.path} ({human_size(folder_size(model.path))})" if model.path else ""
    yield Check("ok", "model", f"{model.name}: {model.kind}{where}")
    if model.path is not None:  # how `ferry serve` would run it (a GGUF's tensor table read)
        from engine import ModelNotFound, describe_chat_template, describe_model_file
        from engine.host import pick_device

        try:
            device = "cuda" if pick_device(settings.device).device.startswith("cuda") else "cpu"
        except ValueError:  # reported by the device check
            device = "cpu"
        try:
            runs = describe_model_file(model.path, settings.dtype, device, settings.quantize)
        except (ModelNotFound, ValueError) as exc:
            yield Check("fail", "runs as", str(exc))
        else:
            yield Check("ok", "runs as", runs)
            template = describe_chat_template(model.path)
            own = template.startswith("the model's")  # else a base model: the plain fallback
            yield Check("ok" if own else "info", "chat template", template)


def memory_checks(settings: Settings, running: bool) -> Iterator[Check]:
    """Each loaded model's resident size by part, from the Ferry already serving on the
    configured port (GET /v1/models), if one is."""
    if not running:
        yield Check("info", "memory", "no server on the port: each loaded model's resident "
                    "size by part shows here (and in /v1/models) while `ferry serve` runs")
        return
    import json
    import urllib.request

    from app.banner import model_memory

    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    try:
        with urllib.request.urlopen(f"http://{host}:{settings.port}/v1/models",
                                    timeout=3) as reply:
            cards = json.loads(reply.read()).get("data", [])
    except (OSError, ValueError, AttributeError) as exc:
        yield Check("info", "memory", f"the server on the port did not list its models: {exc}")
        return
    loaded = [(c["id"], c["memory"]) for c in cards if isinstance(c.get("memory"), dict)]
    if not loaded:
        yield Check("info", "memory", "the server on the port has no model loaded that says "
                    "its memory")
    for name, parts in loaded:
        yield Check("ok", "memory", model_memory(name, parts))


def writable(path: Path) -> bool:
    """path is writable, or can be created under its nearest existing parent."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return probe.is_dir() and os.access(probe, os.W_OK)


def run_checks(settings: Settings | None, paths: Paths, config_error: str | None) -> list[Check]:
    checks = [Check("ok", "python", f"{platform.python_version()} ({sys.executable})")]
    if config_error:
        checks.append(Check("fail", "config", config_error))
    else:
        state = "" if paths.config_file.is_file() else " (not present: defaults)"
        checks.append(Check("ok", "config", f"{paths.config_file}{state}"))
    settings = settings or Settings()
    from engine.host import set_kernel_build_dir

    set_kernel_build_dir(paths.kernels_cache)
    checks.extend(torch_checks(settings))
    checks.extend(dependency_checks(cuda_build=torch_is_cuda_build()))
    checks.extend(model_checks(settings, paths))
    for label, folder in paths.as_dict().items():
        ok = writable(folder)
        checks.append(Check("ok" if ok else "fail", f"{label} dir",
                            str(folder) if ok else f"{folder} is not writable"))
    problem = port_problem(settings.host, settings.port)
    checks.append(Check("fail" if problem else "ok", "port",
                        problem or f"{settings.host}:{settings.port} is free"))
    checks.extend(memory_checks(settings, running=bool(problem)))
    from app.banner import served_names
    checks.append(Check("ok", "hosts", "answers Host " + ", ".join(served_names(settings))
                        + "; others are refused (add one: --allowed-host, "
                        "FERRY_ALLOWED_HOSTS)"))
    if settings.shared:
        try:
            ok = users_exist(paths)
            detail = "present" if ok else "none: run `ferry users add NAME --admin` before sharing"
        except UserError as exc:
            ok, detail = False, str(exc)
        checks.append(Check("ok" if ok else "fail", "users", detail))
    return checks


def render(checks: list[Check], out: TextIO) -> None:
    color = out.isatty() and "NO_COLOR" not in os.environ
    encoding = getattr(out, "encoding", None) or "ascii"
    width = max(len(c.label) for c in checks)
    for check in checks:
        symbol, plain, code = MARKS[check.status]
        try:
            symbol.encode(encoding)
        except (UnicodeEncodeError, LookupError):
            symbol = plain  # e.g. a legacy Windows console code page
        mark = f"\033[{code}m{symbol}\033[0m" if color else symbol
        print(f"{mark} {check.label:<{width}}  {check.detail}", file=out)


def main(settings: Settings | None, paths: Paths, config_error: str | None = None) -> int:
    checks = run_checks(settings, paths, config_error)
    render(checks, sys.stdout)
    return 1 if any(c.status == "fail" for c in checks) else 0
