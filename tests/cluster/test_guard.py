"""The SLO guard in the cluster, on runtime pods that serve real traffic on the real node.

The chart's operator runs in its own pod on the real node and reads each Ready runtime pod's
totals on its pod IP every window; clients inside the cluster's namespace send open-loop load
through the Service's ClusterIP (kube-proxy). ``examples/slow-digits.yaml`` is a primary slow
on purpose (120 ms a model call, ``delayMs``) under a 50 ms p99 SLO, windows of 2 s and
``breachWindows: 3``.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from harness import REPO
from harness.guard import busy_spec, forest_spec
from harness.kube.audit import AuditLog
from harness.kube.client import wait_for
from harness.onnode import (
    LONG_MS,
    RELEASE_NAMESPACE,
    TAILGUARD,
    Load,
    OnNode,
    failures,
    primary_readiness_wrote,
    ready_since,
)
from tailguard.spec import resource

pytestmark = pytest.mark.cluster

SLOW = "slow-digits"
WINDOW_S, BREACH_WINDOWS = 2.0, 3
"""``slo.windowSeconds`` and ``slo.breachWindows`` of examples/slow-digits.yaml."""


def stamp(value: str) -> float:
    """An RFC 3339 time as Unix seconds."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def slow_digits(node: OnNode, primaries: int = 2) -> None:
    """``examples/slow-digits.yaml`` with traffic on the primary, ``primaries`` Ready primary
    pods (scaled as the HPA would) and one fallback pod, so a rollback must raise the
    fallback before the Service moves. Deadlines of 5 s (:data:`LONG_MS`): the slow primary's
    answers take a breaching 120 ms or more, and a CPU stall of the shared machine must not
    turn them into 504s, which the tests would count as requests the rollback lost."""
    node.apply(REPO / "examples" / "slow-digits.yaml")
    node.patch(SLOW, {"traffic": "primary", "scaling": {"minReplicas": 1, "maxReplicas": 4},
                      "batching": {"timeoutMs": LONG_MS}})
    node.wait_serving(SLOW)
    for role, replicas in (("primary", primaries), ("fallback", 1)):
        node.cluster.kubectl("scale", "-n", node.namespace, f"deployment/{SLOW}-{role}",
                             f"--replicas={replicas}")
    wait_for(lambda: len(node.pods(SLOW, "primary")) == primaries
             and len(node.pods(SLOW, "fallback")) == 1, timeout=120,
             what=f"{primaries} primary pods and one fallback pod")
    node.wait_serving(SLOW)


def watch(node: OnNode, load: Load, name: str = SLOW,
          until: Callable[[dict[str, Any]], bool] | None = None, linger_s: float = 5.0
          ) -> list[dict[str, Any]]:
    """Poll the InferenceService ``name``'s status, its Service and its Ready fallback and
    primary pods every 0.25 s until ``load`` ends; one sample per poll. With ``until``: end the load
    (:meth:`Load.interrupt`) ``linger_s`` seconds after the first sample it accepts."""
    samples: list[dict[str, Any]] = []
    end_at = None
    while load.proc.poll() is None:
        isvc = node.get(resource.PLURAL, name) or {}
        samples.append({"t": time.time(), "status": isvc.get("status") or {},
                        "selected": node.selected_role(name),
                        "fallbacks": len(node.ready_pods(name, "fallback")),
                        "primaries": len(node.ready_pods(name, "primary"))})
        if end_at is None and until is not None and until(samples[-1]):
            end_at = time.time() + linger_s
        if end_at is not None and time.time() >= end_at:
            load.interrupt()
        time.sleep(0.25)
    return samples


def rollbacks_counted(node: OnNode, name: str = SLOW) -> float:
    """``tailguard_rollbacks_total`` of ``name``, read from the operator pod's /metrics."""
    return node.counter(node.operator_pod()["status"]["podIP"], 8081,
                        "tailguard_rollbacks_total", f'model="{node.namespace}/{name}"')


