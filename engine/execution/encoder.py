"""The executor of an embedding model: a round's inputs through a BERT-family encoder, each
input's pooled vector written onto its request.

It meets the scheduler's `Executor` protocol, so embedding requests are queued, admitted,
budgeted and shown like any prompt: they are prefill-only (max_tokens 0, `embed` set), the
scheduler never splits one across rounds (bidirectional attention needs the whole input at
once), and they keep no KV: the scheduler's pages are an admission budget only, and there is
no pool behind them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.execution.cpu import RoundThreads, default_threads, on_fresh_thread
from engine.execution.loading.encoder_gguf import decoder_pooling_type, load_bert_gguf
from engine.execution.loading.loader import choose_dtype
from engine.execution.loading.model_files import is_gguf
from engine.execution.model.architectures.encoders import bert
from engine.execution.model.embedding_decoder import (
    EmbeddingDecoder,
    EmbeddingDecoderConfig,
    load_embedding_decoder,
    load_embedding_decoder_gguf,
)
from engine.execution.model.registry import is_bert_folder, is_encoder_folder
from engine.execution.text.tokenizer import gguf_tokenizer_dir
from engine.scheduling.batch import Batch, Sampled
from engine.scheduling.request import Request


class EncoderExecutor:
    source = "safetensors"
    eos_ids: frozenset[int] = frozenset()
    fused = None  # no fused decode layers: an encoder never decodes

    def __init__(self, weights: bert.BertWeights | EmbeddingDecoder,
                 model_config: bert.BertConfig | EmbeddingDecoderConfig,
                 config: EngineConfig, device: torch.device | str = "cpu",
                 model_path: Path | None = None, threads: int | None = None,
                 sep_id: int | None = None, bf16_products: bool = False) -> None:
        """`weights`: a BERT encoder's, or a loaded decoder embedding model (Qwen3-Embedding,
        EmbeddingGemma) with its config. `bf16_products`: a BERT embedding model's matrices
        multiply in bf16 where the CPU does so in hardware (a cross-encoder's stay float32:
        its scores are compared, not just its directions)."""
        # what the engine accepts for it: embedding requests only; a cross-encoder's "vector"
        # is its one relevance score, its inputs query [SEP] document pairs
        self.task = "score" if model_config.scores else "embed"
        # a decoder reranker's prompt for a pair ({query}, {document}); None: a cross-encoder
        # takes the pair as two segments
        self.rerank_template: str | None = getattr(model_config, "rerank_template", None)
        self.sep_id = sep_id
        self.weights = bert.packed(weights, bf16_products and not model_config.scores) \
            if isinstance(weights, bert.BertWeights) else weights
        self.model_config = model_config
        self.config = config
        self.device = torch.device(device)
        if isinstance(model_config, bert.BertConfig):
            self.family = "nomic-bert" if model_config.rope_theta is not None \
                else "roberta" if model_config.roberta else "bert"
        else:
            self.family = model_config.family
        self.dtype = weights.ln[0].dtype if isinstance(weights, bert.BertWeights) \
            else weights.model.dtype
        self.max_context = model_config.max_seq_length
        self.vocab_size = model_config.vocab_size
        self.dimensions = model_config.hidden_size
        self.matryoshka_dims = model_config.matryoshka_dims
        self.model_path = model_path
        self.tokenizer_path = model_path
        self.threads = threads or default_threads()
        self._round_threads = RoundThreads(self.threads)

    @classmethod
    def from_pretrained(cls, folder: str | Path, config: EngineConfig | None = None, *,
                        dtype: str | torch.dtype = "auto", device: str = "cpu",
                        threads: int | None = None,
                        cache_dir: str | Path | None = None) -> EncoderExecutor:
        """Load a sentence-transformers folder (config.json, safetensors, tokenizer, pooling)
        or a GGUF file (llama.cpp's `bert`, or Qwen3-Embedding's `qwen3` with its pooling
        type; its tokenizer kept as a folder under `cache_dir`, when given). dtype auto:
        float32 on CPU, a BERT embedding model's products in bf16 where the CPU multiplies
        bf16 in hardware (about 1.7x faster products; vectors within cosine 0.9999 of
        float32's), a quantized GGUF's layer matrices in their blocks (Ferry's kernels,
        int8 activations); float32: float32 throughout, blocks dequantized; elsewhere
        bf16/fp16."""
        path = Path(folder)
        # auto on the CPU: bf16 products where native, a quantized GGUF's blocks kept
        bf16 = dtype == "auto" and torch.device(device).type == "cpu"

        def load() -> EncoderExecutor:
            if torch.device(device).type == "cpu":
                torch.set_num_threads(threads or default_threads())
            torch_dtype = torch.float32 if dtype == "auto" and device == "cpu" \
                else choose_dtype(dtype, device)
            if is_gguf(path):
                if decoder_pooling_type(path) is not None:  # Qwen3-Embedding's GGUF
                    decoder = load_embedding_decoder_gguf(path, device)
                    executor = cls(decoder, decoder.config, config or EngineConfig(), device,
                                   path, threads)
                else:
                    cfg, weights = load_bert_gguf(path, torch_dtype, device, blocks=bf16)
                    executor = cls(weights, cfg, config or EngineConfig(), device, path,
                                   threads, bf16_products=bf16)
                executor.source = "gguf"
                if cache_dir is not None:
                    executor.tokenizer_path = gguf_tokenizer_dir(path, cache_dir)
                return executor
            if is_encoder_folder(path) and not is_bert_folder(path):
                decoder = load_embedding_decoder(path, torch_dtype, device)
                return cls(decoder, decoder.config, config or EngineConfig(), device, path,
                           threads)
            cfg = bert.config_from_folder(path)
            weights = bert.load_weights(path, cfg, torch_dtype, device)
            sep = None
            if cfg.scores and cfg.type_vocab_size > 1:  # the pair's separator: token types
                from transformers import AutoTokenizer

                sep = AutoTokenizer.from_pretrained(str(path)).sep_token_id
            return cls(weights, cfg, config or EngineConfig(), device, path, threads, sep,
                       bf16_products=bf16)
        return on_fresh_thread(load)

    def memory_bytes(self) -> int:
        """What the loaded encoder holds: its weights (it keeps no KV)."""
        return self.weights.nbytes

    @property
    def bf16_products(self) -> bool:
        """The float matrices multiply in bf16 (packed so: bert.packed)."""
        return any(isinstance(m, torch.Tensor) and m.dtype == torch.bfloat16
                   for m in self._matrices())

    @property
    def block_types(self) -> tuple[str, ...]:
        """The block types of the layers' matrices kept as a quantized GGUF stores them
        (multiplied by Ferry's kernels); () where every matrix is float."""
        from engine.kernels.quant import QuantWeight

        names = set()
        for m in self._matrices():
            for part in getattr(m, "parts", (m,)):  # a SplitWeight's parts
                if isinstance(part, QuantWeight):
                    names.add(part.type_name)
        return tuple(sorted(names))

    def _matrices(self) -> list[Any]:
        w = self.weights
        if not isinstance(w, bert.BertWeights):
            return []
        return [m for it in w.layers for m in (it.qkv_w, it.o_w, it.up_w, it.down_w, it.gate_w)
                if m is not None]

    def describe(self) -> str:
        cfg = self.model_config
        size = self.weights.nbytes / 1e6
        dtype = str(self.dtype).removeprefix("torch.")
        if self.block_types:
            dtype += f", layers in {'/'.join(self.block_types)} blocks"
        if cfg.scores:
            return (f"{self.family}: {self.source} {dtype}, cross-encoder (reranker), "
                    f"{size:.0f} MB")
        if self.bf16_products:
            dtype += " (bf16 products)"
        return (f"{self.family}: {self.source} {dtype}, embeddings of {cfg.hidden_size} "
                f"({cfg.pooling} pooling"
                f"{', normalized' if cfg.normalize else ''}), {size:.0f} MB")

    @property
    def nbytes(self) -> int:
        return self.weights.nbytes

    # --- Executor protocol ------------------------------------------------------------------

    def run(self, batch: Batch) -> list[Sampled]:
        if self.device.type == "cpu":
            self._round_threads.fit()
        items = batch.items
        for it in items:
            if it.start != 0 or it.num_tokens != it.request.prompt_len or it.sample:
                raise ValueError(f"{it.request.id}: an encoder runs whole inputs only")
        if not items:
            return []
        lengths = [it.num_tokens for it in items]
        ids = [t for it in items for t in it.request.prompt_ids]
        positions = [p for n in lengths for p in range(n)]
        types = [0] * len(ids) if self.sep_id is None else \
            [t for it in items for t in bert.token_types(it.request.prompt_ids, self.sep_id)]
        dev = self.device

        def as_tensor(xs: list[int]) -> torch.Tensor:
            return torch.tensor(xs, dtype=torch.int64, device=dev)

        with torch.inference_mode():
            if isinstance(self.weights, EmbeddingDecoder):
                vectors = self.weights.vectors(as_tensor(ids), as_tensor(positions),
                                               lengths).cpu()
                for it, vec in zip(items, vectors):
                    it.request.embedding = vec.tolist()
                return [None] * len(items)
            assert isinstance(self.model_config, bert.BertConfig)
            hidden = bert.encode(self.weights, self.model_config, as_tensor(ids),
                                 as_tensor(positions), as_tensor(types), lengths)
            if self.model_config.scores:
                vectors = bert.score(hidden, self.weights, lengths)[:, None].cpu()
            else:
                vectors = bert.pool(hidden, self.model_config, lengths).cpu()
        for it, vec in zip(items, vectors):
            it.request.embedding = vec.tolist()
        return [None] * len(items)

    def release(self, request: Request) -> None:
        pass  # nothing per request outlives its round
