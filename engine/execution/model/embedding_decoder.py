"""Decoder-based embedding models (Qwen3-Embedding, EmbeddingGemma) from a sentence-transformers
folder: a decoder family's own layers (the registry's CausalLM, loaded as for chat) run over
whole inputs, the final norm's states pooled as the Pooling module says (last token for
Qwen3-Embedding, mean for EmbeddingGemma), passed through the folder's Dense modules and
normalized where a Normalize module is listed. From a GGUF (Qwen3-Embedding's `qwen3` and
EmbeddingGemma's `gemma-embedding`, as llama.cpp's converter writes them): the text model's
blocks as for chat, the pooling its `pooling_type` names, EmbeddingGemma's Dense modules, the
vectors normalized (a GGUF does not say; llama.cpp's server normalizes them too).
Qwen3-Reranker scores a (query, document) prompt by the last token's "yes" against "no": as
published (the LM head's two rows), as its GGUF (rank pooling, `cls.output`: those rows) or as
a one-label sequence classifier (their difference).

Like the BERT encoders they are prefill-only work that keeps no KV: attention runs over each
input's own tokens in a padded block for this round only (`PackedAttention`), causal for a
decoder trained that way, both ways where config.json sets `use_bidirectional_attention`
(EmbeddingGemma; a sliding layer of config.json's window W then sees |i - j| < W // 2 + 1,
as transformers masks it).
The prompt format (Qwen3-Embedding's instruction line) is the client's business.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from engine.execution.model import registry
from engine.execution.model.config import ModelConfig, UnsupportedModel
from engine.execution.model.decoder import CausalLM
from engine.execution.model.pooling import Pooling, modules, pool_states, pooling_of, read_json
from engine.execution.model.weights import SafetensorsSource, load_weights

ACTIVATIONS = {"torch.nn.modules.linear.Identity": None, "torch.nn.modules.activation.Tanh":
               torch.tanh}


@dataclass(frozen=True)
class EmbeddingDecoderConfig:
    family: str  # the model_type
    vocab_size: int
    hidden_size: int  # the width of the vectors answered (after the Dense modules)
    max_seq_length: int
    pooling: Pooling
    normalize: bool
    bidirectional: bool
    matryoshka_dims: tuple[int, ...] = ()
    scores: bool = False  # a reranker (Qwen3-Reranker's GGUF): one relevance per input
    # a reranker's prompt for a (query, document) pair, with {query} and {document}
    rerank_template: str | None = None


@dataclass(frozen=True)
class Dense:
    """A sentence-transformers Dense module: activation(x @ weight.T + bias)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    tanh: bool


