"""The default model as a "thinking model": its own vocabulary under a chat template that
opens a think block in the generation prompt (as Qwen3's thinking templates and the R1
distills do) and takes `enable_thinking`; or under no chat template at all (a base model).

SmolLM2 never saw think tags, but greedy decoding follows a few-shot pattern faithfully:
after FEW_SHOT and the question "4+4?", it writes "Four plus four is eight.\\n</think>\\nA: 8"
and goes on with the next question. So the reply really contains `</think>`, and its
reasoning and answer are known.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.execution.text.tokenizer import Tokenizer

THINKING_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}A: {{ m['content'] }}\n\n"
    "{% else %}{{ m['content'] }}\n\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n"
    "{% else %}<think>\n{% endif %}{% endif %}")
FEW_SHOT = ("Q: 2+2?\n<think>\nTwo plus two is four.\n</think>\nA: 4\n\n"
            "Q: 3+3?\n<think>\nThree plus three is six.\n</think>\nA: 6")
QUESTION = "4+4?"
REASONING = "Four plus four is eight."
ANSWER = "A: 8"


def with_template(tokenizer: Any, folder: Path, template: str | None) -> Tokenizer:
    """The default model's tokenizer saved to `folder` with `template` as its chat template
    (None: without one), loaded back as Ferry loads a model folder."""
    hf = tokenizer.hf
    was = hf.chat_template
    hf.chat_template = template
    try:
        hf.save_pretrained(str(folder))
    finally:
        hf.chat_template = was
    for leftover in ("chat_template.jinja", "chat_template.json"):
        if template is None and (folder / leftover).exists():
            (folder / leftover).unlink()
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": sorted(tokenizer.eos_ids)}))
    return Tokenizer(folder)
