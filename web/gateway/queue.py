"""The gateway's queue rules, pure: which waiting request goes next (fair round-robin across
users, or FIFO), which upstream takes it (least loaded, below its in-flight cap), and why
each of the others waits (`upstream-busy`, `user-limit`, `behind`, `upstream-down`)."""
from __future__ import annotations

import asyncio
import time
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


def choose_upstream(upstreams: list[Upstream], tried: set[str]) -> Upstream | None:
    """The least-loaded usable upstream below its cap (ones that refused this request last)."""
    ready = [u for u in upstreams if u.usable and not u.full]
    if not ready:
        return None
    fresh = [u for u in ready if u.name not in tried] or ready
    return min(fresh, key=lambda u: (u.load(), len(u.in_flight), u.served))


def head_reason(upstreams: list[Upstream]) -> WaitReason:
    """Why the first request in line cannot go now."""
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


def reasons(p: Plan, upstreams: list[Upstream], user_cap: int | None
            ) -> dict[str, WaitReason]:
    out: dict[str, WaitReason] = {}
    if p.order:
        out[p.order[0].id] = head_reason(upstreams)
    for i, req in enumerate(p.order[1:], start=1):
        out[req.id] = WaitReason("behind", f"behind {i} earlier request{'s' if i > 1 else ''}"
                                 f" ({p.order[0].id} first)")
    for req in p.user_limited:
        out[req.id] = WaitReason("user-limit", f"{req.owner} already has {user_cap} "
                                 "requests in flight (the per-user cap)")
    return out
