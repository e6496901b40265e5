"""Constrained decoding in the engine on the default model: every token a constrained request
samples is consumed by its matcher, its output matches the grammar, it ends with `stop` when
the grammar is complete (`length` at max_tokens), and an unconstrained neighbour in the same
rounds gets the very tokens it gets alone. Slots and KV all come back, cancels included."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams, structured
from engine.execution.executor import ModelExecutor
from engine.execution.sampling.grammar_masks import unpack

pytestmark = pytest.mark.model
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


def test_unpack_reads_bits_in_order() -> None:
    bitmask = torch.tensor([[0b101, -1]], dtype=torch.int32)  # ids 0 and 2; all of 32..63
    allowed = unpack(bitmask, 40)
    assert allowed.shape == (1, 40)
    assert allowed[0, :3].tolist() == [True, False, True] and not allowed[0, 3:32].any()
    assert allowed[0, 32:].all()
    assert unpack(bitmask, 70)[0, 64:].sum() == 0  # ids past the mask are never allowed


@pytest.fixture(scope="module")
def engine(weights: Any, model_dir: Path, tokenizer: Any) -> Any:
    config = EngineConfig(max_running=4, kv_tokens=4096, max_context=2048)
    executor = ModelExecutor(weights, config, "cpu", None, tokenizer.eos_ids, model_dir)
    eng = Engine(config, executor, tokenizer).start()
    yield eng
    eng.stop()


def run(engine: Any, tokenizer: Any, text: str, params: SamplingParams) -> Any:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    return engine.submit(ids, params)


def finish(handle: Any) -> tuple[str, Any]:
    events = list(handle.events(timeout=120))
    return handle.text, events[-1]


def test_constrained_beside_unconstrained(engine: Any, tokenizer: Any) -> None:
    plain = SamplingParams(max_tokens=24)
    alone_text, _ = finish(run(engine, tokenizer, "Tell me about cats.", plain))
    constrained = SamplingParams(max_tokens=200, constraint=structured.json_schema(SCHEMA))
    handles = [run(engine, tokenizer, "Describe a person as JSON.", constrained),
               run(engine, tokenizer, "Tell me about cats.", plain),
               run(engine, tokenizer, "Describe a dog as JSON.", constrained)]
    (a, fa), (b, _), (c, fc) = (finish(h) for h in handles)
    assert b == alone_text  # the neighbour's rows are never touched
    for text, final in ((a, fa), (c, fc)):
        assert final.finish_reason == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
    assert engine.wait_idle(10)
    snap = engine.snapshot()
    assert snap.free_slots == 4 and snap.kv.used == 0
    assert snap.metrics.mask_p50 is not None
    assert dict(snap.metrics.structured_requests)["json_schema"] >= 2


def test_length_and_cancel_free_everything(engine: Any, tokenizer: Any) -> None:
    params = SamplingParams(max_tokens=6, constraint=structured.json_object())
    text, final = finish(run(engine, tokenizer, "Some JSON please", params))
    assert final.finish_reason == "length" and final.usage.completion_tokens == 6
    assert text.startswith("{")
    long = SamplingParams(max_tokens=400, ignore_eos=True,
                          constraint=structured.regex("(ab){300}"))
    handle = run(engine, tokenizer, "Repeat ab", long)
    for event in handle.events(timeout=60):
        if getattr(event, "text", ""):
            break
    handle.cancel()
    text, final = finish(handle)
    assert final.finish_reason == "cancelled" and set(text) <= {"a", "b"}
    assert engine.wait_idle(10)
    assert engine.snapshot().free_slots == 4 and engine.snapshot().kv.used == 0


def test_a_grammar_that_does_not_compile_is_refused(engine: Any, tokenizer: Any) -> None:
    from engine import RequestError

    bad = SamplingParams(constraint=structured.json_schema({"type": "nope"}))
    with pytest.raises(RequestError, match="Invalid type"):
        run(engine, tokenizer, "x", bad)


@pytest.mark.parametrize(("constraint", "answer"), [
    (structured.json_schema(SCHEMA), '{"name": "Ann", "age": 7}'),
    (structured.regex("[0-9]{2}"), "42"),
    (structured.choice(["yes", "no"]), "no"),
    (structured.lark('start: "A: " /[0-9]/'), "A: 8")])
def test_after_thinking_the_reasoning_comes_first(tokenizer: Any, constraint: Any,
                                                   answer: str) -> None:
    """A prompt that opened a think block: free reasoning up to `</think>`, then the grammar."""
    compiler = structured.GrammarCompiler(tokenizer.hf)
    thinking = structured.after_thinking(constraint, "</think>")

    def accepts(text: str) -> bool:
        matcher = compiler.matcher(thinking)
        ids = tokenizer.hf.encode(text, add_special_tokens=False)
        return all(matcher.consume_token(t) for t in ids) and matcher.is_accepting()

    assert accepts("Let me see: <b>{not json}</b>.\n</think>\n" + answer)
    assert not accepts("Hmm.\n</think>\nmaybe " + answer)  # the answer is still constrained
    assert not accepts(answer)  # no reasoning closed: not done yet
