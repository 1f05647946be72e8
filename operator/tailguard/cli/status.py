"""``tailguard status NAME``: the live numbers of the local ``tailguard up``, or with
``--cluster`` the InferenceService's status, as plain lines.

Two sources, two functions: :func:`live_lines` formats the runtime's ``GET /tailguard/stats``
JSON (a local ``tailguard up``), :func:`cluster_lines` an InferenceService object as the API
server returns it (``--cluster``). Both are pure and only report what their input holds: a
number that is absent is said to be absent, never made up. The command fetches and prints.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping

from tailguard.cli.options import DEFAULT_PORT, add_target
from tailguard.cli.reach import call_local, kube_problem

NO_OBSERVED = ("live numbers (p99, queue depth, req/s, errors) are not in the status yet: the "
               "operator's SLO guard writes them after its first windows with Ready pods "
               "(unless it runs with TAILGUARD_GUARD=false)")
"""Said when an InferenceService's ``status.observed`` is absent."""


def live_lines(stats: Mapping[str, Any]) -> list[str]:
    """Lines for a ``/tailguard/stats`` document (with the ``status`` of
    ``/tailguard/status`` under ``status``): the active role, then one block per role
    with p99 (ms) against the declared SLO (ms), p50/p95, samples, admitted req/s, queue depth
    (rows), errors and rejections by reason over the stats window (s), and the latest switch.

    Raises:
        KeyError, TypeError: ``stats`` is not shaped like the stats route's answer.
    """
    name, active = stats["name"], stats["activeModel"]
    served = stats.get("served") or {}
    state = "ready" if stats.get("ready") else "not ready (loading or draining)"
    lines = [f"{name}: traffic -> {active}, {state}"]
    switch = stats.get("lastSwitch")
    if switch:
        lines.append(f"  last switch: {switch['from']} -> {switch['to']} by {switch['by']} "
                     f"at {switch['at']}")
    slo = stats.get("sloP99Ms")
    guard = (stats.get("status") or {}).get("guard") or {}
    if guard.get("state"):
        lines.append(f"  SLO guard: {guard['state']}: {guard.get('lastDecisionReason', '')}")
    for role, snap in stats["models"].items():
        identity = served.get(role, {})
        marker = " (active)" if role == active else ""
        lines.append(f"  {role}{marker}: {identity.get('uri', '?')} "
                     f"version {identity.get('version', '?')}")
        lines.append("    " + _latency(snap, slo))
        rejected = snap["rejected"]
        reasons = ", ".join(f"{reason}={count}" for reason, count in sorted(rejected.items()))
        lines.append(f"    queue={snap['queueDepth']} rows  req/s={snap['requestsPerSecond']:g}  "
                     f"errors={snap['errors']}  rejected={snap['rejectedTotal']}"
                     + (f" ({reasons})" if reasons else "")
                     + (f"  judged={snap['judged']}" if "judged" in snap else "")
                     + _left_out(snap.get("excluded") or {})
                     + f"  (last {snap['windowSeconds']:g}s)")
    return lines


def _latency(snap: Mapping[str, Any], slo_ms: float | None) -> str:
    against = "no SLO declared" if slo_ms is None else f"SLO {slo_ms:g}ms"
    if not snap["samples"]:
        return f"p99=- ({against}): no admitted requests in the window"
    return (f"p99={snap['p99Ms']:.1f}ms ({against})  p95={snap['p95Ms']:.1f}ms  "
            f"p50={snap['p50Ms']:.1f}ms  samples={snap['samples']}")


