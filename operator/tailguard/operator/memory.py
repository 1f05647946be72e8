"""What the operator remembers between events, and what its periodic resync covers.

:class:`KnownServices` holds the InferenceServices the handlers have seen; :func:`resync_targets`
adds those a list finds, so a pass covers every object in scope even when a watch went silent;
:class:`SeenChildren` lets a child event through only when it changes what a pass reads. The
loop that runs the passes lives with the handlers (:func:`tailguard.operator.handlers.resync`).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Sequence

from tailguard.operator import kube, reconcile
from tailguard.spec import resource


class KnownServices:
    """The InferenceServices the operator has seen (``(namespace, name)``), for the resync.
    Filled by the handlers (kopf resumes every existing object at startup); an object found
    gone by a resync pass is dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: set[tuple[str, str]] = set()

    def add(self, namespace: str, name: str) -> None:
        with self._lock:
            self._keys.add((namespace, name))

    def discard(self, namespace: str, name: str) -> None:
        with self._lock:
            self._keys.discard((namespace, name))

    def snapshot(self) -> list[tuple[str, str]]:
        """The keys, sorted (a copy: handlers may add while a resync runs)."""
        with self._lock:
            return sorted(self._keys)


def resync_targets(namespaces: Sequence[str], known: KnownServices) -> list[tuple[str, str]]:
    """The InferenceServices a resync pass reconciles: listed from the API server (every
    namespace when ``namespaces`` is empty, else each namespace named exactly), plus those the
    handlers have seen (namespaces matched by a glob pattern). Listing, rather than trusting
    the watches, is the point: a watch that went silent (kopf issues #955, #1276) hides
    objects from the handlers, never from a list.

    Raises:
        kube.KubeError: a list was refused.
    """
    found = set(known.snapshot())
    scopes: list[str | None] = list(namespaces) if namespaces else [None]
    for namespace in scopes:
        if namespace is None or not any(ch in namespace for ch in "*?[!"):
            items, _ = kube.list_objects(resource.KIND, namespace)
            found.update((i["metadata"]["namespace"], i["metadata"]["name"]) for i in items)
    return sorted(found)


class SeenChildren:
    """The :func:`reconcile.fingerprint` of each child last reacted to, by uid."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._prints: dict[str, str] = {}

    def changed(self, event_type: str, body: Mapping[str, Any]) -> bool:
        """Whether this event of a child can change a reconcile pass (a deletion always can);
        records it."""
        uid = str((body.get("metadata") or {}).get("uid", ""))
        with self._lock:
            if event_type == "DELETED":
                self._prints.pop(uid, None)
                return True
            print_ = reconcile.fingerprint(body)
            if self._prints.get(uid) == print_:
                return False
            self._prints[uid] = print_
            return True

    def forget(self, body: Mapping[str, Any]) -> None:
        """Drop what was recorded for this child (its pass failed: the next event counts)."""
        with self._lock:
            self._prints.pop(str((body.get("metadata") or {}).get("uid", "")), None)
