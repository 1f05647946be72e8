"""The InferenceService status the operator writes, as pure functions.

Conditions are ``metav1.Condition`` dicts (``type``, ``status``, ``reason``, ``message``,
``observedGeneration``, ``lastTransitionTime``); ``lastTransitionTime`` changes only when a
condition's ``status`` does. :func:`status_patch` returns ``None`` when nothing the operator
owns has changed, so a quiet reconcile writes no status either.

The operator owns ``observedGeneration``, ``activeModel``, ``url``, ``replicas``,
``replicaSummary`` and the condition types in :data:`OWNED_TYPES`; ``SLOMet`` is kept as found
(the SLO guard judges it) and starts ``Unknown``. ``status.observed`` and ``status.kopf`` belong
to others and are never written here. The clock is an argument.
"""

from __future__ import annotations

import datetime
from typing import Any, Mapping, Sequence

from . import manifests, spec
from .reconcile import TrafficPlan, desired_replicas, ready_replicas

CONDITION_TYPES = ("Ready", "PrimaryReady", "FallbackReady", "SLOMet", "RolledBack")
"""Every condition type the operator sets, in the order it lists them."""
OWNED_TYPES = ("Ready", "PrimaryReady", "FallbackReady", "RolledBack")
"""Condition types recomputed on every reconcile (``SLOMet`` is only initialised)."""
OWNED_KEYS = ("observedGeneration", "activeModel", "url", "replicas", "replicaSummary",
              "conditions")
"""The ``status`` keys the operator writes."""
MAX_MESSAGE = 4096
"""Condition messages are cut to this many characters (the CRD allows 32768)."""


def timestamp(now: datetime.datetime) -> str:
    """RFC 3339 UTC timestamp with second precision (``2025-01-31T12:00:00Z``).

    Raises:
        ValueError: ``now`` is naive (has no timezone).
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: Sequence[Mapping[str, Any]], type_: str, status: str, reason: str,
                  message: str, *, generation: int | None, now: datetime.datetime
                  ) -> list[dict[str, Any]]:
    """A copy of ``conditions`` with ``type_`` set (appended if absent, in place otherwise).

    ``lastTransitionTime`` is kept from the existing condition when ``status`` is unchanged,
    and is ``now`` otherwise. ``status`` is ``"True"``, ``"False"`` or ``"Unknown"``.
    """
    out = [dict(c) for c in conditions]
    previous = next((c for c in out if c.get("type") == type_), None)
    since = timestamp(now)
    if previous is not None and previous.get("status") == status:
        since = previous.get("lastTransitionTime") or since
    new: dict[str, Any] = {"type": type_, "status": status, "reason": reason,
                           "message": message[:MAX_MESSAGE], "lastTransitionTime": since}
    if generation is not None:
        new["observedGeneration"] = generation
    if previous is None:
        out.append(new)
    else:
        out[out.index(previous)] = new
    return out


def find_condition(status: Mapping[str, Any], type_: str) -> dict[str, Any] | None:
    """The condition of type ``type_`` in a status, or ``None``."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == type_:
            return dict(condition)
    return None


def build_status(previous: Mapping[str, Any], isvc: spec.InferenceService, *,
                 generation: int | None, plan: TrafficPlan,
                 deployments: Mapping[str, Mapping[str, Any] | None],
                 conflicts: Sequence[str], now: datetime.datetime,
                 refused: Sequence[str] = ()) -> dict[str, Any]:
    """The owned part of the status after a reconcile pass.

    ``deployments`` maps each role to its live Deployment (or ``None``); ``conflicts`` names
    children that exist but are controlled by another owner; ``refused`` has one line per
    create or patch the API server refused (``Kind/name: 403 Forbidden: ...``). Either makes
    ``Ready`` False, refusals first (reason ``ChildRefused``).
    """
    replicas = {role: {"desired": desired_replicas(deployments.get(role)),
                       "ready": ready_replicas(deployments.get(role))}
                for role in manifests.ROLES}
    conditions = _ordered(previous.get("conditions") or [])

    def put(type_: str, status: str, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, status, reason, message,
                                   generation=generation, now=now)

    for role, type_ in (("primary", "PrimaryReady"), ("fallback", "FallbackReady")):
        counts = f"{replicas[role]['ready']}/{replicas[role]['desired']} replicas ready"
        if replicas[role]["ready"] > 0:
            put(type_, "True", "ReplicasReady", counts)
        else:
            put(type_, "False", "NoReadyReplicas", counts)

    active = replicas[plan.active]
    if refused:
        put("Ready", "False", "ChildRefused",
            "the API server refused: " + "; ".join(refused))
    elif conflicts:
        put("Ready", "False", "ChildConflict",
            "controlled by another owner, left alone: " + ", ".join(conflicts))
    elif active["ready"] > 0:
        put("Ready", "True", "Serving",
            f"traffic goes to the {plan.active} model "
            f"({active['ready']}/{active['desired']} replicas ready)")
    else:
        put("Ready", "False", "NoReadyReplicas",
            f"the {plan.active} model (active) has no Ready replicas yet")

    if find_condition({"conditions": conditions}, "SLOMet") is None:
        put("SLOMet", "Unknown", "NoData",
            "not judged yet: no SLO window with enough samples has been observed")

    if plan.pending:
        reason = "WaitingForFallback" if plan.intent == "fallback" else "WaitingForPrimary"
        rolled = "False" if plan.active == "primary" else "True"
        put("RolledBack", rolled, reason, plan.message)
    elif plan.active == "fallback":
        put("RolledBack", "True", "ManualRollback",
            "traffic goes to the fallback model (spec.traffic: fallback)")
    else:
        put("RolledBack", "False", "OnPrimary", "traffic goes to the primary model")

    return {
        "observedGeneration": generation,
        "activeModel": plan.active,
        "url": manifests.service_url(isvc),
        "replicas": replicas,
        "replicaSummary": f"{active['ready']}/{active['desired']}",
        "conditions": _ordered(conditions),
    }


def invalid_status(previous: Mapping[str, Any], *, generation: int | None, message: str,
                   now: datetime.datetime) -> dict[str, Any]:
    """The owned status of an object the operator refuses: ``Ready`` False with reason
    ``InvalidSpec`` and the problems as the message; the rest stays as it was (children that
    exist are left as they are)."""
    out = {key: previous[key] for key in OWNED_KEYS if key in previous}
    out["observedGeneration"] = generation
    out["conditions"] = _ordered(set_condition(
        previous.get("conditions") or [], "Ready", "False", "InvalidSpec",
        f"{message} (nothing was changed)", generation=generation, now=now))
    return out


def status_patch(previous: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch body (``{"status": {...}}``) writing ``new``'s owned keys, or ``None``
    when they equal ``previous``'s."""
    owned = {key: new[key] for key in OWNED_KEYS if key in new and new[key] is not None}
    if all(previous.get(key) == value for key, value in owned.items()):
        return None
    return {"status": owned}


def _ordered(conditions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Known types first in :data:`CONDITION_TYPES` order, then others as found."""
    rank = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted((dict(c) for c in conditions),
                  key=lambda c: rank.get(c.get("type", ""), len(rank)))
