"""What ``tailguard status NAME`` prints: plain lines from data the CLI fetched.

Two sources, two functions: :func:`live_lines` formats the runtime's ``GET /tailguard/stats``
JSON (a local ``tailguard up``), :func:`cluster_lines` an InferenceService object as the API
server returns it (``--cluster``). Both only report what their input holds: a number that is
absent is said to be absent, never made up. Pure: no I/O, no clock, no logging; the CLI fetches
and prints.
"""

from __future__ import annotations

from typing import Any, Mapping

NO_OBSERVED = ("live numbers (p99, queue depth, req/s, errors) are not in the status yet: they "
               "arrive with the SLO guard's cluster part")
"""Said when an InferenceService's ``status.observed`` is absent."""


def live_lines(stats: Mapping[str, Any]) -> list[str]:
    """Lines for a ``/tailguard/stats`` document: the active role, then one block per role
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
                     f"samples={observed.get('samples', '-')}")
    else:
        lines.append(f"  {NO_OBSERVED}")
    return lines
