"""What a user may learn about the server's files: admins (and the local user, who is one) see
load errors as they are; a normal user of a shared server sees the model's name, never a path
(where Ferry's files, models or home folders lie is the admin's business).

A load failure is named by its model alone; any other text shown to a normal user has its
absolute paths replaced (a last guard: a library's message may hold one).
"""
from __future__ import annotations

import dataclasses
import re

from engine import FinalEvent, ModelInfo
from web.access.users import User

HIDDEN = "<path>"
# an absolute path (POSIX, home-relative or a Windows drive), not a part of a word or URL
_PATH = re.compile(r"(?<![\w/\\.:~])(?:[A-Za-z]:[/\\]|~?/|\\\\)[^\s'\"`,;:()\[\]{}<>]+")
UNAVAILABLE = "model_unavailable"  # FinalEvent.extra: the model whose load failed


def sees_details(user: User) -> bool:
    return user.is_admin


def hide_paths(text: str) -> str:
    return _PATH.sub(HIDDEN, text)


def shown(text: str, user: User) -> str:
    """`text` as `user` may see it."""
    return text if sees_details(user) else hide_paths(text)


def load_failed(model: str, detail: str | None, user: User) -> str:
    """Why `model` is not available, as `user` may see it."""
    return detail if detail and sees_details(user) else f"the model {model} could not be loaded"


def final_error(final: FinalEvent, user: User) -> tuple[str, bool]:
    """A failed request's message for `user`, and whether it failed because its model could
    not be loaded (then the answer is 503, not 500)."""
    model = final.extra.get(UNAVAILABLE)
    if model is not None:
        return load_failed(str(model), final.error, user), True
    return shown(final.error or "generation failed", user), False


def model_info(info: ModelInfo, user: User) -> ModelInfo:
    """A model as `user` may see it: for a normal user no path in its details, its
    last load error named by the model, the reason a file cannot run without paths."""
    if sees_details(user):
        return info
    details = {k: hide_paths(v) if isinstance(v, str) else v
               for k, v in info.details.items() if k != "path"}
    return dataclasses.replace(info, runs=hide_paths(info.runs), details=details,
                               error=load_failed(info.name, None, user) if info.error else None)
