"""The one module that talks to the Kubernetes API (the only importer of ``kubernetes``).

It reads and writes objects as plain dicts (JSON as the API server sends it, no client model
classes) through the official client's configuration and transport, so kubeconfig contexts,
in-cluster service accounts, client certificates and token refresh all work as in ``kubectl``.
Every write is a create or a JSON merge patch (``application/merge-patch+json``): the fake API
in the tests applies patches as plain merges, and a merge patch means the same everywhere.

Calls are synchronous; kopf runs the handlers that use them in its worker threads.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import kubernetes
import urllib3

from tailguard.guard.record import ROLL_FORWARD_ANNOTATION
from tailguard.spec import resource
from tailguard.spec.conditions import timestamp
from tailguard_runtime import __version__

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = (5.0, 30.0)
"""(connect, read) timeouts of one API request, in seconds."""
COMPONENT = "tailguard-operator"
OPERATOR_MANAGER = COMPONENT
"""The field manager of the operator's writes (``metadata.managedFields``, server-side apply's
owner of a field)."""
GUARD_MANAGER = "tailguard-guard"
"""The field manager of the SLO guard's status writes (``status.observed``, ``status.guard``,
the ``SLOMet`` condition)."""
CLI_MANAGER = "tailguard-cli"
"""The field manager of ``tailguard rollback|rollforward --cluster`` (``spec.traffic``)."""
USER_AGENT = f"tailguard/{__version__}"
"""The ``User-Agent`` of every request (the audit log's ``userAgent``)."""

_PATHS: Mapping[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "Event": ("/api/v1", "events"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "ReplicaSet": ("/apis/apps/v1", "replicasets"),
    "HorizontalPodAutoscaler": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    resource.KIND: (f"/apis/{resource.API_VERSION}", resource.PLURAL),
}
"""Collection path prefix and plural of every (namespaced) kind the operator touches."""

_lock = threading.Lock()
_client: Any = None
_namespace = "default"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubeError(RuntimeError):
    """The API server refused a request: ``status`` is the HTTP status, ``reason`` the
    Kubernetes Status reason (``NotFound``, ``AlreadyExists``, ``Conflict``, ...)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason


class NotFound(KubeError):
    """404: the object (or its namespace, or its kind) does not exist."""


class Conflict(KubeError):
    """409: the object already exists, or a precondition (resourceVersion) failed."""


@dataclass(frozen=True)
class Credentials:
    """What :func:`connect` loaded, for kopf's own connection (the same server and identity)."""

    server: str
    ca_path: str | None
    insecure: bool
    username: str | None
    password: str | None
    scheme: str | None
    token: str | None
    certificate_path: str | None
    private_key_path: str | None


def connect(*, kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """(Re)load credentials: the in-cluster service account when running in a pod, else the
    kubeconfig (``kubeconfig``, else ``$KUBECONFIG`` as it is now, else ``~/.kube/config``) and
    its current context (or ``context``). Later calls use the new credentials; they are also
    returned, for kopf's login.

    Raises:
        KubeError: (status 0) neither in-cluster credentials nor a usable kubeconfig exist.
    """
    global _client, _namespace
    config = kubernetes.client.Configuration()
    try:
        if kubeconfig is None and context is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=config)
            try:
                with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as fh:
                    namespace = fh.read().strip() or "default"
            except OSError:
                namespace = "default"
        else:
            raise kubernetes.config.ConfigException("not in a cluster")
    except kubernetes.config.ConfigException:
        try:
            path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=config)
            contexts, active = kubernetes.config.list_kube_config_contexts(
                config_file=path)  # type: ignore[no-untyped-call]
            chosen = next((c for c in contexts if c["name"] == context), active) if context \
                else active
            namespace = (chosen or {}).get("context", {}).get("namespace") or "default"
        except (kubernetes.config.ConfigException, OSError) as exc:
            raise KubeError(0, "NoCredentials", f"no Kubernetes credentials: {exc}") from None
    api_client = kubernetes.client.ApiClient(config)
    api_client.user_agent = USER_AGENT
    with _lock:
        old, _client = _client, api_client
        _namespace = namespace
    if old is not None:
        old.close()
    header = config.get_api_key_with_prefix("BearerToken") or ""
    scheme, _, token = header.partition(" ") if " " in header else ("", "", header)
    return Credentials(server=config.host, ca_path=config.ssl_ca_cert,
                       insecure=not config.verify_ssl, username=config.username or None,
                       password=config.password or None, scheme=scheme or None,
                       token=token or None, certificate_path=config.cert_file,
                       private_key_path=config.key_file)


def get(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The object, or ``None`` when it does not exist.

    Raises:
        KubeError: any other refusal (403, 5xx, ...).
    """
    try:
        return _request("GET", _path(kind, namespace, name))
    except NotFound:
        return None


def peering_status(name: str, namespace: str | None) -> dict[str, Any] | None:
    """The ``status`` of kopf's peering object ``name``: the ``ClusterKopfPeering`` when
    ``namespace`` is ``None``, else the ``KopfPeering`` in ``namespace``. ``None`` when there is
    no such object; ``{}`` when it has no status yet.

    Raises:
        KubeError: any other refusal (403, 5xx, ...).
    """
    path = (f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}" if namespace is None
            else f"/apis/kopf.dev/v1/namespaces/{namespace}/kopfpeerings/{name}")
    try:
        return _request("GET", path).get("status") or {}
    except NotFound:
        return None


def list_objects(kind: str, namespace: str | None, label_selector: str | None = None
                 ) -> tuple[list[dict[str, Any]], str]:
    """Every object of ``kind`` in ``namespace`` (every namespace when ``None``) that
    ``label_selector`` selects (all when ``None``), each with its ``kind`` and ``apiVersion``
    set (a list's items carry neither), and the list's ``resourceVersion``.

    Raises:
        KubeError: the API refused (403 without list permission, ...).
    """
    prefix, plural = _PATHS[kind]
    path = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    params = [("labelSelector", label_selector)] if label_selector else []
    answer = _request("GET", path, params=params)
    api_version = prefix.removeprefix("/apis/").removeprefix("/api/")
    items = [{**item, "kind": kind, "apiVersion": api_version}
             for item in answer.get("items") or []]
    return items, str((answer.get("metadata") or {}).get("resourceVersion", ""))


def create(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Create ``obj`` (its ``kind`` and ``metadata.namespace`` pick the collection); return the
    stored object.

    Raises:
        Conflict: it already exists.
        KubeError: any other refusal.
    """
    namespace = obj["metadata"]["namespace"]
    return _request("POST", _path(obj["kind"], namespace), body=dict(obj),
                    field_manager=OPERATOR_MANAGER)


def merge_patch(kind: str, namespace: str, name: str, patch: Mapping[str, Any], *,
                field_manager: str = OPERATOR_MANAGER) -> dict[str, Any]:
    """Apply a JSON merge patch (RFC 7386) to an object as ``field_manager`` (what
    ``metadata.managedFields`` names); return the stored object.

    Raises:
        NotFound: the object does not exist.
        KubeError: any other refusal.
    """
    return _request("PATCH", _path(kind, namespace, name), body=dict(patch),
                    content_type=MERGE_PATCH, field_manager=field_manager)


def delete(kind: str, namespace: str, name: str, *, uid: str,
           resource_version: str | None = None) -> bool:
    """Delete an object, only if it is still the one read (``uid``, and ``resource_version``
    when given, as the delete's preconditions). Returns whether it was deleted (``False``: it
    was gone already).

    Raises:
        Conflict: a precondition failed (replaced or changed since it was read).
        KubeError: any other refusal.
    """
    preconditions = {"uid": uid, **({"resourceVersion": resource_version}
                                    if resource_version else {})}
    try:
        _request("DELETE", _path(kind, namespace, name),
                 body={"apiVersion": "v1", "kind": "DeleteOptions",
                       "preconditions": preconditions})
    except NotFound:
        return False
    return True


def patch_status(namespace: str, name: str, patch: Mapping[str, Any], *,
                 field_manager: str = OPERATOR_MANAGER) -> dict[str, Any]:
    """Merge-patch an InferenceService's ``status`` subresource with ``patch``
    (``{"status": {...}}``, with ``metadata.resourceVersion`` as a precondition if given) as
    ``field_manager``; return the stored object.

    Raises:
        NotFound: the InferenceService does not exist.
        Conflict: the precondition failed (someone wrote in between).
        KubeError: any other refusal.
    """
    return _request("PATCH", _path(resource.KIND, namespace, name) + "/status", body=dict(patch),
                    content_type=MERGE_PATCH, field_manager=field_manager)


def default_namespace() -> str:
    """The namespace of the current kubeconfig context (or of the pod's service account);
    ``default`` when it names none. Connects first if needed.

    Raises:
        KubeError: no credentials.
    """
    _api_client()
    with _lock:
        return _namespace


def set_traffic(name: str, namespace: str | None, role: str, *,
                roll_forward: str | None = None) -> dict[str, Any]:
    """Set ``spec.traffic`` of an InferenceService (``tailguard rollback NAME --cluster``);
    the operator moves traffic once the role has Ready replicas. ``namespace`` ``None``: the
    current context's (:func:`default_namespace`). ``roll_forward``: also set the
    roll-forward annotation to this RFC 3339 time in the same write, which clears an older
    automatic rollback (``tailguard rollforward NAME --cluster``). Connects first if needed.

    Raises:
        ValueError: ``role`` is not ``primary`` or ``fallback``.
        NotFound: there is no such InferenceService.
        KubeError: no credentials, or any other refusal.
    """
    if role not in ("primary", "fallback"):
        raise ValueError(f"role must be primary or fallback, got {role!r}")
    patch: dict[str, Any] = {"spec": {"traffic": role}}
    if roll_forward is not None:
        patch["metadata"] = {"annotations": {ROLL_FORWARD_ANNOTATION: roll_forward}}
    return merge_patch(resource.KIND, namespace or default_namespace(), name, patch,
                       field_manager=CLI_MANAGER)


EVENT_MESSAGE_CHARS = 1024
"""Longest Event message recorded, in characters (events.k8s.io/v1 holds an Event's note to
1 kB)."""


def post_event(involved: Mapping[str, Any], *, type_: str, reason: str, message: str,
               now: datetime.datetime) -> str | None:
    """Create a core/v1 Event about ``involved`` (an object as returned by the API);
    ``type_`` is ``Normal`` or ``Warning``. Returns the stored Event's name, or None when the
    API refused it. Best effort: a refusal is logged, not raised. (Repeats are folded by
    :mod:`tailguard.operator.events`, which the operator records through.)"""
    meta = involved["metadata"]
    stamp = timestamp(now)
    event = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": involved.get("apiVersion", resource.API_VERSION),
                           "kind": involved.get("kind", resource.KIND), "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta.get("uid", "")},
        "type": type_, "reason": reason, "message": message[:EVENT_MESSAGE_CHARS],
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": f"{resource.GROUP}/operator",
        "reportingInstance": socket.gethostname()[:128],
    }
    try:
        stored = _request("POST", _path("Event", meta["namespace"]), body=event,
                          field_manager=OPERATOR_MANAGER)
    except KubeError as exc:
        logger.warning("event not recorded: object=%s/%s reason=%s error=%s",
                       meta["namespace"], meta["name"], reason, exc)
        return None
    name = (stored.get("metadata") or {}).get("name")
    return str(name) if name else None


def _path(kind: str, namespace: str, name: str | None = None) -> str:
    try:
        prefix, plural = _PATHS[kind]
    except KeyError:
        raise ValueError(f"unsupported kind {kind!r}") from None
    path = f"{prefix}/namespaces/{namespace}/{plural}"
    return f"{path}/{name}" if name is not None else path


def _api_client() -> Any:
    with _lock:
        client = _client
    if client is None:
        connect()
        with _lock:
            client = _client
    return client


def _request(method: str, path: str, *, body: Mapping[str, Any] | None = None,
             content_type: str = "application/json",
             field_manager: str | None = None,
             params: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    client = _api_client()
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    query = [*params, *([("fieldManager", field_manager)] if field_manager else [])] or None
    request = client.param_serialize(method, path, query_params=query, header_params=headers,
                                     body=body, auth_settings=["BearerToken"])
    try:
        response = client.call_api(*request, _request_timeout=REQUEST_TIMEOUT)
        response.read()
    except kubernetes.client.ApiException as exc:  # raised by the transport for some statuses
        raise _error(exc.status or 0, exc.body) from None
    except urllib3.exceptions.HTTPError as exc:  # connection refused, timeouts, TLS failures
        raise KubeError(0, "Unreachable", f"{method} {path}: {exc}") from None
    if not 200 <= response.status < 300:
        raise _error(response.status, response.data)
    return json.loads(response.data) if response.data else {}


def _error(status: int, data: bytes | str | None) -> KubeError:
    reason, message = "Unknown", ""
    try:
        body = json.loads(data or b"{}")
        reason, message = body.get("reason") or reason, body.get("message") or ""
    except (ValueError, AttributeError):
        message = repr(data)[:200]
    cls = NotFound if status == 404 else Conflict if status == 409 else KubeError
    return cls(status, reason, message)
