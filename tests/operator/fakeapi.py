"""A stateful fake Kubernetes API server, served over real HTTP on 127.0.0.1.

kopf (aiohttp) and the ``kubernetes`` client (urllib3) talk to it exactly as to a cluster, so the
operator tests exercise the real request paths. kmock 0.8 was the first candidate, but its
emulator re-sends every object as ADDED on each watch and ignores ``resourceVersion``, keeps no
status subresource apart, and has no PUT, selectors or generations; filling that in meant
subclassing name-mangled internals, so this small aiohttp server replaces it.

Like the real API server, it: serves discovery (``/api``, ``/apis``, ``/version``); stores objects
with ``uid``, ``resourceVersion``, ``generation`` (bumped when anything outside ``metadata`` and
``status`` changes) and ``creationTimestamp``; treats ``status`` as a subresource where the kind
has one (writes to the main resource leave it alone, ``/status`` writes change nothing else);
applies merge patches (RFC 7386), JSON patches (add/remove/replace/test) and PUT with
``resourceVersion`` preconditions; makes no-op writes no-ops (no new version, no event); fills a
few server defaults (Deployment replicas, Service clusterIP, container fields) so that callers
must compare politely; lists with ``kind`` and label/field selectors; and streams watches from
any ``resourceVersion`` with ``timeoutSeconds``.

Unlike it: no garbage collection (owner references are not followed), no admission or schema
validation, strategic merge patches are applied as plain merges, no pagination. Every request is
recorded in :attr:`FakeApiServer.requests` for the tests to count writes.
"""

from __future__ import annotations

import asyncio
import builtins
import copy
import datetime
import json
import re
import socket
import threading
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from aiohttp import web


@dataclass(frozen=True)
class Resource:
    """One served resource kind."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False
    """Has a ``status`` subresource."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCES = (
    Resource("", "v1", "namespaces", "Namespace", namespaced=False, status=True),
    Resource("", "v1", "configmaps", "ConfigMap"),
    Resource("", "v1", "services", "Service", status=True),
    Resource("", "v1", "events", "Event"),
    Resource("apps", "v1", "deployments", "Deployment", status=True),
    Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler",
             status=True),
    Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", status=True),
    Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions",
             "CustomResourceDefinition", namespaced=False, status=True),
)


@dataclass
class Record:
    """One request as received: ``path`` without the query, ``body`` parsed JSON or None."""

    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any
    status: int = 0


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


