"""Polite reconciliation, as pure functions: what to write, and where traffic goes.

:func:`merge_patch` compares a desired child (from :mod:`tailguard.operator.manifests`) with the live object and
returns the smallest JSON merge patch (RFC 7386) that makes the live object carry what the
operator owns, or ``None`` when it already does. The rules:

- only keys present in the desired object are compared; everything else in the live object
  (server defaults, ``status``, labels and annotations added by others) is left alone;
- a list is owned whole: it is rewritten when it differs, compared element by element as a
  subset (so server-defaulted fields inside list items do not count as differences);
- quantities compare by value: the server returns ``1000`` as ``1k`` and ``0.5`` as ``500m``;
- a Deployment's ``spec.replicas`` is never patched: the HPA owns it once the Deployment exists;
- an HPA's ``spec.behavior`` is copied verbatim: replaced whole when it changes, removed when
  the spec drops it;
- the controller owner reference is added next to any other owner references.

:func:`plan_traffic` decides which role the Service selects: traffic moves to the role that
``spec.traffic`` names only once that role has enough Ready replicas to take it.

:func:`unused_config_maps` picks the revision ConfigMaps that nothing refers to any more.

The caller reads and writes; nothing here does I/O, reads the clock or logs.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from tailguard.operator import quantity
from tailguard.operator.manifests import config_maps_named
from tailguard.spec.conditions import timestamp

Path = tuple[str, ...]

IGNORED_PATHS: Mapping[str, tuple[Path, ...]] = {"Deployment": (("spec", "replicas"),)}
"""Paths written at creation only, per kind."""
ATOMIC_PATHS: Mapping[str, tuple[Path, ...]] = {"HorizontalPodAutoscaler": (("spec", "behavior"),)}
"""Dict-valued paths owned whole, per kind: replaced when they differ, removed when the desired
object lacks them."""

_SAME = object()
_MISSING = object()


def merge_patch(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that brings ``live`` to ``desired`` by the rules above, or ``None``.

    ``desired`` is a child built by :mod:`tailguard.operator.manifests` (it has ``kind`` and
    ``metadata.ownerReferences``); ``live`` is the object as the API server returns it.
    """
    kind = desired.get("kind", "")
    want = copy.deepcopy(dict(desired))
    for path in IGNORED_PATHS.get(kind, ()):
        _pop_path(want, path)
    metadata = dict(want.pop("metadata", {}))
    refs = metadata.pop("ownerReferences", [])
    live_meta = live.get("metadata") or {}

    patch: dict[str, Any] = {}
    meta_patch = _diff(metadata, live_meta, ("metadata",), ())
    meta_patch = {} if meta_patch is _SAME else meta_patch
    new_refs = _merged_owner_references(refs, live_meta.get("ownerReferences") or [])
    if new_refs is not None:
        meta_patch["ownerReferences"] = new_refs
    if meta_patch:
        patch["metadata"] = meta_patch
    rest = _diff(want, {k: v for k, v in live.items() if k != "metadata"}, (),
                 ATOMIC_PATHS.get(kind, ()))
    if rest is not _SAME:
        patch.update(rest)
    return patch or None


