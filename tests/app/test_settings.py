"""Settings: defaults < ferry.toml < FERRY_* env < flags, sources, and clear errors."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from app.config_sources import format_config, load_settings
from app.paths import get_paths
from app.settings import Settings, SettingsError, engine_config, is_loopback
from engine.config import EngineConfig


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """An environment whose only FERRY_* variable is FERRY_HOME (nothing from the real home)."""
    return {"FERRY_HOME": str(tmp_path)}


def write_config(env: dict[str, str], text: str) -> Path:
    path = get_paths(env).config_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults(home: dict[str, str]) -> None:
    s = load_settings({}, env=home)
    assert (s.host, s.port, s.model, s.dtype, s.device) == ("127.0.0.1", 8000, "default", "auto",
                                                            "auto")
    assert (s.policy, s.admission) == ("prefill-first", "fifo")
    assert (s.max_running, s.max_prefill_tokens, s.kv_tokens, s.page_size) == (32, 512, 16384, 16)
    assert s.prefix_cache is True and s.open is False and s.model_folders == []
    assert (s.max_waiting, s.per_user_limit, s.max_body_bytes) == (256, 8, 1024 * 1024)
    assert (s.max_messages, s.max_stop, s.max_tokens_limit) == (200, 4, 4096)
    assert s.source("port") == "default"
    assert s.source("policy") == "default (local)"


@pytest.mark.parametrize(
    ("in_file", "in_env", "flag", "want", "source"),
    [
        (True, True, True, 8003, "flag --port"),
        (True, True, False, 8002, "env FERRY_PORT"),
        (True, False, False, 8001, "file"),
        (False, False, False, 8000, "default"),
        (False, True, True, 8003, "flag --port"),
    ],
)
def test_precedence(home: dict[str, str], in_file: bool, in_env: bool, flag: bool, want: int,
                    source: str) -> None:
    if in_file:
        write_config(home, "port = 8001\n")
    env = dict(home, FERRY_PORT="8002") if in_env else home
    s = load_settings({"port": 8003 if flag else None}, env=env)
    assert s.port == want
    assert s.source("port").startswith(source)


def test_sources_per_key(home: dict[str, str]) -> None:
    path = write_config(home, 'model = "/models/x"\nmax_running = 4\n')
    s = load_settings({"host": "127.0.0.2"}, env=dict(home, FERRY_MAX_RUNNING="6"))
    assert s.sources == {"model": f"file {path}", "max_running": "env FERRY_MAX_RUNNING",
                         "host": "flag --host", "policy": "default (local)",
                         "admission": "default (local)"}
    assert s.max_running == 6 and s.model == "/models/x"


def test_shared_host_changes_policy_and_admission(home: dict[str, str]) -> None:
    s = load_settings({"host": "0.0.0.0"}, env=home)
    assert s.shared and (s.policy, s.admission) == ("interleave", "fair")
    assert "shared" in s.source("policy")
    # an explicit choice still wins over the shared default
    s = load_settings({"host": "0.0.0.0", "policy": "mixed"}, env=home)
    assert s.policy == "mixed" and s.source("policy") == "flag --policy"


def test_env_parsing(home: dict[str, str]) -> None:
    env = dict(home, FERRY_PREFIX_CACHE="off", FERRY_OPEN="yes", FERRY_KV_TOKENS=" 4096 ",
               FERRY_MODEL_FOLDERS=os.pathsep.join(["/a", "/b c"]))
    s = load_settings({}, env=env)
    assert s.prefix_cache is False and s.open is True and s.kv_tokens == 4096
    assert s.model_folders == ["/a", "/b c"]


@pytest.mark.parametrize(
    ("where", "key", "value", "words"),
    [
        ("env", "PORT", "abc", ["FERRY_PORT", "port", "integer"]),
        ("env", "PREFIX_CACHE", "maybe", ["FERRY_PREFIX_CACHE", "true or false"]),
        ("file", "port", "70000", ["ferry.toml", "port", "65535"]),
        ("file", "dtype", '"float16"', ["ferry.toml", "dtype", "bfloat16"]),
        ("file", "prefix_cache", '"yes"', ["ferry.toml", "prefix_cache", "true or false"]),
        ("file", "model_folders", '"/one"', ["ferry.toml", "model_folders", "list"]),
        ("file", "page_size", "0", ["ferry.toml", "page_size"]),
        ("flag", "policy", "lifo", ["--policy", "prefill-first, interleave, mixed"]),
        ("flag", "device", "tpu", ["--device", "cuda"]),
        ("flag", "admission", "random", ["--admission", "fifo, fair"]),
        ("flag", "speculative", "eagle", ["--speculative", "ngram, draft, off"]),
        ("flag", "speculative", "draft", ["draft_model", "--draft-model PATH"]),
        ("env", "SPECULATIVE", "draft", ["draft_model", "--draft-model PATH"]),
        ("flag", "mmproj_quantize", "q4_0", ["--mmproj-quantize", "q8_0, none"]),
    ],
)
def test_bad_values_name_key_and_source(home: dict[str, str], where: str, key: str, value: str,
                                        words: list[str]) -> None:
    env, flags = dict(home), {}
    if where == "env":
        env[f"FERRY_{key}"] = value
    elif where == "file":
        write_config(home, f"{key} = {value}\n")
    else:
        flags[key] = value
    with pytest.raises(SettingsError) as info:
        load_settings(flags, env=env)
    for word in words:
        assert word in str(info.value)


def test_unknown_toml_key(home: dict[str, str]) -> None:
    path = write_config(home, "port = 8001\nmax_runing = 3\n")
    with pytest.raises(SettingsError, match="max_runing") as info:
        load_settings({}, env=home)
    assert str(path) in str(info.value) and "known settings" in str(info.value)


def test_invalid_toml(home: dict[str, str]) -> None:
    path = write_config(home, "port = [\n")
    with pytest.raises(SettingsError, match="not valid TOML") as info:
        load_settings({}, env=home)
    assert str(path) in str(info.value)


def test_unreadable_config(home: dict[str, str]) -> None:
    # root reads through chmod 000, so a folder stands where the file should be
    path = get_paths(home).config_file
    path.mkdir(parents=True)
    with pytest.raises(SettingsError, match="cannot read config file") as info:
        load_settings({}, env=home)
    assert str(path) in str(info.value)


def test_explicit_config_file(home: dict[str, str], tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text("port = 9100\n")
    s = load_settings({}, env=home, config_file=other)
    assert s.port == 9100 and s.source("port") == f"file {other}"
    with pytest.raises(SettingsError, match="not found"):
        load_settings({}, env=home, config_file=tmp_path / "missing.toml")


def test_print_config_is_toml_with_sources(home: dict[str, str]) -> None:
    write_config(home, 'model_folders = ["/m"]\n')
    s = load_settings({"port": 9001}, env=dict(home, FERRY_DTYPE="float32"))
    text = format_config(s, get_paths(home).config_file)
    lines = {line.split(" = ")[0]: line for line in text.splitlines() if " = " in line}
    assert lines["port"].endswith("# flag --port")
    assert lines["dtype"].endswith("# env FERRY_DTYPE")
    assert "# file " in lines["model_folders"]
    assert lines["kv_tokens"].endswith("# default")
    parsed = tomllib.loads(text)
    assert set(parsed) == set(Settings.names())
    assert Settings(**parsed) == s  # the output can be pasted back as a ferry.toml


def test_engine_config_mapping(home: dict[str, str]) -> None:
    s = load_settings({"policy": "mixed"}, env=dict(home, FERRY_KV_TOKENS="2048",
                                                    FERRY_PREFIX_CACHE="false"))
    cfg = engine_config(s, max_context=4096)
    assert isinstance(cfg, EngineConfig)
    assert (cfg.policy, cfg.admission, cfg.kv_tokens, cfg.prefix_cache) == ("mixed", "fifo",
                                                                           2048, False)
    assert (cfg.max_running, cfg.max_prefill_tokens, cfg.page_size, cfg.max_waiting) == (
        32, 512, 16, 256)
    assert cfg.max_context == 4096
    assert engine_config(s).max_context == EngineConfig().max_context
    assert cfg.local_kv_tokens == 0 and cfg.sliding_window == 0  # the model sets the window
    s = load_settings({}, env=dict(home, FERRY_LOCAL_KV_TOKENS="4096"))
    assert engine_config(s).local_kv_tokens == 4096
    with pytest.raises(SettingsError, match="local_kv_tokens"):
        load_settings({}, env=dict(home, FERRY_LOCAL_KV_TOKENS="-1"))
    assert cfg.speculative == "ngram"
    off = load_settings({}, env=dict(home, FERRY_SPECULATIVE="off"))
    assert engine_config(off).speculative == "off" and off.sources["speculative"] == \
        "env FERRY_SPECULATIVE"


def test_kv_must_hold_a_page(home: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match="kv_tokens"):
        load_settings({}, env=dict(home, FERRY_KV_TOKENS="8", FERRY_PAGE_SIZE="16"))


@pytest.mark.parametrize(("host", "loop"), [("127.0.0.1", True), ("127.1.2.3", True),
                                            ("localhost", True), ("::1", True), ("[::1]", True),
                                            ("0.0.0.0", False), ("::", False),
                                            ("192.168.1.5", False), ("myhost", False)])
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


def test_paths_under_ferry_home(tmp_path: Path) -> None:
    paths = get_paths({"FERRY_HOME": str(tmp_path)})
    assert {k: v.relative_to(tmp_path).as_posix() for k, v in paths.as_dict().items()} == {
        "data": "data", "config": "config", "cache": "cache", "log": "log"}
    assert paths.config_file.name == "ferry.toml"
    assert paths.users_file == tmp_path / "data" / "users.json"
    paths.ensure()
    assert all(p.is_dir() for p in paths.as_dict().values())


def test_paths_default_to_platformdirs() -> None:
    paths = get_paths({})
    assert all("ferry" in str(p).lower() for p in paths.as_dict().values())


def test_draft_model_from_each_source(home: dict[str, str]) -> None:
    """speculative draft takes its model from ferry.toml, FERRY_DRAFT_MODEL or the flag."""
    write_config(home, 'speculative = "draft"\ndraft_model = "/models/small.gguf"\n')
    s = load_settings({}, env=home)
    assert (s.speculative, s.draft_model) == ("draft", "/models/small.gguf")
    s = load_settings({}, env=dict(home, FERRY_DRAFT_MODEL="/models/other"))
    assert s.draft_model == "/models/other" and s.source("draft_model") == "env FERRY_DRAFT_MODEL"
    s = load_settings({"draft_model": "/m/x.gguf"}, env=home)
    assert s.draft_model == "/m/x.gguf" and s.source("draft_model") == "flag --draft-model"


def test_the_projector_quantization_reaches_the_load(home: dict[str, str]) -> None:
    """mmproj_quantize: q8_0 unless a flag, FERRY_MMPROJ_QUANTIZE or ferry.toml says none;
    the command line's flag is read into the settings."""
    from app.cli import build_parser, serve_flags

    assert load_settings({}, env=home).mmproj_quantize == "q8_0"
    s = load_settings({}, env=dict(home, FERRY_MMPROJ_QUANTIZE="none"))
    assert s.mmproj_quantize == "none" and s.source("mmproj_quantize") == \
        "env FERRY_MMPROJ_QUANTIZE"
    args = build_parser().parse_args(["serve", "--mmproj-quantize", "none"])
    assert load_settings(serve_flags(args), env=home).mmproj_quantize == "none"


def test_draft_serves_one_model(home: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match="serves one model"):
        load_settings({"speculative": "draft", "draft_model": "/m/x.gguf",
                       "models": ["default", "/m/y.gguf"]}, env=home)
