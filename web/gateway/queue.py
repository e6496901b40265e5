"""The gateway's queue rules, pure: which upstreams serve a request's model, which waiting
request goes next (fair round-robin across users, or FIFO; a model whose upstreams are all
busy holds back only its own requests), which upstream takes it (least loaded, below its
in-flight cap), and why each of the others waits (`upstream-busy`, `user-limit`, `behind`,
`upstream-down`)."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine import SamplingParams, WaitReason
from web.gateway.handle import GatewayHandle
from web.gateway.upstream import Upstream


@dataclass(eq=False, slots=True)
class GatewayRequest:
    id: str
    owner: str
    prompt: list[int]  # an UpstreamPrompt, or token ids
    params: SamplingParams
    handle: GatewayHandle
    model: str = ""  # the model it asked for (the default's name when it named none)
    arrival: float = field(default_factory=time.monotonic)
    state: str = "waiting"  # waiting | running | finished
    upstream: Upstream | None = None
    upstream_id: str | None = None  # the upstream's own id for it (Ferry's X-Request-Id)
    task: asyncio.Task[None] | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    output_tokens: int = 0  # stream chunks until the upstream's usage says
    prompt_tokens: int = 0  # estimated until the upstream's usage says
    cached_tokens: int = 0
    itl_sum: float = 0.0
    tried: set[str] = field(default_factory=set)  # upstreams that refused it before output
    attempts: int = 0  # times it was sent upstream
    down_since: float | None = None  # waiting with every upstream down, since
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    order: list[GatewayRequest]  # the order the waiting requests will go in
    user_limited: list[GatewayRequest]  # waiting on their owner's in-flight cap


def plan(waiting: list[GatewayRequest], admission: str, last_served: dict[str, int],
         in_flight: dict[str, int], user_cap: int | None) -> Plan:
    """The projected dispatch order: fair takes each user's oldest request in turn, the user
    served longest ago first; fifo takes arrival order. Requests beyond their user's
    in-flight cap wait apart (they do not block the others)."""
    room: dict[str, int] = {}
    limited: list[GatewayRequest] = []
    per_owner: dict[str, list[GatewayRequest]] = {}
    for req in waiting:
        left = room.setdefault(req.owner, (user_cap - in_flight.get(req.owner, 0))
                               if user_cap is not None else len(waiting))
        if left <= 0:
            limited.append(req)
            continue
        room[req.owner] = left - 1
        per_owner.setdefault(req.owner, []).append(req)
    if admission == "fifo":
        eligible = {id(r) for reqs in per_owner.values() for r in reqs}
        return Plan([r for r in waiting if id(r) in eligible], limited)
    order: list[GatewayRequest] = []
    turn = dict(last_served)
    tick = max(turn.values(), default=0)
    while per_owner:
        # least recently served first; never served: by its oldest request's arrival
        owner = min(per_owner, key=lambda o: (turn.get(o, -1), per_owner[o][0].arrival))
        order.append(per_owner[owner].pop(0))
        if not per_owner[owner]:
            del per_owner[owner]
        tick += 1
        turn[owner] = tick
    return Plan(order, limited)


def served(upstreams: list[Upstream]) -> dict[str, list[Upstream]]:
    """Every model the upstreams list (the union, in the upstreams' order), with the
    upstreams that serve it."""
    out: dict[str, list[Upstream]] = {}
    for up in upstreams:
        for model in up.models:
            out.setdefault(model, []).append(up)
    return out


def routes(upstreams: list[Upstream], model: str, default: str) -> list[Upstream]:
    """The upstreams that serve `model` (their /v1/models lists it). The default model may go
    to any upstream while none lists it (lists not read yet), as with one model."""
    listed = [u for u in upstreams if model in u.models]
    if listed or model != default:
        return listed
    return list(upstreams)


def choose_upstream(upstreams: list[Upstream], tried: set[str]) -> Upstream | None:
    """The least-loaded usable upstream below its cap (ones that refused this request last)."""
    ready = [u for u in upstreams if u.usable and not u.full]
    if not ready:
        return None
    fresh = [u for u in ready if u.name not in tried] or ready
    return min(fresh, key=lambda u: (u.load(), len(u.in_flight), u.served))


def head_reason(upstreams: list[Upstream], model: str | None = None) -> WaitReason:
    """Why the first request in line (for `model`, when the front serves several) cannot go
    now; `upstreams`: those that serve it."""
    if model is not None:
        if not upstreams:
            return WaitReason("upstream-down", f"no upstream serves {model} now")
        why = head_reason(upstreams)
        return WaitReason(why.code, f"{why.text} (for {model})")
    n = len(upstreams)
    usable = [u for u in upstreams if u.usable]
    if not usable:
        if n == 1:
            u = upstreams[0]
            return WaitReason("upstream-down", f"the upstream {u.name} is down since "
                              f"{time.strftime('%H:%M:%S', time.localtime(u.since))}")
        return WaitReason("upstream-down", f"all {n} upstreams are down")
    caps = sorted({u.cap() for u in usable})
    if len(usable) == 1:
        return WaitReason("upstream-busy", f"the upstream {usable[0].name} is at its "
                          f"{caps[0]}-request cap")
    cap = f"{caps[0]}-request cap" if len(caps) == 1 else \
        f"in-flight caps ({', '.join(map(str, caps))})"
    down = n - len(usable)
    tail = f" ({down} down)" if down else ""
    return WaitReason("upstream-busy", f"all {len(usable)} upstreams at their {cap}{tail}")


def reasons(p: Plan, route: Callable[[str], list[Upstream]], several: bool,
            user_cap: int | None) -> dict[str, WaitReason]:
    """Each model's first request in line waits on its upstreams, the rest of that model's
    behind it; `several`: the front serves more than one model (the reasons name it)."""
    out: dict[str, WaitReason] = {}
    heads: dict[str, tuple[str, int]] = {}  # model -> (its first request's id, requests behind)
    for req in p.order:
        if req.model not in heads:
            heads[req.model] = (req.id, 0)
            out[req.id] = head_reason(route(req.model), req.model if several else None)
            continue
        head, i = heads[req.model]
        heads[req.model] = (head, i := i + 1)
        out[req.id] = WaitReason("behind", f"behind {i} earlier request{'s' if i > 1 else ''}"
                                 f" ({head} first)")
    for req in p.user_limited:
        out[req.id] = WaitReason("user-limit", f"{req.owner} already has {user_cap} "
                                 "requests in flight (the per-user cap)")
    return out
