"""Several models from the command line, ferry.toml and FERRY_MODELS; one --model as before."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import build_parser, serve_flags
from app.config_sources import load_settings
from app.settings import SettingsError, parse_bytes


def settings_for(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None,
                 toml: str = "") -> object:
    (tmp_path / "ferry.toml").write_text(toml)
    args = build_parser().parse_args(["serve", *argv])
    return load_settings(serve_flags(args), env={"FERRY_HOME": str(tmp_path), **(env or {})},
                         config_file=tmp_path / "ferry.toml")


def test_one_model_flag_is_as_before(tmp_path: Path) -> None:
    s = settings_for(["--model", "a.gguf"], tmp_path)
    assert s.model == "a.gguf" and s.models == [] and s.served_models == ["a.gguf"]
    assert settings_for([], tmp_path).served_models == ["default"]


def test_repeated_model_flags_serve_several(tmp_path: Path) -> None:
    s = settings_for(["--model", "default", "--model", "ollama:gemma3:270m",
                      "--max-loaded", "2", "--max-memory", "6G", "--keep-alive", "30s"],
                     tmp_path)
    assert s.served_models == ["default", "ollama:gemma3:270m"]
    assert (s.max_loaded, s.max_memory, s.keep_alive) == (2, "6G", "30s")
    assert s.source("models") == "flag --models"


def test_models_from_file_and_environment(tmp_path: Path) -> None:
    s = settings_for([], tmp_path, toml='models = ["default", "b.gguf"]\nkeep_alive = "0"\n')
    assert s.served_models == ["default", "b.gguf"] and s.keep_alive == "0"
    s = settings_for([], tmp_path, env={"FERRY_MODELS": "ollama:qwen3:0.6b, default"})
    assert s.served_models == ["ollama:qwen3:0.6b", "default"]


def test_users_load_models_from_flag_file_and_environment(tmp_path: Path) -> None:
    """On by default (loading on demand, as before); off from a flag, the file or the
    environment."""
    assert settings_for([], tmp_path).users_load_models is True
    assert settings_for(["--no-users-load-models"], tmp_path).users_load_models is False
    assert settings_for([], tmp_path, toml="users_load_models = false\n").users_load_models \
        is False
    s = settings_for([], tmp_path, env={"FERRY_USERS_LOAD_MODELS": "no"})
    assert s.users_load_models is False and s.source("users_load_models") == \
        "env FERRY_USERS_LOAD_MODELS"
    assert settings_for(["--users-load-models"], tmp_path,
                        toml="users_load_models = false\n").users_load_models is True


@pytest.mark.parametrize(("argv", "key"), [
    (["--keep-alive", "soon"], "keep_alive"), (["--keep-alive", "nan"], "keep_alive"),
    (["--keep-alive=-5m"], "keep_alive"), (["--max-memory", "lots"], "max_memory"),
    (["--max-loaded", "-1"], "max_loaded"), (["--model", "a", "--model", "a"], "models")])
def test_bad_values_name_the_setting(argv: list[str], key: str, tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as err:
        settings_for(argv, tmp_path)
    assert err.value.key == key


def test_sizes() -> None:
    assert parse_bytes("8G") == 8 << 30 and parse_bytes("512M") == 512 << 20
    assert parse_bytes("1.5GB") == 3 << 29 and parse_bytes("1000") == 1000
    assert parse_bytes("0") is None and parse_bytes("lots") is None
