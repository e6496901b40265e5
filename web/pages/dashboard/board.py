"""The dashboard's view of one engine snapshot, for one viewer.

Snapshots carry no text; the only text shown is the label of the viewer's own chat
requests (the conversation title), and others' requests show id and owner only.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine import EngineSnapshot, KVView, RequestView, RoundView
from web.access.disclosure import model_info, shown
from web.access.identity import User
from web.pages.dashboard.charts import sparkline
from web.serving import ModelCatalog, Serving
from web.tracker import RequestTracker

# the dashboard's short tag before a wait reason's text (the text reads on its own in the chat)
REASON_TAGS = {"budget": "budget", "slot": "slots", "kv": "KV", "behind": "queued",
               "turn": "turn", "next": "next", "chunk": "prefill", "image": "image"}
TIMELINE_ROUNDS = 40
TIMELINE_ROWS = 14
CHART_SPAN = 360.0


@dataclass(frozen=True, slots=True)
class Row:
    view: RequestView
    label: str | None
    link: str | None
    mine: bool
    can_cancel: bool
    endpoint: str | None = None  # the API route it came through (None: the chat page)

    @property
    def progress(self) -> int:
        return round(100 * self.view.output_tokens / max(1, self.view.max_tokens))

    @property
    def prefill_progress(self) -> int:
        v = self.view
        return round(100 * v.prefill_done / max(1, v.prompt_tokens))


def _row(view: RequestView, user: User, tracker: RequestTracker) -> Row:
    item = tracker.get(view.id)
    mine = view.owner == user.name
    return Row(view, item.label if item and mine else None, item.link if item and mine else None,
               mine, user.can_manage(view.owner), item.endpoint if item else None)


def _mark(rnd: RoundView, rid: str) -> str:
    return "D" if rid in rnd.decodes else "P"


def timeline(rounds: tuple[RoundView, ...]) -> dict[str, Any]:
    """The rounds timeline (as worked example 2 in docs/architecture.md): a row per request,
    a column per round, P / D marks, E where the request's next image was being encoded."""
    recent = rounds[-TIMELINE_ROUNDS:]
    order: list[str] = []
    cells: dict[str, dict[int, tuple[str, int, bool]]] = {}
    for col, rnd in enumerate(recent):
        finished = set(rnd.finished)
        marks = [(rid, _mark(rnd, rid), tokens) for rid, tokens in rnd.batch]
        marks += [(rid, "E", 0) for rid in rnd.encodes if rid not in dict(rnd.batch)]
        for rid, mark, tokens in marks:
            if rid not in cells:
                order.append(rid)
                cells[rid] = {}
            cells[rid][col] = (mark, tokens, rid in finished)
        for rid in finished:
            if rid in cells and col not in cells[rid]:
                cells[rid][col] = ("×", 0, True)
    rows = [(rid, [cells[rid].get(c) for c in range(len(recent))])
            for rid in order[-TIMELINE_ROWS:]]
    return {"rounds": recent, "rows": rows}


def charts(snap: EngineSnapshot) -> list[Any]:
    """Throughput, TTFT and ITL over the last minutes, each ending at the value the tiles show.

    The engine keeps one history point every few seconds; without this snapshot's own
    figures as the last point the chart's headline lagged the tile (17.0 tok/s against 0.1).
    """
    m = snap.metrics
    h = [*m.history]
    if not h or h[-1][0] < snap.time:
        h.append((snap.time, m.output_tokens_per_s, m.ttft_p50, m.itl_p50))
    now = snap.time
    return [
        sparkline([(t, v) for t, v, _, _ in h], now, CHART_SPAN, "Throughput", " tok/s"),
        sparkline([(t, None if v is None else v * 1000) for t, _, v, _ in h], now, CHART_SPAN,
                  "TTFT p50", " ms", "{:.0f}"),
        sparkline([(t, None if v is None else v * 1000) for t, _, _, v in h], now, CHART_SPAN,
                  "ITL p50", " ms", "{:.0f}"),
    ]


def kv_segments(kv: KVView, cached: bool = True) -> list[dict[str, Any]]:
    total = max(1, kv.total)
    parts = [("used", kv.used), ("reserved", kv.reserved)] + \
        ([("cached", kv.cached)] if cached else []) + [("free", kv.free)]
    return [{"name": name, "value": value, "pct": 100 * value / total} for name, value in parts]


def kv_bars(snap: EngineSnapshot) -> list[dict[str, Any]]:
    """The KV bar; for a model with local (sliding-window) layers, a second one for their
    pool, which keeps the window only (and caches nothing)."""
    bars: list[dict[str, Any]] = [{"id": "kvbar", "label": "KV cache usage", "caption": "",
                                   "total": snap.kv.total, "segments": kv_segments(snap.kv)}]
    if snap.local_kv is not None:
        bars.append({"id": "kvbar-local", "label": "Local layers' KV usage",
                     "caption": f"Local layers (window {snap.sliding_window:,})",
                     "total": snap.local_kv.total,
                     "segments": kv_segments(snap.local_kv, cached=False)})
    return bars


