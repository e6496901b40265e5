"""Tiny random Llama-family checkpoints and a harness that drives ModelExecutor round by round.

Each tiny model is built with transformers, given non-trivial biases and norm weights (HF
initialises them to 0 and 1, which would hide mapping mistakes), saved with save_pretrained,
and loaded both by HF (the reference) and by our loader, in float32.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.execution.executor import ModelExecutor
from engine.scheduling.batch import Batch, BatchItem
from engine.scheduling.request import Request, SamplingParams

VOCAB = 320
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "initializer_range": 0.2,
          "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _configs() -> dict[str, object]:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config
    return {
        "llama": LlamaConfig(**COMMON, tie_word_embeddings=False),
        # llama3 rope scaling, biases everywhere, MQA, tied embeddings (SmolLM2-like)
        "llama3": LlamaConfig(**{**COMMON, "num_key_value_heads": 1}, attention_bias=True,
                              mlp_bias=True, tie_word_embeddings=True,
                              rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0,
                                               "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 32}),
        "mistral": MistralConfig(**COMMON, sliding_window=None),
        "qwen2": Qwen2Config(**COMMON, tie_word_embeddings=False),
        "qwen3": Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=False),
    }


ARCHS = ["llama", "llama3", "mistral", "qwen2", "qwen3"]


@dataclass
class TinyModel:
    name: str
    path: Path
    hf: torch.nn.Module

    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return self.hf(torch.tensor([ids])).logits[0].float().cpu()


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    from transformers import AutoModelForCausalLM
    out = {}
    for name, cfg in _configs().items():
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        with torch.no_grad():
            for pname, p in hf.named_parameters():
                if "norm" in pname:
                    p.copy_(1 + 0.2 * torch.randn_like(p))
                elif pname.endswith("bias"):
                    p.copy_(0.2 * torch.randn_like(p))
        path = tmp_path_factory.mktemp(name)
        hf.save_pretrained(path)
        out[name] = TinyModel(name, path, hf)
    return out


@pytest.fixture(params=ARCHS)
def tiny(request: pytest.FixtureRequest, tiny_models: dict[str, TinyModel]) -> TinyModel:
    return tiny_models[request.param]


@dataclass
class Harness:
    """A minimal stand-in for the scheduler: page allocation and round execution."""

    executor: ModelExecutor
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    free: list[int] = field(default_factory=list)
    logits: dict[str, dict[int, torch.Tensor]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.free = list(range(self.executor.pool.num_pages))
        self.rng.shuffle(self.free)  # non-contiguous page tables

    @property
    def page_size(self) -> int:
        return self.executor.page_size

    def new(self, prompt: list[int], shared_pages: list[int] | None = None,
            **params: object) -> Request:
        req = Request(list(prompt), SamplingParams(**{"max_tokens": 64, **params}))
        req.pages = list(shared_pages or [])
        self.logits[req.id] = {}
        return req

    def cover(self, req: Request, end: int) -> None:
        while len(req.pages) * self.page_size < end:
            req.pages.append(self.free.pop())

    def round(self, work: list[tuple[Request, int, int, bool]], phase: str = "prefill",
              use_run: bool = False) -> list[int | None]:
        """work: (request, start, num_tokens, sample). Appends sampled tokens (greedy)."""
        for req, start, n, _ in work:
            self.cover(req, start + n)
        items = tuple(BatchItem(r, s, n, smp) for r, s, n, smp in work)
        batch = Batch(phase, items)  # type: ignore[arg-type]
        if use_run:
            tokens = self.executor.run(batch)
        else:
            logits, rows = self.executor.compute_logits(batch)
            tokens = [None] * len(work)
            for row, i in enumerate(rows):
                req, start, n, _ = work[i]
                self.logits[req.id][start + n - 1] = logits[row].float().cpu()
                tokens[i] = int(logits[row].argmax())
        for (req, start, n, smp), tok in zip(work, tokens):
            if smp:
                assert tok is not None
                req.output_ids.append(tok)
        return tokens

    def prefill(self, reqs: list[Request]) -> None:
        self.round([(r, 0, r.prompt_len, True) for r in reqs])

    def decode(self, reqs: list[Request], steps: int) -> None:
        for _ in range(steps):
            self.round([(r, r.num_tokens - 1, 1, True) for r in reqs], "decode")


def make_executor(path: Path, page_size: int = 4, kv_tokens: int = 8192,
                  dtype: torch.dtype = torch.float32, device: str = "cpu",
                  backend: str | None = None) -> ModelExecutor:
    cfg = EngineConfig(page_size=page_size, kv_tokens=kv_tokens, max_running=64)
    # one thread: tiny models are overhead-bound, and a busy machine cannot starve a team
    return ModelExecutor.from_pretrained(path, cfg, dtype=dtype, device=device, backend=backend,
                                         threads=1)


@pytest.fixture
def harness(tiny: TinyModel, kernels: str) -> Harness:
    return Harness(make_executor(tiny.path))


def check_against_hf(tiny: TinyModel, h: Harness, reqs: list[Request],
                     atol: float = 1e-4) -> None:
    """Every recorded logits row equals HF's at that position; greedy tokens are HF's argmax."""
    for req in reqs:
        full = req.prompt_ids + req.output_ids
        ref = tiny.hf_logits(full)
        recorded = h.logits[req.id]
        assert recorded, f"{req.id} recorded no logits"
        for pos, row in recorded.items():
            where = f"{req.id} position {pos}"
            torch.testing.assert_close(row, ref[pos], atol=atol, rtol=1e-4,
                                       msg=lambda m, where=where: f"{where}: {m}")
        for i, tok in enumerate(req.output_ids):
            assert tok == int(ref[req.prompt_len - 1 + i].argmax()), (req.id, i)


@pytest.fixture
def check() -> object:
    return check_against_hf


@pytest.fixture
def make_harness() -> object:
    return lambda path, **kw: Harness(make_executor(path, **kw))
