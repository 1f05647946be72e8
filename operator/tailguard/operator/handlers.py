"""The kopf handlers: a thin shell around :mod:`tailguard.operator.manifests`, :mod:`tailguard.operator.reconcile` and
:mod:`tailguard.operator.status`, with :mod:`tailguard.operator.kube` for every read and write.

One function, :func:`reconcile_service`, brings an InferenceService's children and status in
line with its spec. kopf calls it on create, update and resume of the InferenceService, and on
every change of a child (the watch on the children restores a child deleted or edited by hand,
and notices when a role's pods become Ready, which is what a pending traffic switch waits for).
There is no kopf timer, daemon or delete handler: kopf would add a finalizer for any of them,
and deleting an InferenceService must work while the operator is down (children go by their
owner references). A plain task started with the operator, :func:`resync`, lists and
reconciles every InferenceService in scope every ``resync_seconds`` instead, which repairs what
a watch missed. A second task runs the SLO guard (:mod:`tailguard.operator.guarding`) over the
runtime pods, which the operator watches read only.

Run it with ``tailguard operator`` (:func:`run_operator`) or ``kopf run -m
tailguard.operator.handlers``. Handlers return nothing, so kopf stores no results in the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import random
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import kopf
from prometheus_client import start_http_server

from tailguard.guard.policy import model_identity
from tailguard.guard.record import GuardRecord, rollback_in_effect
from tailguard.operator import events, kube, manifests, reconcile
from tailguard.operator.cache import WatchCache
from tailguard.operator.guarding import ClusterGuard
from tailguard.operator.memory import KnownServices, SeenChildren, resync_targets
from tailguard.operator.peering import DEFAULT_PEERING, Peering, active_peer
from tailguard.operator.podindex import PodIndex
from tailguard.operator.settings import OperatorSettings
from tailguard.operator.status import build_status, invalid_status
from tailguard.operator.statuswrite import STATUS_ATTEMPTS, write_status
from tailguard.spec import conditions, resource, schema

logger = logging.getLogger(__name__)

_CHILDREN = (("", "v1", "configmaps"), ("", "v1", "services"), ("apps", "v1", "deployments"),
             ("autoscaling", "v2", "horizontalpodautoscalers"),
             ("policy", "v1", "poddisruptionbudgets"))

_PODS = ("", "v1", "pods")
"""The runtime pods, watched (by :data:`CHILD_SELECTOR`) for the SLO guard's pod index."""

CHILD_SELECTOR = f"{manifests.LABEL_MANAGED_BY}={manifests.MANAGED_BY}"
"""The label selector of the child watches, sent to the API server: the operator lists and
watches only its own ConfigMaps, Services, Deployments, HPAs and PDBs."""
CHILD_KINDS = ("ConfigMap", "Service", "Deployment", "HorizontalPodAutoscaler",
               "PodDisruptionBudget")
"""The kinds of :data:`_CHILDREN`, as a pass reads them (and the watch cache keeps them)."""

REFUSALS = frozenset({400, 403, 404, 409, 422})
"""Statuses of a child write that say the request itself was refused (invalid, forbidden,
exceeded quota, namespace gone): reported in the status. Others (no answer, 429, 5xx) are
retried as they are."""

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()
_seeding = threading.Lock()
_running: set[tuple[str, str]] = set()
"""InferenceServices whose pass is running (guarded by ``_locks_guard``)."""
_again: set[tuple[str, str]] = set()
"""Of them, those a child event asked for another pass meanwhile: the running pass runs once
more when it ends, so a burst of events makes one pass, not one each."""


@dataclass(frozen=True)
class Outcome:
    """What one reconcile pass found and did."""

    plan: reconcile.TrafficPlan | None = None
    """The traffic decision (``None`` when the object is gone or invalid)."""
    invalid: str | None = None
    """Why the spec was refused, or ``None``."""
    created: tuple[str, ...] = ()
    """``Kind/name`` of the children created."""
    patched: tuple[str, ...] = ()
    """``Kind/name`` of the children patched."""
    conflicts: tuple[str, ...] = ()
    """``Kind/name`` of children controlled by another owner (left alone)."""
    refused: tuple[str, ...] = ()
    """``Kind/name: status reason: message`` of each create or patch the API refused."""
    deleted: tuple[str, ...] = ()
    """``Kind/name`` of the revision ConfigMaps deleted (nothing mounts them any more)."""


