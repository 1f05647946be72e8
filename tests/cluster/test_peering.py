"""Two operator replicas with kopf peering, on the real control plane: one writer at a time.

kopf pauses a standby replica's watches and handlers; the operator's own resync task must
pause with them. Found by trying: a standby made 309 passes in 50 s and re-created a deleted
Service while the active replica was frozen.

The replicas run as the chart deploys them with ``peering.enabled`` (kopf's peering CRDs and a
``ClusterKopfPeering`` rendered from the chart, the chart's grants on it, ``TAILGUARD_PEERING``
and a ``POD_ID`` each), under the operator's ServiceAccount.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import Any, Iterator

import pytest
import yaml

from harness.kube.audit import WRITE_VERBS
from harness.kube.install import apply_peering_crds
from harness.scene import RESYNC_SECONDS, Scene, example
from tailguard.spec import resource

PEERING = "tailguard"
"""The chart's default ``peering.name``."""
IN_FLIGHT_GRACE_S = 2.0
"""How long after the active replica's SIGSTOP the requests it had already sent may still be
received by the API server (s). In one run, with another suite on the machine, the API server
logged an InferenceService list by the operator's ServiceAccount received after the stop.
Nothing tells the two replicas' requests apart (one ServiceAccount, one user agent), so the
test waits this long before it counts."""


@pytest.fixture
def peering(scene: Scene) -> Iterator[None]:
    """kopf's peering CRDs and the ``ClusterKopfPeering``, rendered by the chart with peering
    on, and the chart's grant on it for the operator's ServiceAccount; the grant goes at the
    end (the CRDs stay: other kopf operators may share them, as the chart says)."""
    cluster = scene.installation.cluster
    docs = apply_peering_crds(cluster)
    (peer,) = [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(peer))
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    grant = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "tailguard-test-peering"},
             "rules": [r for r in role["rules"] if "kopf.dev" in r.get("apiGroups", [])]}
    account = scene.installation.deployment["spec"]["template"]["spec"]["serviceAccountName"]
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "tailguard-test-peering"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "tailguard-test-peering"},
               "subjects": [{"kind": "ServiceAccount", "name": account,
                             "namespace": scene.installation.namespace}]}
    assert grant["rules"], role["rules"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([grant, binding]))
    try:
        yield
    finally:
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", "tailguard-test-peering",
                        check=False)


def peers(scene: Scene) -> dict[str, Any]:
    """The ``ClusterKopfPeering``'s status: one key per live replica (its ``POD_ID``)."""
    done = scene.installation.cluster.kubectl("get", "clusterkopfpeering", PEERING, "-o", "yaml")
    return yaml.safe_load(done.stdout).get("status") or {}


def test_a_standby_replica_writes_nothing_while_the_active_one_is_frozen(
        scene: Scene, peering: None) -> None:
    env = {"TAILGUARD_PEERING": PEERING, "TAILGUARD_RESYNC_SECONDS": str(RESYNC_SECONDS),
           "TAILGUARD_RETRY_DELAY_SECONDS": "0.5"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    frozen: subprocess.Popen[bytes] | None = None
    try:
        for pod in ("op-a", "op-b"):
            procs[pod] = scene.installation.start_operator(
                scene.logs.with_name(f"{pod}.log"), {**env, "POD_ID": pod})
        scene.wait(lambda: set(peers(scene)) >= set(procs), what="both replicas in the peering")
        records = peers(scene)
        active = max(procs, key=lambda pod: records[pod]["priority"])
        standby = next(pod for pod in procs if pod != active)
        lifetime = min(int(r.get("lifetime", 60)) for r in records.values())
        if standby == "op-a":  # it ran alone first: kopf pauses it once it reads op-b's record
            scene.wait(lambda: "Pausing operations" in scene.logs.with_name(
                "op-a.log").read_text(), what="the first replica to stand by")
        # (op-b, started second, stands by from its start: kopf waits for the peering first)
        scene.create(example(namespace=scene.namespace))
        scene.wait(lambda: scene.condition("Ready").get("status") == "True", what="Ready")
        scene.settle()

        frozen = procs[active]
        os.kill(frozen.pid, signal.SIGSTOP)  # alive to kopf until its keep-alive expires
        stopped_at = time.monotonic()
        # A request the active replica wrote just before the stop still reaches the API
        # server, and on a busy machine it is received (and logged) a while after: what is
        # received from here on is the standby's. (It has nothing to react to meanwhile; a
        # resync it makes in the grace is followed by four more below.)
        time.sleep(IN_FLIGHT_GRACE_S)
        quiet_from = time.time()
        mark = scene.audit.mark()
        scene.delete("services", "iris")
        time.sleep(4 * RESYNC_SECONDS)  # four of the standby's resync periods
        assert time.monotonic() - stopped_at < lifetime  # the frozen replica still counts
        assert scene.get("services", "iris") is None, "the standby re-created the Service"
        # what the API server received once the active replica's last requests were in
        since = [r for r in scene.requests(mark) if r.received >= quiet_from]
        assert [r for r in since if r.verb in WRITE_VERBS] == [], since
        # not even a read of the InferenceService (a pass reads the watch cache, a resync
        # lists the namespace's InferenceServices into it first)
        assert [r for r in since if r.resource == resource.PLURAL] == []

        os.kill(frozen.pid, signal.SIGCONT)
        frozen = None
        scene.wait(lambda: scene.get("services", "iris") is not None,
                   what="the active replica to restore the Service")
    finally:
        if frozen is not None:
            os.kill(frozen.pid, signal.SIGCONT)
        codes = {pod: scene.installation.stop_operator(proc) for pod, proc in procs.items()}
    assert set(codes.values()) == {0}, codes
