"""The InferenceService status the operator writes, as pure functions.

Conditions are ``metav1.Condition`` dicts (``type``, ``status``, ``reason``, ``message``,
``observedGeneration``, ``lastTransitionTime``); ``lastTransitionTime`` changes only when a
condition's ``status`` does. :func:`status_patch` returns ``None`` when nothing the operator
owns has changed, so a quiet reconcile writes no status either.

The operator owns ``observedGeneration``, ``activeModel``, ``url``, ``replicas``,
``replicaSummary`` and the condition types in :data:`OWNED_TYPES` (conditions are built with
:mod:`tailguard.spec.conditions`); ``SLOMet`` is kept as found
(the SLO guard judges it) and starts ``Unknown``. ``status.observed`` and ``status.guard``
belong to the SLO guard (:mod:`tailguard.operator.guarding`) and ``status.kopf`` to kopf:
they are never written here, though ``RolledBack`` reads ``status.guard`` (an automatic
rollback). The clock is an argument.
"""

from __future__ import annotations

import datetime
from typing import Any, Mapping, Sequence

from tailguard.operator import manifests
from tailguard.operator.reconcile import TrafficPlan, desired_replicas, ready_replicas
from tailguard.spec import resource
from tailguard.spec.conditions import find_condition, ordered, set_condition

OWNED_TYPES = ("Ready", "PrimaryReady", "FallbackReady", "RolledBack")
"""Condition types recomputed on every reconcile (``SLOMet`` is only initialised)."""
OWNED_KEYS = ("observedGeneration", "activeModel", "url", "replicas", "replicaSummary",
              "conditions", "minReplicasHold")
"""The ``status`` keys the operator writes."""
REMOVED_WHEN_ABSENT = ("minReplicasHold",)
"""Owned keys a status without them removes (the others are always present)."""


def build_status(previous: Mapping[str, Any], isvc: resource.InferenceService, *,
                 generation: int | None, plan: TrafficPlan,
                 deployments: Mapping[str, Mapping[str, Any] | None],
                 conflicts: Sequence[str], now: datetime.datetime,
                 refused: Sequence[str] = (), automatic: str | None = None,
                 not_starting: Mapping[str, Sequence[str]] | None = None,
                 hold: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The owned part of the status after a reconcile pass.

    ``deployments`` maps each role to its live Deployment (or ``None``); ``conflicts`` names
    children that exist but are controlled by another owner; ``refused`` has one line per
    create or patch the API server refused (``Kind/name: 403 Forbidden: ...``). Either makes
    ``Ready`` False, refusals first (reason ``ChildRefused``). ``automatic``: the reason of the
    SLO guard's rollback when it is what holds traffic on the fallback (``RolledBack`` then
    says ``AutomaticRollback``), else ``None``. ``not_starting`` maps a role to one line per
    pod of it that cannot start (``NAME: REASON: MESSAGE``, e.g. an image that is not there):
    its condition (and ``Ready``, when that role has traffic and no Ready replica) then says
    ``PodsNotStarting`` and names them. ``hold``: the HPA minimum held after a traffic move
    (:func:`~tailguard.operator.reconcile.hold_minimum`), written as ``minReplicasHold``
    (None: the key is left out, and :func:`status_patch` removes it).
    """
    replicas = {role: {"desired": desired_replicas(deployments.get(role)),
                       "ready": ready_replicas(deployments.get(role))}
                for role in manifests.ROLES}
    conditions = ordered(previous.get("conditions") or [])

    def put(type_: str, status: str, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, type_, status, reason, message,
                                   generation=generation, now=now)

    stuck = {role: _pods_line(lines, _older_ready(deployments.get(role), replicas[role]["ready"]))
             for role, lines in (not_starting or {}).items() if lines}
    for role, type_ in (("primary", "PrimaryReady"), ("fallback", "FallbackReady")):
        counts = f"{replicas[role]['ready']}/{replicas[role]['desired']} replicas ready"
        status = "True" if replicas[role]["ready"] > 0 else "False"
        if role in stuck:
            put(type_, status, "PodsNotStarting", f"{counts}; {stuck[role]}")
        elif replicas[role]["ready"] > 0:
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
    elif plan.active in stuck:
        put("Ready", "False", "PodsNotStarting",
            f"the {plan.active} model (active) has no Ready replicas: {stuck[plan.active]}")
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
    elif plan.active == "fallback" and automatic is not None:
        put("RolledBack", "True", "AutomaticRollback",
            f"the SLO guard moved traffic to the fallback model: {automatic} (roll forward: "
            "tailguard rollforward NAME --cluster)")
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
        "conditions": ordered(conditions),
        **({"minReplicasHold": dict(hold)} if hold else {}),
    }


MAX_NAMED_PODS = 3
"""Pods that cannot start named in a condition's message at most (the rest are counted)."""


def _pods_line(lines: Sequence[str], older_ready: int) -> str:
    """``N pod(s) cannot start: LINE; LINE; ...`` naming at most :data:`MAX_NAMED_PODS`, and
    how many Ready pods of the previous template still serve."""
    named = "; ".join(lines[:MAX_NAMED_PODS])
    more = f"; {len(lines) - MAX_NAMED_PODS} more" if len(lines) > MAX_NAMED_PODS else ""
    older = (f" ({older_ready} Ready pod(s) of the previous template still serve)"
             if older_ready else "")
    return f"{len(lines)} pod(s) cannot start: {named}{more}{older}"


def _older_ready(deployment: Mapping[str, Any] | None, current_ready: int) -> int:
    """Ready pods of a Deployment's previous templates: ``status.readyReplicas`` counts every
    ReplicaSet's, ``current_ready`` is the current template's."""
    status = (deployment or {}).get("status") or {}
    return max(0, int(status.get("readyReplicas") or 0) - current_ready)


def invalid_status(previous: Mapping[str, Any], *, generation: int | None, message: str,
                   now: datetime.datetime) -> dict[str, Any]:
    """The owned status of an object the operator refuses: ``Ready`` False with reason
    ``InvalidSpec`` and the problems as the message; the rest stays as it was (children that
    exist are left as they are)."""
    out = {key: previous[key] for key in OWNED_KEYS if key in previous}
    out["observedGeneration"] = generation
    out["conditions"] = ordered(set_condition(
        previous.get("conditions") or [], "Ready", "False", "InvalidSpec",
        f"{message} (nothing was changed)", generation=generation, now=now))
    return out


def status_patch(previous: Mapping[str, Any], new: Mapping[str, Any],
                 keys: Sequence[str] = OWNED_KEYS) -> dict[str, Any] | None:
    """The merge patch body (``{"status": {...}}``) writing ``new``'s ``keys`` (by default
    the operator's), or ``None`` when they equal ``previous``'s. A key of
    :data:`REMOVED_WHEN_ABSENT` among ``keys`` that ``previous`` has and ``new`` lacks is
    removed (a merge patch's null)."""
    owned = {key: new[key] for key in keys if key in new and new[key] is not None}
    for key in REMOVED_WHEN_ABSENT:
        if key in keys and key not in new and previous.get(key) is not None:
            owned[key] = None
    if all(previous.get(key) == value for key, value in owned.items()):
        return None
    return {"status": owned}