def reconcile_service(namespace: str, name: str, settings: OperatorSettings, *,
                      now: datetime.datetime | None = None,
                      cache: WatchCache | None = None, pods: PodIndex | None = None) -> Outcome:
    """Bring the InferenceService ``namespace/name``'s children and status in line with its
    spec; one pass at a time per object (calls from several kopf workers wait for each other).

    Reads the object and its children (from ``cache`` when given: what the watches delivered,
    the namespace seeded by a list first if it is not yet; else from the API), creates missing
    children, merge-patches what differs (see :mod:`tailguard.operator.reconcile`), writes the
    status only if it changed (naming the runtime pods in ``pods`` that cannot start), and
    records Events on transitions. A missing or terminating object is left alone
    (``Outcome()``). When :func:`reconcile_soon` asked for another pass while this one ran, it
    runs again before returning (the last pass's outcome is returned).

    Raises:
        kube.KubeError: the API refused a read or a write.
    """
    key = (namespace, name)
    with _lock_for(namespace, name):
        with _locks_guard:
            _running.add(key)
        try:
            while True:
                outcome = _reconcile(namespace, name, settings,
                                     now or datetime.datetime.now(datetime.timezone.utc), cache,
                                     pods)
                with _locks_guard:
                    if key not in _again:
                        break
                    _again.discard(key)
                now = None  # the next pass is later
        finally:
            with _locks_guard:
                _running.discard(key)
                _again.discard(key)
    if outcome == Outcome():  # gone: its lock goes too, so the table grows with live objects
        with _locks_guard:
            _locks.pop((namespace, name), None)
    return outcome


def reconcile_soon(namespace: str, name: str, settings: OperatorSettings,
                   cache: WatchCache | None = None, pods: PodIndex | None = None) -> None:
    """:func:`reconcile_service`, unless a pass of that InferenceService is running: then that
    pass runs once more when it ends, and this returns at once (a burst of child events
    makes one more pass, not one each).

    Raises:
        kube.KubeError: as :func:`reconcile_service`.
    """
    with _locks_guard:
        if (namespace, name) in _running:
            _again.add((namespace, name))
            return
    reconcile_service(namespace, name, settings, cache=cache, pods=pods)


def seed_namespace(cache: WatchCache, namespace: str) -> None:
    """List the InferenceServices and each child kind (labelled as the watches are) in
    ``namespace`` into ``cache`` (:meth:`WatchCache.seed`): six requests.

    Raises:
        kube.KubeError: a list was refused.
    """
    lists = {kind: kube.list_objects(kind, namespace, CHILD_SELECTOR) for kind in CHILD_KINDS}
    lists[resource.KIND] = kube.list_objects(resource.KIND, namespace)
    cache.seed(namespace, lists)


def _reader(cache: WatchCache | None,
            namespace: str) -> Callable[[str, str], dict[str, Any] | None]:
    """``read(kind, name)`` in ``namespace`` for one pass: the API's answer, or, with a
    ``cache``, what the watches delivered (the namespace seeded first if it is not yet).

    Raises:
        kube.KubeError: seeding was refused (``read`` raises it too, for a refused GET).
    """
    if cache is None:
        return lambda kind, name: kube.get(kind, namespace, name)
    if not cache.seeded(namespace):
        with _seeding:  # the first passes in a namespace often start together: one lists
            if not cache.seeded(namespace):
                seed_namespace(cache, namespace)
    return lambda kind, name: cache.get(kind, namespace, name)