def test_a_slow_primary_is_rolled_back_by_the_operator_under_load(node: OnNode) -> None:
    """Open-loop load through the ClusterIP on a primary slower than its SLO: the guard in the
    operator's pod sees breached windows, rolls back within ``breachWindows x windowSeconds +
    2 s`` of the end of the first one, the fallback is raised to the primary's two Ready
    pods before the Service moves, and no request fails. ``kubectl get`` shows P99 and
    QUEUE throughout; the guard never writes ``spec.traffic``."""
    slow_digits(node)
    before = rollbacks_counted(node)
    audit = AuditLog(node.cluster.audit_log)
    mark = audit.mark()
    load = node.load(SLOW, rate=40, seconds=60, label="guard-rollback")
    samples = watch(node, load, until=lambda s: s["selected"] == "fallback", linger_s=10)
    records = load.finish()
    isvc = node.get(resource.PLURAL, SLOW)
    assert isvc is not None
    guard = isvc["status"]["guard"]

    assert failures(records) == []
    breached = [s for s in samples if s["status"].get("guard", {}).get("state") == "breach"]
    assert breached, f"no breached window seen; last: {samples[-1]['status'].get('guard')}"
    first_breach = stamp(breached[0]["status"]["guard"]["lastDecisionTime"])
    rolled = stamp(guard["rolledBackAt"])
    assert 0 < rolled - first_breach <= BREACH_WINDOWS * WINDOW_S + 2.0, (
        f"rolled back {rolled - first_breach:.1f} s after the first breached window ended")
    assert guard["rolledBackModel"].startswith("builtin://digits/random-forest")
    assert "p99" in guard["rollbackReason"] and guard["state"] == "rolledBack"
    rolled_back = node.condition(SLOW, "RolledBack")
    assert (rolled_back["status"], rolled_back["reason"]) == ("True", "AutomaticRollback")
    assert isvc["spec"]["traffic"] == "primary", "the guard wrote the person's intent"
    assert node.selected_role(SLOW) == "fallback"

    # the fallback was raised to as many Ready pods as the primary had (two, unless the
    # shared machine's load made a primary pod miss its readiness probes) before the Service
    # moved to it
    moved_at = next(k for k, s in enumerate(samples) if s["selected"] == "fallback")
    moved = samples[moved_at]
    primaries = [s["primaries"] for s in samples[max(0, moved_at - 8):moved_at]]  # its last 2 s
    # unless a primary pod's readiness changed just before the move (primary_readiness_wrote)
    changed = primary_readiness_wrote(audit, mark, node.namespace, SLOW, moved["t"])
    needed = 1 if changed else max(min(primaries, default=2), 1)
    assert moved["fallbacks"] >= needed, (moved, primaries, changed)
    fallback_pods = node.ready_pods(SLOW, "fallback")
    assert len(fallback_pods) >= moved["fallbacks"]
    sent_to_fallback = [r["sent"] for r in records if r["role"] == "fallback"]
    assert sent_to_fallback, "no answer from the fallback before the load ended"
    first_fallback = min(sent_to_fallback)
    assert first_fallback >= max(ready_since(p) for p in fallback_pods) - 1.0  # whole seconds
    # P99 and QUEUE were there while it ran, and the SLO met again on the fallback
    observed = [s["status"].get("observed") or {} for s in samples]
    assert any(o.get("p99Ms", 0) > 50 and o.get("role") == "primary" for o in observed)
    table = node.cluster.kubectl("get", "tgis", SLOW, "-n", node.namespace, "-o", "wide").stdout
    header, row = table.splitlines()[:2]
    assert "P99-MS" in header and "QUEUE" in header and "GUARD" in header
    assert "rolledBack" in row and "fallback" in row
    assert len(node.events(SLOW, "AutomaticRollback")) == 1
    assert rollbacks_counted(node) == before + 1
    print(f"first breached window ended -> rollback recorded: {rolled - first_breach:.1f} s; "
          f"-> first answer from the fallback: {first_fallback - first_breach:.1f} s")


