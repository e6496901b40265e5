"""A chat template that reads a message's content only as a list of parts (SmolVLM's loops
over `message['content']` and prints each text part) still gets every message's text: Ferry
hands it a string content as one text part. Templates that take strings are untouched."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

# SmolVLM's template, in the form its Hugging Face folders carry it
PARTS_ONLY = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}"
    "{% endif %}")


@pytest.fixture(scope="module")
def parts_tokenizer(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from engine import Tokenizer

    folder: Path = tmp_path_factory.mktemp("parts-template")
    hf: Any = copy.deepcopy(tokenizer.hf)
    hf.chat_template = PARTS_ONLY
    hf.save_pretrained(folder)
    return Tokenizer(folder)


def test_string_contents_reach_a_parts_only_template(parts_tokenizer: Any) -> None:
    assert parts_tokenizer.content_as_parts
    text = parts_tokenizer.render_chat([{"role": "user", "content": "What is this?"},
                                        {"role": "assistant", "content": "A cat."},
                                        {"role": "user", "content": "Sure?"}])
    assert text == ("<|im_start|>User: What is this?<end_of_utterance>\n"
                    "Assistant: A cat.<end_of_utterance>\nUser: Sure?<end_of_utterance>\n"
                    "Assistant:")


def test_a_string_template_is_untouched(tokenizer: Any) -> None:
    assert not tokenizer.content_as_parts
    assert "hello there" in tokenizer.render_chat([{"role": "user", "content": "hello there"}])
