"""The GPU check (scripts/gpu-check.sh and its Python steps) parses, and its steps that need
no GPU run here: the environment report and the gathering into results.json."""
from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"


def load() -> object:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPTS / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["gpu-check.sh", "gpu-wheels.sh"])
def test_shell_scripts_parse(script: str) -> None:
    subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", str(SCRIPTS / script)], capture_output=True,
                              text=True, check=False)
        assert done.returncode == 0, done.stdout


def test_env_and_collect_steps(tmp_path: Path) -> None:
    gpu_check = load()
    assert gpu_check.main(["nothing", str(tmp_path)]) == 2  # type: ignore[attr-defined]
    assert gpu_check.main(["env", str(tmp_path)]) == 0  # type: ignore[attr-defined]
    (tmp_path / "steps.txt").write_text("install ok\n")
    assert gpu_check.main(["collect", str(tmp_path)]) == 0  # type: ignore[attr-defined]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["env"]["torch"] and "cuda_available" in results["env"]
    assert results["env"]["pick_device"]  # the reason a CPU runs, said
    assert results["steps"] == "install ok\n"


def test_the_default_models_shape_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The throughput run's random model is a folder Ferry loads (shrunk to 2 layers)."""
    gpu_check = load()
    monkeypatch.setitem(gpu_check.SMOLLM2, "num_hidden_layers", 2)  # type: ignore[attr-defined]
    monkeypatch.setitem(gpu_check.SMOLLM2, "vocab_size", 512)  # type: ignore[attr-defined]
    folder = gpu_check._model_dir(tmp_path)  # type: ignore[attr-defined]
    from engine.execution.loading.loader import load_model

    model = load_model(folder, dtype=__import__("torch").bfloat16)
    assert model.config.num_layers == 2 and model.config.head_dim == 64


def test_requirements_name_what_the_tests_import() -> None:
    wanted = (SCRIPTS / "gpu-requirements.txt").read_text()
    for name in ("transformers", "gguf", "llguidance", "pytest", "apache-tvm-ffi"):
        assert name in wanted
