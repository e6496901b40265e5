"""Where Ferry keeps its files: platformdirs per-user folders, or one FERRY_HOME root.

FERRY_HOME exists so tests (and portable installs) never touch the real home directory.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from web.config import USERS_FILE

APP_NAME = "ferry"
HOME_ENV = "FERRY_HOME"
KERNELS_ENV = "FERRY_KERNEL_CACHE"  # one compiled-kernels folder for several homes
TOKENIZERS_ENV = "FERRY_TOKENIZER_CACHE"  # one folder of GGUF tokenizers for several homes
CONFIG_FILE = "ferry.toml"


@dataclass(frozen=True, slots=True)
class Paths:
    data: Path  # chat history, users, the installer's venv
    config: Path  # ferry.toml
    cache: Path  # converted models (cache/models/<name>)
    log: Path  # rotating ferry.log
    kernels: Path | None = None  # compiled kernels, when not cache/kernels
    tokenizers: Path | None = None  # GGUF files' tokenizer folders, when not cache/models

    @property
    def config_file(self) -> Path:
        return self.config / CONFIG_FILE

    @property
    def users_file(self) -> Path:
        return self.data / USERS_FILE

    @property
    def models_cache(self) -> Path:
        return self.cache / "models"

    @property
    def kernels_cache(self) -> Path:
        """Ferry's fused CPU kernels, compiled once per machine (engine.kernels.native);
        FERRY_KERNEL_CACHE names another folder (tests and portable installs share one build
        across many FERRY_HOMEs instead of compiling once per home)."""
        return self.kernels or self.cache / "kernels"

    @property
    def tokenizer_cache(self) -> Path:
        """Where a GGUF file's tokenizer is kept as a folder once built from the file
        (seconds per file): the models cache, or the folder FERRY_TOKENIZER_CACHE names
        (tests and portable installs share the builds across many FERRY_HOMEs)."""
        return self.tokenizers or self.models_cache

    @property
    def log_file(self) -> Path:
        return self.log / "ferry.log"

    def ensure(self) -> None:
        """Create the folders (reading settings never needs them; serving does)."""
        for folder in (self.data, self.config, self.cache, self.log):
            folder.mkdir(parents=True, exist_ok=True)

    def as_dict(self) -> dict[str, Path]:
        return {"data": self.data, "config": self.config, "cache": self.cache, "log": self.log}


def get_paths(env: dict[str, str] | None = None) -> Paths:
    """The folders for this user; FERRY_HOME=<dir> puts all four under that one folder."""
    environ = os.environ if env is None else env
    home = environ.get(HOME_ENV)
    shared, tokenizers = (Path(value).expanduser().resolve() if value else None
                          for value in (environ.get(KERNELS_ENV), environ.get(TOKENIZERS_ENV)))
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(root / "data", root / "config", root / "cache", root / "log", shared,
                     tokenizers)
    # appauthor=False: no extra vendor folder level on Windows
    return Paths(
        data=Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
        config=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
        cache=Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        log=Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
        kernels=shared,
        tokenizers=tokenizers,
    )
