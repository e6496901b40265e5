"""The reasoning splitter: on every way of cutting the text, and on real token streams."""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from engine.text.reasoning import CLOSE, OPEN, Reasoning, ReasoningSplitter, continuation

CASES = [
    # (output, started, reasoning, answer)
    ("<think>\nLet me add: 2+2 is 4.\n</think>\n\nThe answer is 4.", False,
     "Let me add: 2+2 is 4.", "The answer is 4."),
    ("Okay, the user greets me.\n</think>\n\nHello!", True, "Okay, the user greets me.",
     "Hello!"),
    ("  <think>a < b, and </thin is not the tag</think>b", False,
     "a < b, and </thin is not the tag", "b"),
    ("Plain answer, no thinking. <think> later </think> stays.", False, "",
     "Plain answer, no thinking. <think> later </think> stays."),
    ("\n\nIndented answer", False, "", "\n\nIndented answer"),
    ("<think>\n\n</think>\n\nEmpty thoughts.", False, "", "Empty thoughts."),
    ("still thinking when cut", True, "still thinking when cut", ""),
    ("<think>cut inside the tag </thi", False, "cut inside the tag </thi", ""),
    ("<thi", False, "", "<thi"),
    ("<think>日本語 🙂 thought</think>答え 🙂", False, "日本語 🙂 thought", "答え 🙂"),
]


def run(pieces: list[str], started: bool) -> tuple[str, str, list[tuple[str, str]]]:
    split = ReasoningSplitter(started=started)
    deltas = [split.push(p) for p in pieces] + [split.flush()]
    return "".join(r for r, _ in deltas), "".join(c for _, c in deltas), deltas


@pytest.mark.parametrize(("text", "started", "reasoning", "answer"), CASES)
def test_every_single_cut(text: str, started: bool, reasoning: str, answer: str) -> None:
    assert run([text], started)[:2] == (reasoning, answer)
    for cut in range(len(text) + 1):  # `<th` | `ink>`, `</thi` | `nk>`, and every other cut
        assert run([text[:cut], text[cut:]], started)[:2] == (reasoning, answer), cut


@pytest.mark.parametrize(("text", "started", "reasoning", "answer"), CASES)
def test_one_character_at_a_time_and_random_chunks(text: str, started: bool, reasoning: str,
                                                   answer: str) -> None:
    assert run(list(text), started)[:2] == (reasoning, answer)
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(text) + 1), min(4, len(text) + 1)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        assert run(pieces, started)[:2] == (reasoning, answer)


def test_reasoning_streams_before_the_answer_and_is_never_held_long() -> None:
    _, _, deltas = run(["<think>", "step one", " and", " two", "</think>", "done"], False)
    assert deltas[1] == ("step one", "") and deltas[2] == (" and", "")
    assert all(not c for r, c in deltas[:5]) and deltas[5] == ("", "done")


def test_continuation_tails() -> None:
    plain, opened = Reasoning(), Reasoning(started=True)
    assert continuation(plain, "", "Hello") == ("Hello", False)
    assert continuation(plain, "hmm", "") == ("<think>\nhmm", True)
    assert continuation(plain, "hmm", "Hi") == ("<think>\nhmm\n</think>\n\nHi", False)
    assert continuation(opened, "hmm", "") == ("hmm", True)
    assert continuation(opened, "hmm", "Hi") == ("hmm\n</think>\n\nHi", False)
    assert continuation(opened, "", "Hi") == ("</think>\n\nHi", False)


def test_real_token_stream_through_the_detokenizer(tokenizer: Any) -> None:
    """The default model's tokenizer cuts the tags into several tokens (`<`, `think`, `>`):
    streamed one token at a time through the incremental detokenizer, the split is exact."""
    text = ("<think>\nThe user asks for the café's name: “Chez Ÿ” 🙂.\n</think>\n\n"
            "It is called “Chez Ÿ”.")
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids[:1]) != "<think>", "the tags span several tokens here"
    detok = tokenizer.detokenizer()
    split = ReasoningSplitter()
    deltas = [split.push(detok.push(i)) for i in ids]
    deltas += [split.push(detok.flush()), split.flush()]
    assert "".join(r for r, _ in deltas) == "The user asks for the café's name: “Chez Ÿ” 🙂."
    assert "".join(c for _, c in deltas) == "It is called “Chez Ÿ”."
    assert sum(bool(r) for r, _ in deltas) > 5  # streamed, not delivered at the end


def test_handle_splits_single_token_tags_and_stops_on_the_answer_only(
        tokenizer: Any, tmp_path: Path) -> None:
    """A Qwen3-like vocabulary, where `<think>` and `</think>` are tokens of their own: the
    tokenizer says the model thinks (from its vocabulary alone), and a request handle fed
    the token events splits reasoning from answer, with a stop string that also occurs in
    the reasoning ending only the answer."""
    from tokenizers import AddedToken

    from engine.execution.text.template_files import describe_chat_template
    from engine.execution.text.tokenizer import Tokenizer
    from engine.runtime.events import FinalEvent, Timings, TokenEvent, Usage
    from engine.runtime.handle import RequestHandle, TextDelta
    from tests.tools.thinking import with_template

    plain = with_template(tokenizer, tmp_path, tokenizer.hf.chat_template)
    assert not plain.thinks
    plain.hf.add_tokens([AddedToken(OPEN, special=False), AddedToken(CLOSE, special=False)])
    plain.hf.save_pretrained(str(tmp_path))
    tok = Tokenizer(tmp_path)
    assert tok.thinks and "reasoning in <think>" in describe_chat_template(tmp_path)
    ids = tok.encode("<think>\nStop and think.\n</think>\n\nThe answer. Stop here.",
                     add_special_tokens=False)
    assert tok.vocab_size - 2 in ids and tok.vocab_size - 1 in ids  # one token each
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    reasoning = tok.reasoning_for(prompt)
    assert reasoning is not None and not reasoning.started
    cancels: list[str] = []
    handle = RequestHandle("r", "me", prompt, tok, ("Stop",),
                           lambda rid, why: cancels.append(why) or True, reasoning)
    for i in ids:
        handle.put(TokenEvent((i,)))
    handle.put(FinalEvent("length", Usage(len(prompt), len(ids)), Timings(0, 0, 0, 0)))
    deltas = [e for e in handle.events(timeout=5) if isinstance(e, TextDelta)]
    assert "".join(d.reasoning for d in deltas) == handle.reasoning == "Stop and think."
    assert "".join(d.text for d in deltas) == handle.text == "The answer. "
    assert cancels == ["stop"] and handle.final is not None
    assert handle.final.finish_reason == "stop"
