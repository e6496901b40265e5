"""locks/: the exact versions Ferry is tested with, per platform, agree with each other and
with pyproject's ranges; `ferry doctor` compares the installed versions with them."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from app.commands import doctor
from app.commands.lock import find_lock, lock_platform, normalize, read_pins

REPO = Path(__file__).resolve().parents[2]
PLATFORMS = ("linux-x86_64-cpu", "linux-x86_64-cuda", "macos-arm64", "windows-x86_64")


def test_every_platform_has_a_runtime_and_a_dev_lock() -> None:
    assert {p.stem for p in (REPO / "locks").glob("*.txt")} == set(PLATFORMS)
    assert {p.stem for p in (REPO / "locks" / "dev").glob("*.txt")} == set(PLATFORMS)


@pytest.mark.parametrize("name", PLATFORMS)
def test_lock_agrees_with_its_dev_lock_and_pyproject(name: str) -> None:
    runtime = read_pins(REPO / "locks" / f"{name}.txt")
    dev = read_pins(REPO / "locks" / "dev" / f"{name}.txt")
    # what the tests run on is what ships: the dev lock only adds the tools
    assert {dist: dev.get(dist) for dist in runtime} == runtime
    assert {"pytest", "pyinstaller", "uv", "ruff", "mypy"} <= dev.keys() - runtime.keys()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    system = {"linux": "Linux", "macos": "Darwin", "windows": "Windows"}[name.split("-")[0]]
    for req in wanted:
        if req.marker is not None and not req.marker.evaluate({"platform_system": system}):
            continue  # not for this platform (triton: Linux only)
        pinned = dev.get(normalize(req.name))
        assert pinned is not None, f"{name}: {req.name} is not locked"
        assert req.specifier.contains(pinned, prereleases=True), (name, str(req), pinned)


def test_torch_builds() -> None:
    torch = {name: read_pins(REPO / "locks" / f"{name}.txt")["torch"] for name in PLATFORMS}
    assert len({version.split("+")[0] for version in torch.values()}) == 1, torch
    assert torch["linux-x86_64-cpu"].endswith("+cpu")
    assert all("+" not in torch[name] for name in PLATFORMS if name != "linux-x86_64-cpu")
    cuda = read_pins(REPO / "locks" / "linux-x86_64-cuda.txt")
    assert any(dist.startswith("nvidia-") for dist in cuda)  # PyPI's Linux torch: CUDA
    cpu = read_pins(REPO / "locks" / "linux-x86_64-cpu.txt")
    assert not any(dist.startswith("nvidia-") for dist in cpu)


def test_read_pins_skips_comments_and_markers(tmp_path: Path) -> None:
    lock = tmp_path / "x.txt"
    lock.write_text("# via make lock\nTyping_Extensions==4.16.0\n    # via torch\n"
                    "colorama==0.4.6 ; sys_platform == 'win32'\nnumpy==2.4.6 \\\n"
                    "    --hash=sha256:00\n-e .\n")
    assert read_pins(lock) == {"typing-extensions": "4.16.0", "colorama": "0.4.6",
                               "numpy": "2.4.6"}


def test_this_checkout_finds_its_lock() -> None:
    assert find_lock(lock_platform(cuda_build=False)) in \
        {REPO / "locks" / f"{name}.txt" for name in PLATFORMS} | {None}
    assert find_lock("no-such-platform") is None


def test_doctor_flags_a_version_off_the_lock(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # the installed set matches the checkout's lock (make install); a lock that says
    # otherwise stands in for an install that drifted from it
    name = lock_platform(cuda_build=False)
    real = find_lock(name)
    if real is None:
        pytest.skip(f"no lock for {name}")
    checks = {c.label: c for c in doctor.dependency_checks(cuda_build=False)}
    assert checks["lock"].status == "ok" and str(real) in checks["lock"].detail
    for dist in doctor.KEY_DEPENDENCIES:
        assert checks[dist].status == "ok" and checks[dist].detail.endswith("(as locked)"), \
            checks[dist]
    drifted = tmp_path / "lock.txt"
    drifted.write_text(real.read_text().replace("\ntransformers==", "\ntransformers==0.0.1+"))
    monkeypatch.setattr(doctor, "find_lock", lambda _: drifted)
    checks = {c.label: c for c in doctor.dependency_checks(cuda_build=False)}
    assert checks["transformers"].status == "warn"
    assert "but the lock has 0.0.1+" in checks["transformers"].detail
    assert checks["torch"].status == "ok"
    monkeypatch.setattr(doctor, "find_lock", lambda _: None)
    checks = {c.label: c for c in doctor.dependency_checks(cuda_build=False)}
    assert checks["lock"].status == "info" and checks["torch"].status == "info"
