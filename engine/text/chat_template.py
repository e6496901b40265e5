"""The chat template a model chats with, named the same in the banner, /v1/models and
`ferry doctor`.

A file without a chat template (a base model, such as Gemma 3 270M) still chats, through
FALLBACK_TEMPLATE: a plain "User: ... / Assistant:" transcript after the BOS token, with
"\\nUser:" as a stop string so the model does not go on to write the user's next turn.
"""
from __future__ import annotations

from engine.text.reasoning import CLOSE, OPEN

FALLBACK_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% else %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}")
FALLBACK_NAME = "plain fallback (User:/Assistant:; the model has no chat template)"
FALLBACK_STOPS = ("\nUser:",)


def chat_template_name(has_own: bool, thinks: bool = False) -> str:
    if not has_own:
        return FALLBACK_NAME
    return "the model's own" + (f" (reasoning in {OPEN}...{CLOSE} shown apart)" if thinks else "")
