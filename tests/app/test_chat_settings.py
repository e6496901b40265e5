"""The chat page's defaults come from the settings (ferry.toml, FERRY_* env) into WebConfig."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.config_sources import format_config, load_settings
from app.paths import get_paths
from app.serve import web_config
from app.settings import SettingsError


def test_chat_defaults_from_file_and_env(tmp_path: Path) -> None:
    env = {"FERRY_HOME": str(tmp_path), "FERRY_CHAT_TOP_P": "0.5"}
    path = get_paths(env).config_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('chat_system_prompt = "Answer in French."\nchat_temperature = 1\n'
                    "default_max_tokens = 64\n")
    s = load_settings({}, env=env)
    web = web_config(s, get_paths(env), "m")
    assert (web.chat_system_prompt, web.chat_temperature, web.chat_top_p,
            web.default_max_tokens) == ("Answer in French.", 1.0, 0.5, 64)
    assert "chat_top_p = 0.5" in format_config(s, path)
    other = {"FERRY_HOME": str(tmp_path / "other")}
    plain = web_config(load_settings({}, env=other), get_paths(other), "m")
    assert plain.chat_system_prompt is None and plain.chat_temperature == 0.7


@pytest.mark.parametrize(("key", "value", "words"), [
    ("FERRY_CHAT_TEMPERATURE", "3", ["chat_temperature", "0 to 2"]),
    ("FERRY_CHAT_TEMPERATURE", "warm", ["chat_temperature", "a number"]),
    ("FERRY_CHAT_TOP_P", "0", ["chat_top_p", "above 0"]),
    ("FERRY_DEFAULT_MAX_TOKENS", "0", ["default_max_tokens"]),
])
def test_bad_chat_defaults_are_named(tmp_path: Path, key: str, value: str,
                                     words: list[str]) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({}, env={"FERRY_HOME": str(tmp_path), key: value})
    for word in words:
        assert word in str(info.value)
