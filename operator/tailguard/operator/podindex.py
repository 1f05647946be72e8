"""The runtime pods the operator watches: as the SLO guard reads them, and those that cannot start.

The operator watches the pods it created (by its ``app.kubernetes.io/managed-by`` label, read
only: it never writes a pod). :class:`PodIndex` keeps, for each InferenceService, what the
guard needs of each pod (:class:`PodTarget`: its uid, name, IP, role and readiness), not the
pod's body: a few hundred bytes a pod, whatever the size of its spec. It also keeps the pods
that cannot start (:class:`StuckPod`: an image that is not there, a container that crashes in
a loop), which the reconcile pass names in the role's condition. Thread-safe (kopf runs
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


NOT_STARTING_REASONS = frozenset({
    "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
    "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
    "CrashLoopBackOff"})
"""Reasons a container waits (``status.containerStatuses[].state.waiting.reason``, set by the
kubelet) that do not pass by themselves: the pod needs something a person must fix (an image,
a config, a model that loads). ``ContainerCreating`` and ``PodInitializing`` are not here: they
pass."""
CRASH_LOOP = "CrashLoopBackOff"
SAME_TROUBLE = (frozenset({"ErrImagePull", "ImagePullBackOff"}),
                frozenset({"RunContainerError", CRASH_LOOP}))
"""Reasons the kubelet alternates for one trouble: a pull that fails then backs off, a
container that fails to run then backs off."""
MESSAGE_CHARS = 300
"""Longest message kept of a waiting container."""


@dataclass(frozen=True)
class StuckPod:
    """A runtime pod whose container waits for a reason in :data:`NOT_STARTING_REASONS`."""

    namespace: str
    service: str
    role: str
    uid: str
    name: str
    reason: str
    message: str

    def line(self) -> str:
        """``NAME: REASON: MESSAGE`` (no message: ``NAME: REASON``)."""
        return f"{self.name}: {self.reason}" + (f": {self.message}" if self.message else "")


def stuck_pod(body: Mapping[str, Any]) -> StuckPod | None:
    """The pod as one that cannot start, or ``None``: no InferenceService or role label,
    terminating, or neither placed out of reach by a claim it mounts (:func:`_claim_trouble`)
    nor with a container waiting for a reason in :data:`NOT_STARTING_REASONS`. A crash
    loop's message is how the container last ended: its exit code and its termination message
    (the runtime writes ``CAUSE: message`` there when its model does not load, e.g.
    ``ModelChecksumMismatch: https://...``), else the kubelet's reason. It stays the same from one
    restart to the next; the kubelet's own names a back-off that doubles each time."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    service, role = labels.get(LABEL_SERVICE), labels.get(LABEL_ROLE)
    if not service or not role or meta.get("deletionTimestamp"):
        return None
    status = body.get("status") or {}

    def stuck(reason: str, message: str) -> StuckPod:
        return StuckPod(str(meta.get("namespace", "")), str(service), str(role),
                        str(meta.get("uid", "")), str(meta.get("name", "")), reason,
                        " ".join(message.split())[:MESSAGE_CHARS])

    claim = _claim_trouble(status)
    if claim is not None:
        return stuck(*claim)
    for container in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []):
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason not in NOT_STARTING_REASONS:
            continue
        if reason == CRASH_LOOP:  # the kubelet's message names the back-off, which grows
            ended = (container.get("lastState") or {}).get("terminated") or {}
            said = str(ended.get("message") or "").strip()
            message = (f"the container exited with code {ended.get('exitCode')}"
                       + (f": {said}" if said else
                          f" ({ended.get('reason') or 'no reason given'})") if ended else "")
        else:
            message = str(waiting.get("message") or "")
        return stuck(str(reason), message)
    return None


def _claim_trouble(status: Mapping[str, Any]) -> tuple[str, str] | None:
    """``(ClaimNotFound | ClaimNotBound, the scheduler's message)`` when the scheduler cannot
    place the pod because of a PersistentVolumeClaim it mounts (a ``pvc://`` model's), else
    ``None``. The scheduler's volume binding says ``persistentvolumeclaim "NAME" not found``
    or ``pod has unbound immediate PersistentVolumeClaims``; other reasons a pod waits for a
    node (CPU, taints) may pass and are not noted."""
    for cond in status.get("conditions") or []:
        if cond.get("type") != "PodScheduled" or cond.get("status") != "False" \
                or cond.get("reason") != "Unschedulable":
            continue
        message = str(cond.get("message") or "")
        lowered = message.lower()
        if "persistentvolumeclaim" in lowered and "not found" in lowered:
            return "ClaimNotFound", message
        if "unbound" in lowered and "persistentvolumeclaim" in lowered:
            return "ClaimNotBound", message
    return None


