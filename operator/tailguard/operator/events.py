"""Events about InferenceServices, with repeats folded into one Event.

An Event the operator has recorded before (the same object, ``type``, ``reason`` and
``message``) is not created again: the stored one's ``count`` goes up by one and its
``lastTimestamp`` moves, so ``kubectl describe`` shows ``(x3 over 10m)`` and a flapping
condition cannot fill etcd. This is client-go's event recorder's rule (``tools/record``,
``EventCorrelator``'s logger: a least-recently-used table of 4,096 keys, a hit patches
``count`` and ``lastTimestamp``). An Event that has gone meanwhile (the API server keeps them
an hour, ``--event-ttl``) is created afresh. The table is bounded; the operator's own state
does not grow with the Events it records.

The key and the patch are pure functions; :class:`EventRecorder` is the thin shell that calls
:mod:`tailguard.operator.kube`.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

from tailguard.operator import kube
from tailguard.spec.conditions import timestamp

logger = logging.getLogger(__name__)

MAX_REMEMBERED = 4096
"""Most distinct Events remembered for folding repeats (client-go's ``maxLruCacheEntries``);
the least recently recorded is forgotten first, and its next repeat is a new Event."""

EventKey = tuple[str, str, str, str, str]
"""``(namespace, uid of the object, type, reason, message)``."""


def event_key(involved: Mapping[str, Any], type_: str, reason: str, message: str) -> EventKey:
    """What makes two Events the same one: the object (by namespace and uid, so a service
    deleted and created again under its name starts afresh), ``type_``, ``reason`` and the
    message as stored (cut to 1,024 characters, as :func:`kube.post_event` does)."""
    meta = involved["metadata"]
    return (meta["namespace"], meta.get("uid", "") or meta["name"], type_, reason,
            message[:kube.EVENT_MESSAGE_CHARS])


def repeat_patch(count: int, now: datetime.datetime) -> dict[str, Any]:
    """The merge patch that records one more occurrence of a stored Event: its new ``count``
    and ``lastTimestamp`` (RFC 3339, seconds, UTC)."""
    return {"count": count, "lastTimestamp": timestamp(now)}


@dataclass
class _Stored:
    namespace: str
    name: str
    count: int


class EventRecorder:
    """Records Events, folding a repeat into the Event already stored (see the module).

    Safe to call from several threads (kopf's workers and the guard's loop): the table is
    locked; the API calls are made outside the lock. ``max_remembered``: the table's bound.
    Best effort, like :func:`kube.post_event`: an API refusal is logged, never raised.
    """

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self.max_remembered = max_remembered
        self._stored: OrderedDict[EventKey, _Stored] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._stored)

    def record(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str,
               now: datetime.datetime) -> None:
        """Record that ``reason`` happened to ``involved`` (an object as the API returns it):
        raise the count of the same Event recorded before, else create one."""
        key = event_key(involved, type_, reason, message)
        with self._lock:  # the count is taken here, so two threads never write the same one
            stored = self._stored.get(key)
            if stored is not None:
                self._stored.move_to_end(key)
                stored.count += 1
                count = stored.count
        if stored is not None:
            try:
                kube.merge_patch("Event", stored.namespace, stored.name,
                                 repeat_patch(count, now))
                return
            except kube.NotFound:  # expired or deleted: record it anew
                pass
            except kube.KubeError as exc:
                logger.warning("event repeat not recorded: event=%s/%s reason=%s error=%s",
                               stored.namespace, stored.name, reason, exc)
                return
        name = kube.post_event(involved, type_=type_, reason=reason, message=message, now=now)
        if name is None:
            return
        with self._lock:
            self._stored[key] = _Stored(key[0], name, 1)
            self._stored.move_to_end(key)
            while len(self._stored) > self.max_remembered:
                self._stored.popitem(last=False)


_recorder = EventRecorder()


def record(involved: Mapping[str, Any], *, type_: str, reason: str, message: str,
           now: datetime.datetime) -> None:
    """:meth:`EventRecorder.record` on the process's one recorder."""
    _recorder.record(involved, type_=type_, reason=reason, message=message, now=now)
