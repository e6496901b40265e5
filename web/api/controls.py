"""The scheduling policy and admission order at runtime: GET and POST /v1/engine/policy.

Anyone signed in may read them; only an admin may change them (403 for others in shared
mode). A change reaches the engine through its inbox and applies from the next round
boundary; requests already running keep their slots and KV.
"""
from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get, post
from litestar.params import JSONBody
from msgspec import Struct

from engine import ADMISSIONS, POLICIES, AdmissionOrder, Policy
from web.access.identity import admin_guard
from web.api.errors import APIError, error_docs
from web.services import Services, services


class PolicyChange(Struct, kw_only=True):
    policy: Policy | None = None
    admission: AdmissionOrder | None = None


class PolicyInfo(Struct):
    policy: str
    admission: str
    policies: list[str]
    admissions: list[str]


def apply_policy(s: Services, policy: str | None, admission: str | None) -> PolicyInfo:
    """Ask the engine for a new policy and/or admission order; the answer is what will
    apply from the next round. Raises APIError (400) for a missing or unknown value."""
    policy, admission = policy or None, admission or None
    if policy is None and admission is None:
        raise APIError("give a policy, an admission order, or both", param="policy")
    if policy is not None and policy not in POLICIES:
        raise APIError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}",
                       param="policy")
    if admission is not None and admission not in ADMISSIONS:
        raise APIError(f"admission must be one of {', '.join(ADMISSIONS)}, got "
                       f"{admission!r}", param="admission")
    s.engine.reconfigure(policy=policy, admission=admission)
    snap = s.engine.snapshot()
    return PolicyInfo(policy or snap.policy, admission or snap.admission, list(POLICIES),
                      list(ADMISSIONS))


class EngineController(Controller):
    path = "/v1/engine"
    tags = ("Engine",)

    @get("/policy", summary="The scheduling policy and admission order in use")
    async def get_policy(self, request: Request[Any, Any, Any]) -> PolicyInfo:
        snap = services(request).engine.snapshot()
        return PolicyInfo(snap.policy, snap.admission, list(POLICIES), list(ADMISSIONS))

    @post("/policy", status_code=200, guards=[admin_guard], responses=error_docs(400, 403),
          summary="Change the policy and/or admission order (admins; from the next round)")
    async def set_policy(self, request: Request[Any, Any, Any],
                         data: JSONBody[PolicyChange]) -> PolicyInfo:
        return apply_policy(services(request), data.policy, data.admission)