def rolled_back(node: OnNode) -> str | None:
    """``status.guard.rolledBackAt`` of slow-digits, if a rollback is in effect."""
    status = (node.get(resource.PLURAL, SLOW) or {}).get("status") or {}
    return (status.get("guard") or {}).get("rolledBackAt")


def restart_operator(node: OnNode, *, force: bool = False) -> None:
    """Delete the operator's pod (``force``: killed at once, no graceful stop) and wait for
    the Deployment's next pod to be Ready."""
    old = node.operator_pod()["metadata"]["name"]
    node.cluster.kubectl("delete", "pod", "-n", RELEASE_NAMESPACE, old, "--wait=false",
                         *(["--grace-period=0", "--force"] if force else []))
    wait_for(lambda: [p["metadata"]["name"] for p in node.operator_pods()] not in ([], [old]),
             timeout=120, what="a new operator pod to be Ready")


def test_a_restarted_operator_keeps_the_rollback_and_rolling_forward_or_a_new_model_rearms_it(
        node: OnNode) -> None:
    """After a rollback the operator's pod is replaced: its successor finds the rollback in
    ``status.guard`` and neither undoes nor repeats it. ``tailguard rollforward --cluster``
    moves traffic back and re-arms the guard; under load it rolls back again, and the operator
    killed as soon as that rollback is recorded (while the fallback is being raised, when the
    timing allows) is replaced by one that completes it: one rollback, not two. A new primary
    model re-arms the guard: traffic returns to it, and it is rolled back on its own account."""
    if rolled_back(node) is None:  # this test alone: roll back first
        slow_digits(node)
        node.load(SLOW, rate=40, seconds=15, label="guard-first").finish()
        wait_for(lambda: node.selected_role(SLOW) == "fallback", timeout=60,
                 what="the first rollback")
    rolled_at = rolled_back(node)
    events = len(node.events(SLOW, "AutomaticRollback"))
    restart_operator(node)
    records = node.load(SLOW, rate=20, seconds=8, label="guard-restart").finish()
    assert failures(records) == [] and {r["role"] for r in records} == {"fallback"}
    assert rolled_back(node) == rolled_at
    assert len(node.events(SLOW, "AutomaticRollback")) == events

    env = {**os.environ, "KUBECONFIG": str(node.cluster.identities["admin"].kubeconfig)}
    done = subprocess.run([str(TAILGUARD), "rollforward", SLOW, "--cluster", "-n",
                           node.namespace], capture_output=True, text=True, env=env,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "tailguard.dev/roll-forward=" in done.stdout
    wait_for(lambda: node.selected_role(SLOW) == "primary", timeout=60,
             what="traffic back on the primary")
    wait_for(lambda: rolled_back(node) is None, timeout=30,
             what="the rollback cleared from status.guard")
    guard = (node.get(resource.PLURAL, SLOW) or {})["status"]["guard"]
    assert guard["rollForwardObserved"]
    node.cluster.kubectl("scale", "-n", node.namespace, f"deployment/{SLOW}-fallback",
                         "--replicas=1")
    wait_for(lambda: len(node.pods(SLOW, "fallback")) == 1, timeout=60,
             what="one fallback pod")

    load = node.load(SLOW, rate=40, seconds=60, label="guard-rearmed")
    killed_while_waiting, second = None, None
    while load.proc.poll() is None and killed_while_waiting is None:
        second = rolled_back(node)
        if second is not None:
            killed_while_waiting = node.selected_role(SLOW) == "primary"
            restart_operator(node, force=True)
        time.sleep(0.1)
    assert second is not None, "the re-armed guard did not roll back"
    wait_for(lambda: node.selected_role(SLOW) == "fallback", timeout=60,
             what="the new operator to complete the rollback")
    records = load.stop(at=time.time() + 3)
    assert failures(records) == []
    assert rolled_back(node) == second, "the rollback was recorded twice"
    assert len(node.ready_pods(SLOW, "fallback")) == 2
    assert len(node.events(SLOW, "AutomaticRollback")) <= events + 1
    print(f"operator killed {'before' if killed_while_waiting else 'after'} the Service moved")

    # a new primary model (still slow) re-arms the guard: traffic goes back to it, and it is
    # judged afresh and rolled back on its own account
    slower = "builtin://digits/random-forest?trees=50&delayMs=130"
    node.patch(SLOW, {"model": {"uri": slower}})
    wait_for(lambda: node.selected_role(SLOW) == "primary", timeout=120,
             what="traffic on the new primary")
    node.wait_serving(SLOW)
    load = node.load(SLOW, rate=40, seconds=60, label="guard-new-primary")
    wait_for(lambda: node.selected_role(SLOW) == "fallback", timeout=60,
             what="the new primary rolled back")
    records = load.stop(at=time.time() + 2)
    assert failures(records) == []
    guard = (node.get(resource.PLURAL, SLOW) or {})["status"]["guard"]
    assert guard["rolledBackModel"].startswith(slower), guard
    assert guard["rolledBackAt"] != second


ATTACKS = REPO / "tests" / "harness" / "attacks.py"
HEALTHY = forest_spec("healthy")
BUSY = busy_spec(min_samples=20, scaling="minReplicas: 2, maxReplicas: 2, targetQueueDepth: 2")


def attack(node: OnNode, name: str, kind: str, rate: float, seconds: float
           ) -> subprocess.Popen[bytes]:
    """Start :mod:`harness.attacks` inside the cluster's namespace against ``name``'s
    ClusterIP."""
    url = f"http://{node.cluster_ip(name)}/v2/models/{name}"
    return subprocess.Popen(node.holder.command(
        [sys.executable, str(ATTACKS), url, kind, "--rate", str(rate), "--seconds",
         str(seconds)]), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def answered(proc: subprocess.Popen[bytes]) -> dict[str, int]:
    """The attacker's answers counted by status."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    return dict(json.loads(out))


def never_rolled_back(node: OnNode, name: str, samples: list[dict[str, Any]]) -> None:
    """Every sample and the InferenceService now: traffic on the primary, no rollback in
    ``status.guard``, and no AutomaticRollback Event."""
    assert all(s["selected"] == "primary" for s in samples)
    assert not any((s["status"].get("guard") or {}).get("rolledBackAt") for s in samples)
    assert not ((node.get(resource.PLURAL, name) or {})["status"].get("guard") or {}).get(
        "rolledBackAt")
    assert node.events(name, "AutomaticRollback") == []


def test_idle_overload_and_hostile_clients_never_roll_back(node: OnNode) -> None:
    """What the guard in the operator must not roll back, on runtime pods of the real node with
    traffic through the ClusterIP: a primary at its capacity, with ``maxReplicas`` reached and
    then with room to scale (overload: the HPA's job); then, while it idles (10 windows, and
    not one status write), a healthy primary whose other clients send tiny deadlines and
    requests as large as the whole queue."""
    for name, text in (("healthy", HEALTHY), ("busy", BUSY)):
        manifest = node.workdir / f"{name}.yaml"
        manifest.write_text(text)
        node.apply(manifest)
    node.wait_serving("healthy")
    node.wait_serving("busy")

    def guard_state(name: str) -> str | None:
        status = (node.get(resource.PLURAL, name) or {}).get("status") or {}
        return (status.get("guard") or {}).get("state")

    # busy offered four times what its two pods serve: at maxReplicas, then with room to scale
    for phase, max_replicas, answer in (("at-max", 2, "at maxReplicas=2"),
                                        ("room", 4, "scaling's job")):
        node.patch("busy", {"scaling": {"maxReplicas": max_replicas}})

        def answered_overload(sample: dict[str, Any], answer: str = answer) -> bool:
            guard = sample["status"].get("guard") or {}
            return guard.get("state") == "overload" and answer in guard.get(
                "lastDecisionReason", "")
        # at most 60 s: the load ends 3 s after the guard says overload (a few seconds here;
        # beside another suite a CI run's operator judged no window in 20 s)
        load = node.load("busy", rate=100, seconds=60, label=f"guard-overload-{phase}")
        samples = watch(node, load, "busy", until=answered_overload, linger_s=3.0)
        records = load.finish()
        assert sum(r["status"] == 429 for r in records) > 0, "no overload"
        overloaded = [s["status"]["guard"] for s in samples
                      if (s["status"].get("guard") or {}).get("state") == "overload"]
        assert overloaded, [s["status"].get("guard") for s in samples[-5:]]
        assert any(answered_overload(s) for s in samples), overloaded
        assert not any((s["status"].get("guard") or {}).get("state") == "breach"
                       and s["status"]["guard"].get("breaches", 0) >= 2 for s in samples)
        never_rolled_back(node, "busy", samples)
        wait_for(lambda: guard_state("busy") == "idle", timeout=30,
                 what="busy idle again")

    def busy_read() -> bool:  # idle, both pods read: nothing left to write
        status = (node.get(resource.PLURAL, "busy") or {}).get("status") or {}
        return ((status.get("guard") or {}).get("state") == "idle"
                and (status.get("observed") or {}).get("pods") == 2)

    # a change while idle (a pod becoming Ready) is written within max(window, 30 s)
    wait_for(busy_read, timeout=90, what="the guard to judge busy idle on its two pods")
    wait_for(lambda: guard_state("healthy") == "idle", timeout=60,
             what="the guard to judge healthy idle")
    time.sleep(2.0)  # a write under way is done
    idle_version = (node.get(resource.PLURAL, "busy") or {})["metadata"]["resourceVersion"]
    idle_from = time.time()

    # busy idles while healthy's clients attack it
    before = rollbacks_counted(node, "healthy")
    attackers = [attack(node, "healthy", "deadlines", 10, 12),
                 attack(node, "healthy", "oversized", 2, 12)]
    load = node.load("healthy", rate=40, seconds=12, label="guard-attacked")
    samples = watch(node, load, "healthy")
    records = load.finish()
    deadlines, oversized = (answered(proc) for proc in attackers)
    busy = node.get(resource.PLURAL, "busy") or {}
    assert time.time() - idle_from >= 10 * 1.0
    assert busy["metadata"]["resourceVersion"] == idle_version, (
        "the idle InferenceService was written: " + json.dumps(busy.get("status"))[:2000])
    assert busy["status"]["guard"]["state"] == "idle"

    # while an admitted oversized request fills the queue, others are refused 429: real load
    assert {r["status"] for r in records} <= {200, 429}
    assert sum(r["status"] == 200 for r in records) >= 0.8 * len(records)
    assert deadlines.get("429", 0) + deadlines.get("504", 0) >= 15, deadlines
    assert deadlines.get("200", 0) >= 10 and sum(oversized.values()) >= 10, (deadlines,
                                                                              oversized)
    never_rolled_back(node, "healthy", samples)
    judged = [s["status"].get("observed") or {} for s in samples
              if (s["status"].get("guard") or {}).get("state") == "ok"]
    assert judged and max(o.get("judged", 0) for o in judged) >= 10, samples[-1]["status"]
    excluded = [(o.get("excluded") or {}).get("short_deadline", 0) for o in judged]
    assert max(excluded) > 0, "the guard did not say it left the tiny deadlines out"
    assert rollbacks_counted(node, "healthy") == before
    assert len(node.ready_pods("busy", "primary")) == 2
