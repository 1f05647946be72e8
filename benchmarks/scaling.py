"""How long scaling on queue depth takes, part by part, on the real node with the real pipeline.

    .venv/bin/python benchmarks/scaling.py                  # both profiles, one round each
    .venv/bin/python benchmarks/scaling.py --rounds 2 --profiles fast

For each profile it starts the same cluster as the tests (``tests/harness/kube``: control plane,
real node, the chart's operator in its pod, and metrics-server, Prometheus and
prometheus-adapter from ``hack/metrics/build.py``), applies one InferenceService whose primary
answers ``CAPACITY`` requests/s a pod (``delayMs`` bound: more pods add capacity on 2 cores),
and offers an open-loop load of ``--overload`` times that from inside the cluster's namespace.
Every 0.25 s it reads the primary pods' own ``/metrics``, the custom metrics API, the HPA and
the pods, and it keeps every request's record. It reports, in seconds from the moment the
first pod's own queue depth crossed the HPA's target:

- ``seen``: the custom metrics API (Prometheus' scrape, then the adapter) shows it above;
- ``decided``: the HPA raised its desired replicas (its sync);
- ``created`` / ``ready`` / ``serving``: the first new pod exists, is Ready, has answered;
- ``p99_ok``: from here on, every 2 s window of requests (by scheduled send time) has its p99
  under the SLO.

A request that waits longer than the load generator's 15 s timeout counts as failed.

Profiles (the chart's and Kubernetes' defaults, and the fastest setting each part allows):

- ``default``: HPA sync 15 s (kube-controller-manager's default), scrape interval 15 s (the
  chart's ``podMonitor.interval``);
- ``fast``: HPA sync 1 s, scrape interval 1 s.

prometheus-adapter relists series every 5 s and metrics-server scrapes the kubelet every 10 s
in both (``tests/harness/kube/metrics.py``). Everything runs in the cluster's private network
namespace; every process started here is ended by its PID.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness, as a package

import yaml  # noqa: E402

from harness.kube.client import Client, wait_for  # noqa: E402
from harness.kube.controlplane import ControlPlane, bindir  # noqa: E402
from harness.kube.images import node_images  # noqa: E402
from harness.kube.install import install  # noqa: E402
from harness.kube.metrics import MetricsPipeline  # noqa: E402
from harness.kube.metrics import bindir as metrics_bindir  # noqa: E402
from harness.onnode import (  # noqa: E402
    OnNode,
    installed_on_node,
    is_ready,
    monitoring_from_chart,
    ready_since,
)
from tailguard.operator.manifests import PORT  # noqa: E402
from tailguard.spec import resource  # noqa: E402

DEFAULT_TAG = "v1.37.2"
DELAY_MS, BATCH, TARGET, SLO_MS = 100, 2, 4, 1000
CAPACITY = BATCH * 1000 / DELAY_MS
PROFILES = {"default": {"sync_s": 15, "scrape": "15s"}, "fast": {"sync_s": 1, "scrape": "1s"}}
NAME = "queue"


def service() -> dict[str, Any]:
    """The measured InferenceService: one to three primary pods, ``TARGET`` rows per pod."""
    return {
        "apiVersion": f"{resource.GROUP}/{resource.VERSION}", "kind": resource.KIND,
        "metadata": {"name": NAME},
        "spec": {
            "model": {"uri": f"builtin://iris/logistic-regression?delayMs={DELAY_MS}"},
            "fallback": {"uri": "builtin://iris/logistic-regression"},
            "batching": {"maxBatchSize": BATCH, "maxWaitMs": 0, "timeoutMs": 30000,
                         "maxQueueSize": 1024},
            "slo": {"p99LatencyMs": SLO_MS, "windowSeconds": 5, "minSamples": 20},
            "scaling": {"minReplicas": 1, "maxReplicas": 3, "targetQueueDepth": TARGET},
            "rollback": {"automatic": False},
        },
    }


def p99_ok_from(records: list[dict[str, Any]], after: float, window_s: float = 2.0) -> float:
    """The start of the first ``window_s`` window (by scheduled time, from ``after``) from
    which every window's p99 latency is under the SLO; NaN if the last one is not."""
    buckets: dict[int, list[float]] = {}
    for r in records:
        if r["scheduled"] >= after:
            ms = (r["done"] - r["scheduled"]) * 1000 if r["status"] == 200 else float("inf")
            buckets.setdefault(int((r["scheduled"] - after) // window_s), []).append(ms)
    ok_from = float("nan")
    for index in sorted(buckets):
        values = sorted(buckets[index])
        p99 = values[max(0, int(len(values) * 0.99) - 1)]
        if p99 >= SLO_MS:
            ok_from = float("nan")
        elif ok_from != ok_from:  # NaN: a run of good windows begins here
            ok_from = after + index * window_s
    return ok_from


def measure(node: OnNode, overload: float, seconds: float) -> dict[str, Any]:
    """One load on the service; the times of each part (s from the queue crossing)."""
    cluster, ns = node.cluster, node.namespace
    marks: dict[str, float] = {}
    first = {p["metadata"]["name"] for p in node.pods(NAME, "primary")}
    load = node.load(NAME, rate=CAPACITY * overload, seconds=seconds, label="scaling")
    try:
        deadline = time.time() + seconds
        while time.time() < deadline and "serving" not in marks:
            now = time.time()
            pods = node.pods(NAME, "primary")
            if "crossed" not in marks:
                depth = sum(queue_depth(node, p) for p in pods
                            if p["metadata"]["name"] in first)
                if depth > TARGET:
                    marks["crossed"] = now
            if "seen" not in marks:
                done = cluster.kubectl("get", "--raw", "/apis/custom.metrics.k8s.io/v1beta1/"
                                       f"namespaces/{ns}/pods/*/tailguard_queue_depth",
                                       check=False)
                items = json.loads(done.stdout)["items"] if done.returncode == 0 else []
                if any(_quantity(i["value"]) > TARGET for i in items):
                    marks["seen"] = now
            found = node.get("horizontalpodautoscalers", f"{NAME}-primary") or {}
            if "decided" not in marks and (found.get("status") or {}).get(
                    "desiredReplicas", 1) > 1:
                marks["decided"] = now
            new = [p for p in pods if p["metadata"]["name"] not in first]
            if new and "created" not in marks:
                marks["created"] = now
            ready = [p for p in new if is_ready(p)]
            if ready and "ready" not in marks:
                marks["ready"] = max(now - 0.25, ready_since(ready[0]))
            if ready and any(node.answered(p) > 0 for p in ready):
                marks["serving"] = now
            time.sleep(0.25)
        time.sleep(max(0.0, min(30.0, deadline - time.time())))
        records = load.stop(time.time())
    finally:
        load.abandon()
    start = marks.get("crossed", float("nan"))
    failed = sum(1 for r in records if r["status"] != 200)
    return {"parts_s": {k: round(v - start, 1) for k, v in marks.items() if k != "crossed"}
            | {"p99_ok": round(p99_ok_from(records, start) - start, 1)},
            "requests": len(records), "failed": failed}


def queue_depth(node: OnNode, pod: dict[str, Any]) -> float:
    """``tailguard_queue_depth`` on the pod's own /metrics (0 while it cannot be read)."""
    try:
        return node.counter(pod["status"]["podIP"], PORT, "tailguard_queue_depth")
    except (KeyError, subprocess.CalledProcessError):
        return 0.0


def _quantity(text: str) -> float:
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def run_profile(profile: str, rounds: int, overload: float, seconds: float,
                tag: str) -> list[dict[str, Any]]:
    """Start a cluster for ``profile``, measure ``rounds`` loads, tear it all down."""
    settings = PROFILES[profile]
    work = Path(tempfile.mkdtemp(prefix=f"tailguard-scaling-{profile}-"))
    images = node_images()
    plane = ControlPlane(bindir(tag), work / "cluster", tag,
                         images=[images[n].archive for n in ("pause", "runtime", "operator")],
                         pause_image=images["pause"].ref, hpa_sync_period_s=settings["sync_s"])
    results = []
    pipeline = None
    plane.start()
    try:
        admin = Client(plane.admin.kubeconfig)
        install(plane, admin)
        plane.wait_node()
        namespace = "scaling"
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        wait_for(lambda: admin.get("serviceaccounts", namespace, "default"), what="the SA")
        installed_on_node(plane, admin, namespace, images)
        monitors, rules = monitoring_from_chart(plane, namespace, images, settings["scrape"])
        pipeline = MetricsPipeline(plane, metrics_bindir(), work / "metrics")
        pipeline.start(monitors, rules)
        node = OnNode(plane, admin, namespace, work / "node")
        node.workdir.mkdir(parents=True, exist_ok=True)
        for round_ in range(rounds):
            path = node.workdir / "queue.yaml"
            path.write_text(yaml.safe_dump(service()))
            node.apply(path)
            node.wait_serving(NAME)
            print(f"[{profile}] round {round_ + 1}: load {CAPACITY * overload:.0f} req/s "
                  f"on one pod of {CAPACITY:.0f} ...", file=sys.stderr, flush=True)
            result = {"profile": profile, **settings, **measure(node, overload, seconds)}
            print(json.dumps(result), flush=True)
            results.append(result)
            node.delete_all()
    finally:
        if pipeline is not None:
            pipeline.stop()
        plane.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profiles", default="default,fast",
                        help=f"comma-separated, of {', '.join(PROFILES)} (both)")
    parser.add_argument("--rounds", type=int, default=1, help="loads per profile (1)")
    parser.add_argument("--overload", type=float, default=1.25,
                        help="load as a multiple of one pod's capacity (1.25)")
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="longest load (s; it ends 30 s after a new pod serves)")
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"Kubernetes release ({DEFAULT_TAG})")
    args = parser.parse_args()
    results = []
    for profile in args.profiles.split(","):
        if profile not in PROFILES:
            parser.error(f"unknown profile {profile!r} (known: {', '.join(PROFILES)})")
        results += run_profile(profile, args.rounds, args.overload, args.seconds, args.tag)
    print("\n| profile | seen | decided | created | ready | serving | p99 ok | failed |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        parts = r["parts_s"]
        cells = [f"{parts.get(k, float('nan')):.1f}" for k in
                 ("seen", "decided", "created", "ready", "serving", "p99_ok")]
        print(f"| {r['profile']} | {' | '.join(cells)} | {r['failed']}/{r['requests']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
