"""Tokenizer glue: chat template, EOS ids, incremental detokenizing and stop strings.

Uses a tiny byte-level BPE tokenizer built here, so multi-byte characters really are split
across tokens (as they are in GPT-2/Llama 3/Qwen/SmolLM vocabularies).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from engine.execution.text.tokenizer import Tokenizer
from engine.text.stops import StopMatcher

CORPUS = ["hello world", "the quick brown fox", "hello there", "world peace"] * 20
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = TEMPLATE
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    (Path(path) / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 7]}))
    return Tokenizer(path)


TEXT = "héllo wörld 🙂 ✓ 日本語 the quick brown fox ÿ"


def test_multibyte_characters_are_split_across_tokens(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    pieces = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces), "test needs characters split across tokens"


def test_incremental_detokenizer_never_emits_broken_characters(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = tok.detokenizer()
    chunks = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in c for c in chunks)
    assert "".join(chunks) == TEXT


def test_detokenizer_with_prompt_context_and_special_tokens(tok: Tokenizer) -> None:
    prompt = tok.encode("hello there", add_special_tokens=False)
    ids = tok.encode(" world 🙂", add_special_tokens=False) + [tok.hf.eos_token_id]
    detok = tok.detokenizer(prompt)
    out = "".join(detok.push(i) for i in ids) + detok.flush()
    assert out == " world 🙂"  # prompt not repeated, EOS skipped


def test_flush_with_nothing_new_decodes_nothing(tok: Tokenizer,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """An embedding (no tokens after its prompt) or a reply whose text is all out ends
    without decoding its context again."""
    prompt = tok.encode("hello there", add_special_tokens=False)
    ids = tok.encode(" world", add_special_tokens=False)
    detok = tok.detokenizer(prompt)
    assert "".join(detok.push(i) for i in ids) == " world"
    calls: list[object] = []
    monkeypatch.setattr(detok, "_decode", lambda *a: calls.append(a) or "")
    assert detok.flush() == "" and tok.detokenizer(prompt).flush() == ""
    assert not calls


def test_truncated_character_is_flushed_as_replacement(tok: Tokenizer) -> None:
    ids = tok.encode("ok 🙂", add_special_tokens=False)
    detok = tok.detokenizer()
    text = "".join(detok.push(i) for i in ids[:-1])
    assert "\ufffd" not in text
    assert detok.flush().endswith("\ufffd")  # the stream ended mid-character


def test_stop_string_spanning_tokens() -> None:
    m = StopMatcher(["STOP", "\n\n"])
    assert m.push("abc S") == ("abc ", False)
    assert m.push("T") == ("", False)
    assert m.push("OP and more") == ("", True)
    assert m.push("ignored") == ("", True)
    m = StopMatcher(["STOP"])
    assert m.push("ST") == ("", False)
    assert m.push("ART") == ("START", False)  # false start is released
    assert m.push("x ST") == ("x ", False)
    assert m.flush() == "ST"  # held text comes out at the end


def test_stop_matching_is_independent_of_chunking() -> None:
    text = "one two ##END## three"
    for seed in range(20):
        rng = random.Random(seed)
        cuts = sorted(rng.sample(range(1, len(text)), 6))
        parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        m = StopMatcher(["##END##", "never"])
        out, stopped = "", False
        for p in parts:
            emitted, stopped = m.push(p)
            out += emitted
            if stopped:
                break
        assert stopped and out == "one two "


def test_earliest_stop_wins() -> None:
    m = StopMatcher(["cd", "bcde"])
    assert m.push("abcdef") == ("a", True)  # "bcde" starts before "cd"


def test_detokenizer_and_stops_together(tok: Tokenizer) -> None:
    ids = tok.encode("hello wörld STOP the fox", add_special_tokens=False)
    detok, stops = tok.detokenizer(), StopMatcher([" STOP"])
    out = ""
    for i in ids:
        emitted, stopped = stops.push(detok.push(i))
        out += emitted
        if stopped:
            break
    assert stopped and out == "hello wörld"


def test_chat_template_and_eos_ids(tok: Tokenizer) -> None:
    msgs = [{"role": "user", "content": "hello"}]
    ids = tok.apply_chat_template(msgs)
    assert tok.decode(ids, skip_special_tokens=False) == "<|user|>hello</s><|assistant|>"
    assert tok.eos_ids == {tok.hf.eos_token_id, 1, 7}


def test_a_speculative_run_is_streamed_as_tokens_one_at_a_time(tok: Tokenizer) -> None:
    """Several tokens in one event (a speculative round's run): the text, token ids and
    logprobs equal what one event per token gives, and a stop string inside the run ends the
    reply at the token that completes it; the run's later tokens are dropped."""
    from engine.runtime.events import FinalEvent, Timings, TokenEvent, Usage
    from engine.runtime.handle import RequestHandle, TextDelta
    from engine.scheduling.request import TokenLogprob

    ids = tok.encode("hello world the quick brown fox hello there", add_special_tokens=False)
    lps = tuple(TokenLogprob(t, -0.5) for t in ids)
    final = FinalEvent("length", Usage(3, len(ids), 0), Timings(0, 0, 0, 0), None)

    def stream(chunks: list[int], stop: tuple[str, ...]
               ) -> tuple[str, list[int], int, list[str], int]:
        cancels: list[str] = []
        handle = RequestHandle("r", "local", [], tok, stop,
                               lambda rid, reason: cancels.append(reason) is None)
        at = 0
        for n in chunks:
            handle.put(TokenEvent(tuple(ids[at:at + n]), lps[at:at + n]))
            at += n
        handle.put(final)
        events = list(handle.events(timeout=5))
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert isinstance(events[-1], FinalEvent)
        return (text, handle.token_ids, len(handle.logprobs), cancels,
                events[-1].usage.completion_tokens)

    one = [1] * len(ids)
    runs = [3, 1, 4, 2, len(ids) - 10]
    assert stream(runs, ()) == stream(one, ())
    assert stream(runs, ())[0] == "hello world the quick brown fox hello there"
    for stop in (("quick",), ("fox hel",), ("there",)):
        by_token, by_run = stream(one, stop), stream(runs, stop)
        assert by_run == by_token and by_run[3] == ["stop"]
        assert stop[0] not in by_run[0] and len(by_run[1]) == by_run[2] == by_run[4]
    text, kept, _, _, used = stream([len(ids)], ("quick",))  # the whole reply in one run
    assert text == "hello world the " and len(kept) == used < len(ids)
