"""The pods the guard reads (Ready runtime pods of a role) and those that cannot start, indexed by
their InferenceService."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.operator.podindex import PodIndex, pod_target, stuck_pod


def pod(name: str, role: str = "primary", *, ready: bool = True, ip: str | None = "10.244.0.7",
        phase: str = "Running", service: str = "iris", port: int | None = 8080,
        deleting: bool = False, waiting: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team", "uid": f"uid-{name}",
                            "labels": {"tailguard.dev/inferenceservice": service,
                                       "tailguard.dev/role": role}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T17:00:00Z"
    ports = [] if port is None else [{"name": "http", "containerPort": port}]
    status: dict[str, Any] = {"phase": phase, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    if waiting:
        status["containerStatuses"] = [{"name": "runtime", "ready": False, "state": {"waiting": {
            "reason": waiting, "message": f"{waiting} of\n  docker.io/tailguard/runtime:absent"}}}]
    return {"kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "runtime", "ports": ports}]}, "status": status}


def test_only_running_pods_with_an_ip_and_labels_are_targets() -> None:
    target = pod_target(pod("a", port=9000))
    assert target is not None
    assert (target.service, target.role, target.ip, target.port, target.ready) == \
        ("iris", "primary", "10.244.0.7", 9000, True)
    assert pod_target(pod("a", port=None)).port == 8080  # type: ignore[union-attr]
    assert pod_target(pod("a", ip=None)) is None
    assert pod_target(pod("a", phase="Pending")) is None
    assert pod_target(pod("a", deleting=True)) is None
    assert pod_target({"metadata": {"name": "x"}, "status": {"phase": "Running",
                                                             "podIP": "1.2.3.4"}}) is None


def test_the_index_follows_the_watch() -> None:
    index = PodIndex()
    for body in (pod("p1"), pod("p2", ready=False), pod("f1", "fallback"),
                 pod("other", service="digits")):
        index.keep(body)
    assert [p.name for p in index.ready("team", "iris", "primary")] == ["p1"]
    assert [p.name for p in index.ready("team", "iris", "fallback")] == ["f1"]
    assert index.uids("team", "iris") == {"uid-p1", "uid-p2", "uid-f1"}
    index.keep(pod("p2"))  # became Ready
    assert [p.name for p in index.ready("team", "iris", "primary")] == ["p1", "p2"]
    index.keep(pod("p1", deleting=True))  # terminating: no longer read
    index.drop(pod("f1", "fallback"))
    assert [p.name for p in index.ready("team", "iris", "primary")] == ["p2"]
    assert index.uids("team", "iris") == {"uid-p2"}
    index.drop(pod("p2"))
    index.drop(pod("never-seen"))
    assert index.uids("team", "iris") == set() and index.ready("team", "iris", "primary") == []


def test_a_pod_waiting_for_what_a_person_must_fix_cannot_start() -> None:
    stuck = stuck_pod(pod("p9", phase="Pending", waiting="ErrImageNeverPull"))
    assert stuck is not None
    assert stuck.line() == ("p9: ErrImageNeverPull: ErrImageNeverPull of "
                            "docker.io/tailguard/runtime:absent")
    assert stuck_pod(pod("p9", waiting="CrashLoopBackOff")) is not None  # Running, restarting
    assert stuck_pod(pod("p9", phase="Pending", waiting="ContainerCreating")) is None  # passes
    assert stuck_pod(pod("p9", phase="Pending")) is None
    assert stuck_pod(pod("p9", waiting="ErrImagePull", deleting=True)) is None


def test_the_index_says_when_its_pods_that_cannot_start_change() -> None:
    index = PodIndex()
    assert index.keep(pod("p1")) is False  # serving: nothing to say
    assert index.keep(pod("p2", phase="Pending", waiting="ErrImageNeverPull")) is True
    assert index.keep(pod("p2", phase="Pending", waiting="ErrImageNeverPull")) is False  # same
    assert index.keep(pod("f2", "fallback", phase="Pending", waiting="ErrImagePull")) is True
    assert index.keep(pod("p3", phase="Pending", waiting="ErrImageNeverPull",
                          service="digits")) is True
    stuck = index.not_starting("team", "iris")
    assert {role: [p.name for p in pods] for role, pods in stuck.items()} == {
        "primary": ["p2"], "fallback": ["f2"]}
    # the kubelet alternates a failed pull and its back-off: one trouble, noted once
    assert index.keep(pod("p2", phase="Pending", waiting="ErrImagePull")) is True
    assert index.keep(pod("p2", phase="Pending", waiting="ImagePullBackOff")) is False
    assert index.not_starting("team", "iris")["primary"][0].reason == "ErrImagePull"
    index.forget(pod("p2"))  # the pass that would report it failed: the next event counts
    assert index.keep(pod("p2", phase="Pending", waiting="ImagePullBackOff")) is True
    assert index.drop(pod("p2")) is True
    assert index.keep(pod("f2", "fallback")) is True  # it started after all
    assert index.not_starting("team", "iris") == {}
    assert [p.name for p in index.ready("team", "iris", "fallback")] == ["f2"]
    assert list(index.not_starting("team", "digits")) == ["primary"]


def crashing(name: str, state: dict[str, Any], *, ready: bool = False) -> dict[str, Any]:
    body = pod(name, ready=ready)
    body["status"]["containerStatuses"] = [{
        "name": "runtime", "ready": ready, "restartCount": 3, "state": state,
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]
    return body


def test_a_crash_loop_is_noted_once_until_the_pod_is_ready() -> None:
    index = PodIndex()
    backoff = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting"}}
    assert index.keep(crashing("p1", backoff)) is True
    (stuck,) = index.not_starting("team", "iris")["primary"]
    assert stuck.line() == "p1: CrashLoopBackOff: the container exited with code 1 (Error)"
    longer = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting"}}
    assert index.keep(crashing("p1", longer)) is False  # the back-off grew: nothing new
    assert index.keep(crashing("p1", {"running": {}})) is False  # restarted, not Ready yet
    assert index.not_starting("team", "iris")["primary"] == [stuck]
    assert index.keep(crashing("p1", {"running": {}}, ready=True)) is True  # it serves
    assert index.not_starting("team", "iris") == {}
    # a container restarted once, not in a crash loop, is never noted
    assert index.keep(crashing("p2", {"running": {}})) is False


def test_a_crash_loop_names_what_the_runtime_left_in_its_termination_message() -> None:
    body = crashing("p1", {"waiting": {"reason": "CrashLoopBackOff"}})
    said = "ModelChecksumMismatch: https://m.example.com/iris.joblib: sha256 mismatch: " + "x" * 400
    body["status"]["containerStatuses"][0]["lastState"]["terminated"].update(
        exitCode=2, message=said + "\n")
    stuck = stuck_pod(body)
    assert stuck is not None and stuck.reason == "CrashLoopBackOff"
    assert stuck.line().startswith("p1: CrashLoopBackOff: the container exited with code 2: "
                                   "ModelChecksumMismatch: https://m.example.com/iris.joblib")
    assert len(stuck.message) == 300


@pytest.mark.parametrize("message, reason", [
    ('0/3 nodes are available: persistentvolumeclaim "models" not found. preemption: 0/3 '
     'nodes are available: 3 Preemption is not helpful for scheduling.', "ClaimNotFound"),
    ("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: "
     "0/3 nodes are available: 3 Preemption is not helpful for scheduling.", "ClaimNotBound"),
    ("0/3 nodes are available: 3 Insufficient cpu.", None),
])
def test_a_pod_its_claim_keeps_off_every_node_cannot_start(message: str,
                                                            reason: str | None) -> None:
    body = pod("p1", phase="Pending", ip=None, ready=False)
    body["status"]["conditions"].append({"type": "PodScheduled", "status": "False",
                                         "reason": "Unschedulable", "message": message})
    index = PodIndex()
    assert index.keep(body) is (reason is not None)
    stuck = index.not_starting("team", "iris").get("primary", [])
    assert [p.reason for p in stuck] == ([reason] if reason else [])
    if reason:
        assert stuck[0].message == message[:300]
        assert index.keep(body) is False  # the same trouble again: nothing new