class FakeApiServer:
    """The fake server. Use as a context manager; :attr:`url` is ``http://127.0.0.1:PORT``."""

    def __init__(self, resources: tuple[Resource, ...] = RESOURCES) -> None:
        self.resources = {(r.group, r.plural): r for r in resources}
        self.requests: list[Record] = []
        self._objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._history: list[tuple[Resource, str, dict[str, Any]]] = []
        self._rv = 100
        self._lock = threading.RLock()
        self._loop = asyncio.new_event_loop()
        self._wakeup: asyncio.Event | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-k8s-api",
                                        daemon=True)
        self._runner: web.AppRunner | None = None
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self.create(None, {"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": "default"}})

    # --- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> "FakeApiServer":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._wakeup = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock).start()

    async def _stop(self) -> None:
        self._closing = True
        self._wake()
        assert self._runner is not None
        await self._runner.cleanup()

    def _wake(self) -> None:
        if self._wakeup is not None:
            old, self._wakeup = self._wakeup, asyncio.Event()
            old.set()

    def _notify(self) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._loop.call_soon_threadsafe(self._wake)
        else:
            self._wake()

    # --- the store (thread-safe; also the tests' direct access) -------------------------------
    def resource(self, plural: str) -> Resource:
        """The served resource with this plural (``deployments``, ``inferenceservices``...)."""
        for res in self.resources.values():
            if res.plural == plural:
                return res
        raise KeyError(plural)

    def add_resource(self, res: Resource) -> None:
        """Serve another kind (a CRD's)."""
        with self._lock:
            self.resources[(res.group, res.plural)] = res

    def get(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        """A deep copy of the stored object, or None."""
        with self._lock:
            obj = self._objects.get(self._key(self.resource(plural), namespace, name))
            return copy.deepcopy(obj)

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Deep copies of the stored objects of a kind (in ``namespace``, or everywhere)."""
        res = self.resource(plural)
        with self._lock:
            return [copy.deepcopy(o) for (g, p, ns, _), o in sorted(self._objects.items())
                    if (g, p) == (res.group, res.plural) and namespace in (None, ns)]

    def history(self, plural: str) -> builtins.list[tuple[str, dict[str, Any]]]:
        """Every stored version of a kind's objects so far, as (event type, object) pairs."""
        res = self.resource(plural)
        with self._lock:
            return [(kind, copy.deepcopy(obj)) for r, kind, obj in self._history if r == res]

    def create(self, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """Store a new object (as a POST would); returns the stored copy."""
        res = self._resource_of(body)
        return self._create(res, namespace or body["metadata"].get("namespace"), body)

    def patch(self, plural: str, namespace: str | None, name: str, patch: dict[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        """Merge-patch a stored object (as a PATCH would, ``subresource="status"`` too)."""
        return self._write(self.resource(plural), namespace, name,
                           lambda old: apply_merge_patch(old, patch), subresource)

    def delete(self, plural: str, namespace: str | None, name: str) -> None:
        """Delete a stored object (as a DELETE would)."""
        self._delete(self.resource(plural), namespace, name)

    def _key(self, res: Resource, namespace: str | None,
             name: str) -> tuple[str, str, str, str]:
        return res.group, res.plural, (namespace or "") if res.namespaced else "", name

    def _resource_of(self, body: dict[str, Any]) -> Resource:
        group, _, version = body["apiVersion"].rpartition("/")
        for res in self.resources.values():
            if (res.group, res.version, res.kind) == (group, version, body["kind"]):
                return res
        raise ApiError(404, "NotFound", f"no resource for {body['apiVersion']} {body['kind']}")

    def _create(self, res: Resource, namespace: str | None, body: dict[str, Any]
                ) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        with self._lock:
            if res.namespaced:
                if meta.get("namespace", namespace) != namespace:
                    raise ApiError(400, "BadRequest", "the namespace of the object does not "
                                   "match the namespace of the request")
                if self._key(self.resource("namespaces"), None, namespace or "") \
                        not in self._objects:
                    raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
                meta["namespace"] = namespace
            key = self._key(res, namespace, meta["name"])
            if key in self._objects:
                raise ApiError(409, "AlreadyExists",
                               f'{res.plural} "{meta["name"]}" already exists')
            if res.status:
                obj.pop("status", None)
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            meta.update(uid=str(uuid.uuid4()), generation=1,
                        creationTimestamp=_now())
            _server_defaults(res.kind, obj)
            return self._commit(res, key, obj, "ADDED")

    def _write(self, res: Resource, namespace: str | None, name: str,
               change: Callable[[dict[str, Any]], dict[str, Any]],
               subresource: str | None) -> dict[str, Any]:
        with self._lock:
            key = self._key(res, namespace, name)
            old = self._objects.get(key)
            if old is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            new = change(copy.deepcopy(old))
            version = (new.get("metadata") or {}).get("resourceVersion")
            if version is not None and version != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified; please apply "
                               "your changes to the latest version and try again")
            if subresource == "status":
                new = {**old, "status": new.get("status")}
                if new["status"] is None:
                    del new["status"]
            elif subresource is not None:
                raise ApiError(404, "NotFound", f"no subresource {subresource}")
            elif res.status:
                new = {k: v for k, v in new.items() if k != "status"}
                if "status" in old:
                    new["status"] = old["status"]
            meta = new.setdefault("metadata", {})
            for fixed in ("uid", "creationTimestamp", "generation", "name", "namespace",
                          "resourceVersion", "deletionTimestamp"):
                if fixed in old["metadata"]:
                    meta[fixed] = old["metadata"][fixed]
                else:
                    meta.pop(fixed, None)
            new["apiVersion"], new["kind"] = res.api_version, res.kind
            if new == old:
                return copy.deepcopy(old)
            if _content(new) != _content(old):
                meta["generation"] = old["metadata"].get("generation", 0) + 1
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                return self._commit(res, key, new, "DELETED")
            return self._commit(res, key, new, "MODIFIED")

    def _delete(self, res: Resource, namespace: str | None, name: str) -> dict[str, Any]:
        with self._lock:
            key = self._key(res, namespace, name)
            old = self._objects.get(key)
            if old is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            if old["metadata"].get("finalizers"):
                new = copy.deepcopy(old)
                new["metadata"].setdefault("deletionTimestamp", _now())
                return self._commit(res, key, new, "MODIFIED")
            return self._commit(res, key, copy.deepcopy(old), "DELETED")

    def _commit(self, res: Resource, key: tuple[str, str, str, str], obj: dict[str, Any],
                kind: str) -> dict[str, Any]:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if kind == "DELETED":
            self._objects.pop(key, None)
        else:
            self._objects[key] = obj
        self._history.append((res, kind, copy.deepcopy(obj)))
        self._notify()
        return copy.deepcopy(obj)

    # --- HTTP ----------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body: Any = None
        if request.can_read_body:
            raw = await request.read()
            body = json.loads(raw) if raw else None
        record = Record(request.method, request.path, dict(request.query),
                        request.headers.get("Content-Type", ""), body)
        with self._lock:
            self.requests.append(record)
        try:
            if request.query.get("watch") in ("true", "1"):
                record.status = 200
                return await self._watch(request)
            payload, status = self._dispatch(request, body)
        except ApiError as exc:
            payload, status = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Failure", "reason": exc.reason,
                               "message": exc.message, "code": exc.code}, exc.code
        record.status = status
        return web.json_response(payload, status=status)

    def _dispatch(self, request: web.Request, body: Any) -> tuple[Any, int]:
        path, method = request.path.rstrip("/") or "/", request.method
        if method == "GET" and path in ("/version", "/api", "/apis"):
            return self._discovery(path), 200
        match = re.fullmatch(r"/apis/([^/]+)(?:/([^/]+))?", path)
        if method == "GET" and path == "/api/v1":
            return self._resource_list("", "v1"), 200
        if method == "GET" and match:
            return self._group(match[1], match[2]), 200
        res, namespace, name, sub = self._parse(path)
        if name is None:
            if method == "GET":
                return self._list(res, namespace, request.query), 200
            if method == "POST":
                return self._create(res, namespace, body), 201
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
        if method == "GET":
            obj = self.get(res.plural, namespace, name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{res.plural} "{name}" not found')
            return obj, 200
        if method == "DELETE":
            return self._delete(res, namespace, name), 200
        if method == "PUT":
            return self._write(res, namespace, name, lambda old: body, sub), 200
        if method == "PATCH":
            kind = request.headers.get("Content-Type", "").split(";")[0]
            if kind == "application/json-patch+json":
                change: Callable[[dict[str, Any]], dict[str, Any]] = \
                    lambda old: _json_patch(old, body)  # noqa: E731
            elif kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                change = lambda old: apply_merge_patch(old, body)  # noqa: E731
            else:
                raise ApiError(415, "UnsupportedMediaType", f"patch type {kind!r}")
            return self._write(res, namespace, name, change, sub), 200
        raise ApiError(405, "MethodNotAllowed", method)

    def _parse(self, path: str) -> tuple[Resource, str | None, str | None, str | None]:
        match = re.fullmatch(r"/api/v1/(.+)|/apis/([^/]+)/([^/]+)/(.+)", path)
        if not match:
            raise ApiError(404, "NotFound", f"no route {path}")
        group, version, rest = ("", "v1", match[1]) if match[1] else match.group(2, 3, 4)
        parts = rest.split("/")
        namespace = None
        if parts[0] == "namespaces" and len(parts) >= 3:
            namespace, parts = parts[1], parts[2:]
        res = self.resources.get((group, parts[0]))
        scoped = (namespace is not None or len(parts) == 1) if res and res.namespaced \
            else namespace is None
        if res is None or res.version != version or len(parts) > 3 or not scoped:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource "
                           f"({path})")
        return res, namespace, (parts[1] if len(parts) > 1 else None), \
            (parts[2] if len(parts) > 2 else None)

    def _list(self, res: Resource, namespace: str | None, query: Any) -> dict[str, Any]:
        selector = _Selector(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        with self._lock:
            items = [o for o in self.list(res.plural, namespace) if selector.matches(o)]
            return {"apiVersion": res.api_version, "kind": f"{res.kind}List",
                    "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    async def _watch(self, request: web.Request) -> web.StreamResponse:
        res, namespace, name, _ = self._parse(request.path)
        query = request.query
        selector = _Selector(query.get("labelSelector", ""), query.get("fieldSelector", ""))
        since = query.get("resourceVersion")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(query.get("timeoutSeconds") or 3600)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with self._lock:
            cursor = len(self._history)
            if since in (None, "", "0"):
                first = [{"type": "ADDED", "object": o} for o in self.list(res.plural, namespace)]
            else:
                cursor = next((i for i, (_, _, o) in enumerate(self._history)
                               if int(o["metadata"]["resourceVersion"]) > int(since)), cursor)
                first = []
        if query.get("sendInitialEvents") == "true":
            first.append({"type": "BOOKMARK", "object": {
                "kind": res.kind, "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self._rv),
                             "annotations": {"k8s.io/initial-events-end": "true"}}}})
        try:
            for event in first:
                await response.write(json.dumps(event).encode() + b"\n")
            while not self._closing and loop.time() < deadline:
                with self._lock:
                    new, cursor = self._history[cursor:], len(self._history)
                for r, kind, obj in new:
                    meta = obj["metadata"]
                    if r == res and namespace in (None, meta.get("namespace")) \
                            and name in (None, meta["name"]) and selector.matches(obj):
                        await response.write(json.dumps({"type": kind, "object": obj}).encode()
                                             + b"\n")
                wakeup = self._wakeup
                assert wakeup is not None
                try:
                    await asyncio.wait_for(wakeup.wait(), min(1.0, deadline - loop.time()))
                except (TimeoutError, ValueError):
                    pass
        except (ConnectionResetError, asyncio.CancelledError):
            return response
        return response

    # --- discovery -----------------------------------------------------------------------------
    def _discovery(self, path: str) -> dict[str, Any]:
        if path == "/version":
            return {"major": "1", "minor": "34", "gitVersion": "v1.34.0-fake",
                    "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        groups: dict[str, list[str]] = {}
        for res in self.resources.values():
            if res.group and res.version not in groups.setdefault(res.group, []):
                groups[res.group].append(res.version)
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [self._group(g) for g in sorted(groups)]}

    def _group(self, group: str, version: str | None = None) -> dict[str, Any]:
        versions = sorted({r.version for r in self.resources.values() if r.group == group})
        if not versions or (version is not None and version not in versions):
            raise ApiError(404, "NotFound", f"no group {group}/{version}")
        if version is not None:
            return self._resource_list(group, version)
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
                "preferredVersion": entries[0]}

    def _resource_list(self, group: str, version: str) -> dict[str, Any]:
        entries: list[dict[str, Any]] = []
        for res in self.resources.values():
            if (res.group, res.version) != (group, version):
                continue
            entries.append({"name": res.plural, "singularName": res.kind.lower(),
                            "namespaced": res.namespaced, "kind": res.kind,
                            "verbs": ["create", "delete", "get", "list", "patch", "update",
                                      "watch"]})
            if res.status:
                entries.append({"name": f"{res.plural}/status", "singularName": "",
                                "namespaced": res.namespaced, "kind": res.kind,
                                "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": entries}


class _Selector:
    """Label selectors (``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``,
    ``a notin (x,y)``) and ``metadata.name``/``metadata.namespace`` field selectors."""

    def __init__(self, labels: str, fields: str) -> None:
        self.labels = [t.strip() for t in re.split(r",(?![^()]*\))", labels) if t.strip()]
        self.fields = [t.strip() for t in fields.split(",") if t.strip()]

    def matches(self, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        for term in self.labels:
            if m := re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term):
                values = {v.strip() for v in m[3].split(",")}
                if (labels.get(m[1]) in values) != (m[2] == "in"):
                    return False
            elif m := re.fullmatch(r"([^!=]+)(==|=|!=)(.*)", term):
                if (labels.get(m[1].strip()) == m[3].strip()) != (m[2] != "!="):
                    return False
            elif term.startswith("!"):
                if term[1:] in labels:
                    return False
            elif term not in labels:
                return False
        for term in self.fields:
            key, _, value = term.partition("=")
            if meta.get(key.removeprefix("metadata.").lstrip("=")) != value.lstrip("="):
                return False
        return True


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _content(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def _json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 add/remove/replace/test (enough for kopf)."""
    doc = copy.deepcopy(target)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].lstrip("/").split("/")]
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if op["op"] == "test":
            current = node[int(last)] if isinstance(node, list) else node.get(last)
            if current != op["value"]:
                raise ApiError(422, "Invalid", f"test failed at {op['path']}")
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        elif isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if op["op"] == "add":
                node.insert(index, op["value"])
            else:
                node[index] = op["value"]
        else:
            node[last] = op["value"]
    return doc


def _server_defaults(kind: str, obj: dict[str, Any]) -> None:
    """A few fields the real API server fills in, so callers cannot compare naively."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind == "Deployment":
        spec.setdefault("replicas", 1)
        spec.setdefault("progressDeadlineSeconds", 600)
        pod = spec.get("template", {}).get("spec", {})
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("dnsPolicy", "ClusterFirst")
        for container in pod.get("containers", []):
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if probe in container:
                    container[probe].setdefault("successThreshold", 1)
                    container[probe]["httpGet"].setdefault("scheme", "HTTP")
    elif kind == "Service":
        spec.setdefault("clusterIP", "10.96.0.10")
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