def _reconcile(namespace: str, name: str, settings: OperatorSettings,
               now: datetime.datetime, cache: WatchCache | None,
               pods: PodIndex | None) -> Outcome:
    logger.debug("pass service=%s/%s", namespace, name)
    read = _reader(cache, namespace)
    body = read(resource.KIND, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return Outcome()
    generation = body["metadata"].get("generation")
    previous: Mapping[str, Any] = body.get("status") or {}
    try:
        isvc = resource.parse(body, default_namespace=namespace)
        problems = manifests.cluster_problems(isvc)
        if problems:
            raise schema.SpecError(problems)
    except schema.SpecError as exc:
        _refuse(body, previous, generation, str(exc), now, cache)
        return Outcome(invalid=str(exc))

    owner = manifests.Owner.from_body(body)
    live = {_key(obj): read(obj["kind"], obj["metadata"]["name"])
            for obj in manifests.children(isvc, owner, settings, active_role="primary")}
    current = (previous.get("activeModel") or _selected_role(live[("Service", name)])
               or isvc.traffic)
    if current not in manifests.ROLES:
        current = isvc.traffic
    done: dict[str, list[str]] = {"created": [], "patched": [], "conflict": [], "refused": [],
                                  "deleted": []}
    # What the pods serve first (the revision ConfigMaps they read, then the pod templates);
    # then plan on the Deployments as stored now, so a template this pass changed counts no
    # Ready replica until its own pods are Ready; then the traffic ConfigMap, the Service and
    # the rest.
    for desired in manifests.children(isvc, owner, settings, active_role=current):
        if _served_first(desired):
            _apply(desired, live, owner, done, cache)
    deployments = {role: live[("Deployment", manifests.child_name(name, "Deployment", role))]
                   for role in manifests.ROLES}
    record = GuardRecord.from_status(previous)
    automatic = rollback_in_effect(record, model_identity(isvc.model.uri, isvc.model.version),
                                   body["metadata"].get("annotations"))
    plan = reconcile.plan_traffic(
        intent="fallback" if automatic else isvc.traffic, current=current,
        ready={role: reconcile.ready_replicas(d) for role, d in deployments.items()},
        min_replicas=isvc.scaling.min_replicas, max_replicas=isvc.scaling.max_replicas)
    plan, hold = reconcile.hold_minimum(plan, previous.get("minReplicasHold"), now,
                                        reconcile.scale_down_window_s(isvc.scaling.behavior))
    for desired in manifests.children(isvc, owner, settings, active_role=plan.active,
                                      min_replicas=plan.min_replicas):
        if not _served_first(desired):
            _apply(desired, live, owner, done, cache)
    _collect_config_maps(namespace, name, owner, live, done, cache)
    created, patched, conflicts, refused = (done["created"], done["patched"], done["conflict"],
                                            done["refused"])

    deployments = {role: live[("Deployment", manifests.child_name(name, "Deployment", role))]
                   for role in manifests.ROLES}
    not_starting = {role: [pod.line() for pod in stuck] for role, stuck in
                    (pods.not_starting(namespace, name) if pods is not None else {}).items()}
    outcome = Outcome(plan=plan, created=tuple(created), patched=tuple(patched),
                      conflicts=tuple(conflicts), refused=tuple(refused),
                      deleted=tuple(done["deleted"]))
    # before the status write that ends the pass: a pass cut short after its writes is run
    # again from the old status, and announces again (a repeat raises the Event's count)
    _announce(body, previous, outcome, now)
    write_status(body, lambda stored: build_status(
        stored, isvc, generation=generation, plan=plan, deployments=deployments,
        conflicts=conflicts, refused=refused, now=now,
        automatic=record.reason if automatic and isvc.traffic != "fallback" else None,
        not_starting=not_starting, hold=hold), cache)
    return outcome


def _served_first(desired: Mapping[str, Any]) -> bool:
    """Whether a child says what the pods serve (a Deployment, a revision ConfigMap): applied
    before traffic is planned."""
    return desired["kind"] == "Deployment" or manifests.is_revision_config(desired)


def _collect_config_maps(namespace: str, name: str, owner: manifests.Owner,
                         live: Mapping[tuple[str, str], Any], done: dict[str, list[str]],
                         cache: WatchCache | None) -> None:
    """Delete the service's revision ConfigMaps that this pass does not want and that no
    Deployment or ReplicaSet of the service mounts (:func:`reconcile.unused_config_maps`);
    note each in ``done["deleted"]``. The ConfigMaps are read from ``cache`` when given (else
    listed); the ReplicaSets are listed only when a ConfigMap is unused by the Deployments
    (one request, after a change of what a role serves; the operator does not watch them).
    A ConfigMap changed or replaced since it was read is left for a later pass. The
    Deployment controller prunes an old ReplicaSet without a Deployment event, so its
    ConfigMap goes at the service's next pass, a resync at the latest.

    Raises:
        kube.KubeError: the API failed in a way worth retrying.
    """
    selector = f"{CHILD_SELECTOR},{manifests.LABEL_SERVICE}={name}"
    found = (cache.grouped("ConfigMap", namespace, name) if cache is not None
             else kube.list_objects("ConfigMap", namespace, selector)[0])
    config_maps = {cm["metadata"]["name"]: cm for cm in found
                   if manifests.is_revision_config(cm)}
    holders = [body for (kind, _), body in live.items() if kind == "Deployment" and body]
    keep = [child for kind, child in live if kind == "ConfigMap"]
    if not reconcile.unused_config_maps(config_maps.values(), holders, keep, owner.uid):
        return
    holders += kube.list_objects("ReplicaSet", namespace, selector)[0]
    for unused in reconcile.unused_config_maps(config_maps.values(), holders, keep, owner.uid):
        meta = config_maps[unused]["metadata"]
        try:
            kube.delete("ConfigMap", namespace, unused, uid=meta["uid"],
                        resource_version=meta.get("resourceVersion"))
        except kube.KubeError as exc:
            if exc.status not in REFUSALS:
                raise
            logger.warning("cannot delete service=%s/%s ConfigMap/%s: %s", namespace, name,
                           unused, exc)
            continue
        if cache is not None:
            cache.drop(config_maps[unused])
        done["deleted"].append(f"ConfigMap/{unused}")


def _apply(desired: Mapping[str, Any], live: dict[tuple[str, str], Any],
           owner: manifests.Owner, done: dict[str, list[str]],
           cache: WatchCache | None = None) -> None:
    """Apply one child (:func:`_apply_child`), keep what is stored now in ``live`` (and in
    ``cache``), and note
    what was done in ``done`` (``created``, ``patched``, ``conflict``, ``refused``; a child
    already listed is not listed twice).

    Raises:
        kube.KubeError: the API failed in a way worth retrying (unreachable, throttled, 5xx).
    """
    key = _key(desired)
    label = "/".join(key)
    try:
        action, stored = _apply_child(desired, live[key], owner)
    except kube.KubeError as exc:
        if exc.status not in REFUSALS:  # unreachable, throttled, a server error: retry
            raise
        done["refused"].append(f"{label}: {exc}")
        return
    if stored is not None:
        live[key] = stored
        if cache is not None:
            cache.keep(stored)
    if action is not None and label not in done[action]:
        done[action].append(label)


def _apply_child(desired: Mapping[str, Any], found: Mapping[str, Any] | None,
                 owner: manifests.Owner) -> tuple[str | None, dict[str, Any] | None]:
    """Create or patch one child. Returns what was done (``"created"``, ``"patched"``,
    ``"conflict"`` when another owner controls it and it was left alone, ``None`` when it
    already matched) and the object as stored now (``None``: unchanged).

    Raises:
        kube.KubeError: the API server refused the create or the patch.
    """
    kind, name = _key(desired)
    namespace = desired["metadata"]["namespace"]
    fresh = None
    if found is None:
        try:
            return "created", kube.create(desired)
        except kube.Conflict:  # created meanwhile: compare with what is there now
            found = fresh = kube.get(kind, namespace, name)
            if found is None:
                raise
    for _ in range(STATUS_ATTEMPTS):
        if reconcile.controller_uid(found) not in (None, owner.uid):
            return "conflict", fresh
        patch = reconcile.merge_patch(desired, found)
        if patch is None:
            return None, fresh
        if "ownerReferences" in (patch.get("metadata") or {}):
            # a merge patch replaces the list whole: only over the version it was merged into
            patch["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
        try:
            return "patched", kube.merge_patch(kind, namespace, name, patch)
        except kube.Conflict:  # someone wrote in between: merge into what is there now
            found = fresh = kube.get(kind, namespace, name)
            if found is None:
                raise
    raise kube.KubeError(409, "Conflict", f"{kind}/{name}: other writers came in between "
                         f"{STATUS_ATTEMPTS} times in a row")


def _refuse(body: Mapping[str, Any], previous: Mapping[str, Any], generation: int | None,
            message: str, now: datetime.datetime, cache: WatchCache | None) -> None:
    meta = body["metadata"]
    before = conditions.find_condition(previous, "Ready") or {}
    if before.get("reason") != "InvalidSpec" or not before.get("message", "").startswith(message):
        logger.warning("invalid spec service=%s/%s reason=%s", meta["namespace"], meta["name"],
                       message)
        events.record(body, type_="Warning", reason="InvalidSpec", message=message, now=now)
    write_status(body, lambda stored: invalid_status(
        stored, generation=generation, message=message, now=now), cache)


def _announce(body: Mapping[str, Any], previous: Mapping[str, Any], outcome: Outcome,
              now: datetime.datetime) -> None:
    """Log and record Events for the transitions of one pass."""
    meta = body["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    plan = outcome.plan
    assert plan is not None
    said: list[tuple[str, str, str]] = []
    first = previous.get("observedGeneration") is None  # no pass has ended for it yet
    if first:
        said.append(("Normal", "Created", "created " + (", ".join(outcome.created)
                                                        or "its children")))
    elif outcome.created:
        said.append(("Normal", "Restored", "recreated " + ", ".join(outcome.created)))
    if outcome.patched and not plan.switched:
        said.append(("Normal", "Configured", "patched " + ", ".join(outcome.patched)))
    if outcome.deleted:
        logger.info("service=%s deleted unused %s", where, ", ".join(outcome.deleted))
    if plan.switched:
        said.append(("Normal", "RolledBack" if plan.active == "fallback" else "RolledForward",
                     plan.message))
    before = conditions.find_condition(previous, "RolledBack") or {}
    if plan.pending and not str(before.get("reason", "")).startswith("WaitingFor"):
        said.append(("Normal", f"WaitingFor{plan.intent.capitalize()}", plan.message))
    before_ready = conditions.find_condition(previous, "Ready") or {}
    if outcome.refused and before_ready.get("reason") != "ChildRefused":
        said.append(("Warning", "ChildRefused", "the API server refused: "
                     + "; ".join(outcome.refused)))
    if outcome.conflicts and before_ready.get("reason") != "ChildConflict":
        said.append(("Warning", "ChildConflict", "controlled by another owner, left alone: "
                     + ", ".join(outcome.conflicts)))
    for type_, reason, message in said:
        logger.info("service=%s reason=%s %s", where, reason, message)
        events.record(body, type_=type_, reason=reason, message=message, now=now)


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _selected_role(service: Mapping[str, Any] | None) -> str | None:
    """The role a live Service selects, if it is one."""
    role = ((service or {}).get("spec") or {}).get("selector", {}).get(manifests.LABEL_ROLE)
    return role if role in manifests.ROLES else None


def _lock_for(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def _owner_name(body: Mapping[str, Any]) -> str | None:
    """The name of the InferenceService controlling a child, if one does."""
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == resource.KIND \
                and str(ref.get("apiVersion", "")).startswith(resource.GROUP + "/"):
            return ref.get("name")  # type: ignore[no-any-return]
    return None


# --- kopf registrations --------------------------------------------------------------------

@kopf.on.startup()
def configure(*, settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """Tune kopf and build the operator settings. kopf posts no Events of its own (the
    operator records its transitions; a retry every few seconds while traffic waits would
    flood ``kubectl describe``); the child watches are filtered by the API server, by label."""
    settings.posting.enabled = False
    # Watches are renewed every minute: a watch the API server leaves silent (as it can while
    # a just-created CRD's watch cache initializes) costs at most a minute.
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    for group, version, plural in (*_CHILDREN, _PODS):  # the API server filters
        settings.watching.label_selectors[group, version, plural] = CHILD_SELECTOR
    if getattr(memo, "tailguard", None) is None:
        memo.tailguard = OperatorSettings.from_env(os.environ)
    # made here, before any watch delivers: handlers in several worker threads share them
    # (kopf gives each object a shallow copy of this memo; a table made later, in a handler,
    # would be that object's alone)
    _known(memo)
    _cache(memo)
    _pods(memo)
    _seen(memo)


def _known(memo: Any) -> KnownServices:
    known = getattr(memo, "known_services", None)
    if known is None:
        known = memo.known_services = KnownServices()
    return known


def _cache(memo: Any) -> WatchCache:
    cache = getattr(memo, "watch_cache", None)
    if cache is None:
        cache = memo.watch_cache = WatchCache(group_label=manifests.LABEL_SERVICE)
    return cache


def _pods(memo: Any) -> PodIndex:
    pods = getattr(memo, "pod_index", None)
    if pods is None:
        pods = memo.pod_index = PodIndex()
    return pods


def _seen(memo: Any) -> SeenChildren:
    seen = getattr(memo, "seen_children", None)
    if seen is None:
        seen = memo.seen_children = SeenChildren()
    return seen


async def resync(memo: Any) -> None:
    """Reconcile every InferenceService in scope every ``resync_seconds``, forever.

    Not a kopf timer or daemon (either would put a finalizer on every InferenceService): one
    task for the whole operator, started and stopped with it. A pass that finds nothing to
    change writes nothing. A failure is logged, and the next period tries again.
    """
    settings: OperatorSettings = memo.tailguard
    known = _known(memo)
    cache = _cache(memo)
    peers: Peering | None = getattr(memo, "peering", None)
    namespaces = getattr(memo, "namespaces", ())
    while True:
        await asyncio.sleep(settings.resync_seconds)
        try:
            if peers is not None and not namespaces and not await asyncio.to_thread(
                    _active, peers, None):
                continue  # a standby: the active replica resyncs
            targets = await asyncio.to_thread(resync_targets, namespaces, known)
        except Exception as exc:  # the task must outlive any one failure
            logger.warning("resync list failed error=%s", exc, exc_info=not isinstance(
                exc, kube.KubeError))
            continue
        standby: dict[str, bool] = {}  # per namespace, for an operator watching namespaces
        listed: set[str] = set()  # namespaces seeded again this round
        for namespace, name in targets:
            try:
                if peers is not None and namespaces:
                    if namespace not in standby:
                        standby[namespace] = not await asyncio.to_thread(_active, peers,
                                                                         namespace)
                    if standby[namespace]:
                        continue
                if namespace not in listed:  # what a silent watch missed is corrected here
                    await asyncio.to_thread(seed_namespace, cache, namespace)
                    listed.add(namespace)
                outcome = await asyncio.to_thread(reconcile_service, namespace, name, settings,
                                                  cache=cache, pods=_pods(memo))
            except Exception as exc:
                logger.warning("resync failed service=%s/%s error=%s", namespace, name, exc,
                               exc_info=not isinstance(exc, kube.KubeError))
                continue
            if outcome == Outcome():  # gone
                known.discard(namespace, name)


def _active(peers: Peering, namespace: str | None) -> bool:
    """Whether kopf lets this replica work (the cluster's peering object when ``namespace`` is
    ``None``, else the namespace's), by :func:`~tailguard.operator.peering.active_peer`.

    Raises:
        kube.KubeError: the read was refused.
    """
    status = kube.peering_status(peers.name, namespace)
    return active_peer(status, peers.priority, datetime.datetime.now(datetime.timezone.utc))


@kopf.on.startup()
async def start_resync(*, memo: Any, **_: Any) -> None:
    """Start the :func:`resync` task (after :func:`configure`, which builds the settings)."""
    memo.resync_task = asyncio.create_task(resync(memo), name="tailguard-resync")


@kopf.on.startup()
async def start_guard(*, memo: Any, **_: Any) -> None:
    """Start the SLO guard's task (:class:`~tailguard.operator.guarding.ClusterGuard`) unless
    ``TAILGUARD_GUARD`` is false."""
    settings: OperatorSettings = memo.tailguard
    if not settings.guard:
        logger.info("slo guard off (TAILGUARD_GUARD=false): SLOMet stays Unknown")
        return
    peers: Peering | None = getattr(memo, "peering", None)
    namespaces = getattr(memo, "namespaces", ())
    cache, pods = _cache(memo), _pods(memo)
    guard = ClusterGuard(
        settings, cache, pods,
        reconcile=lambda namespace, name: reconcile_soon(namespace, name, settings, cache, pods),
        is_active=None if peers is None else (lambda scope: _active(peers, scope)),
        cluster_wide=not namespaces)
    memo.guard_task = asyncio.create_task(guard.run(), name="tailguard-guard")


@kopf.on.cleanup()
async def stop_resync(*, memo: Any, **_: Any) -> None:
    """Stop the :func:`resync` and guard tasks (a pass already running in a worker thread is
    not interrupted; it ends with the process)."""
    for attribute in ("resync_task", "guard_task"):
        task: asyncio.Task[None] | None = getattr(memo, attribute, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """Load credentials once, through :func:`kube.connect`, for both kopf and :mod:`tailguard.operator.kube`
    (kopf calls this again when the API answers 401)."""
    creds = kube.connect()
    return kopf.ConnectionInfo(
        server=creds.server, ca_path=creds.ca_path, insecure=creds.insecure,
        username=creds.username, password=creds.password, scheme=creds.scheme,
        token=creds.token, certificate_path=creds.certificate_path,
        private_key_path=creds.private_key_path)


@kopf.on.resume(resource.GROUP, resource.VERSION, resource.PLURAL)
@kopf.on.create(resource.GROUP, resource.VERSION, resource.PLURAL)
@kopf.on.update(resource.GROUP, resource.VERSION, resource.PLURAL)
def reconcile_handler(*, namespace: str | None, name: str, body: kopf.Body, memo: Any,
                      **_: Any) -> None:
    """Reconcile on create/update/resume. An invalid spec fails permanently (after its status
    condition is written); a child the API server refused is retried after a delay. A traffic
    switch waiting for Ready replicas is not an error: the pass reported it (the ``RolledBack``
    condition, one Event and one log line), and the Deployment's own status changes, or the
    resync, bring the pass that moves traffic (kopf's retries wrote its progress to the object
    every few seconds, for as long as the wait lasted)."""
    settings: OperatorSettings = memo.tailguard
    _known(memo).add(namespace or "", name)
    cache = _cache(memo)
    cache.keep(body)
    outcome = reconcile_service(namespace or "", name, settings, cache=cache, pods=_pods(memo))
    if outcome.invalid is not None:
        raise kopf.PermanentError(f"invalid spec: {outcome.invalid}")
    if outcome.refused:
        raise kopf.TemporaryError("the API server refused: " + "; ".join(outcome.refused),
                                  delay=settings.retry_delay_seconds)


def child_changed(*, type: str | None, body: kopf.Body, namespace: str | None, memo: Any,
                  **_: Any) -> None:
    """A child was added, changed or deleted: keep it in the watch cache, and reconcile its
    owner (restores hand edits and deletions; moves pending traffic once the target's pods are
    Ready), one more pass at most while a pass runs (:func:`reconcile_soon`). The initial
    listing is kept but starts no pass: resuming the owners covers it."""
    cache = _cache(memo)
    if type == "DELETED":
        cache.drop(body)
    else:
        cache.keep(body)
    owner = _owner_name(body)
    if type is None or owner is None or namespace is None:
        return
    seen = _seen(memo)
    if not seen.changed(type, body):
        return  # a status write that no pass reads (the HPA controller's, every few seconds)
    _known(memo).add(namespace, owner)
    try:
        reconcile_soon(namespace, owner, memo.tailguard, cache, _pods(memo))
    except BaseException:
        seen.forget(body)  # the next event of this child must get its pass
        raise


@kopf.on.event(resource.GROUP, resource.VERSION, resource.PLURAL, id="watch-cache")
def service_changed(*, type: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    """Keep each InferenceService the watch delivers in the watch cache (its passes are
    started by the create, update and resume handlers)."""
    if type == "DELETED":
        _cache(memo).drop(body)
    else:
        _cache(memo).keep(body)


@kopf.on.event(*_PODS, id="guard-pods", labels={manifests.LABEL_MANAGED_BY: manifests.MANAGED_BY})
def pod_changed(*, type: str | None, body: kopf.Body, namespace: str | None, memo: Any,
                **_: Any) -> None:
    """Keep each runtime pod the watch delivers in the pod index (read only: the operator never
    writes a pod). A pod that starts or stops being unable to start (an image that is not
    there, a crash loop) reconciles its InferenceService, whose status names it; other pod
    changes start no pass (the Deployment's status brings readiness)."""
    pods = _pods(memo)
    changed = pods.drop(body) if type == "DELETED" else pods.keep(body)
    service = (body.get("metadata", {}).get("labels") or {}).get(manifests.LABEL_SERVICE)
    if changed and namespace and service:
        try:
            reconcile_soon(namespace, service, memo.tailguard, _cache(memo), pods)
        except BaseException:
            pods.forget(body)  # the pod's next event must get its pass
            raise


for _group, _version, _plural in _CHILDREN:
    kopf.on.event(_group, _version, _plural, id=f"child-{_plural}",
                  labels={manifests.LABEL_MANAGED_BY: manifests.MANAGED_BY})(child_changed)


def run_operator(namespaces: Sequence[str] | None = None, *, peering: bool | str = False,
                 settings: OperatorSettings | None = None, liveness_endpoint: str | None = None,
                 verbose: bool = False) -> None:
    """Run the operator in this thread until interrupted (``tailguard operator``).

    ``namespaces``: watch only these (globs allowed); ``None`` or empty: the whole cluster.
    ``peering``: coordinate replicas through kopf's peering objects (their CRDs and an object
    named ``peering``, or ``default`` when it is ``True``, must exist); ``False`` or ``""``:
    run standalone, as the only replica. ``settings`` default to
    :meth:`OperatorSettings.from_env`. ``liveness_endpoint``: e.g.
    ``http://0.0.0.0:8080/healthz``.

    Raises:
        ValueError: bad ``TAILGUARD_*`` environment variables.
    """
    kopf.configure(verbose=verbose)
    chosen = settings or OperatorSettings.from_env(os.environ)
    logging.getLogger("tailguard").setLevel(chosen.log_level.upper())
    if chosen.metrics_port:
        start_http_server(chosen.metrics_port)  # prometheus_client's, in a daemon thread
    # Peers with equal priority all pause (kopf's rule), so each replica draws its own.
    priority = random.randint(1, 2**31 - 1) if peering else None
    # An empty name must reach kopf as None: any string makes peering mandatory, and kopf then
    # pauses every watch until a peering object appears.
    name = peering if isinstance(peering, str) and peering else None
    peers = None if priority is None else Peering(name or DEFAULT_PEERING, priority)
    memo = kopf.Memo(tailguard=chosen,
                     namespaces=list(namespaces or ()), peering=peers)
    kopf.run(clusterwide=not namespaces, namespaces=list(namespaces or ()),
             standalone=not peering, peering_name=name, priority=priority, memo=memo,
             liveness_endpoint=liveness_endpoint)