def _uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid", ""))


def _trouble(reason: str) -> str:
    """The reason, or the first of its :data:`SAME_TROUBLE` group, sorted."""
    for group in SAME_TROUBLE:
        if reason in group:
            return min(group)
    return reason


class PodIndex:
    """:class:`PodTarget` and :class:`StuckPod` by InferenceService (``namespace``, ``name``)
    and pod uid."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[tuple[str, str], dict[str, PodTarget]] = {}
        self._where: dict[str, tuple[str, str]] = {}  # pod uid -> its InferenceService
        self._stuck: dict[tuple[str, str], dict[str, StuckPod]] = {}
        self._stuck_where: dict[str, tuple[str, str]] = {}

    def keep(self, body: Mapping[str, Any]) -> bool:
        """A pod was listed, added or changed: index it, or drop it when it is no longer one to
        read (:func:`pod_target`); note it when it cannot start (:func:`stuck_pod`). Returns
        whether what :meth:`not_starting` says of its InferenceService changed.

        A note stands while the reason moves within one of :data:`SAME_TROUBLE` (a pull that
        fails, then backs off, then fails again) and, for a crash loop, until the pod is Ready
        (its container runs for a while after each restart): saying "it started" and "it
        cannot start" at every retry would reconcile and write each time."""
        uid = _uid(body)
        target, stuck = pod_target(body), stuck_pod(body)
        with self._lock:
            self._drop_target(uid)
            if target is not None:
                key = (target.namespace, target.service)
                self._pods.setdefault(key, {})[uid] = target
                self._where[uid] = key
            before = self._stuck_note(uid)
            if before is not None and not (body.get("metadata") or {}).get("deletionTimestamp"):
                if stuck is None and before.reason == CRASH_LOOP and (
                        target is None or not target.ready):
                    stuck = before
                elif stuck is not None and _trouble(stuck.reason) == _trouble(before.reason) \
                        and (stuck.namespace, stuck.service) == (before.namespace,
                                                                 before.service):
                    stuck = before
            return self._note_stuck(uid, stuck) != stuck

    def drop(self, body: Mapping[str, Any]) -> bool:
        """A pod was deleted. Returns whether what :meth:`not_starting` says of its
        InferenceService changed."""
        uid = _uid(body)
        with self._lock:
            self._drop_target(uid)
            return self._note_stuck(uid, None) is not None

    def forget(self, body: Mapping[str, Any]) -> None:
        """Forget what was noted of the pod's start, so that its next event counts as a change
        (the pass that would have reported it failed)."""
        with self._lock:
            self._note_stuck(_uid(body), None)

    def _drop_target(self, uid: str) -> None:
        key = self._where.pop(uid, None)
        if key is None:
            return
        pods = self._pods.get(key, {})
        pods.pop(uid, None)
        if not pods:
            self._pods.pop(key, None)

    def _stuck_note(self, uid: str) -> StuckPod | None:
        key = self._stuck_where.get(uid)
        return None if key is None else self._stuck.get(key, {}).get(uid)

    def _note_stuck(self, uid: str, stuck: StuckPod | None) -> StuckPod | None:
        """Set the pod's note to ``stuck`` (or none); return the note it had (lock held)."""
        key = self._stuck_where.pop(uid, None)
        before = self._stuck.get(key, {}).pop(uid, None) if key is not None else None
        if key is not None and not self._stuck.get(key):
            self._stuck.pop(key, None)
        if stuck is not None:
            where = (stuck.namespace, stuck.service)
            self._stuck.setdefault(where, {})[uid] = stuck
            self._stuck_where[uid] = where
        return before

    def not_starting(self, namespace: str, service: str) -> dict[str, list[StuckPod]]:
        """The pods of one InferenceService that cannot start, by role, each list by name."""
        with self._lock:
            stuck = list(self._stuck.get((namespace, service), {}).values())
        out: dict[str, list[StuckPod]] = {}
        for pod in sorted(stuck, key=lambda p: p.name):
            out.setdefault(pod.role, []).append(pod)
        return out

    def ready(self, namespace: str, service: str, role: str) -> list[PodTarget]:
        """The Ready pods of one role of one InferenceService, by name."""
        with self._lock:
            pods = list(self._pods.get((namespace, service), {}).values())
        return sorted((p for p in pods if p.role == role and p.ready), key=lambda p: p.name)

    def uids(self, namespace: str, service: str) -> set[str]:
        """The uids of every indexed pod of one InferenceService (any role, Ready or not)."""
        with self._lock:
            return set(self._pods.get((namespace, service), {}))