def controller_uid(live: Mapping[str, Any]) -> str | None:
    """The ``uid`` of the live object's controller owner reference, or ``None`` if it has none."""
    for ref in (live.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")  # type: ignore[no-any-return]
    return None


def ready_replicas(deployment: Mapping[str, Any] | None) -> int:
    """Ready replicas of a live Deployment's current pod template: those that serve what the
    spec says now, never the previous ReplicaSet's pods. 0 without an object, and 0 until the
    Deployment controller has seen the latest template (``status.observedGeneration`` below
    ``metadata.generation``: its status still describes the previous one).

    ``status.readyReplicas`` counts the Ready pods of every ReplicaSet and
    ``status.updatedReplicas`` the pods (Ready or not) of the current one; the Deployment's
    status has no Ready count of the current ReplicaSet alone. Assuming every older pod is
    Ready gives a lower bound, exact once the rollout has replaced them:
    ``min(updated, ready - (replicas - updated))``, at least 0. A rollout in progress is thus
    counted short, never long, so traffic never moves to pods of an old model.
    """
    if not deployment:
        return 0
    generation = (deployment.get("metadata") or {}).get("generation")
    status = deployment.get("status") or {}
    if generation is not None and int(status.get("observedGeneration") or 0) < int(generation):
        return 0
    ready = int(status.get("readyReplicas") or 0)
    updated = int(status.get("updatedReplicas") or 0)
    older = max(0, int(status.get("replicas") or 0) - updated)
    return max(0, min(updated, ready - older))


def desired_replicas(deployment: Mapping[str, Any] | None) -> int:
    """``spec.replicas`` of a live Deployment (what the HPA last set); 0 when there is none."""
    if not deployment:
        return 0
    return int((deployment.get("spec") or {}).get("replicas") or 0)


READ_STATUS: Mapping[str, tuple[str, ...]] = {
    "Deployment": ("replicas", "readyReplicas", "updatedReplicas", "observedGeneration")}
"""The only status fields of a child that a reconcile pass reads, per kind."""
_VOLATILE_METADATA = ("resourceVersion", "managedFields", "generation")


def fingerprint(live: Mapping[str, Any]) -> str:
    """What of a live child a reconcile pass can react to, as a string: everything but its
    ``status`` (except the fields in :data:`READ_STATUS`) and the metadata that changes with
    every write. Two events of a child with the same fingerprint need one reconcile, not two:
    the HPA controller, for one, rewrites every HPA's status every few seconds."""
    meta = {k: v for k, v in (live.get("metadata") or {}).items() if k not in _VOLATILE_METADATA}
    status = live.get("status") or {}
    kept = {k: status.get(k) for k in READ_STATUS.get(str(live.get("kind")), ())}
    rest = {k: v for k, v in live.items() if k not in ("metadata", "status")}
    return json.dumps([meta, kept, rest], sort_keys=True, default=str)


@dataclass(frozen=True)
class TrafficPlan:
    """Where traffic goes after this reconcile pass, and what a pending move waits for."""

    intent: str
    """``spec.traffic``: the role traffic should go to."""
    active: str
    """The role the Service selects (and ``status.activeModel``) after this pass."""
    switched: bool
    """Traffic moved in this pass (from the other role to ``active``)."""
    needed: int = 0
    """Ready replicas the intended role needs before traffic moves to it (0: nothing to move)."""
    ready: int = 0
    """Ready replicas the intended role has."""
    min_replicas: dict[str, int] = field(default_factory=dict)
    """Raised HPA ``minReplicas`` per role, while traffic waits to move there."""

    @property
    def pending(self) -> bool:
        """Traffic should move but the intended role is not Ready enough yet."""
        return self.intent != self.active

    @property
    def message(self) -> str:
        """One line for conditions, logs and events."""
        if self.pending:
            return (f"waiting for the {self.intent} model: {self.ready}/{self.needed} Ready "
                    f"replicas needed before traffic moves; traffic stays on {self.active}")
        if self.switched:
            return f"traffic moved to the {self.active} model ({self.ready} Ready replicas)"
        return f"traffic goes to the {self.active} model"


def plan_traffic(*, intent: str, current: str, ready: Mapping[str, int], min_replicas: int,
                 max_replicas: int) -> TrafficPlan:
    """Decide which role serves.

    Traffic moves from ``current`` to ``intent`` once ``intent`` has as many Ready replicas as
    ``current`` has now (so it can carry the same load), at least ``min_replicas`` and at most
    ``max_replicas``. Until then ``current`` keeps serving, and the intended role's HPA minimum
    is raised to that count so the autoscaler brings the replicas up.

    ``ready`` maps a role to the Ready replicas of its Deployment's current template
    (:func:`ready_replicas`).
    """
    if intent == current:
        return TrafficPlan(intent=intent, active=current, switched=False)
    needed = min(max(ready.get(current, 0), min_replicas, 1), max_replicas)
    have = ready.get(intent, 0)
    if have >= needed:
        return TrafficPlan(intent=intent, active=intent, switched=True, needed=needed, ready=have)
    return TrafficPlan(intent=intent, active=current, switched=False, needed=needed, ready=have,
                       min_replicas={intent: needed})


HPA_SCALE_DOWN_WINDOW_S = 300
"""The HPA's default scale-down stabilization window, s (``behavior.scaleDown``'s
``stabilizationWindowSeconds``; kube-controller-manager's
``--horizontal-pod-autoscaler-downscale-stabilization``, 5 minutes)."""


def scale_down_window_s(behavior: Mapping[str, Any] | None) -> int:
    """The HPA's scale-down stabilization window in seconds under ``spec.scaling.behavior``
    (HPA v2's ``behavior``), else :data:`HPA_SCALE_DOWN_WINDOW_S`."""
    window = ((behavior or {}).get("scaleDown") or {}).get("stabilizationWindowSeconds")
    return HPA_SCALE_DOWN_WINDOW_S if window is None else int(window)


def hold_minimum(plan: TrafficPlan, hold: Mapping[str, Any] | None, now: datetime.datetime,
                 window_s: int) -> tuple[TrafficPlan, dict[str, Any] | None]:
    """Keep the HPA minimum of the role traffic just moved to at the Ready replicas it moved
    with, for ``window_s`` seconds (the HPA's scale-down stabilization window,
    :func:`scale_down_window_s`) after the move.

    Before the move that role served nothing, so every replica count its HPA recommended from
    its metrics was low; were its minimum to drop back to ``minReplicas`` at the move, the HPA
    could scale it down at its next sync, before its metrics show the load it now carries. Held
    for a window, the HPA's own stabilization then remembers the recommendations made under
    that load.

    ``hold`` is ``status.minReplicasHold`` as last written (``role``, ``replicas``, ``until``
    RFC 3339), or None. Returns the plan with the held minimum in its ``min_replicas`` and the
    hold to write (None: none, or it ended, or traffic moved on).
    """
    if plan.switched and plan.needed > 0:
        until = now + datetime.timedelta(seconds=window_s)
        hold = {"role": plan.active, "replicas": plan.needed, "until": timestamp(until)}
    if not hold or hold.get("role") != plan.active or window_s <= 0:
        return plan, None
    try:
        until = datetime.datetime.fromisoformat(str(hold["until"]).replace("Z", "+00:00"))
        replicas = int(hold["replicas"])
    except (KeyError, TypeError, ValueError):
        return plan, None
    if now >= until:
        return plan, None
    raised = {**plan.min_replicas,
              plan.active: max(plan.min_replicas.get(plan.active, 0), replicas)}
    return dataclasses.replace(plan, min_replicas=raised), dict(hold)


def unused_config_maps(config_maps: Iterable[Mapping[str, Any]],
                       holders: Iterable[Mapping[str, Any]], keep: Iterable[str],
                       owner_uid: str) -> list[str]:
    """Names of the revision ConfigMaps to delete: those ``owner_uid`` controls that are not in
    ``keep`` (what this pass wants) and that no pod template in ``holders`` mounts (the
    service's Deployments and ReplicaSets as stored, current and old: the Deployment controller
    keeps ``revisionHistoryLimit`` old ReplicaSets, and ``kubectl rollout undo`` brings one
    back, so its ConfigMap lives as long as it does). Sorted.

    ``config_maps``: the service's revision ConfigMaps as stored (see
    :func:`tailguard.operator.manifests.is_revision_config`). A ConfigMap another owner
    controls, or none does, is never chosen.
    """
    used = set(keep)
    for holder in holders:
        used |= config_maps_named(holder)
    return sorted(str(cm["metadata"]["name"]) for cm in config_maps
                  if controller_uid(cm) == owner_uid and cm["metadata"]["name"] not in used)


def _diff(desired: Any, live: Any, path: Path, atomic: tuple[Path, ...]) -> Any:
    """The merge patch taking ``live`` to ``desired`` at ``path``, or ``_SAME``."""
    if path in atomic:
        return _SAME if _subset(desired, live, path) else _replacement(desired, live)
    if isinstance(desired, dict) and isinstance(live, dict):
        out: dict[str, Any] = {}
        for key, value in desired.items():
            sub = _diff(value, live.get(key, _MISSING), path + (key,), atomic)
            if sub is not _SAME:
                out[key] = sub
        for owned in atomic:  # owned keys the desired object no longer has: remove them
            if owned[:-1] == path and owned[-1] not in desired and owned[-1] in live:
                out[owned[-1]] = None
        return out or _SAME
    return _SAME if _subset(desired, live, path) else desired


def _subset(desired: Any, live: Any, path: Path = ()) -> bool:
    """``desired`` is contained in ``live``: dicts by key, lists item by item, quantities by
    value (the server stores them in canonical form), else equality."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(
            key in live and _subset(value, live[key], path + (key,))
            for key, value in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(live) == len(desired)
                and all(_subset(d, v, path + ("[]",)) for d, v in zip(desired, live)))
    if isinstance(desired, str) and isinstance(live, str) and _is_quantity(path):
        return quantity.same(desired, live)
    return bool(desired == live) and type(desired) is type(live)


def _is_quantity(path: Path) -> bool:
    """Whether the value at ``path`` is a resource.Quantity in the objects built here:
    container requests and limits, an emptyDir's ``sizeLimit``, an HPA target's value."""
    return ((len(path) >= 3 and path[-3] == "resources" and path[-2] in ("requests", "limits"))
            or path[-1:] == ("sizeLimit",)
            or (len(path) >= 2 and path[-2] == "target" and path[-1] in ("averageValue",
                                                                         "value")))


def _replacement(desired: Any, live: Any) -> Any:
    """A merge patch value that makes ``live`` equal ``desired``: keys only ``live`` has are
    set to ``null`` (recursively in dicts both have)."""
    if not (isinstance(desired, dict) and isinstance(live, dict)):
        return desired
    out: dict[str, Any] = {key: None for key in live if key not in desired}
    for key, value in desired.items():
        out[key] = _replacement(value, live[key]) if key in live else value
    return out


def _merged_owner_references(desired: list[dict[str, Any]],
                             live: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """``None`` if every desired reference is in ``live``; else the live references (minus any
    stale copy of ours, by uid) followed by the desired ones."""
    missing = [ref for ref in desired if not any(_subset(ref, other) for other in live)]
    if not missing:
        return None
    uids = {ref.get("uid") for ref in desired}
    return [ref for ref in live if ref.get("uid") not in uids] + list(desired)


def _pop_path(obj: dict[str, Any], path: Path) -> None:
    node: Any = obj
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)
