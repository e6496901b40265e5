"""The default model through the engine on the code path a CUDA machine runs, on this CPU:
Ferry's C kernels off, the GGUF dequantized to bfloat16 (as CUDA loads it), the attention
chosen at start-up (FlashInfer, here its stand-in from tests/fakes). A chat, prompt-lookup
speculation greedy (the same tokens as without) and sampled (temperature 0.7, the chat
default), and a grammar-constrained reply all finish, and every slot and page comes back."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams, structured
from engine.execution.executor import ModelExecutor
from engine.runtime.handle import TextDelta
from tests.fakes.stand_ins import fake_flashinfer, kernels_off
from tests.tools.engine_runs import assert_all_free

pytestmark = pytest.mark.model
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
REPEAT = ("Repeat this sentence exactly: the old lighthouse keeper climbed the spiral stairs "
          "every evening at dusk and lit the great lamp.")


@pytest.fixture(scope="module")
def stand_in(model_dir: Path, tokenizer: Any) -> Iterator[tuple[Engine, ModuleType]]:
    with pytest.MonkeyPatch.context() as mp, fake_flashinfer(mp) as flashinfer:
        kernels_off(mp)
        config = EngineConfig(max_running=4, kv_tokens=2048, max_context=1024, page_size=16)
        executor = ModelExecutor.from_pretrained(model_dir, config, dtype="bfloat16",
                                                 threads=2)
        assert executor.model.dtype == torch.bfloat16 and executor.fused is None
        assert executor.attention.name == "flashinfer", executor.attention.reason
        eng = Engine(config, executor, tokenizer).start()
        yield eng, flashinfer
        eng.stop()


@pytest.fixture
def engine(stand_in: tuple[Engine, ModuleType]) -> Iterator[Engine]:
    yield stand_in[0]
    assert_all_free(stand_in[0])


def chat(engine: Engine, tokenizer: Any, text: str, params: SamplingParams
         ) -> tuple[list[int], Any, str]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}])
    handle = engine.submit(ids, params)
    tokens: list[int] = []
    final = None
    for ev in handle.events(timeout=300):
        if isinstance(ev, TextDelta):
            tokens.extend(ev.token_ids)
        else:
            final = ev
    return tokens, final, handle.text


def test_greedy_speculation_writes_plain_greedy_tokens(
        engine: Engine, tokenizer: Any, stand_in: tuple[Engine, ModuleType]) -> None:
    plain, _, _ = chat(engine, tokenizer, REPEAT, SamplingParams(max_tokens=16,
                                                                  speculative=False))
    drafted, _, _ = chat(engine, tokenizer, REPEAT, SamplingParams(max_tokens=16))
    assert drafted == plain and len(plain) > 5
    assert engine.snapshot().metrics.drafted_tokens > 0
    runs = {kind for kind, what in stand_in[1].calls if what == "run"}
    assert runs == {"decode", "prefill"}


def test_a_sampled_speculative_chat(engine: Engine, tokenizer: Any) -> None:
    before = engine.snapshot().metrics.drafted_tokens
    for _ in range(3):  # unseeded (so it speculates): a reply may leave the sentence at once
        sampled, final, _ = chat(engine, tokenizer, REPEAT,
                                 SamplingParams(max_tokens=16, temperature=0.7))
        assert sampled and final.finish_reason in ("stop", "length")
        if engine.snapshot().metrics.drafted_tokens > before:
            break
    assert engine.snapshot().metrics.drafted_tokens > before


def test_a_grammar_constrained_reply(engine: Engine, tokenizer: Any) -> None:
    _, final, text = chat(engine, tokenizer, "Describe a person as JSON.",
                          SamplingParams(max_tokens=80,
                                         constraint=structured.json_schema(SCHEMA)))
    assert final.finish_reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)
    assert engine.snapshot().metrics.mask_p50 is not None
