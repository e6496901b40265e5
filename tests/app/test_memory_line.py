"""The banner's and `ferry doctor`'s words for a loaded model's memory."""
from __future__ import annotations

import socket

from app.banner import memory_line, model_memory
from app.commands.doctor import memory_checks
from app.settings import Settings

PARTS = {"weights": 106_000_000, "kv": 24_000_000, "tokenizer": 18_000_000,
         "vocabulary": 0, "other": 12_000_000, "total": 160_000_000}


def test_the_banner_names_the_floor_and_each_part() -> None:
    line = memory_line(466_000_000, 306_000_000, [("default", PARTS)])
    assert line == ("466 MB resident: 306 MB Python, torch and the server; default 160 MB "
                    "(weights 106, KV 24, tokenizer 18, vocabulary 0, other 12)")
    assert model_memory("a", PARTS).startswith("a 160 MB (weights 106")


def test_doctor_without_a_server_says_where_the_figures_show() -> None:
    checks = list(memory_checks(Settings(), running=False))
    assert [c.status for c in checks] == ["info"] and "/v1/models" in checks[0].detail


def test_doctor_with_something_else_on_the_port_says_it_did_not_answer() -> None:
    with socket.socket() as listener:  # listens, never answers HTTP
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        checks = list(memory_checks(Settings(port=port), running=True))
    assert checks[0].status == "info" and "did not list its models" in checks[0].detail
