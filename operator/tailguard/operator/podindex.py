"""The runtime pods the operator watches, as the SLO guard reads them.

The operator watches the pods it created (by its ``app.kubernetes.io/managed-by`` label, read
only: it never writes a pod). :class:`PodIndex` keeps, for each InferenceService, what the
guard needs of each pod (:class:`PodTarget`: its uid, name, IP, role and readiness), not the
pod's body: a few hundred bytes a pod, whatever the size of its spec. Thread-safe (kopf runs
handlers in worker threads; the guard reads from the event loop). Pure otherwise: no I/O.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

from tailguard.operator.manifests import LABEL_ROLE, LABEL_SERVICE, PORT, PORT_NAME


@dataclass(frozen=True)
class PodTarget:
    """A runtime pod the guard can read: ``uid`` (a restarted container keeps it; a new pod
    gets a new one), ``name``, ``ip`` and ``port`` (its container port named ``http``), its
    ``role`` and whether it is ``ready`` (its ``Ready`` condition is ``True``)."""

    namespace: str
    service: str
    role: str
    uid: str
    name: str
    ip: str
    ready: bool
    port: int = PORT


def pod_target(body: Mapping[str, Any]) -> PodTarget | None:
    """A runtime pod as the guard sees it, or ``None`` when it is not one to read: no
    InferenceService or role label, terminating, not running, or no IP yet."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = body.get("status") or {}
    service, role, ip = labels.get(LABEL_SERVICE), labels.get(LABEL_ROLE), status.get("podIP")
    if not service or not role or not ip or meta.get("deletionTimestamp") \
            or status.get("phase") != "Running":
        return None
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])
    ports = [p.get("containerPort") for c in (body.get("spec") or {}).get("containers") or []
             for p in c.get("ports") or [] if p.get("name") == PORT_NAME]
    port = ports[0] if ports and isinstance(ports[0], int) else PORT
    return PodTarget(str(meta.get("namespace", "")), str(service), str(role),
                     str(meta.get("uid", "")), str(meta.get("name", "")), str(ip), ready, port)


class PodIndex:
    """:class:`PodTarget` by InferenceService (``namespace``, ``name``) and pod uid."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict[str, PodTarget]] = {}
        self._where: dict[str, tuple[str, str]] = {}  # pod uid -> its InferenceService

    def keep(self, body: Mapping[str, Any]) -> None:
        """A pod was listed, added or changed: index it, or drop it when it is no longer one to
        read (:func:`pod_target`)."""
        target = pod_target(body)
        if target is None:
            self.drop(body)
            return
        key = (target.namespace, target.service)
        with self._lock:
            self._pods.setdefault(key, {})[target.uid] = target
            self._where[target.uid] = key

    def drop(self, body: Mapping[str, Any]) -> None:
        """A pod was deleted (or stopped being one to read)."""
        uid = str((body.get("metadata") or {}).get("uid", ""))
        with self._lock:
            key = self._where.pop(uid, None)
            if key is None:
                return
            pods = self._pods.get(key, {})
            pods.pop(uid, None)
            if not pods:
                self._pods.pop(key, None)

    def ready(self, namespace: str, service: str, role: str) -> list[PodTarget]:
        """The Ready pods of one role of one InferenceService, by name."""
        with self._lock:
            pods = list(self._pods.get((namespace, service), {}).values())
        return sorted((p for p in pods if p.role == role and p.ready), key=lambda p: p.name)

    def uids(self, namespace: str, service: str) -> set[str]:
        """The uids of every indexed pod of one InferenceService (any role, Ready or not)."""
        with self._lock:
            return set(self._pods.get((namespace, service), {}))