class PackedAttention:
    """The attention a decoder layer calls (AttentionBackend's `forward`), over this round's
    packed inputs only: each input attends to its own tokens, causal or both ways, within
    each layer's window. Nothing is stored."""

    def __init__(self, cfg: ModelConfig, lengths: Sequence[int], bidirectional: bool,
                 device: torch.device) -> None:
        n, longest = len(lengths), max(lengths)
        lens = torch.tensor(list(lengths), dtype=torch.int64, device=device)
        starts = torch.cumsum(lens, 0) - lens
        row_in = torch.repeat_interleave(torch.arange(n, device=device), lens)
        col = torch.arange(int(lens.sum()), device=device) - starts[row_in]
        self.slot = row_in * longest + col
        self.n, self.longest, self.scale = n, longest, cfg.scale
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        i = torch.arange(longest, device=device)
        q, k = i[:, None], i[None, :]
        valid_k = (i[None, :] < lens[:, None])[:, None, None, :]  # [n, 1, 1, L]
        pad_q = i[None, :] >= lens[:, None]  # [n, L]
        self.masks: dict[int | None, torch.Tensor] = {}
        for window in set(cfg.windows):
            allowed = torch.ones(longest, longest, dtype=torch.bool, device=device)
            if not bidirectional:
                allowed &= k <= q
            if window is not None:
                # both ways, transformers reads config.json's window W as W // 2 + 1 each
                # side, exclusive (Gemma3TextConfig with use_bidirectional_attention)
                allowed &= (q - k).abs() < window // 2 + 1 if bidirectional \
                    else (q - k) < window
            mask = valid_k & allowed[None, None]
            # padding queries attend to the first key: their rows are dropped, but never NaN
            mask[:, 0, :, 0] |= pad_q
            self.masks[window] = mask
        self.windows = cfg.windows

    def forward(self, q: torch.Tensor, kv: torch.Tensor, layer: int) -> torch.Tensor:
        """q [T, heads, d], kv [T, 2, kv_heads, d] -> [T, heads * d]."""
        rows, h, d = self.n * self.longest, self.heads, self.head_dim
        pq = q.new_zeros(rows, h, d)
        pq[self.slot] = q
        pkv = kv.new_zeros(rows, 2, self.kv_heads, d)
        pkv[self.slot] = kv
        qh = pq.view(self.n, self.longest, h, d).transpose(1, 2)
        kh = pkv[:, 0].view(self.n, self.longest, self.kv_heads, d).transpose(1, 2)
        vh = pkv[:, 1].view(self.n, self.longest, self.kv_heads, d).transpose(1, 2)
        if h != self.kv_heads:
            kh = kh.repeat_interleave(h // self.kv_heads, dim=1)
            vh = vh.repeat_interleave(h // self.kv_heads, dim=1)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=self.masks[self.windows[layer]],
                                             scale=self.scale)
        return out.transpose(1, 2).reshape(rows, h * d)[self.slot]


class _Unprefixed:
    """A folder saved from the bare decoder (AutoModel: `layers.0...`, no LM head) under
    the CausalLM's names (`model.layers.0...`); an LM head or a classifier's `score` row, if
    saved, is left out (a reranker's is read apart)."""

    def __init__(self, inner: SafetensorsSource) -> None:
        self.inner, self.where = inner, inner.where
        self.names = {k if k.startswith("model.") else f"model.{k}": k
                      for k in inner.keys()  # noqa: SIM118 (a source, not a dict)
                      if not k.startswith(("lm_head.", "score."))}

    def keys(self) -> list[str]:
        return list(self.names)

    def matrix(self, keys: list[str], dtype: torch.dtype, device: torch.device | str) -> Any:
        return self.inner.matrix([self.names[k] for k in keys], dtype, device)

    def vector(self, keys: list[str], dtype: torch.dtype,
               device: torch.device | str) -> torch.Tensor:
        return self.inner.vector([self.names[k] for k in keys], dtype, device)


class EmbeddingDecoder:
    """A loaded decoder embedding model: `vectors` of packed inputs."""

    def __init__(self, model: CausalLM, cfg: EmbeddingDecoderConfig,
                 dense: tuple[Dense, ...], judge: torch.Tensor | None = None) -> None:
        self.model, self.config, self.dense = model, cfg, dense
        # a reranker's [2, hidden]: the LM head's "yes" and "no" rows; or [1, hidden], a
        # sequence classifier's row (their difference)
        self.judge = judge

    @property
    def nbytes(self) -> int:
        """The weights as they sit in memory (a GGUF's blocks and packed copies included,
        engine.execution.footprint) and the Dense modules'."""
        from engine.execution.footprint import weight_bytes

        extra = [t for d in self.dense for t in (d.weight, d.bias) if t is not None]
        extra += [self.judge] if self.judge is not None else []
        return weight_bytes(self.model) + sum(t.numel() * t.element_size() for t in extra)

    def hidden(self, ids: torch.Tensor, positions: torch.Tensor,
               lengths: Sequence[int]) -> torch.Tensor:
        """[T] packed ids and positions -> the final norm's states [T, hidden]."""
        m, cfg = self.model, self.model.config
        x = m.model.embed_tokens(ids)
        if cfg.embed_scale is not None:
            x = x * torch.tensor(cfg.embed_scale, dtype=x.dtype, device=x.device)
        tables = [rotary(positions, x.dtype) for rotary in m.model.rotary]
        attn: Any = PackedAttention(cfg, lengths, self.config.bidirectional, x.device)
        residual: torch.Tensor | None = None
        for layer, rope in zip(m.model.layers, m.rope_index, strict=True):
            x, residual = layer(x, residual, *tables[rope], attn)
        out: torch.Tensor = m.model.norm(x) if residual is None \
            else m.model.norm.add_and_norm(x, residual)[0]
        return out

    def vectors(self, ids: torch.Tensor, positions: torch.Tensor,
                lengths: Sequence[int]) -> torch.Tensor:
        """Pooled, through the Dense modules, normalized where the model says: [inputs, dim]
        float32. A reranker's: [inputs, 1], each the probability that the model answers
        "yes" rather than "no" after the last token (Qwen3-Reranker's relevance)."""
        out = pool_states(self.hidden(ids, positions, lengths), self.config.pooling, lengths)
        if self.judge is not None:
            rows = F.linear(out.float(), self.judge)  # [inputs, 2] (yes, no) or [inputs, 1]
            return torch.sigmoid(rows[:, :1] - rows[:, 1:] if rows.shape[1] == 2 else rows)
        for d in self.dense:
            out = F.linear(out, d.weight, d.bias)
            if d.tanh:
                out = torch.tanh(out)
        return F.normalize(out, p=2, dim=1) if self.config.normalize else out


def _dense(folder: Path, dtype: torch.dtype, device: torch.device | str) -> tuple[Dense, ...]:
    from safetensors.torch import load_file

    out = []
    for m in modules(folder):
        if not str(m.get("type", "")).endswith(".Dense"):
            continue
        where = folder / str(m.get("path", ""))
        cfg = read_json(where / "config.json")
        act = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
        if act not in ACTIVATIONS:
            raise UnsupportedModel(f"{where}: activation {act!r} is not supported "
                                   "(Identity or Tanh)")
        file = where / "model.safetensors"
        if not file.is_file():
            raise UnsupportedModel(f"{where} holds no model.safetensors")
        tensors = load_file(str(file))
        weight = tensors["linear.weight"].to(device=device, dtype=torch.float32)
        bias = tensors.get("linear.bias")
        out.append(Dense(weight, None if bias is None else bias.to(device=device,
                                                                     dtype=torch.float32),
                         ACTIVATIONS[act] is not None))
    widths = [(d.weight.shape[1], d.weight.shape[0]) for d in out]
    for (_, w_out), (w_in, _) in itertools.pairwise(widths):
        if w_out != w_in:
            raise UnsupportedModel(f"{folder}: Dense modules of {w_out} then {w_in} inputs")
    del dtype  # the modules run in float32 on the pooled vectors (a few rows)
    return tuple(out)


def load_embedding_decoder(folder: str | Path, dtype: torch.dtype,
                           device: torch.device | str) -> EmbeddingDecoder:
    """The folder's decoder (its registry family, float weights in `dtype`), pooling, Dense
    modules and normalization."""
    folder = Path(folder)
    raw = read_json(folder / "config.json")
    if not registry.is_embedding_decoder(folder, raw):
        raise UnsupportedModel(f"{folder} is not a decoder embedding model ("
                               f"{', '.join(registry.EMBEDDING_DECODERS)} with a Pooling "
                               "module, or a one-label sequence classifier)")
    tied = bool(raw.get("tie_word_embeddings", False))  # Qwen3's default
    raw["tie_word_embeddings"] = True  # the LM head is never used: no copy of it
    arch = registry.for_hf(raw)
    model = arch(arch.config_from_hf(raw), dtype, "meta")
    source = SafetensorsSource(folder, model)
    load_weights(model, _Unprefixed(source), device)
    if registry.is_decoder_scorer(raw):
        return _sequence_classifier(folder, raw, model, source, device)
    if registry.is_decoder_reranker(folder, raw):
        return _published_reranker(folder, raw, model, source, device, tied)
    pooling, normalize = pooling_of(folder)
    dense = _dense(folder, dtype, device)
    width = dense[-1].weight.shape[0] if dense else model.config.hidden_size
    if dense and dense[0].weight.shape[1] != model.config.hidden_size:
        raise UnsupportedModel(f"{folder}: the first Dense module takes "
                               f"{dense[0].weight.shape[1]}, the model gives "
                               f"{model.config.hidden_size}")
    positions = model.config.max_position_embeddings
    st = read_json(folder / "sentence_bert_config.json")
    dims = read_json(folder / "config_sentence_transformers.json").get("matryoshka_dims") \
        or raw.get("matryoshka_dims") or ()
    cfg = EmbeddingDecoderConfig(
        family=str(raw["model_type"]), vocab_size=model.config.vocab_size, hidden_size=width,
        max_seq_length=min(positions, int(st.get("max_seq_length") or positions)),
        pooling=pooling, normalize=normalize,
        bidirectional=bool(raw.get("use_bidirectional_attention")),
        matryoshka_dims=tuple(int(d) for d in dims))
    return EmbeddingDecoder(model, cfg, dense)


def _sequence_classifier(folder: Path, raw: dict[str, Any], model: CausalLM,
                         source: SafetensorsSource, device: torch.device | str
                         ) -> EmbeddingDecoder:
    """Qwen3-Reranker saved as a one-label sequence classifier: its `score` row (the LM
    head's "yes" row minus its "no" row) scores the last token of Qwen's rerank prompt."""
    if "score.weight" not in source.keys():  # noqa: SIM118 (a source, not a dict)
        raise UnsupportedModel(f"{folder}: a sequence classifier without score.weight")
    judge = source.vector(["score.weight"], torch.float32, device)
    width = model.config.hidden_size
    if judge.numel() != width:
        raise UnsupportedModel(f"{folder}: score.weight holds {judge.numel()} numbers, a "
                               f"reranker's one row of {width}")
    judge = judge.reshape(1, width)
    return EmbeddingDecoder(model, _reranker_config(raw, model), (), judge)


def _reranker_config(raw: dict[str, Any], model: CausalLM) -> EmbeddingDecoderConfig:
    """A decoder reranker's: one relevance per input, from its last token, over Qwen's
    rerank prompt."""
    return EmbeddingDecoderConfig(
        family=str(raw["model_type"]), vocab_size=model.config.vocab_size, hidden_size=1,
        max_seq_length=model.config.max_position_embeddings, pooling="lasttoken",
        normalize=False, bidirectional=False, scores=True, rerank_template=RERANK_TEMPLATE)


def _published_reranker(folder: Path, raw: dict[str, Any], model: CausalLM,
                        source: SafetensorsSource, device: torch.device | str,
                        tied: bool) -> EmbeddingDecoder:
    """Qwen3-Reranker as Qwen publishes it (a causal LM): its LM head's "yes" and "no" rows
    (the embeddings' where the head is tied) score the last token of Qwen's rerank prompt,
    as llama.cpp's converter takes them."""
    from tokenizers import Tokenizer as RustTokenizer

    words = folder / "tokenizer.json"
    if not words.is_file():
        raise UnsupportedModel(f"{folder}: a reranker without tokenizer.json (its \"yes\" "
                               "and \"no\" tokens)")
    vocabulary = RustTokenizer.from_file(str(words))
    yes, no = vocabulary.token_to_id("yes"), vocabulary.token_to_id("no")
    del vocabulary  # the whole vocabulary, for two ids
    if yes is None or no is None:
        raise UnsupportedModel(f"{folder}: its vocabulary has no \"yes\" or \"no\" token")
    stored = set(source.keys())
    head = "model.embed_tokens.weight" if tied or "lm_head.weight" not in stored \
        else "lm_head.weight"
    if head not in stored:
        raise UnsupportedModel(f"{folder}: no {head} (the reranker's yes and no rows)")
    judge = source.rows(head, [yes, no], torch.float32, device)
    return EmbeddingDecoder(model, _reranker_config(raw, model), (), judge)


def load_embedding_decoder_gguf(path: str | Path, device: torch.device | str
                                ) -> EmbeddingDecoder:
    """A decoder GGUF that names its pooling (loading.encoder_gguf.decoder_pooling_type): its
    blocks used as they are (on CPU; on a GPU where the kernels pass their self-test).
    EmbeddingGemma's (`gemma-embedding`) attends both ways and keeps its Dense modules as
    `dense_2` and `dense_3` (llama.cpp's converter writes them with
    --sentence-transformers-dense-modules: weights only, no activation)."""
    from engine.execution.loading.encoder_gguf import POOLING, RANK, decoder_pooling_type
    from engine.execution.loading.loader import GGUF, GGUF_DEVICE, load_model

    path = Path(path)
    kind = decoder_pooling_type(path)
    if kind not in POOLING and kind != RANK:
        raise UnsupportedModel(f"{path} is not a decoder embedding model (a qwen3 or "
                               "gemma-embedding GGUF with a pooling type of mean, cls, last "
                               "or rank)")
    from gguf import GGUFReader

    reader = GGUFReader(str(path), "r")  # the tensors beside the text model, read once
    judge, template = (_reranker(path, reader) if kind == RANK else (None, None))
    on_cpu = torch.device(device).type == "cpu"
    model = load_model(path, torch.float32 if on_cpu else torch.bfloat16, device,
                       quantize=GGUF if on_cpu else GGUF_DEVICE)
    mc = model.config
    if judge is not None and tuple(judge.shape) != (2, mc.hidden_size):
        raise UnsupportedModel(f"{path}: cls.output is {list(judge.shape)}, a reranker's is "
                               f"[2, {mc.hidden_size}] (yes, no)")
    dense = tuple(Dense(w.to(device), None, False)
                  for w in (_head_tensor(reader, n) for n in ("dense_2.weight", "dense_3.weight"))
                  if w is not None)
    widths = [mc.hidden_size, *(d.weight.shape[0] for d in dense)]
    for d, width in zip(dense, widths, strict=False):
        if d.weight.shape[1] != width:
            raise UnsupportedModel(f"{path}: a Dense module of {d.weight.shape[1]} inputs "
                                   f"after {width}")
    cfg = EmbeddingDecoderConfig(
        family=mc.model_type, vocab_size=mc.vocab_size,
        hidden_size=1 if judge is not None else widths[-1],
        max_seq_length=mc.max_position_embeddings,
        pooling=POOLING.get(kind or 0, "lasttoken"), normalize=judge is None,
        bidirectional=mc.model_type == "gemma-embedding", scores=judge is not None,
        rerank_template=template)
    return EmbeddingDecoder(model, cfg, dense, None if judge is None else judge.to(device))


def _head_tensor(reader: Any, name: str) -> torch.Tensor | None:
    """A tensor beside the text model (gguf_file.HEAD_TENSORS) in float32, in torch's
    [rows, columns]; None where the file (its GGUFReader) has none."""
    import numpy as np
    from gguf import GGMLQuantizationType, quants

    found = next((t for t in reader.tensors if t.name == name), None)
    if found is None:
        return None
    rows = quants.dequantize(np.asarray(found.data), GGMLQuantizationType(found.tensor_type))
    shape = [int(d) for d in reversed(found.shape.tolist())]
    return torch.from_numpy(np.array(rows, dtype=np.float32).reshape(shape))  # a copy


# Qwen3-Reranker's prompt, as llama.cpp's converter writes it (tokenizer.chat_template.rerank)
RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>"
    "\n<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def _reranker(path: Path, reader: Any) -> tuple[torch.Tensor, str]:
    """A rank-pooling GGUF's judge (`cls.output`: the LM head's "yes" and "no" rows, as
    llama.cpp's converter takes them from Qwen3-Reranker) and its prompt."""
    judge = _head_tensor(reader, "cls.output.weight")
    if judge is None:
        raise UnsupportedModel(f"{path}: a rank-pooling GGUF without cls.output.weight (the "
                               "reranker's yes and no rows)")
    field = reader.fields.get("tokenizer.chat_template.rerank")
    template = str(field.contents()) if field is not None else RERANK_TEMPLATE
    if "{query}" not in template or "{document}" not in template:
        raise UnsupportedModel(f"{path}: its rerank template lacks {{query}} or {{document}}")
    return judge, template
