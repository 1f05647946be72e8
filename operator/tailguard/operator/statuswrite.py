"""Writing a part of an InferenceService's status without erasing anyone else's.

Two writers share the status: the reconcile pass (``observedGeneration``, ``activeModel``,
replicas and its conditions; :mod:`tailguard.operator.status`) and the SLO guard
(``observed``, ``guard`` and the ``SLOMet`` condition; :mod:`tailguard.operator.guarding`).
Each writes only its keys, as its own field manager, with the object's ``resourceVersion`` as a
precondition: a write that came in between makes the API answer 409, and the writer reads the
status again and recomputes its part from it, so no one's condition is lost to a stale read.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from tailguard.operator import kube
from tailguard.operator.cache import WatchCache
from tailguard.operator.status import OWNED_KEYS, status_patch
from tailguard.spec import resource

STATUS_ATTEMPTS = 5
"""Writes tried per pass (a status, a child's owner references) when other writers keep coming
in between (409)."""


def write_status(body: Mapping[str, Any],
                 compute: Callable[[Mapping[str, Any]], dict[str, Any]],
                 cache: WatchCache | None = None, *, keys: Sequence[str] = OWNED_KEYS,
                 field_manager: str = kube.OPERATOR_MANAGER) -> bool:
    """Write the ``keys`` of the status that ``compute`` makes from the stored one, if they
    differ, as ``field_manager``, with the object's ``resourceVersion`` as a precondition
    (read and computed again after a 409). Returns whether it wrote. What it writes or reads
    is kept in ``cache``.

    Raises:
        kube.KubeError: the API refused, or others wrote in between :data:`STATUS_ATTEMPTS`
            times in a row.
    """
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    current: Mapping[str, Any] | None = body
    for _ in range(STATUS_ATTEMPTS):
        if current is None or current["metadata"].get("deletionTimestamp"):
            return False
        stored = current.get("status") or {}
        patch = status_patch(stored, compute(stored), keys)
        if patch is None:
            return False
        patch["metadata"] = {"resourceVersion": current["metadata"]["resourceVersion"]}
        try:
            stored = kube.patch_status(namespace, name, patch, field_manager=field_manager)
            if cache is not None:
                cache.keep(stored)
            return True
        except kube.Conflict:
            current = kube.get(resource.KIND, namespace, name)
            if cache is not None and current is not None:
                cache.keep(current)
    raise kube.KubeError(409, "Conflict", f"status of {namespace}/{name}: other writers came "
                         f"in between {STATUS_ATTEMPTS} times in a row")