def cluster_lines(obj: Mapping[str, Any]) -> list[str]:
    """Lines for an InferenceService read from the API server: intent (``spec.traffic``) and
    the active model, URL, replicas, conditions, and ``status.observed`` when the operator
    wrote it (else :data:`NO_OBSERVED`).

    Raises:
        KeyError: ``obj`` has no ``metadata.name``.
    """
    meta = obj["metadata"]
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    where = f"{meta.get('namespace', 'default')}/{meta['name']}"
    if not status:
        return [f"{where}: traffic intent {spec.get('traffic', 'primary')}; no status yet "
                "(is the tailguard operator running?)"]
    lines = [f"{where}: traffic -> {status.get('activeModel', '?')} "
             f"(intent {spec.get('traffic', 'primary')})"]
    if status.get("url"):
        lines.append(f"  url: {status['url']}")
    if status.get("replicaSummary"):
        lines.append(f"  replicas of the active model (ready/desired): {status['replicaSummary']}")
    for condition in status.get("conditions") or []:
        reason = f" ({condition['reason']})" if condition.get("reason") else ""
        message = f": {condition['message']}" if condition.get("message") else ""
        lines.append(f"  {condition.get('type')}={condition.get('status')}{reason}{message}")
    observed = status.get("observed")
    slo = (spec.get("slo") or {}).get("p99LatencyMs")
    if observed:
        p99 = observed.get("p99Ms")
        lines.append(f"  observed: p99={'-' if p99 is None else f'{p99:g}ms'} "
                     f"(SLO {'-' if slo is None else f'{slo}ms'})  "
                     f"queue={observed.get('queueDepth', '-')}  "
                     f"req/s={observed.get('requestsPerSecond', '-')}  "
                     f"errorRate={observed.get('errorRate', '-')}  "
                     f"samples={observed.get('samples', '-')}"
                     + (f"  judged={observed['judged']}" if "judged" in observed else "")
                     + _left_out(observed.get("excluded") or {}))
        if observed.get("unreadPods"):
            lines.append(f"  pods not read in the last window: {', '.join(observed['unreadPods'])}")
    else:
        lines.append(f"  {NO_OBSERVED}")
    guard = status.get("guard") or {}
    if guard.get("state"):
        lines.append(f"  SLO guard: {guard['state']}: {guard.get('lastDecisionReason', '')}")
    if guard.get("rolledBackAt"):
        lines.append(f"  automatic rollback at {guard['rolledBackAt']} of "
                     f"{guard.get('rolledBackModel', '?')}: {guard.get('rollbackReason', '')} "
                     f"(roll forward: tailguard rollforward {meta['name']} --cluster)")
    return lines


def _left_out(excluded: dict[str, int]) -> str:
    """``  excluded=N (reason=n, ...)`` when a window left requests out of judgement."""
    if not excluded:
        return ""
    reasons = ", ".join(f"{reason}={n}" for reason, n in sorted(excluded.items()))
    return f"  excluded={sum(excluded.values())} ({reasons})"


def add_parser(sub: Any) -> None:
    """Register ``status`` on the ``tailguard`` subcommands."""
    text = "show a service's live numbers: active model, p99 against the SLO, queue, errors"
    status = sub.add_parser("status", help=text, description=(
        "Show the live numbers of the local tailguard up (active model, p99 against the SLO, "
        "queue depth, req/s, errors, rejections by reason, over the SLO window), or with "
        "--cluster the InferenceService's status."))
    add_target(status, "tailguard up")
    status.set_defaults(func=_status)


def _status(args: argparse.Namespace) -> int:
    if args.cluster:
        from tailguard.operator import kube
        from tailguard.spec.resource import KIND

        try:
            namespace = args.namespace or kube.default_namespace()
            obj = kube.get(KIND, namespace, args.name)
        except kube.KubeError as exc:
            print(f"tailguard status: {kube_problem(exc, args.name, 'read')}", file=sys.stderr)
            return 1
        if obj is None:
            print(f"tailguard status: no InferenceService {args.name!r} in namespace "
                  f"{namespace!r}", file=sys.stderr)
            return 1
        print("\n".join(cluster_lines(obj)))
        return 0
    from tailguard.up.control import find_control_file

    if args.port is None:
        control = find_control_file(args.name, None)
        args.port = DEFAULT_PORT if control is None else control.port
    stats = call_local(args, "GET", "/tailguard/stats", None)
    if stats is None:
        return 1
    if stats.get("name") != args.name:
        print(f"tailguard status: 127.0.0.1:{args.port} serves {stats.get('name')!r}, not "
              f"{args.name!r}", file=sys.stderr)
        return 1
    guarded = call_local(args, "GET", "/tailguard/status", None)  # loopback only
    if guarded is None:
        return 1
    print("\n".join(live_lines({**stats, "status": guarded.get("status") or {}})))
    return 0
