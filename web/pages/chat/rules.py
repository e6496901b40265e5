"""The chat's rules that need no engine: a conversation's settings (the Settings form's
rules, which the import follows too), titles, where a reply stands among its versions, and
how much of a long conversation one page shows."""
from __future__ import annotations

from dataclasses import dataclass

from web.storage.store import Message, Store


class ChatError(Exception):
    """An action the chat refuses (shown to the user as a notice)."""

    def __init__(self, message: str, status_code: int = 409) -> None:
        super().__init__(message)
        self.status_code = status_code


SETTING_NAMES = {"system_prompt": "system prompt", "temperature": "temperature",
                 "top_p": "top_p", "max_tokens": "max tokens"}
Settings = tuple[str | None, float | None, float | None, int | None]


def check_settings(max_tokens_limit: int, system_prompt: str | None, temperature: float | None,
                   top_p: float | None, max_tokens: float | None,
                   names: dict[str, str]) -> Settings:
    """A conversation's settings (None: the server's default) by the Settings form's rules,
    which the import follows too; raises ChatError (400) naming the field as `names` says."""
    def within(value: float | None, name: str, low: float, high: float) -> None:
        if value is not None and not low <= value <= high:  # NaN fails too
            raise ChatError(f"{names[name]} must be between {low:g} and {high:g}", 400)
    within(temperature, "temperature", 0.0, 2.0)
    within(top_p, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ChatError(f"{names['top_p']} must be above 0", 400)
    within(max_tokens, "max_tokens", 1, max_tokens_limit)
    if max_tokens is not None and max_tokens != int(max_tokens):
        raise ChatError(f"{names['max_tokens']} must be a whole number", 400)
    return (system_prompt, temperature, top_p, None if max_tokens is None else int(max_tokens))


def title_for(content: str, limit: int = 60) -> str:
    line = " ".join(content.split())
    return line if len(line) <= limit else line[:limit - 1].rstrip() + "…"


# A page shows a conversation's latest messages up to these bounds and offers the earlier
# ones a page at a time: what one view costs (rendering, the page's size, the server's share
# of both) is bounded however long the conversation grows or an import makes it.
PAGE_MESSAGES = 40
PAGE_CHARS = 96 * 1024  # of message text, reasoning included


@dataclass(frozen=True, slots=True)
class Earlier:
    """What a page leaves out before its first message: how many, and where the next page
    of them ends (the id of the first message shown)."""

    count: int
    before: int


def latest_page(messages: list[Message]) -> tuple[list[Message], Earlier | None]:
    """The last messages that fit a page (at least one; a reply with its question where the
    bounds allow), and what is left before them."""
    start, chars = len(messages), 0
    while start > 0 and len(messages) - start < PAGE_MESSAGES:
        m = messages[start - 1]
        chars += len(m.content or "") + len(m.reasoning or "")
        if chars > PAGE_CHARS and start < len(messages):
            break
        start -= 1
    if 0 < start < len(messages) and messages[start].role == "assistant":
        question = messages[start - 1]  # a reply reads best with its question, if short
        if question.role == "user" and len(question.content or "") <= PAGE_CHARS // 8:
            start -= 1
    shown = messages[start:]
    return shown, (Earlier(start, shown[0].id) if start else None)


@dataclass(frozen=True, slots=True)
class Version:
    """Where a reply stands among the versions of its group (‹index/count›)."""

    index: int  # 1-based
    count: int
    previous: int | None  # message ids to switch to
    next: int | None


def version_nav(store: Store, messages: list[Message]) -> dict[int, Version]:
    """Version navigation for the replies of `messages` that have more than one version."""
    nav: dict[int, Version] = {}
    for m in messages:
        if m.role != "assistant":
            continue
        ids = [v.id for v in store.versions(m.group)]
        if len(ids) > 1 and m.id in ids:
            i = ids.index(m.id)
            nav[m.id] = Version(i + 1, len(ids), ids[i - 1] if i else None,
                                ids[i + 1] if i + 1 < len(ids) else None)
    return nav
