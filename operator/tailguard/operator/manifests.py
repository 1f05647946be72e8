"""The Kubernetes objects one InferenceService owns, as plain dicts.

Pure functions of a validated :class:`~tailguard.spec.resource.InferenceService`, its owner
identity and the :class:`~tailguard.operator.settings.OperatorSettings`: no I/O, no clock, no
Kubernetes client. For a service ``NAME`` they build:

- ConfigMap ``NAME-traffic``: key ``traffic.json``, ``{"activeModel": ROLE}``, the role traffic
  goes to (rewritten on a switch; the pods re-read it);
- ConfigMaps ``NAME-ROLE-HASH``, one per role and revision: key ``runtime.json``, what the pods
  of that role serve (:func:`role_config`), immutable, named by the first 10 hex digits of its
  SHA-256 (:func:`config_checksum`). A Deployment's pod template names its revision's, so an
  old ReplicaSet's pods (restarted mid-rollout, or brought back by ``kubectl rollout undo``)
  load the model they were made for;
- Deployments ``NAME-primary`` and ``NAME-fallback``, one runtime role each;
- Service ``NAME``: port 80 to the pods of the active role;
- HorizontalPodAutoscalers and PodDisruptionBudgets ``NAME-primary`` / ``NAME-fallback``.

Every object carries the same labels and a controller owner reference, so it goes when its owner
goes. Comparing them with live objects, and deciding what to write, is :mod:`tailguard.operator.reconcile`'s job.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from tailguard.operator.settings import OperatorSettings
from tailguard.spec import resource
from tailguard_runtime.settings import (
    DEFAULT_MAX_BYTES,
    MODEL_CA_FILE_ENV,
    MODEL_CACHE_ENV,
    PVC_ROOT_ENV,
)
from tailguard_runtime.uris import claim_of, is_url

ROLES = ("primary", "fallback")
PORT = 8080
PORT_NAME = "http"
SERVICE_PORT = 80
GRPC_PORT_NAME = "grpc"
"""The runtime's gRPC port (``spec.grpcPort``) in pods and on the Service, with
``appProtocol: grpc`` on the Service so that meshes and gateways speak HTTP/2 to it."""
CONFIG_DIR = "/etc/tailguard"
"""Where a runtime pod finds its config: one projected volume holding :data:`CONFIG_KEY` (from
its revision's ConfigMap) and :data:`TRAFFIC_KEY` (from ``NAME-traffic``)."""
CONFIG_KEY = "runtime.json"
TRAFFIC_KEY = "traffic.json"
CONFIG_HASH_DIGITS = 10
"""Hex digits of :func:`config_checksum` in a revision's ConfigMap name (40 bits: as
``kubectl create configmap --append-hash`` and kustomize, which use 10 characters)."""
MODEL_CACHE_DIR = "/var/cache/tailguard/models"
"""Where a role whose model is an http(s) URL downloads it (an ``emptyDir`` sized by
``maxBytes``): the pod fetches once at start, and a restarted container finds it there."""
MODEL_CA_DIR = "/etc/tailguard/model-ca"
"""Where ``caConfigMap``'s ``ca.crt`` is mounted."""
MODEL_CA_KEY = "ca.crt"
PVC_ROOT = "/mnt/pvc"
"""Where the claim a ``pvc://CLAIM/...`` model names is mounted, read-only, as ``PVC_ROOT/CLAIM``."""
TERMINATION_LOG = "/dev/termination-log"
"""The kubelet's default ``terminationMessagePath``: the runtime writes why its model did not
load there (``CAUSE: message``), and the operator reads it back from the pod's status."""
QUEUE_DEPTH_METRIC = "tailguard_queue_depth"
"""The runtime's per-pod gauge the HPAs scale on (rows waiting, the unit of ``maxQueueSize``)."""

LABEL_ROLE = "tailguard.dev/role"
LABEL_SERVICE = "tailguard.dev/inferenceservice"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "tailguard-operator"
CHECKSUM_ANNOTATION = "tailguard.dev/config-checksum"

KIND_ORDER = ("ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler",
              "PodDisruptionBudget")
"""The order children are created in: the config before the pods that mount it, the pods
before the Service and autoscalers that point at them."""


@dataclass(frozen=True)
class Owner:
    """The InferenceService object that owns the children (``metadata.name`` and ``uid``)."""

    name: str
    uid: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> "Owner":
        """Take the identity from an InferenceService object as the API server returns it.

        Raises:
            KeyError: no ``metadata.name`` or ``metadata.uid``.
        """
        return cls(name=body["metadata"]["name"], uid=body["metadata"]["uid"])


def owner_reference(owner: Owner) -> dict[str, Any]:
    """The controller owner reference every child carries (garbage-collected with its owner)."""
    return {"apiVersion": resource.API_VERSION, "kind": resource.KIND, "name": owner.name,
            "uid": owner.uid, "controller": True, "blockOwnerDeletion": True}


def common_labels(name: str) -> dict[str, str]:
    """Labels of every child of the InferenceService ``name``."""
    return {"app.kubernetes.io/name": "tailguard-runtime", "app.kubernetes.io/instance": name,
            "app.kubernetes.io/component": "predictor", LABEL_MANAGED_BY: MANAGED_BY,
            "app.kubernetes.io/part-of": "tailguard", LABEL_SERVICE: name}


def role_labels(name: str, role: str) -> dict[str, str]:
    """Labels of a role's Deployment, pods, HPA and PDB."""
    return {**common_labels(name), LABEL_ROLE: role}


def selector_labels(name: str, role: str) -> dict[str, str]:
    """The (immutable) selector of a role's pods; the Service selects the active role with it."""
    return {"app.kubernetes.io/name": "tailguard-runtime", "app.kubernetes.io/instance": name,
            LABEL_ROLE: role}


def child_name(name: str, kind: str, role: str | None = None) -> str:
    """Name of a child: ``NAME`` (Service), ``NAME-traffic`` (the ConfigMap without a role),
    else ``NAME-ROLE`` (a revision's ConfigMap is :func:`config_map_name`).

    Raises:
        ValueError: a kind with one child per role, and ``role`` is not a role.
    """
    if kind == "Service" or (kind == "ConfigMap" and role is None):
        return name if kind == "Service" else f"{name}-traffic"
    if role not in ROLES:
        raise ValueError(f"{kind} needs a role among {ROLES}, got {role!r}")
    return f"{name}-{role}"


def config_map_name(name: str, role: str, checksum: str) -> str:
    """``NAME-ROLE-HASH``: the ConfigMap of one revision of a role (``checksum``: the hex
    :func:`config_checksum`, cut to :data:`CONFIG_HASH_DIGITS`)."""
    return f"{child_name(name, 'ConfigMap', role)}-{checksum[:CONFIG_HASH_DIGITS]}"


def service_url(isvc: resource.InferenceService) -> str:
    """The in-cluster v2 inference URL clients call."""
    return f"http://{isvc.name}.{isvc.namespace}.svc/v2/models/{isvc.name}/infer"


def cluster_problems(isvc: resource.InferenceService) -> list[str]:
    """What a valid spec still lacks to run in a cluster, one ``field: problem`` line each
    (empty when nothing): a ``file://`` or ``pvc://`` model must name its ``sha256`` there,
    because the file comes from an image or volume that the operator cannot inspect."""
    problems = []
    for field, ref in (("spec.model", isvc.model), ("spec.fallback", isvc.fallback)):
        scheme = ref.uri.partition("://")[0]
        if scheme in ("file", "pvc") and not ref.sha256:
            problems.append(f"{field}.sha256: required in a cluster for a {scheme}:// model "
                            f"({ref.uri})")
    return problems


def _model_volumes(ref: resource.ModelRef) -> list[dict[str, Any]]:
    """A URL model's volumes: the ``models`` emptyDir (room for the file and 1 MiB more; the
    download is renamed into place, never copied) and ``model-ca``, the ``caConfigMap``'s
    ``ca.crt``, when it names one. A ``pvc://`` model's claim, read-only, as
    ``model-claim``. None for other models."""
    claim = claim_of(ref.uri)
    if claim is not None:
        return [{"name": "model-claim",
                 "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}]
    if not is_url(ref.uri):
        return []
    size = (ref.max_bytes or DEFAULT_MAX_BYTES) + (1 << 20)
    ca = ([{"name": "model-ca", "configMap": {
        "name": ref.ca_config_map, "items": [{"key": MODEL_CA_KEY, "path": MODEL_CA_KEY}]}}]
          if ref.ca_config_map else [])
    return [{"name": "models", "emptyDir": {"sizeLimit": str(size)}}, *ca]


def _model_mounts(ref: resource.ModelRef) -> list[dict[str, Any]]:
    claim = claim_of(ref.uri)
    if claim is not None:
        return [{"name": "model-claim", "mountPath": f"{PVC_ROOT}/{claim}", "readOnly": True}]
    if not is_url(ref.uri):
        return []
    ca = ([{"name": "model-ca", "mountPath": MODEL_CA_DIR, "readOnly": True}]
          if ref.ca_config_map else [])
    return [{"name": "models", "mountPath": MODEL_CACHE_DIR}, *ca]


def drain_grace_seconds(isvc: resource.InferenceService) -> int:
    """Seconds a terminating runtime gives admitted requests: their deadline
    (``batching.timeoutMs``, rounded up) plus 5 s of slack, and at least 10 s."""
    return max(10, math.ceil(float(isvc.batching.timeout_ms) / 1000) + 5)


def termination_grace_seconds(isvc: resource.InferenceService, settings: OperatorSettings) -> int:
    """The pod's ``terminationGracePeriodSeconds``: preStop delay + drain + 10 s, so the kubelet
    never kills a pod that is still draining."""
    return settings.pre_stop_seconds + drain_grace_seconds(isvc) + 10


def pre_stop_command(settings: OperatorSettings) -> list[str]:
    """The runtime container's preStop hook: SIGUSR1 to the runtime (PID 1 of its container:
    from then on it answers with ``Connection: close``), then ``settings.pre_stop_seconds`` of
    sleep while the endpoints and kube-proxy's rules drop the pod."""
    return ["sh", "-c", f"kill -USR1 1; exec sleep {settings.pre_stop_seconds}"]


def runtime_config(isvc: resource.InferenceService, active_role: str) -> dict[str, Any]:
    """The JSON the runtime reads: the service's runtime settings, with the drain this module
    chooses (:func:`drain_grace_seconds`), as
    :meth:`tailguard_runtime.settings.RuntimeSettings.to_config` writes them (both models,
    and ``activeModel``: ``active_role``)."""
    settings = isvc.runtime_settings(drain_grace_seconds=drain_grace_seconds(isvc))
    config: dict[str, Any] = settings.to_config(active_role)
    return config


def role_config(isvc: resource.InferenceService, role: str) -> dict[str, Any]:
    """What the pods of ``role`` serve: :func:`runtime_config` without ``activeModel`` and
    without the other role's model.

    Raises:
        ValueError: ``role`` is not a role.
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    config = runtime_config(isvc, "primary")
    del config["activeModel"]
    config["models"] = [m for m in config["models"] if m["role"] == role]
    return config


def config_checksum(isvc: resource.InferenceService, role: str) -> str:
    """SHA-256 (hex) of :func:`role_config` (keys sorted, compact). It changes, and rolls that
    role's pods, exactly when what they serve changes: a traffic switch rolls nothing, and a
    new primary model leaves the fallback's pods alone.

    Raises:
        ValueError: ``role`` is not a role.
    """
    return hashlib.sha256(json.dumps(role_config(isvc, role), sort_keys=True).encode()
                          ).hexdigest()


def config_map(isvc: resource.InferenceService, owner: Owner, role: str) -> dict[str, Any]:
    """The immutable ConfigMap ``NAME-ROLE-HASH`` (:func:`config_map_name`) holding
    ``runtime.json``: :func:`role_config`, indented, keys sorted.

    Raises:
        ValueError: ``role`` is not a role.
    """
    text = json.dumps(role_config(isvc, role), indent=2, sort_keys=True) + "\n"
    metadata = _metadata(isvc, owner, "ConfigMap", role)
    metadata["name"] = config_map_name(isvc.name, role, config_checksum(isvc, role))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "immutable": True, "data": {CONFIG_KEY: text}}


def traffic_config_map(isvc: resource.InferenceService, owner: Owner,
                       active_role: str) -> dict[str, Any]:
    """ConfigMap ``NAME-traffic`` holding ``traffic.json``: ``{"activeModel": active_role}``.
    Every runtime pod mounts it and re-reads it; pods of the other role stop keeping
    connections alive."""
    text = json.dumps({"activeModel": active_role}) + "\n"
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _metadata(isvc, owner, "ConfigMap", None),
            "data": {TRAFFIC_KEY: text}}


def is_revision_config(obj: Mapping[str, Any]) -> bool:
    """Whether a child is a revision's ConfigMap (it has a role label; ``NAME-traffic`` has
    none)."""
    return obj.get("kind") == "ConfigMap" and LABEL_ROLE in (
        (obj.get("metadata") or {}).get("labels") or {})


def config_maps_named(template_holder: Mapping[str, Any]) -> set[str]:
    """Names of the ConfigMaps a Deployment's or ReplicaSet's pod template mounts (plain or
    projected volumes); empty for another object."""
    spec = (((template_holder.get("spec") or {}).get("template") or {}).get("spec") or {})
    names: set[str] = set()
    for volume in spec.get("volumes") or []:
        sources = [volume] + list((volume.get("projected") or {}).get("sources") or [])
        names.update(str(src["configMap"]["name"]) for src in sources
                     if (src.get("configMap") or {}).get("name"))
    return names


def deployment(isvc: resource.InferenceService, owner: Owner, role: str,
               settings: OperatorSettings) -> dict[str, Any]:
    """Deployment ``NAME-ROLE`` running ``tailguard-runtime --role ROLE``.

    ``spec.replicas`` is ``scaling.minReplicas``: written at creation only (the HPA owns it
    after that, see :mod:`tailguard.operator.reconcile`). The pod template mounts the role's
    revision ConfigMap and carries its checksum, so a change of what this role serves rolls
    its pods, and nothing else does.
    """
    labels = role_labels(isvc.name, role)
    checksum = config_checksum(isvc, role)
    ref = isvc.model if role == "primary" else isvc.fallback
    probe = {"periodSeconds": 2, "timeoutSeconds": 1}
    container = {
        "name": "runtime",
        "image": settings.runtime_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["tailguard-runtime", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}",
                    "--traffic", f"{CONFIG_DIR}/{TRAFFIC_KEY}", "--role", role, "--host", "0.0.0.0", "--port", str(PORT),
                    "--termination-log", TERMINATION_LOG],
        "ports": [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"},
                  {"name": GRPC_PORT_NAME, "containerPort": isvc.grpc_port, "protocol": "TCP"}],
        "env": [*({"name": var, "value": "1"}
                  for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")),
                *([{"name": MODEL_CACHE_ENV, "value": MODEL_CACHE_DIR}]
                  if is_url(ref.uri) else []),
                *([{"name": MODEL_CA_FILE_ENV, "value": f"{MODEL_CA_DIR}/{MODEL_CA_KEY}"}]
                  if ref.ca_config_map else []),
                *([{"name": PVC_ROOT_ENV, "value": PVC_ROOT}]
                  if claim_of(ref.uri) else [])],
        "resources": {"requests": {"cpu": settings.cpu_request, "memory": settings.memory_request},
                      "limits": {"memory": settings.memory_limit}},
        # Up to 3 minutes to load (or train, for builtin://) the model before liveness counts;
        # 15 for a URL model, whose download may take one 10-minute attempt and the retries
        # of a few stalls (tailguard_runtime.sources.FetchSettings).
        "startupProbe": {"httpGet": {"path": "/v2/health/live", "port": PORT_NAME},
                         **probe, "failureThreshold": 450 if is_url(ref.uri) else 90},
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": PORT_NAME},
                           **probe, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": PORT_NAME},
                          "periodSeconds": 10, "timeoutSeconds": 2, "failureThreshold": 3},
        # Tell the runtime (PID 1) it is leaving, then keep serving while endpoints drop it.
        "lifecycle": {"preStop": {"exec": {"command": pre_stop_command(settings)}}},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}, *_model_mounts(ref)],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }
    pod_spec = {
        "containers": [container],
        "volumes": [{"name": "config", "projected": {"sources": [
                        {"configMap": {"name": config_map_name(isvc.name, role, checksum),
                            "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}]}},
                        {"configMap": {"name": child_name(isvc.name, "ConfigMap"),
                                       "items": [{"key": TRAFFIC_KEY, "path": TRAFFIC_KEY}]}}]}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                    *_model_volumes(ref)],
        "terminationGracePeriodSeconds": termination_grace_seconds(isvc, settings),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": settings.run_as_user,
                            "runAsGroup": settings.run_as_user, "fsGroup": settings.run_as_user,
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }
    if settings.runtime_node_selector:
        pod_spec["nodeSelector"] = dict(settings.runtime_node_selector)
    if settings.runtime_tolerations:
        pod_spec["tolerations"] = [dict(t) for t in settings.runtime_tolerations]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _metadata(isvc, owner, "Deployment", role),
        "spec": {
            "replicas": isvc.scaling.min_replicas,
            "selector": {"matchLabels": selector_labels(isvc.name, role)},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {CHECKSUM_ANNOTATION: checksum,
                                    "prometheus.io/scrape": "true",
                                    "prometheus.io/port": str(PORT),
                                    "prometheus.io/path": "/metrics"},
                },
                "spec": pod_spec,
            },
        },
    }


def service(isvc: resource.InferenceService, owner: Owner, active_role: str) -> dict[str, Any]:
    """Service ``NAME``: port 80 (``http``) and ``spec.grpcPort`` (``grpc``, ``appProtocol:
    grpc``) to the pods of ``active_role``."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _metadata(isvc, owner, "Service", None),
        "spec": {"type": "ClusterIP",
                 "selector": selector_labels(isvc.name, active_role),
                 "ports": [{"name": PORT_NAME, "port": SERVICE_PORT, "targetPort": PORT_NAME,
                            "protocol": "TCP"},
                           {"name": GRPC_PORT_NAME, "port": isvc.grpc_port,
                            "targetPort": GRPC_PORT_NAME, "protocol": "TCP",
                            "appProtocol": "grpc"}]},
    }


def autoscaler(isvc: resource.InferenceService, owner: Owner, role: str,
               min_replicas: int | None = None) -> dict[str, Any]:
    """autoscaling/v2 HPA ``NAME-ROLE`` on the per-pod queue depth (``Pods`` metric,
    ``AverageValue`` = ``scaling.targetQueueDepth`` rows) and CPU utilization.

    ``min_replicas`` overrides ``scaling.minReplicas`` (raised while traffic waits to move to
    this role); ``scaling.behavior`` is copied verbatim when given.
    """
    scaling = isvc.scaling
    hpa_spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                           "name": child_name(isvc.name, "Deployment", role)},
        "minReplicas": scaling.min_replicas if min_replicas is None else min_replicas,
        "maxReplicas": scaling.max_replicas,
        "metrics": [
            {"type": "Pods",
             "pods": {"metric": {"name": QUEUE_DEPTH_METRIC},
                      "target": {"type": "AverageValue",
                                 "averageValue": str(scaling.target_queue_depth)}}},
            {"type": "Resource",
             "resource": {"name": "cpu",
                          "target": {"type": "Utilization",
                                     "averageUtilization": scaling.target_cpu_utilization}}},
        ],
    }
    if scaling.behavior is not None:
        hpa_spec["behavior"] = json.loads(json.dumps(scaling.behavior))  # a deep copy
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "metadata": _metadata(isvc, owner, "HorizontalPodAutoscaler", role),
            "spec": hpa_spec}


