"""Logging to the console and to a rotating file in the log dir."""
from __future__ import annotations

import logging
import logging.handlers
import os
import sys
from pathlib import Path
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
MAX_BYTES = 5 * 1024 * 1024
BACKUPS = 3
_MARK = "_ferry_handler"  # tags our handlers so configuring twice does not duplicate lines


def configure_logging(log_file: Path | None, level: int | str = logging.INFO,
                      console: bool = True) -> logging.Logger:
    """Set up the root logger; returns the "ferry" logger. Safe to call more than once."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)
    formatter = logging.Formatter(FORMAT)
    handlers: list[logging.Handler] = []
    if console:
        handlers.append(logging.StreamHandler(sys.stderr))
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.handlers.RotatingFileHandler(
            log_file, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
        setattr(handler, _MARK, True)
        root.addHandler(handler)
    return logging.getLogger("ferry")


def quiet_progress_bars(stream: TextIO) -> bool:
    """Turn download and loading progress bars off when `stream` is not a terminal (a log
    file, a pipe, a service journal), where their carriage returns and escape codes would be
    written raw. True when they were turned off."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return False
    os.environ["TQDM_DISABLE"] = "1"  # tqdm >= 4.66 reads TQDM_* as its defaults
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:  # already imported: the variable was read
        from huggingface_hub.utils import disable_progress_bars  # type: ignore[attr-defined]
        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    return True
