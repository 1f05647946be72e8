"""The plain client the tests act through: dicts in and out, as one identity.

It is deliberately not the operator's own :mod:`tailguard.operator.kube` (the code under test):
tests act as a person or another controller would, through the official client's transport.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import kubernetes

RESOURCES: Mapping[str, tuple[str, str]] = {
    "namespaces": ("/api/v1", ""),
    "nodes": ("/api/v1", ""),
    "configmaps": ("/api/v1", "ns"),
    "services": ("/api/v1", "ns"),
    "pods": ("/api/v1", "ns"),
    "events": ("/api/v1", "ns"),
    "serviceaccounts": ("/api/v1", "ns"),
    "endpoints": ("/api/v1", "ns"),
    "resourcequotas": ("/api/v1", "ns"),
    "persistentvolumes": ("/api/v1", ""),
    "persistentvolumeclaims": ("/api/v1", "ns"),
    "deployments": ("/apis/apps/v1", "ns"),
    "replicasets": ("/apis/apps/v1", "ns"),
    "horizontalpodautoscalers": ("/apis/autoscaling/v2", "ns"),
    "poddisruptionbudgets": ("/apis/policy/v1", "ns"),
    "inferenceservices": ("/apis/tailguard.dev/v1alpha1", "ns"),
    "customresourcedefinitions": ("/apis/apiextensions.k8s.io/v1", ""),
}
"""API prefix of each resource the tests touch, and whether it is namespaced (``ns``)."""


class ApiError(Exception):
    """The API server refused: ``status`` (HTTP), ``reason`` and ``body`` (the Status)."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status} {body.get('reason')}: {body.get('message')}")
        self.status = status
        self.reason = str(body.get("reason", ""))
        self.body = body


class Client:
    """Requests to the API server as the identity of ``kubeconfig``."""

    def __init__(self, kubeconfig: Path) -> None:
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig), client_configuration=config)
        self._api = kubernetes.client.ApiClient(config)

    def close(self) -> None:
        self._api.close()

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json",
                query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """One request; the decoded JSON answer.

        Raises:
            ApiError: any status outside 2xx.
        """
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = self._api.param_serialize(method, path, header_params=headers, body=body,
                                           query_params=list((query or {}).items()),
                                           auth_settings=["BearerToken"])
        try:
            response = self._api.call_api(*params, _request_timeout=(5, 30))
            response.read()
            status, data = response.status, response.data
        except kubernetes.client.ApiException as exc:
            status, data = exc.status or 0, exc.body
        decoded = json.loads(data) if data else {}
        if not 200 <= status < 300:
            raise ApiError(status, decoded)
        return decoded  # type: ignore[no-any-return]

    def path(self, plural: str, namespace: str | None = None, name: str | None = None) -> str:
        prefix, scope = RESOURCES[plural]
        path = f"{prefix}/namespaces/{namespace}/{plural}" if scope else f"{prefix}/{plural}"
        return f"{path}/{name}" if name else path

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """The object, or ``None`` if there is none."""
        try:
            return self.request("GET", self.path(plural, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, plural: str, namespace: str | None = None,
             labels: str | None = None) -> list[dict[str, Any]]:
        """Every object of ``plural`` in ``namespace`` (all when ``None``), by name."""
        query = {"labelSelector": labels} if labels else None
        items = self.request("GET", self.path(plural, namespace), query=query)["items"]
        return sorted(items, key=lambda o: o["metadata"]["name"])

    def create(self, body: Mapping[str, Any], namespace: str | None = None,
               dry_run: bool = False) -> dict[str, Any]:
        """Create ``body`` (its kind picks the resource; ``namespace`` overrides its own)."""
        plural = _plural(body["kind"])
        ns = namespace or body.get("metadata", {}).get("namespace")
        query = {"dryRun": "All"} if dry_run else None
        return self.request("POST", self.path(plural, ns), dict(body), query=query)

    def patch(self, plural: str, namespace: str | None, name: str, patch: Mapping[str, Any],
              subresource: str = "") -> dict[str, Any]:
        """A JSON merge patch."""
        path = self.path(plural, namespace, name) + (f"/{subresource}" if subresource else "")
        return self.request("PATCH", path, dict(patch), "application/merge-patch+json")

    def delete(self, plural: str, namespace: str | None, name: str,
               propagation: str = "Background") -> None:
        """Delete, as ``kubectl delete`` does (dependents go through the garbage collector)."""
        self.request("DELETE", self.path(plural, namespace, name),
                     {"kind": "DeleteOptions", "apiVersion": "v1",
                      "propagationPolicy": propagation})


def _plural(kind: str) -> str:
    special = {"HorizontalPodAutoscaler": "horizontalpodautoscalers",
               "ResourceQuota": "resourcequotas",
               "PodDisruptionBudget": "poddisruptionbudgets",
               "CustomResourceDefinition": "customresourcedefinitions",
               "PersistentVolume": "persistentvolumes",
               "PersistentVolumeClaim": "persistentvolumeclaims"}
    return special.get(kind, kind.lower() + "s")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    """Poll ``predicate`` every 50 ms until it returns something truthy; return that.

    Raises:
        AssertionError: still falsy after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(0.05)
