"""The pods the guard reads: Ready runtime pods of a role, indexed by their InferenceService."""

from __future__ import annotations

from typing import Any

from tailguard.operator.podindex import PodIndex, pod_target


def pod(name: str, role: str = "primary", *, ready: bool = True, ip: str | None = "10.244.0.7",
        phase: str = "Running", service: str = "iris", port: int | None = 8080,
        deleting: bool = False) -> dict[str, Any]:
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