def memory_parts(memory: Mapping[str, int] | None) -> str:
    """"weights 106 · KV 24 · tokenizer 19 · vocabulary 38 · other 11 MB" (resident)."""
    if not memory:
        return ""
    names = {"weights": "weights", "kv": "KV", "tokenizer": "tokenizer",
             "vocabulary": "vocabulary", "other": "other"}
    return " · ".join(f"{label} {memory.get(key, 0) / 1e6:,.0f}"
                      for key, label in names.items()) + " MB"


def model_rows(snap: EngineSnapshot, catalog: ModelCatalog,
               user: User) -> list[dict[str, Any]]:
    """The Models panel: each model's queue, running set, slots and KV, from its own
    snapshot (its waiting requests, those waiting for its load included, from the whole);
    for a normal user of a shared server, no path in it."""
    own = dict(catalog.model_snapshots())
    rows = []
    for m in (model_info(m, user) for m in catalog.models()):
        mine = own.get(m.name)
        rows.append({
            "name": m.name, "default": m.default, "state": m.state, "loaded": m.loaded,
            "runs": m.runs or m.details.get("runs") or "", "error": m.error,
            "memory_wait": m.memory_wait,
            "waiting": sum(1 for v in snap.waiting if v.model == m.name),
            "running": sum(1 for v in snap.running if v.model == m.name),
            "slots": f"{mine.max_running - mine.free_slots} / {mine.max_running}"
            if mine else None,
            "kv": mine.kv.usage if mine else None,
            "size": f"{m.size / 1e6:,.0f} MB" if m.size else "–",
            "memory": memory_parts(m.memory), "takes_images": m.takes_images,
            "keep_alive": "stays" if m.keep_alive is None else f"{m.keep_alive:g} s"})
    return rows


def rounds_of(snap: EngineSnapshot, catalog: ModelCatalog | None,
              model: str | None) -> tuple[str | None, EngineSnapshot | None]:
    """Whose rounds the timeline and charts show (several models: the chosen one, else the
    default) and that model's own snapshot (None while it is not loaded)."""
    if catalog is None:
        return None, snap
    name = model if model in catalog.names else catalog.default
    if name == catalog.default and model is None:
        return name, snap  # the whole set's snapshot is built on the default's
    return name, dict(catalog.model_snapshots()).get(name)


def board_context(snap: EngineSnapshot, engine: Serving, user: User,
                  tracker: RequestTracker, model: str | None = None) -> dict[str, Any]:
    """The board for `user`; `model` (several models): whose rounds and charts it shows."""
    running = [_row(v, user, tracker) for v in snap.running]
    # the queue is what is not admitted yet; a chunked prompt holds a slot and shows in
    # Running, so the Waiting tile, the queue header and /metrics count the same requests
    waiting = [_row(v, user, tracker) for v in snap.waiting if v.state == "waiting"]
    by_id = {r.view.id: r for r in running}
    slots = [(i, by_id.get(rid) if rid else None, rid) for i, rid in enumerate(snap.slots)]
    cfg = engine.config
    catalog = engine if isinstance(engine, ModelCatalog) else None
    events = [{"kind": e.kind, "text": shown(e.text, user), "clock": time.strftime("%H:%M:%S",
                                                                     time.localtime(e.time))}
              for e in reversed(list(catalog.events)[-8:])] if catalog else []
    chart_model, own = rounds_of(snap, catalog, model)
    models = model_rows(snap, catalog, user) if catalog else []
    # the model whose rounds the timeline shows takes pictures: its legend names E
    encodes = any(m["name"] == chart_model and m["takes_images"] for m in models) if catalog \
        else bool(getattr(engine, "takes_images", False))
    per_user = getattr(cfg, "prefix_cache_per_owner", False)  # a gateway's config has none
    prefix = ("on, per user" if per_user else "on") if snap.prefix_cache else "off"
    return {
        "models": models, "model_events": events,
        "snap": snap, "running": running, "waiting": waiting, "slots": slots,
        "kv_bars": kv_bars(snap), "chart_model": chart_model,
        "encodes": encodes,
        "timeline": timeline(own.rounds if own else ()), "charts": charts(own) if own else [],
        "gateway": engine.gateway_view() if hasattr(engine, "gateway_view") else None,
        "metrics": snap.metrics, "alive": engine.alive, "user": user, "reason_tags": REASON_TAGS,
        "settings": [("Policy", snap.policy), ("Admission", snap.admission),
                     ("Slots", snap.max_running),
                     ("Prefill budget", f"{snap.max_prefill_tokens} tokens / round"),
                     ("KV pool", f"{snap.kv.total:,} positions · pages of {snap.page_size}"),
                     ("Prefix cache", prefix),
                     ("Context", f"{cfg.max_context:,} tokens"),
                     ("Queue bound", f"{cfg.max_waiting} waiting")],
    }