def disruption_budget(isvc: resource.InferenceService, owner: Owner, role: str) -> dict[str, Any]:
    """PodDisruptionBudget ``NAME-ROLE``: voluntary evictions take one pod at a time, and never
    block on pods that are not Ready anyway."""
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": _metadata(isvc, owner, "PodDisruptionBudget", role),
            "spec": {"maxUnavailable": 1,
                     "selector": {"matchLabels": selector_labels(isvc.name, role)},
                     "unhealthyPodEvictionPolicy": "AlwaysAllow"}}


def children(isvc: resource.InferenceService, owner: Owner, settings: OperatorSettings, *,
             active_role: str, min_replicas: Mapping[str, int] | None = None
             ) -> list[dict[str, Any]]:
    """Every child, in :data:`KIND_ORDER` (the ConfigMaps: ``NAME-traffic``, then each role's
    revision). ``min_replicas`` maps a role to its HPA's raised ``minReplicas`` (see
    :func:`autoscaler`).

    Raises:
        ValueError: ``active_role`` is not a role.
    """
    if active_role not in ROLES:
        raise ValueError(f"active_role must be one of {ROLES}, got {active_role!r}")
    raised = min_replicas or {}
    return [
        traffic_config_map(isvc, owner, active_role),
        *(config_map(isvc, owner, role) for role in ROLES),
        *(deployment(isvc, owner, role, settings) for role in ROLES),
        service(isvc, owner, active_role),
        *(autoscaler(isvc, owner, role, raised.get(role)) for role in ROLES),
        *(disruption_budget(isvc, owner, role) for role in ROLES),
    ]


def _metadata(isvc: resource.InferenceService, owner: Owner, kind: str,
              role: str | None) -> dict[str, Any]:
    labels = common_labels(isvc.name) if role is None else role_labels(isvc.name, role)
    return {"name": child_name(isvc.name, kind, role), "namespace": isvc.namespace,
            "labels": labels, "ownerReferences": [owner_reference(owner)]}
