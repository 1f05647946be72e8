"""The SLO guard in a cluster: one operator-wide task that observes, decides and records.

Every ``slo.windowSeconds`` of each InferenceService the operator knows (its watch cache), the
task reads ``/tailguard/stats`` of each Ready runtime pod of the role traffic goes to, on the
pod's IP (:class:`~tailguard.operator.podindex.PodIndex`, fed by the pod watch), at most
``guard_concurrency`` reads at once and ``guard_read_timeout_seconds`` each: a pod that does
not answer is left out of the window, counted (``tailguard_guard_reads_total``) and named in
the log and in ``status.observed.unreadPods``, and never delays the others. Each pod is
differenced against its previous read and the pods are summed
(:class:`~tailguard.guard.pods.PodWindows`), and the same pure decision as ``tailguard up``
judges the window (:func:`~tailguard.guard.policy.decide`, with the replicas read and
``maxReplicas``: overload with room to scale is the HPA's job, never a rollback).

An automatic rollback is a status write: ``status.guard`` records it (``rolledBackAt``,
``rollbackReason``, ``rolledBackModel``, ``lastActionTime``), and the reconcile pass, which
reads the effective intent from there (:func:`~tailguard.guard.record.traffic_intent`), raises
the fallback and moves the Service once its pods are Ready, as for a manual rollback. So a
restarted operator finds the rollback and neither loses nor repeats it. A roll-forward request
(the ``tailguard.dev/roll-forward`` annotation) is recorded the same way.

Status writes are bounded: at once on a guard transition (its state, its count of breached
windows or the ``SLOMet`` status changes, a rollback, a roll-forward), otherwise at most one per InferenceService per
``max(windowSeconds, 30 s)`` while what it would write changes, and none while it does not (an
idle service writes nothing). The guard writes only ``status.observed``, ``status.guard`` and
the ``SLOMet`` condition, as the field manager ``tailguard-guard``
(:func:`~tailguard.operator.statuswrite.write_status`).

Not a kopf timer or daemon (they add finalizers); paused while this replica is not the active
peer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import httpx
from prometheus_client import Counter

from tailguard.guard.observe import Observation, observe, status_observed
from tailguard.guard.pods import PodWindows, totals_of
from tailguard.guard.policy import (
    Action,
    Decision,
    GuardSpec,
    History,
    decide,
    remember,
    rolled_forward,
)
from tailguard.guard.record import (
    GuardRecord,
    format_time,
    guard_status,
    history_from,
    roll_forward_request,
    status_guard_patch,
)
from tailguard.guard.rollbacks import bind_rollbacks
from tailguard.operator import events, kube, manifests
from tailguard.operator.cache import WatchCache
from tailguard.operator.podindex import PodIndex, PodTarget
from tailguard.operator.settings import OperatorSettings
from tailguard.operator.statuswrite import write_status
from tailguard.spec import resource, schema
from tailguard.spec.conditions import set_condition
from tailguard_runtime.stats import TotalsSnapshot

logger = logging.getLogger(__name__)

GUARD_KEYS = ("observed", "guard", "conditions")
"""The ``status`` keys the guard writes (of ``conditions``, only ``SLOMet`` changes)."""
MIN_WRITE_INTERVAL_S = 30.0
"""Least seconds between two status writes of one InferenceService that are not transitions
(or ``windowSeconds`` when longer)."""
MAX_UNREAD_NAMES = 10
"""Pods named in ``status.observed.unreadPods`` at most."""
PEERING_TTL_S = 5.0
"""How long an answer of "is this replica the active peer" is reused, in seconds."""
IDLE_SLEEP_S = 1.0
"""Longest sleep of the loop: how soon a new InferenceService gets its first read."""
STATS_PATH = "/tailguard/stats"

READS = Counter("tailguard_guard_reads",
                "Reads of a runtime pod's totals by the SLO guard, by result (ok, timeout, "
                "error).", ("result",))
for _result in ("ok", "timeout", "error"):
    READS.labels(_result)


@dataclass
class _Tracked:
    """What the guard holds in memory of one InferenceService."""

    next_s: float
    pods: PodWindows = field(default_factory=PodWindows)
    history: History = field(default_factory=History)
    last_read_s: float | None = None
    written_s: float | None = None
    written: Any = None
    """What the last write held, without its timestamps (:func:`_comparable`)."""
    written_state: tuple[str, int, str] | None = None
    """``(status.guard.state, status.guard.breaches, SLOMet status)`` last written."""
    count_rollback: Callable[[str], None] | None = None


class ClusterGuard:
    """The operator's SLO guard (see the module docstring).

    ``reconcile(namespace, name)`` runs a reconcile pass (blocking; called in a worker thread
    after a rollback or roll-forward was recorded); ``is_active(namespace)`` says whether this
    replica may write (``namespace`` ``None``: for the whole cluster). ``clock`` is monotonic
    seconds and ``wall`` the aware UTC time, parameters for tests.
    """

    def __init__(self, settings: OperatorSettings, cache: WatchCache, pods: PodIndex, *,
                 reconcile: Callable[[str, str], None],
                 is_active: Callable[[str | None], bool] | None = None,
                 cluster_wide: bool = True,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(
                     datetime.timezone.utc)) -> None:
        self.settings = settings
        self.cache = cache
        self.pods = pods
        self._reconcile = reconcile
        self._is_active = is_active
        self._cluster_wide = cluster_wide
        self._clock = clock
        self._wall = wall
        self._tracked: dict[tuple[str, str], _Tracked] = {}
        self._active: dict[str | None, tuple[float, bool]] = {}
        self._reads = asyncio.Semaphore(settings.guard_concurrency)
        self._client: httpx.AsyncClient | None = None

    async def run(self) -> None:
        """Guard every InferenceService in the watch cache, forever (until cancelled). A failure
        of one service's window is logged and never stops the others."""
        timeout = httpx.Timeout(self.settings.guard_read_timeout_seconds)
        limits = httpx.Limits(max_connections=self.settings.guard_concurrency,
                              max_keepalive_connections=self.settings.guard_concurrency)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            self._client = client
            while True:
                await asyncio.sleep(await self.round())

    async def round(self) -> float:
        """Close the window of every InferenceService that is due; return the seconds until
        the next one is."""
        now_s = self._clock()
        known = set(self.cache.names(resource.KIND))
        for key in [key for key in self._tracked if key not in known]:
            del self._tracked[key]
        due = []
        for key in known:
            tracked = self._tracked.get(key)
            if tracked is None:
                tracked = self._tracked[key] = _Tracked(next_s=now_s)
            if tracked.next_s <= now_s:
                due.append(key)
        if due:
            results = await asyncio.gather(*(self._due(key, now_s) for key in due),
                                           return_exceptions=True)
            for (namespace, name), result in zip(due, results):
                if isinstance(result, BaseException):
                    logger.warning("slo guard window failed service=%s/%s error=%s", namespace,
                                   name, result, exc_info=not isinstance(result, kube.KubeError))
        soonest = min((t.next_s for t in self._tracked.values()), default=now_s + IDLE_SLEEP_S)
        return min(max(soonest - self._clock(), 0.05), IDLE_SLEEP_S)

    async def _due(self, key: tuple[str, str], now_s: float) -> None:
        namespace, name = key
        tracked = self._tracked[key]
        body = self.cache.get(resource.KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        try:
            isvc = resource.parse(body, default_namespace=namespace)
        except schema.SpecError:
            tracked.next_s = now_s + IDLE_SLEEP_S  # the reconcile pass reports it
            return
        window_s = float(isvc.slo.window_seconds)
        # a fixed schedule; a window missed (a slow round) is not made up
        tracked.next_s = max(tracked.next_s + window_s, now_s + window_s / 2)
        if not await self._may_write(namespace):
            tracked.last_read_s = None  # a standby judges nothing; it starts afresh if it leads
            tracked.pods = PodWindows()
            return
        await self.window(body, isvc, tracked)

    async def window(self, body: Mapping[str, Any], isvc: resource.InferenceService,
                     tracked: _Tracked) -> Decision:
        """Close one window of ``isvc`` (``body``: as stored): read, decide, record."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        status = body.get("status") or {}
        spec = GuardSpec.from_service(isvc, local=False)
        active = status.get("activeModel")
        role = active if isinstance(active, str) and active in manifests.ROLES else "primary"
        record = GuardRecord.from_status(status)
        transition = False
        request = roll_forward_request(meta.get("annotations"), record)
        now_s, now = self._clock(), self._wall()
        if request is not None:
            tracked.history = rolled_forward(tracked.history, now_s)
            record = dataclasses.replace(record, rolled_back_at=None, reason="", model="",
                                         roll_forward_observed=request)
            transition = True
            self._say(namespace, name, f"rolled forward by {request!r}: the guard judges the "
                      "primary again from its next window")

        pods = self.pods.ready(namespace, name, role)
        reads, unread = await self._read_pods(pods, role)
        now_s, now = self._clock(), self._wall()
        obs = self._observe(tracked, spec, role, reads, now_s, namespace, name)
        if obs is not None:
            tracked.history = remember(spec, tracked.history, obs)
        decision = decide(spec, history_from(record, tracked.history, now=now, now_s=now_s),
                          now_s)
        if decision.action is Action.ROLL_BACK:
            record = dataclasses.replace(record, rolled_back_at=now, reason=decision.reason,
                                         model=spec.primary, last_action_at=now)
            transition = True

        stamp = format_time(now)
        observed = None if obs is None else {
            **status_observed(obs, stamp), "pods": len(reads),
            **({"unreadPods": unread[:MAX_UNREAD_NAMES]} if unread else {})}
        guard = guard_status(decision, record, stamp)
        state = (decision.state, decision.breaches, decision.slo_status)
        comparable = _comparable(observed, guard, decision)
        transition = transition or state != tracked.written_state
        if not write_due(transition=transition, changed=comparable != tracked.written,
                         last_write_s=tracked.written_s, window_s=spec.window_seconds,
                         now_s=now_s):
            return decision
        written = await asyncio.to_thread(self._write, body, observed, guard, decision)
        if written:
            tracked.written_s, tracked.written, tracked.written_state = now_s, comparable, state
        if decision.action is Action.ROLL_BACK and written:
            self._rolled_back(body, tracked, decision)
        if transition and written and (decision.action is Action.ROLL_BACK or request):
            await asyncio.to_thread(self._reconcile, namespace, name)
        return decision

    def _observe(self, tracked: _Tracked, spec: GuardSpec, role: str,
                 reads: Mapping[str, TotalsSnapshot], now_s: float, namespace: str,
                 name: str) -> Observation | None:
        """The window since the last read, or ``None`` when there is nothing to judge (no pod
        read twice yet, or pods still on another SLO)."""
        last, tracked.last_read_s = tracked.last_read_s, now_s
        try:
            counts, replicas = tracked.pods.window(reads, self.pods.uids(namespace, name))
            if last is None or replicas == 0:
                return None
            return observe(counts, role=role, end_s=now_s, window_s=max(now_s - last, 1e-3),
                           slo_ms=spec.p99_latency_ms, replicas=replicas)
        except ValueError as exc:  # pods of an old and a new SLO, during a rollout
            logger.info("slo guard service=%s/%s window not judged: %s", namespace, name, exc)
            return None

    async def _read_pods(self, pods: list[PodTarget],
                         role: str) -> tuple[dict[str, TotalsSnapshot], list[str]]:
        """Read each pod's totals concurrently; return them by pod uid, and the names of the
        pods that did not answer in time or answered something unreadable."""
        answers = await asyncio.gather(*(self._read(pod, role) for pod in pods))
        reads = {pod.uid: totals for pod, totals in zip(pods, answers) if totals is not None}
        unread = [pod.name for pod, totals in zip(pods, answers) if totals is None]
        return reads, unread

    async def _read(self, pod: PodTarget, role: str) -> TotalsSnapshot | None:
        assert self._client is not None, "run() opens the client"
        host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip  # an IPv6 pod IP
        url = f"http://{host}:{pod.port}{STATS_PATH}"
        async with self._reads:
            try:
                answer = await self._client.get(url)
                answer.raise_for_status()
                totals = totals_of(answer.json(), role)
            except httpx.TimeoutException:
                READS.labels("timeout").inc()
                logger.warning("slo guard: pod %s/%s did not answer %s within %gs", pod.namespace,
                               pod.name, STATS_PATH, self.settings.guard_read_timeout_seconds)
                return None
            except (httpx.HTTPError, ValueError) as exc:
                READS.labels("error").inc()
                logger.warning("slo guard: pod %s/%s: %s %s", pod.namespace, pod.name,
                               STATS_PATH, exc)
                return None
        READS.labels("ok").inc()
        return totals

    def _write(self, body: Mapping[str, Any], observed: dict[str, Any] | None,
               guard: dict[str, Any], decision: Decision) -> bool:
        generation = body["metadata"].get("generation")

        def compute(stored: Mapping[str, Any]) -> dict[str, Any]:
            conditions = set_condition(stored.get("conditions") or [], "SLOMet",
                                       decision.slo_status, decision.slo_reason,
                                       decision.reason, generation=generation, now=self._wall())
            out = {"guard": status_guard_patch(stored.get("guard"), guard),
                   "conditions": conditions}
            if observed is not None:
                out["observed"] = observed
            return out

        return write_status(body, compute, self.cache, keys=GUARD_KEYS,
                            field_manager=kube.GUARD_MANAGER)

    def _rolled_back(self, body: Mapping[str, Any], tracked: _Tracked,
                     decision: Decision) -> None:
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if tracked.count_rollback is None:
            tracked.count_rollback = bind_rollbacks(f"{namespace}/{name}")
        tracked.count_rollback(decision.breach or "latency")
        message = (f"automatic rollback to the fallback: {decision.reason} (roll forward with "
                   f"tailguard rollforward {name} --cluster)")
        self._say(namespace, name, message)
        events.record(body, type_="Warning", reason="AutomaticRollback", message=message,
                      now=self._wall())

    async def _may_write(self, namespace: str) -> bool:
        """Whether this replica is the active peer (for ``namespace``, or the cluster)."""
        if self._is_active is None:
            return True
        scope = None if self._cluster_wide else namespace
        now_s = self._clock()
        known = self._active.get(scope)
        if known is not None and now_s - known[0] < PEERING_TTL_S:
            return known[1]
        try:
            active = await asyncio.to_thread(self._is_active, scope)
        except kube.KubeError as exc:
            logger.warning("slo guard: peering not read (%s); not judging this round", exc)
            active = False
        self._active[scope] = (now_s, active)
        return active

    @staticmethod
    def _say(namespace: str, name: str, text: str) -> None:
        logger.info("slo guard service=%s/%s %s", namespace, name, text)


def write_due(*, transition: bool, changed: bool, last_write_s: float | None, window_s: float,
              now_s: float) -> bool:
    """Whether the guard writes status now: at once on a ``transition``; otherwise only when
    what it would write ``changed``, and at most once per ``max(window_s,``
    :data:`MIN_WRITE_INTERVAL_S` ``)`` seconds (monotonic ``now_s`` and ``last_write_s``)."""
    if transition:
        return True
    if not changed:
        return False
    return last_write_s is None or now_s - last_write_s >= max(window_s, MIN_WRITE_INTERVAL_S)


def _comparable(observed: Mapping[str, Any] | None, guard: Mapping[str, Any],
                decision: Decision) -> Any:
    """What a write holds, without what changes every window whatever happens: the window's
    end and exact length, the decision's time, and its one-line reason (it names the window's
    length to the millisecond; the numbers it quotes are in ``observed``)."""
    return ({k: v for k, v in (observed or {}).items() if k not in ("windowEnd", "windowSeconds")},
            {k: v for k, v in guard.items()
             if k not in ("lastDecisionTime", "lastDecisionReason")},
            (decision.slo_status, decision.slo_reason))
