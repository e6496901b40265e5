"""The chat's prompt over the real tokenizer: the oldest turns are left out (the system prompt
kept) when the history does not fit, and a reply limit cut by the context says so."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from web.config import WebConfig
from web.pages.chat.prompting import ConversationModel
from web.pages.chat.service import ChatError
from web.storage.store import Conversation, Message, Store


def service(tokenizer: Any, context: int, tmp_path: Any, **web: Any) -> ConversationModel:
    # the store holds the conversation's pictures (none here); the engine is a text model's
    s = SimpleNamespace(config=WebConfig(data_dir=tmp_path, **web), context_limit=context,
                        tokenizer=tokenizer, store=Store(tmp_path / "ferry.sqlite3"),
                        engine=SimpleNamespace(), model_name="SmolLM2")
    return ConversationModel(s)  # type: ignore[arg-type]


def history(n: int, words: int) -> list[Message]:
    text = " ".join(f"w{i}" for i in range(words))
    return [Message(i + 1, 1, "user" if i % 2 == 0 else "assistant", f"turn {i}: {text}",
                    "complete", None, None, None, 0.0) for i in range(n)]


def conv(**settings: Any) -> Conversation:
    return Conversation(1, "local", "t", 0.0, 0.0, **settings)


def test_oldest_turns_are_left_out_and_the_system_prompt_kept(tokenizer: Any,
                                                              tmp_path: Any) -> None:
    chat = service(tokenizer, 1024, tmp_path, default_max_tokens=100)
    p = chat.prompt(conv(system_prompt="SYSTEM-MARKER rules."), history(9, 60))
    text = tokenizer.decode(p.ids)
    assert "SYSTEM-MARKER" in text and "turn 8:" in text and "turn 0:" not in text
    assert len(p.ids) <= 1024 - 100 and p.max_tokens == 100
    assert p.note is not None and "oldest messages were left out to fit the 1024-token" in p.note
    # everything fits: no note, nothing left out
    small = chat.prompt(conv(), history(3, 5))
    assert small.note is None and "turn 0:" in tokenizer.decode(small.ids)


def test_a_reply_limit_the_context_cuts_is_said(tokenizer: Any, tmp_path: Any) -> None:
    chat = service(tokenizer, 600, tmp_path, default_max_tokens=100)
    # one long message: nothing can be left out, and the reply gets less room than asked
    p = chat.prompt(conv(max_tokens=500), history(1, 100))
    assert p.max_tokens == 600 - len(p.ids) < 500
    assert p.note is not None and f"limited to {p.max_tokens} tokens (not 500)" in p.note
    # a message that cannot fit at all is refused with the sizes, before the engine sees it
    with pytest.raises(ChatError, match="does not fit the model's 600-token context"):
        chat.prompt(conv(), history(1, 400))


def test_continue_appends_the_partial_reply_without_an_end_of_turn(tokenizer: Any,
                                                                    tmp_path: Any) -> None:
    chat = service(tokenizer, 2048, tmp_path)
    p = chat.prompt(conv(), history(1, 3), tail="Once upon a")
    assert tokenizer.decode(p.ids).endswith("Once upon a")
