"""The model side of a round: pack a Batch, run the decoder over the paged KV pool, sample.

Implements the scheduler's `Executor` protocol. Per round it builds one packed input (token
ids, positions, KV slots; sequences with one new token first, as the attention backends
want), prepares the backend's index tensors once, runs the model with the LM head only on
the rows that sample, and samples each of those with its request's parameters.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.execution.attention import get_backend
from engine.execution.attention.base import AttentionInputs, LocalInputs
from engine.execution.attention.choice import BackendChoice, choose
from engine.execution.cpu import (
    RoundThreads,
    default_threads,
    on_fresh_thread,
    reuse_freed_memory,
)
from engine.execution.footprint import device_memory, fit_kv_tokens, weight_bytes
from engine.execution.host import to_device
from engine.execution.image_encoder import ImageEncoder
from engine.execution.kv_pool import KVPool, LocalTables, slot_of
from engine.execution.loading.loader import load_model, pool_dtype, resolve_model, weight_mode
from engine.execution.loading.model_files import is_gguf
from engine.execution.loading.projector_gguf import projector_for
from engine.execution.model.decoder import CausalLM
from engine.execution.model.fused_decode import FusedDecode, per_row_rows
from engine.execution.model.layers.linear import Linear
from engine.execution.model.vision import VisionConfig
from engine.execution.residency import (
    Footprint,
    Measured,
    model_tensors,
    release_unused_file_pages,
    resident,
    storages,
    weights_resident,
)
from engine.execution.sampling.grammar_masks import MaskWorker, consume
from engine.execution.sampling.sampler import Sampler
from engine.execution.sampling.verify import verify_items
from engine.execution.text.tokenizer import gguf_tokenizer_dir, read_eos_ids
from engine.scheduling.admission import image_ahead
from engine.scheduling.batch import Batch, Sampled
from engine.scheduling.request import Request, TokenLogprob
from engine.vision import ImageInput, mrope_positions

log = logging.getLogger(__name__)


class ModelExecutor:
    def __init__(self, model: CausalLM, config: EngineConfig,
                 device: torch.device | str = "cpu", backend: str | None = None,
                 eos_ids: frozenset[int] = frozenset(), model_path: Path | None = None,
                 threads: int | None = None) -> None:
        cfg = model.config
        self.model = model
        self.config = config
        self.device = torch.device(device)
        self.dtype = model.dtype
        self.page_size = config.page_size
        # local layers: those whose window is shorter than the context. They keep K/V for
        # the widest such window only, in a pool of their own (engine.scheduling.sliding_kv)
        windows = tuple(w if w and w < config.max_context else None for w in cfg.windows)
        self.sliding_window = max((w for w in windows if w), default=0)
        num_local = sum(1 for w in windows if w)
        kv_dtype = pool_dtype(config.kv_dtype, model.dtype, model.quantized)
        local_pages = replace(config, sliding_window=self.sliding_window).num_local_pages
        memory = device_memory(self.device)
        if memory is not None:  # the KV pool fitted beside the weights (the Engine adopts it)
            per_token = KVPool.bytes_per_token(1, cfg.num_kv_heads, cfg.head_dim, kv_dtype)
            kv_tokens = fit_kv_tokens(config.kv_tokens, config.page_size,
                                      per_token * (cfg.num_layers - num_local), *memory,
                                      other=per_token * num_local * local_pages
                                      * config.page_size)
            self.config = config = replace(config, kv_tokens=kv_tokens)
        self.pool = KVPool(cfg.num_layers - num_local, config.num_pages, config.page_size,
                           cfg.num_kv_heads, cfg.head_dim, kv_dtype, self.device)
        self.local_pool = None if not num_local else KVPool(
            num_local, local_pages, config.page_size, cfg.num_kv_heads, cfg.head_dim,
            kv_dtype, self.device)
        if backend is not None:  # asked for by name: that one, or its error
            self.attention = BackendChoice(backend, "requested")
        else:
            self.attention = choose(self.device, kv_dtype, cfg.num_heads, cfg.num_kv_heads,
                                    cfg.head_dim, cfg.scale, config.page_size, windows,
                                    whole_images=cfg.vision is not None
                                    and cfg.vision.whole_images)
        self.attn = get_backend(self.attention.name)(
            self.pool, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.scale, windows,
            self.local_pool)
        # decode rounds of a few sequences run each layer in one C call where the model's
        # layers are the fused recipe's (built from the model's neutral description)
        self.fused = FusedDecode.build(cfg, model.decode_layers(), model.dtype, model)
        self.sampler = Sampler()
        # a vision model's images, encoded in the rounds that reach them
        self.images = ImageEncoder(model, self.device) if model.takes_images else None
        self.masks = MaskWorker(cfg.vocab_size)
        self.eos_ids = eos_ids
        self.max_context = cfg.max_context
        self.vocab_size = cfg.vocab_size
        self.model_path = model_path  # the .gguf file or the folder loaded
        self.tokenizer_path = model_path  # a folder (or .gguf) Tokenizer() loads from
        # torch's intra-op thread count is per calling thread under OpenMP: set on the thread
        # that runs rounds, at each round (engine.execution.cpu.RoundThreads)
        self.threads = threads or default_threads()
        self._round_threads = RoundThreads(self.threads)

    @classmethod
    def from_pretrained(cls, model: str | Path | None = None, config: EngineConfig | None = None,
                        *, dtype: str | torch.dtype = "auto", device: str = "cpu",
                        cache_dir: str | Path | None = None, backend: str | None = None,
                        threads: int | None = None, progress: bool = True,
                        quantize: str | None = None,
                        tokenizer_cache: str | Path | None = None,
                        projector: str | Path | None = None,
                        projector_quantize: str = "q8_0") -> ModelExecutor:
        """Load `model` (None = the default SmolLM2 GGUF; a HF folder; a .gguf file; or a hub
        id) and size the KV pool from `config`. dtype auto on CPU runs a GGUF in its own
        quantization; `quantize` ("q8_0" / "q4_0") quantizes a float folder once, at load.
        A GGUF's tokenizer is kept under `tokenizer_cache` (tokenizer files only; default
        `cache_dir`). A GGUF vision model's `projector` file (llama.cpp's mmproj) is the one
        given, else the one beside the file (projector_gguf.projector_for), if any; where
        the text model runs in its blocks, the tower's float matrices are quantized to
        `projector_quantize` at load ("q8_0"; "none": they stay float, as the file has them).

        Runs on a short-lived thread so that the engine thread's OpenMP team is the only one
        afterwards (engine.execution.cpu explains why that halves small-batch step times)."""
        def load() -> ModelExecutor:
            if torch.device(device).type == "cpu":
                torch.set_num_threads(threads or default_threads())
                reuse_freed_memory()
            path = resolve_model(model, cache_dir, progress)
            torch_dtype, quant = weight_mode(path, dtype, device, quantize)
            paired = projector_for(path, projector)
            net = load_model(path, torch_dtype, device, quant, paired, projector_quantize)
            net.pack_weights()
            log.info("loaded %s as %s on %s", path, quant or torch_dtype, device)
            gguf = is_gguf(path)
            if gguf:  # the file's blocks that loading copied elsewhere: held once, not twice
                held = model_tensors(net)
                for file in (path, paired) if paired is not None else (path,):
                    release_unused_file_pages(str(file), held)
            eos = net.eos_ids if gguf else read_eos_ids(path)
            ex = cls(net, config or EngineConfig(), device, backend, eos, path, threads)
            tokenizers = tokenizer_cache or cache_dir
            if gguf and tokenizers is not None:
                ex.tokenizer_path = gguf_tokenizer_dir(path, tokenizers)
            ex.source = "GGUF" if gguf else "safetensors"
            ex.projector = paired if net.takes_images else None
            return ex
        with Measured() as grew:  # and gives the allocator's slack of loading back
            ex = on_fresh_thread(load)
        parts = ex.footprint()
        ex.load_other = max(0, grew.bytes - parts.weights - parts.kv)
        return ex

    source = ""  # "GGUF" / "safetensors" when loaded from_pretrained
    projector: Path | None = None  # a GGUF vision model's projector file

    @property
    def vision(self) -> VisionConfig | None:
        """A vision model's image side (its processor, tokens per image); None: text."""
        vision: VisionConfig | None = self.model.config.vision
        return vision

    def describe(self) -> str:
        """How the model runs, in one line: e.g. "GGUF Q4_1 + Q8_0 head, native AVX2
        kernels, 98 MB" or "safetensors float32, 538 MB"."""
        from engine.execution.model.describe import describe_weights

        return describe_weights(self.model, self.source, self.projector)

    # --- Executor protocol ------------------------------------------------------------------

    def run(self, batch: Batch) -> list[Sampled]:
        out = self._forward(batch)
        if batch.encodes:  # after the forward: its chunks' image rows stay cached for it
            self.encode_ahead(batch.encodes)
        return out

    def _forward(self, batch: Batch) -> list[Sampled]:
        items = batch.items
        out: list[Sampled] = [None] * len(items)
        if not items:
            return out
        # the constrained rows' masks are filled on a worker while the forward runs
        job = self.masks.start([it.request for it in items
                                if it.sample and it.request.matcher is not None])
        with torch.inference_mode():
            logits, sample_items = self.compute_logits(batch)
            if any(it.drafts for it in items):  # speculative items: verified, not sampled
                logits, sample_items = verify_items(logits, sample_items, items, out,
                                                    self.sampler.generator, token_logprobs)
            reqs = [items[i].request for i in sample_items]
            wanted = [row for row, r in enumerate(reqs) if r.params.logprobs is not None]
            # a copy: the model's own distribution, before temperature / top-k / top-p / mask
            raw = logits[wanted] if wanted else None
            if job is not None:
                row_of = {id(r): row for row, r in enumerate(reqs)}
                job.apply(logits, [row_of[id(r)] for r in job.requests])
            tokens = self.sampler.sample(logits, [r.params for r in reqs], [r.id for r in reqs])
            if job is not None:
                consume(reqs, tokens)
            if raw is not None:
                scored = token_logprobs(raw, [tokens[row] for row in wanted],
                                        max(reqs[row].params.logprobs or 0 for row in wanted))
                for row, lp in zip(wanted, scored):
                    reqs[row].output_logprobs.append(trim(lp, reqs[row].params.logprobs or 0))
        for i, tok in zip(sample_items, tokens):
            out[i] = tok
        return out

    def release(self, request: Request) -> None:
        self.sampler.release(request.id)
        if self.images is not None and request.images:
            self.images.drop(request.images)

    @property
    def image_ready(self) -> Callable[[str], bool] | None:
        """Whether an image's encoder output is cached (the scheduler's Scheduler.image_ready:
        a chunk waits for it), for a vision model; None for a text model."""
        return None if self.images is None else self.images.has

    @property
    def image_progress(self) -> Callable[[str], str | None] | None:
        """How far an image's encoder has got ("layer 3 of 27"; None: not begun), for the
        wait reason; None for a text model."""
        if self.images is None or self.model.config.vision is None:
            return None
        images, layers = self.images, self.model.config.vision.layers

        def progress(digest: str) -> str | None:
            done = images.layers_done(digest)
            return None if done is None else f"layer {min(done + 1, layers)} of {layers}"
        return progress

    def encode_ahead(self, requests: Sequence[Request]) -> None:
        """A slice of encoder work on the next image of each of these requests whose rows
        are not cached (the scheduler lists a request only when that image comes next once
        this round's chunk is computed)."""
        if self.images is None:
            raise ValueError(f"{self.model.config.model_type} takes no images")
        self._bind_threads()
        found = (image_ahead(req, self.images.has) for req in requests)
        ahead = [image for image in found if image is not None]
        with torch.inference_mode():
            self.images.advance(ahead)

    @property
    def decode_rows(self) -> int:
        """Rows a decode round multiplies row by row (int8 products, fused layers or not): a
        speculative round's drafts stay within it, so each row's numbers are those of plain
        decoding (and its cost grows little per row)."""
        if self.fused is not None:
            return self.fused.per_row
        # layer by layer: the quantized projections' per-row limit (15 on AMX CPUs), else 16
        return per_row_rows((m for m in self.model.modules() if isinstance(m, Linear)), 16)

    # --- the forward pass -------------------------------------------------------------------

    def _bind_threads(self) -> None:
        if self.device.type == "cpu":
            self._round_threads.fit()

    def compute_logits(self, batch: Batch) -> tuple[torch.Tensor, list[int]]:
        """Run the round's forward pass (writing its K/V) -> (logits [S, vocab], for each row
        the index of its item: items with `sample` set, in order; a speculative item has
        1 + len(drafts) rows in a row, after its last token and after each draft)."""
        self._bind_threads()
        items = batch.items
        # single-token sequences first (stable), as AttentionInputs requires; a speculative
        # item is 1 + k of them (see below)
        order = sorted(range(len(items)),
                       key=lambda i: items[i].num_tokens != 1 and not items[i].drafts)
        ps = self.page_size
        ids: list[int] = []
        positions: list[int] = []
        # M-RoPE's three position components, once a row of the round needs them
        planes: tuple[list[int], list[int], list[int]] | None = None
        slots: list[int] = []
        query_lens: list[int] = []
        kv_lens: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        sample_items: list[int] = []
        local = LocalTables(ps, self.sliding_window) if self.local_pool is not None else None
        score_rows: list[int] = []  # rows whose logits score the next prompt token
        scored: list[tuple[Request, int, int]] = []  # (request, first target, count)
        pieces: list[tuple[int, ImageInput, int, int]] = []  # (first row, image, from, to)
        spans: list[tuple[int, int, int]] = []  # (sequence, first row, rows): whole images
        for i in order:
            it = items[i]
            req, start, n = it.request, it.start, it.num_tokens
            end = start + n
            pages = req.pages
            if end > len(pages) * ps:
                raise ValueError(f"{req.id}: positions up to {end} need "
                                 f"{-(-end // ps)} pages, page table has {len(pages)}")
            if end > self.max_context:  # checked here, on the host (rotary would sync)
                raise ValueError(f"position {end - 1} beyond the model's "
                                 f"{self.max_context} positions")
            if req.images and not it.drafts:  # the image rows this item computes
                for image in req.images:
                    lo, hi = max(start, image.offset), min(end, image.end)
                    if lo < hi:
                        pieces.append((len(ids) + lo - start, image, lo - image.offset,
                                       hi - image.offset))
                        if image.whole:  # the scheduler never splits it (chunk_end)
                            spans.append((len(query_lens), lo - start, hi - lo))
            if n == 1:
                ids.append(req.token_at(start))
            elif it.drafts:  # the last token, then the drafts (not in the output yet)
                ids.extend((req.token_at(start), *it.drafts))
            elif end <= req.prompt_len:
                ids.extend(req.prompt_ids[start:end])
            else:
                ids.extend(req.token_at(p) for p in range(start, end))
            if any(image.grid for image in req.images):  # M-RoPE: (time, row, column)
                if planes is None:  # the rows before: text, the same in all three
                    planes = (list(positions), list(positions), list(positions))
                for plane, part in zip(planes, mrope_positions(req.images, start, end),
                                       strict=True):
                    plane.extend(part)
            else:
                positions.extend(range(start, end))
                for plane in planes or ():
                    plane.extend(range(start, end))
            slots.extend(slot_of(pages, p, ps) for p in range(start, end))
            if it.drafts:
                # each position its own single-token sequence over the same pages: every
                # layer stores the round's K/V before it attends, so row j sees [0, start + j]
                # and the rows run on the decode path, with plain decoding's numbers
                query_lens.extend([1] * n)
                kv_lens.extend(range(start + 1, end + 1))
                tables.extend([pages] * n)
                sample_rows.extend(range(len(ids) - n, len(ids)))
                sample_items.extend([i] * n)
                continue
            query_lens.append(n)
            kv_lens.append(end)
            tables.append(pages)
            if local is not None:
                local.add(req, start, end)
            if req.params.prompt_logprobs is not None and start < req.prompt_len - 1:
                # row of position p predicts prompt token p + 1 (the last prompt row samples)
                last = min(end, req.prompt_len - 1)
                first_row = len(ids) - n
                score_rows.extend(range(first_row, first_row + last - start))
                scored.append((req, start + 1, last - start))
            if it.sample:
                sample_rows.append(len(ids) - 1)
                sample_items.append(i)
        dev = self.device

        def as_tensor(xs: list[int]) -> torch.Tensor:
            return to_device(xs, torch.int64, dev)

        if planes is not None and not planes[0] == planes[1] == planes[2]:
            where = to_device(planes[0] + planes[1] + planes[2], torch.int64, dev).view(3, -1)
        else:  # text only: one component says it (decode rounds after an image too)
            where = as_tensor(planes[0] if planes is not None else positions)

        with torch.inference_mode():
            self.attn.prepare(AttentionInputs(
                query_lens, kv_lens, tables, as_tensor(slots),
                None if local is None else LocalInputs(local.kv_lens, local.tables,
                                                       as_tensor(local.slots)),
                tuple(spans)))
            rows, embeds = self._image_rows(pieces) if pieces else (None, None)
            logits = self.model(as_tensor(ids), where, self.attn,
                                as_tensor(score_rows + sample_rows), self.fused, rows, embeds)
            if score_rows:
                self._score_prompts(logits[:len(score_rows)], scored)
                logits = logits[len(score_rows):]
        return logits, sample_items

    def _image_rows(self, pieces: list[tuple[int, ImageInput, int, int]]
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the batch rows that hold image positions, their encoder rows), encoding the
        images this round reaches first."""
        if self.images is None:
            raise ValueError(f"{self.model.config.model_type} takes no images")
        encoded = self.images.rows([image for _, image, _, _ in pieces])
        rows = [r for first, _, lo, hi in pieces for r in range(first, first + hi - lo)]
        embeds = torch.cat([encoded[image.digest][lo:hi] for _, image, lo, hi in pieces])
        return to_device(rows, torch.int64, self.device), embeds

    @staticmethod
    def _score_prompts(logits: torch.Tensor, scored: list[tuple[Request, int, int]]) -> None:
        """logits [sum of counts, vocab] -> each request's prompt_logprobs, extended."""
        row = 0
        for req, first, count in scored:
            n = req.params.prompt_logprobs or 0
            targets = req.prompt_ids[first:first + count]
            if not req.prompt_logprobs:
                req.prompt_logprobs.append(None)  # the first prompt token: nothing predicts it
            for block in range(0, count, SCORE_BLOCK):  # bounds the float32 copy
                part = logits[row + block:row + min(count, block + SCORE_BLOCK)]
                req.prompt_logprobs.extend(
                    token_logprobs(part, targets[block:block + SCORE_BLOCK], n))
            row += count

    # --- sizing ----------------------------------------------------------------

    @property
    def kv_tokens(self) -> int:
        """KV positions the global pool holds (fewer than asked where the GPU's memory
        did not hold them)."""
        return self.pool.num_pages * self.page_size

    def weight_bytes(self) -> int:
        """The model's weights as they sit on its device."""
        return weight_bytes(self.model, self.device)

    def memory_bytes(self) -> int:
        """What the loaded model holds: its weights on the device and its KV pools."""
        pools = self.pool.nbytes + (self.local_pool.nbytes if self.local_pool else 0)
        return self.weight_bytes() + pools

    load_other = 0  # bytes loading left beyond the weights and KV (from_pretrained measures)

    def footprint(self, tokenizer: int = 0, vocabulary: int = 0,
                  in_use: bool = False) -> Footprint:
        """This model's resident bytes by part (engine.execution.residency); the tokenizer's
        and the vocabulary tables' are measured by their owners and passed in. `in_use`:
        what it holds once every weight has been read and every KV page written (what a
        budget counts), rather than what is resident now."""
        pools = [self.pool.data] + ([self.local_pool.data] if self.local_pool else [])
        if in_use:  # on any device: the weights as they sit there, the pools whole
            return Footprint(self.weight_bytes(), self.memory_bytes() - self.weight_bytes(),
                             tokenizer, vocabulary, self.load_other)
        gguf = self.model_path is not None and is_gguf(Path(self.model_path))
        weights = weights_resident(model_tensors(self.model),
                                   str(self.model_path) if gguf else None)
        return Footprint(weights, resident(storages(pools)), tokenizer, vocabulary,
                         self.load_other)

    def kv_bytes_per_token(self) -> int:
        """Memory one position of the global pool costs (every layer but the local ones,
        whose pool is sized by their window, not by kv_tokens)."""
        cfg = self.model.config
        return KVPool.bytes_per_token(self.pool.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                      self.pool.dtype)


SCORE_BLOCK = 128  # prompt rows turned into float32 log-probabilities at a time


def token_logprobs(logits: torch.Tensor, targets: list[int], top: int) -> list[TokenLogprob]:
    """logits [R, vocab] -> per row, log_softmax (float32) at `targets[r]` and the `top` best."""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [R, vocab]
    chosen = logp.gather(1, to_device(targets, torch.int64, logp.device)[:, None]).squeeze(1)
    chosen_list = chosen.tolist()
    if top <= 0:
        return [TokenLogprob(t, lp) for t, lp in zip(targets, chosen_list)]
    vals, idx = logp.topk(top, dim=-1)  # [R, top]
    return [TokenLogprob(t, lp, tuple(zip(i, v)))
            for t, lp, i, v in zip(targets, chosen_list, idx.tolist(), vals.tolist())]


def trim(lp: TokenLogprob, top: int) -> TokenLogprob:
    """Keep a row's `top` best alternatives (rows of one batch are scored to the widest ask)."""
    return lp if len(lp.top) <= top else TokenLogprob(lp.token_id, lp.logprob, lp.top[:top])

