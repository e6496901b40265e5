"""Build Settings from defaults < ferry.toml < FERRY_* env < flags, keeping each value's source."""
from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from app.paths import Paths, get_paths
from app.settings import Settings, SettingsError

ENV_PREFIX = "FERRY_"
TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off"}


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    if name == "upstreams":
        return "--upstream"  # repeatable: one URL each
    return "--" + name.replace("_", "-")


def read_config_file(path: Path) -> dict[str, object]:
    """The TOML table at path ({} when it does not exist); errors name the file."""
    if not path.exists():
        return {}
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(None, f"config file {path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise SettingsError(None, f"cannot read config file {path}: {exc.strerror or exc}") from exc
    kinds = Settings.kinds()
    unknown = sorted(set(data) - set(kinds))
    if unknown:
        raise SettingsError(
            unknown[0],
            f"config file {path}: unknown setting {unknown[0]!r} "
            f"(known settings: {', '.join(kinds)})")
    return data


def parse_text(name: str, kind: str, text: str) -> object:
    """Turn an environment string into the setting's type (bad text is left for validation)."""
    if kind == "int":
        try:
            return int(text.strip())
        except ValueError:
            return text
    if kind == "float":
        try:
            return float(text.strip())
        except ValueError:
            return text
    if kind == "bool":
        word = text.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        return text
    if name == "models":  # FERRY_MODELS: comma separated (ollama:NAME:TAG holds colons)
        return [part.strip() for part in text.split(",") if part.strip()]
    if name == "allowed_hosts":  # FERRY_ALLOWED_HOSTS: names, comma or space separated
        return [part for part in text.replace(",", " ").split() if part]
    if kind == "list[str]":
        return [part for part in text.split(os.pathsep) if part]
    if kind == "list[dict[str, object]]":  # FERRY_UPSTREAMS: URLs, space or comma separated
        return [part for part in text.replace(",", " ").split() if part]
    return text


def load_settings(
    flags: Mapping[str, object] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    paths: Paths | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Effective settings. flags maps setting names to values; None means "flag not given"."""
    environ = os.environ if env is None else env
    paths = paths or get_paths(dict(environ))
    path = config_file or paths.config_file
    if config_file is not None and not config_file.exists():
        raise SettingsError(None, f"config file {config_file} not found")  # asked for by name
    kinds = Settings.kinds()
    values: dict[str, object] = {}
    sources: dict[str, str] = {}

    for name, value in read_config_file(path).items():
        values[name], sources[name] = value, f"file {path}"
    for name, kind in kinds.items():
        text = environ.get(env_name(name))
        if text is not None:
            values[name], sources[name] = parse_text(name, kind, text), f"env {env_name(name)}"
    for name, value in (flags or {}).items():
        if name not in kinds:
            raise SettingsError(name, f"unknown setting {name!r}")
        if value is not None:
            values[name], sources[name] = value, f"flag {flag_name(name)}"

    try:
        return Settings(**values, sources=sources)  # type: ignore[arg-type]
    except SettingsError as exc:
        where = sources.get(exc.key or "", "")
        raise SettingsError(exc.key, _place(where, str(exc))) from None


def _place(source: str, message: str) -> str:
    """Prefix an error with where the bad value came from."""
    if source.startswith("file "):
        return f"config file {source[5:]}: {message}"
    if source.startswith("env "):
        return f"environment variable {source[4:]}: {message}"
    if source.startswith("flag "):
        return f"{source[5:]}: {message}"
    return message


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list) and any(isinstance(v, dict) for v in value):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table; an API key is never printed
        return "{" + ", ".join(f"{k} = {toml_value('***' if k == 'api_key' else v)}"
                               for k, v in value.items()) + "}"
    return json.dumps(value)  # JSON strings and string lists are valid TOML here


def format_config(settings: Settings, config_file: Path) -> str:
    """`ferry serve --print-config`: valid TOML, each line commented with its source."""
    state = "found" if config_file.is_file() else "not present"
    lines = [
        "# Ferry effective settings; precedence: default < file < env < flag",
        f"# config file: {config_file} ({state})",
    ]
    width = max(len(f"{n} = {toml_value(getattr(settings, n))}") for n in Settings.names())
    for name in Settings.names():
        line = f"{name} = {toml_value(getattr(settings, name))}"
        lines.append(f"{line:<{width}}  # {settings.source(name)}")
    return "\n".join(lines)
