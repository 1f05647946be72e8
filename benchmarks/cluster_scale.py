"""The operator at scale on a real control plane: N InferenceServices on kwok nodes.

    .venv/bin/python benchmarks/cluster_scale.py                # 200 services (about 5 minutes)
    .venv/bin/python benchmarks/cluster_scale.py --services 20  # a smoke run

Starts the same control plane as the tests (``tests/harness/kube``; binaries from
``hack/kube/build.py``), installs the chart with the real helm, runs the operator as the chart
deploys it (its ServiceAccount, its RBAC, its environment, the chart's default resync period
unless ``--resync-seconds``), creates N InferenceServices at once and reports:

- the time until every one is Ready (kwok marks the pods Running and Ready, the Deployment
  controller counts them, the operator writes the status), and its p50/p99 per service;
- API requests per InferenceService, reads and writes, from the API server's audit log;
- the operator's CPU time until every one is Ready, and while idle;
- the operator's peak resident memory (``VmHWM``);
- writes while idle: every write the operator makes over ``--idle-seconds`` after the last
  service is Ready (must be 0; the resync keeps reading).

Everything listens on 127.0.0.1; every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test harness, as a package

import yaml  # noqa: E402

from harness.hack import load  # noqa: E402
from harness.kube.audit import AuditLog  # noqa: E402
from harness.kube.client import Client  # noqa: E402
from harness.kube.controlplane import ControlPlane, bindir  # noqa: E402
from harness.kube.install import install  # noqa: E402

DEFAULT_TAG = load("build").DEFAULT_TAG


def ready_times(admin: Client, namespace: str) -> dict[str, str]:
    """name -> lastTransitionTime of Ready=True, for the services that are Ready."""
    out = {}
    for isvc in admin.list("inferenceservices", namespace):
        for cond in (isvc.get("status") or {}).get("conditions") or []:
            if cond["type"] == "Ready" and cond["status"] == "True":
                out[isvc["metadata"]["name"]] = cond["lastTransitionTime"]
    return out


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far, in seconds (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, default=200, help="InferenceServices (200)")
    parser.add_argument("--tag", default=DEFAULT_TAG, help=f"Kubernetes release ({DEFAULT_TAG})")
    parser.add_argument("--resync-seconds", type=float, default=None,
                        help="operator resync period (default: the chart's, 120 s)")
    parser.add_argument("--idle-seconds", type=float, default=150.0,
                        help="how long to count writes while idle (150 s: more than one resync)")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after (s)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below

    work = Path(tempfile.mkdtemp(prefix="tailguard-scale-"))
    plane = ControlPlane(bindir(args.tag), work / "cluster", args.tag)
    print(f"starting a {args.tag} control plane in {work} ...", flush=True)
    plane.start()
    result: dict[str, Any] = {"services": args.services, "kubernetes": args.tag}
    installation = None
    try:
        admin = Client(plane.admin.kubeconfig)
        installation = install(plane, admin)
        audit = AuditLog(plane.audit_log)
        namespace = "scale"
        admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        extra = {"TAILGUARD_RESYNC_SECONDS": str(args.resync_seconds)} \
            if args.resync_seconds else {}
        proc = installation.start_operator(work / "operator.log", extra)
        example = yaml.safe_load((REPO / "examples" / "iris.yaml").read_text())
        mark = audit.mark()
        cpu_before = cpu_seconds(proc.pid)
        started = time.monotonic()
        for i in range(args.services):
            admin.create({**example, "metadata": {"name": f"iris-{i:04d}",
                                                  "namespace": namespace}})
        created_s = time.monotonic() - started
        print(f"created {args.services} InferenceServices in {created_s:.1f} s; waiting for "
              "Ready ...", flush=True)
        last = -1
        while True:
            done = len(ready_times(admin, namespace))
            if done != last:
                print(f"  {done}/{args.services} Ready after {time.monotonic() - started:.0f} s",
                      flush=True)
                last = done
            if done == args.services:
                break
            if time.monotonic() - started > args.timeout:
                raise SystemExit(f"only {done}/{args.services} Ready after {args.timeout} s")
            time.sleep(1)
        all_ready_s = time.monotonic() - started
        cpu_to_ready = cpu_seconds(proc.pid) - cpu_before
        requests = audit.requests(mark, user=installation.user)
        writes = [r for r in requests if r.verb in ("create", "patch", "update", "delete")]
        result.update({
            "create_all_s": round(created_s, 1),
            "all_ready_s": round(all_ready_s, 1),
            "requests_per_service": round(len(requests) / args.services, 1),
            "writes_per_service": round(len(writes) / args.services, 1),
            "reads_per_service": round((len(requests) - len(writes)) / args.services, 1),
            "operator_cpu_s_to_ready": round(cpu_to_ready, 1),
        })
        idle_mark, cpu_idle = audit.mark(), cpu_seconds(proc.pid)
        print(f"all Ready after {all_ready_s:.0f} s; counting writes for {args.idle_seconds:.0f} "
              "s while idle ...", flush=True)
        time.sleep(args.idle_seconds)
        idle = audit.requests(idle_mark, user=installation.user)
        idle_writes = [r for r in idle if r.verb in ("create", "patch", "update", "delete")]
        result.update({
            "idle_seconds": args.idle_seconds,
            "idle_writes": len(idle_writes),
            "idle_reads": len([r for r in idle if r.verb in ("get", "list")]),
            "operator_cpu_s_idle": round(cpu_seconds(proc.pid) - cpu_idle, 1),
            "operator_peak_rss_mib": round(peak_rss_mib(proc.pid), 1),
        })
        assert installation.stop_operator(proc) == 0
    finally:
        for started in installation.processes if installation else ():
            installation.stop_operator(started)  # type: ignore[union-attr]
        plane.stop()
    print(json.dumps(result, indent=2))
    return 0 if result.get("idle_writes") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
