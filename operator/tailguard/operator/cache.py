"""What the operator's watches delivered: the latest body of each object, for the passes to read.

A pass reads its InferenceService and its children. Read from the API server, every
child event whose fingerprint changed cost nine GETs: creating 100 services took 5,781. kopf
already holds a watch on the InferenceServices and on each child kind (filtered by the
operator's label); every event it delivers, and every object a write of the operator's returns,
is kept here, and a pass reads from here.

A namespace is served from here only once the cache is *seeded* there: one LIST of the
InferenceServices and one per child kind, labelled as the watches are, so that an absent entry
means an absent object, not an event not yet delivered. The first pass in a namespace seeds it,
and every resync seeds each namespace again, so what a silent watch missed (kopf issues #955,
#1276) is corrected within a resync period, as before.

Watch events can arrive after a newer body of the same object was kept (a write's answer comes
before the watch event of an older write). Bodies are compared by ``resourceVersion`` where
both are integers, as every etcd-backed API server makes them; an older one is ignored, and a
deletion leaves a tombstone so that a late body cannot bring the object back. (The API calls
``resourceVersion`` opaque; where it is not an integer, the latest delivered wins, as in a
client-go informer.)
"""

from __future__ import annotations

import threading
from typing import Any, Iterable, Mapping

import orjson

Key = tuple[str, str, str]
"""``(kind, namespace, name)``."""

MAX_TOMBSTONES = 10_000
"""Deletions remembered (the oldest go first): a late body of an object deleted longer ago
than that is the resync's to correct."""


def _version(body: Mapping[str, Any]) -> int | None:
    value = str((body.get("metadata") or {}).get("resourceVersion", ""))
    return int(value) if value.isdigit() else None


def _key(body: Mapping[str, Any]) -> Key:
    meta = body["metadata"]
    return str(body["kind"]), str(meta.get("namespace", "")), str(meta["name"])


class WatchCache:
    """Objects by :data:`Key` (without ``metadata.managedFields``), and the namespaces it holds
    in full. Thread-safe (kopf runs handlers in worker threads)."""

    def __init__(self, group_label: str | None = None) -> None:
        """``group_label``: objects that carry it are also found by its value
        (:meth:`grouped`)."""
        self._lock = threading.Lock()
        self._group_label = group_label
        self._objects: dict[Key, tuple[int | None, bytes, str | None]] = {}
        """Each object's ``resourceVersion``, its body as compact JSON (a tenth of the
        memory of the parsed dict: 1,000 InferenceServices and their 8,000 children took the
        operator past the chart's 512 MiB limit held as dicts; parsed again on each read), and
        its ``group_label`` value."""
        self._groups: dict[tuple[str, str, str], set[str]] = {}
        """``(kind, namespace, group)`` to the names of the kept objects in it."""
        self._gone: dict[Key, int | None] = {}  # tombstones: the deletion's resourceVersion
        self._seeded: set[str] = set()

    def keep(self, body: Mapping[str, Any]) -> None:
        """Keep ``body`` (with its ``kind``: as a watch event or a write's answer delivers it)
        unless what is kept, or the object's deletion, is newer."""
        key, version = _key(body), _version(body)
        with self._lock:
            if not _newer(version, self._gone.get(key, _NONE)):
                return
            kept = self._objects.get(key)
            if kept is not None and not _newer(version, kept[0]):
                return
            self._gone.pop(key, None)
            labels = (body.get("metadata") or {}).get("labels") or {}
            group = labels.get(self._group_label) if self._group_label else None
            self._ungroup(key)
            self._objects[key] = (version, orjson.dumps(_lean(body), default=_plain), group)
            if group is not None:
                self._groups.setdefault((key[0], key[1], str(group)), set()).add(key[2])

    def drop(self, body: Mapping[str, Any]) -> None:
        """The object was deleted (a ``DELETED`` event carrying its last body)."""
        key = _key(body)
        with self._lock:
            self._ungroup(key)
            self._objects.pop(key, None)
            self._gone[key] = _version(body)
            while len(self._gone) > MAX_TOMBSTONES:
                del self._gone[next(iter(self._gone))]

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The kept body (a new dict on each call: the caller may change it), or ``None``."""
        with self._lock:
            kept = self._objects.get((kind, namespace, name))
        if kept is None:
            return None
        body: dict[str, Any] = orjson.loads(kept[1])
        return body

    def grouped(self, kind: str, namespace: str, group: str) -> list[dict[str, Any]]:
        """The kept bodies of ``kind`` in ``namespace`` whose ``group_label`` is ``group`` (new
        dicts, in no particular order)."""
        with self._lock:
            names = self._groups.get((kind, namespace, group), ())
            kept = [self._objects[(kind, namespace, name)][1] for name in names]
        return [orjson.loads(body) for body in kept]

    def names(self, kind: str) -> list[tuple[str, str]]:
        """``(namespace, name)`` of every kept object of ``kind``."""
        with self._lock:
            return [(key[1], key[2]) for key in self._objects if key[0] == kind]

    def seeded(self, namespace: str) -> bool:
        """Whether an absent child in ``namespace`` is known to be absent."""
        with self._lock:
            return namespace in self._seeded

    def seed(self, namespace: str,
             lists: Mapping[str, tuple[Iterable[Mapping[str, Any]], str]]) -> None:
        """Replace what is kept of each kind in ``namespace`` by a fresh list of it (``lists``:
        kind to the listed bodies, with their ``kind``, and the list's ``resourceVersion``),
        and serve the namespace's children from here from now on. A kept object the list
        lacks is dropped unless it is newer than the list (created since); a listed one is
        kept unless what is kept is newer.
        """
        for kind, (bodies, list_version) in lists.items():
            listed = {_key(body): body for body in bodies}
            as_of = int(list_version) if list_version.isdigit() else None
            with self._lock:
                stale = [key for key, kept in self._objects.items()
                         if key[0] == kind and key[1] == namespace and key not in listed
                         and not (as_of is not None and (kept[0] or 0) > as_of)]
                for key in stale:
                    self._ungroup(key)
                    del self._objects[key]
            for body in listed.values():
                self.keep(body)
        with self._lock:
            self._seeded.add(namespace)

    def _ungroup(self, key: Key) -> None:
        """Take a kept object out of its group (the lock held)."""
        kept = self._objects.get(key)
        if kept is None or kept[2] is None:
            return
        group = (key[0], key[1], kept[2])
        names = self._groups.get(group)
        if names is not None:
            names.discard(key[2])
            if not names:
                del self._groups[group]


_NONE = object()


def _plain(value: Any) -> Any:
    """For orjson: a mapping that is not a ``dict`` (kopf's ``Body`` and its views) as one."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _lean(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """``body`` without ``metadata.managedFields``: no pass reads it, and it is often the
    largest part of an object (a field set per writer)."""
    meta = body.get("metadata") or {}
    if "managedFields" not in meta:
        return body
    return {**body, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _newer(version: int | None, than: Any) -> bool:
    """Whether a body of ``version`` may replace one of version ``than`` (``_NONE``: nothing
    to compare with; ``None`` on either side: not comparable, so the later one wins)."""
    if than is _NONE or version is None or than is None:
        return True
    return bool(version > than)
