"""Smaller app pieces: model resolution, banner, logging, the users-file check."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app import banner
from app.commands.users import users_exist
from app.logs import configure_logging
from app.models import ModelError, converted_dir, default_gguf, human_size, resolve_model
from app.paths import get_paths
from app.settings import Settings
from web.access.users import UserError, UserStore


def test_default_model_found_without_import() -> None:
    gguf = default_gguf()
    assert gguf is not None and gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    ref = resolve_model("default")
    assert ref.kind == "default" and ref.path == gguf and ref.name == "SmolLM2-135M-Instruct"


def test_resolve_paths_and_ids(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    with pytest.raises(ModelError, match="not a model folder"):
        resolve_model(str(folder))
    (folder / "config.json").write_text("{}")
    assert resolve_model(str(folder)).kind == "folder"
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model(str(gguf)).kind == "gguf"
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelError, match=r"\.gguf"):
        resolve_model(str(tmp_path / "weights.bin"))
    with pytest.raises(ModelError, match="not found"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ModelError, match="not found"):
        resolve_model("missing.gguf")
    hf = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert hf.kind == "hf" and hf.path is None


def test_converted_dir_and_sizes(tmp_path: Path) -> None:
    paths = get_paths({"FERRY_HOME": str(tmp_path)})
    assert converted_dir(paths, "org/name") == tmp_path / "cache" / "models" / "org--name"
    assert [human_size(n) for n in (512, 2048, 3 * 1024**3)] == ["512 B", "2.0 KiB", "3.0 GiB"]


def test_banner_upstream_front_has_no_engine_line() -> None:
    settings = Settings(upstreams=[{"url": "http://gpu1:8000"}, {"url": "http://gpu2:8000"}])
    text = banner.banner(settings, "llama-70b", "upstream", "http://gpu1:8000, http://gpu2:8000")
    assert "llama-70b (upstream, http://gpu1:8000, http://gpu2:8000)" in text
    assert "Front:   2 upstreams" in text and "slots" not in text and "Engine:" not in text


def test_banner_local() -> None:
    text = banner.banner(Settings(), "SmolLM2-135M-Instruct", "cpu", "bfloat16")
    assert "http://127.0.0.1:8000/" in text and "LAN" not in text
    assert "SmolLM2-135M-Instruct (cpu, bfloat16)" in text
    assert "policy prefill-first" in text and "32 slots" in text and "KV 16384" in text


def test_banner_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(banner, "lan_address", lambda: "10.1.2.3")
    text = banner.banner(Settings(host="0.0.0.0", port=8100), "m")
    assert "Local:   http://127.0.0.1:8100/" in text
    assert "LAN:     http://10.1.2.3:8100/" in text
    assert "policy interleave, admission fair" in text
    assert banner.lan_url(Settings(host="192.168.0.9")) == "http://192.168.0.9:8000/"
    assert banner.local_url(Settings(host="::1")) == "http://[::1]:8000/"


def test_banner_and_settings_name_the_allowed_hosts(tmp_path: Path) -> None:
    from app.config_sources import load_settings
    from app.settings import SettingsError

    text = banner.banner(Settings(port=8100), "m")
    assert "Hosts:   127.0.0.1:8100, localhost:8100, [::1]:8100   (others refused" in text
    settings = load_settings({"allowed_hosts": ["Chat.Example.com", "box.lan:8443"]},
                             env={"FERRY_HOME": str(tmp_path)})
    assert settings.allowed_hosts == ["chat.example.com", "box.lan:8443"]
    assert "chat.example.com (any port), box.lan:8443" in banner.banner(settings, "m")
    from_env = load_settings(env={"FERRY_HOME": str(tmp_path),
                                  "FERRY_ALLOWED_HOSTS": "a.example, b.example:9000"})
    assert from_env.allowed_hosts == ["a.example", "b.example:9000"]
    with pytest.raises(SettingsError, match="allowed_hosts"):
        load_settings({"allowed_hosts": ["http://x/"]}, env={"FERRY_HOME": str(tmp_path)})
    shared = banner.served_names(Settings(host="0.0.0.0"))
    import socket
    assert socket.gethostname().lower() + ":8000" in shared


def test_open_browser_uses_webbrowser(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(banner.webbrowser, "open", opened.append)
    banner.open_browser("http://127.0.0.1:8000/", delay=0).join(5)
    assert opened == ["http://127.0.0.1:8000/"]


def test_logging_to_rotating_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    log_file = tmp_path / "log" / "ferry.log"
    configure_logging(log_file, console=False)
    configure_logging(log_file, console=True)  # again: replaces, never duplicates
    ours = [h for h in root.handlers if getattr(h, "_ferry_handler", False)]
    assert len(ours) == 2
    logging.getLogger("ferry.test").info("hello file")
    for handler in ours:
        handler.flush()
    assert "ferry.test: hello file" in log_file.read_text()
    configure_logging(None, console=False)
    assert not [h for h in root.handlers if getattr(h, "_ferry_handler", False)]


def test_the_web_app_keeps_the_log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        tokenizer: object) -> None:
    """Building the web app leaves Ferry's handlers on the root logger (Litestar's default
    logging config would replace them): the host refusals and unexpected errors of a running
    server reach ferry.log."""
    from web.app import create_app
    from web.config import WebConfig

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    log_file = tmp_path / "ferry.log"
    configure_logging(log_file, console=False)
    create_app(object(), tokenizer, WebConfig(data_dir=tmp_path))  # type: ignore[arg-type]
    assert [h for h in root.handlers if getattr(h, "_ferry_handler", False)]
    logging.getLogger("ferry.hosts").warning("refused a request for host 'evil.example'")
    for handler in root.handlers:
        handler.flush()
    assert "ferry.hosts: refused a request for host 'evil.example'" in log_file.read_text()
    configure_logging(None, console=False)


@pytest.mark.parametrize(("content", "exists"), [(None, False), ("", False), ("{}", False),
                                                 ('{"version": 1, "users": {}}', False)])
def test_users_exist(tmp_path: Path, content: str | None, exists: bool) -> None:
    paths = get_paths({"FERRY_HOME": str(tmp_path)})
    if content is not None:
        paths.users_file.parent.mkdir(parents=True)
        paths.users_file.write_text(content)
    assert users_exist(paths) is exists


def test_users_exist_reads_the_user_store(tmp_path: Path) -> None:
    paths = get_paths({"FERRY_HOME": str(tmp_path)})
    UserStore(paths.users_file, scrypt_n=2 ** 10).add("ann", admin=True)
    assert users_exist(paths)
    paths.users_file.write_text('{"ann": {}}')  # not a users file Ferry wrote
    with pytest.raises(UserError, match="not a Ferry users file"):
        users_exist(paths)


def test_banner_says_the_device_and_why() -> None:
    text = banner.banner(Settings(), "m", "cpu", "bfloat16",
                         device_info="cpu (no NVIDIA GPU found), torch 2.13.0 (CPU build)")
    assert "  Device:  cpu (no NVIDIA GPU found), torch 2.13.0 (CPU build)" in text


def test_a_shared_tokenizer_cache_serves_several_homes(tmp_path: Path) -> None:
    """FERRY_TOKENIZER_CACHE: one folder of GGUF tokenizers for every FERRY_HOME; without
    it each home keeps its own under its models cache."""
    alone = get_paths({"FERRY_HOME": str(tmp_path / "a")})
    assert alone.tokenizer_cache == alone.models_cache
    shared = str(tmp_path / "tokenizers")
    a, b = (get_paths({"FERRY_HOME": str(tmp_path / h), "FERRY_TOKENIZER_CACHE": shared})
            for h in ("a", "b"))
    assert a.tokenizer_cache == b.tokenizer_cache == (tmp_path / "tokenizers").resolve()
    assert a.models_cache != b.models_cache  # the rest stays each home's own
