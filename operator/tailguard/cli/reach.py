"""How the commands reach a service: the local ``tailguard up`` over its loopback routes, or
the cluster through the operator's Kubernetes client, each failure turned into one line."""

from __future__ import annotations

import argparse
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tailguard.operator.kube import KubeError


def call_local(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None,
               secret: str | None = None) -> dict[str, Any] | None:
    """Call the local ``tailguard up`` on ``127.0.0.1:args.port`` (``secret``: its control
    secret, sent as ``Authorization: Bearer``); the JSON reply, or ``None`` (after printing one
    line on stderr) when nothing answers, the answer is not 200, or it is not a JSON object."""
    import httpx

    headers = {} if secret is None else {"Authorization": f"Bearer {secret}"}
    try:
        reply = httpx.request(method, f"http://127.0.0.1:{args.port}{path}", json=body,
                              headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        print(f"tailguard {args.command}: no local tailguard up answers on 127.0.0.1:{args.port} "
              f"({type(exc).__name__}); use --port, or --cluster for a cluster", file=sys.stderr)
        return None
    try:
        doc = reply.json()
    except ValueError:
        doc = None
    if reply.status_code != 200 or not isinstance(doc, dict):
        detail = doc.get("error", reply.text) if isinstance(doc, dict) else reply.text[:200]
        print(f"tailguard {args.command}: 127.0.0.1:{args.port} answered {reply.status_code}: "
              f"{detail}", file=sys.stderr)
        return None
    return doc


def kube_problem(exc: KubeError, name: str, verb: str) -> str:
    """One line for a :class:`~tailguard.operator.kube.KubeError` (``status``, ``reason``,
    message): no credentials, an unreachable API server (its address and the socket error), a
    missing InferenceService or CRD, or the API server's own refusal."""
    text = str(exc)
    if exc.reason == "NoCredentials":
        detail = text.split("no Kubernetes credentials: ", 1)[-1]
        return (f"no Kubernetes credentials ({detail}); set KUBECONFIG or use a context where "
                "kubectl works")
    if exc.reason == "Unreachable":
        where = re.search(r"host='([^']+)', port=(\d+)", text)
        why = re.search(r"\[Errno -?\d+\] ([^'\")]+)|(timed out|[A-Za-z]*SSL[A-Za-z]*Error)", text)
        return ("cannot reach the Kubernetes API server"
                + (f" at {where.group(1)}:{where.group(2)}" if where else "")
                + (f" ({(why.group(1) or why.group(2)).strip()})" if why else "")
                + "; check the kubeconfig context (kubectl cluster-info)")
    if exc.status == 404:
        return (f"cannot {verb} InferenceService {name!r}: not found (wrong name or namespace, "
                "or the tailguard CRD is not installed)")
    return f"cannot {verb} InferenceService {name!r}: the API server answered {text}"
