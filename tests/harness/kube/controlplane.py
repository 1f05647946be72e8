"""Start and stop a Kubernetes cluster in a private network namespace, as a real cluster runs.

:class:`ControlPlane` runs etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
kwok (binaries from ``hack/kube/build.py``) as child processes inside a :class:`~.holder.Holder`
namespace, each with its own client certificate, and waits until the cluster has what a real
one has before a test runs: a ready API server, the ``default`` ServiceAccount, and Ready nodes
without the not-ready taint. The API server authorizes with ``Node,RBAC``, runs the default
admission plugins plus ``NodeRestriction``, signs service account tokens, and writes an audit
log of every write (:mod:`.audit`). It advertises the node address, so the ``kubernetes``
Service leads to it, and runs the aggregation layer (a front-proxy CA of its own), so extension
API servers such as the metrics pipeline's (:mod:`.metrics`) can serve through it.

Two kinds of node: kwok's (:data:`NODES`), whose pods exist only as API objects that kwok marks
Running and Ready, and, when asked for, one real node (:class:`~.node.Node`: containerd, runc,
CNI, kubelet, kube-proxy) whose pods run the project's images; it is tainted, so only pods that
tolerate it land there. The real node starts in a thread once the control plane is usable (its
containerd, image imports and kubelet take about 25 s), so tests of the control plane alone run
meanwhile; :meth:`ControlPlane.wait_node` waits for it. The host reaches the API server
through a loopback forwarder (:attr:`ControlPlane.url`); every kubeconfig of
:attr:`ControlPlane.identities` uses it. Every process is ended by its PID in
:meth:`ControlPlane.stop`, and the namespace with them.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from harness import REPO

from . import pki
from .holder import NODE_IP, Holder
from .node import POD_CIDR, Node, NodeError, containerd_bindir
from .procs import end

SERVICE_CIDR = "10.96.0.0/16"
"""Cluster IPs the API server hands out; inside the namespace they lead to pods on the real
node (kube-proxy), from the host nowhere."""
KWOK_POD_CIDR = "10.245.0.0/16"
"""Pod addresses kwok writes into its pods' status (API values only)."""
INNER_URL = "https://127.0.0.1:6443"
"""The API server as the components inside the namespace reach it (a fresh namespace has
every port free, so the ports there are fixed)."""
SERVICE_ISSUER = "https://kubernetes.default.svc.cluster.local"
NODES = ("kwok-node-0", "kwok-node-1")
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_SIZE = {"cpu": "1k", "memory": "4Ti", "pods": "2k"}
FRONT_PROXY_CLIENT = "front-proxy-client"
"""The name the API server's aggregator presents to extension API servers."""
START_TIMEOUT_S = 90.0
"""How long the whole control plane may take to become usable (it needs about 10 s here)."""

AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        # Everything the operator's ServiceAccount does (the chart's namespace), reads included
        # and with the bodies it sends: tests wait for its passes and read its writes.
        {"level": "Request", "userGroups": ["system:serviceaccounts:tailguard-system"]},
        # Everyone else's reads are not counted; every other request is logged.
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "Metadata"},
    ],
}


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready (the message names it and its log)."""


@dataclass
class Identity:
    """A client of the API server: its user name and a kubeconfig that authenticates as it."""

    user: str
    kubeconfig: Path


@dataclass
class ControlPlane:
    """A control plane of ``version`` (e.g. ``v1.37.2``) run from ``bindir`` in ``workdir``."""

    bindir: Path
    workdir: Path
    version: str
    images: list[Path] | None = None
    """OCI archives for the real node (the first is the pause image); None: no real node."""
    pause_image: str = ""
    hpa_sync_period_s: int = 15
    """The HPA controller's ``--horizontal-pod-autoscaler-sync-period`` (its default, 15 s)."""
    url: str = ""
    identities: dict[str, Identity] = field(default_factory=dict)
    holder: Holder | None = None
    node: Node | None = None
    _inner: dict[str, Path] = field(default_factory=dict)
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    _authority: pki.Authority | None = None
    _node_start: threading.Thread | None = None
    _node_started: threading.Event = field(default_factory=threading.Event)
    _node_released: threading.Event = field(default_factory=threading.Event)
    _node_error: BaseException | None = None

    @property
    def ca(self) -> Path:
        """The cluster CA certificate (PEM)."""
        assert self._authority is not None
        return self._authority.pair.cert

    @property
    def authority(self) -> pki.Authority:
        """The cluster CA, which signs every serving and client certificate of the cluster."""
        assert self._authority is not None
        return self._authority

    @property
    def admin(self) -> Identity:
        """The cluster admin (group ``system:masters``)."""
        return self.identities["admin"]

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (JSON lines, one event per write)."""
        return self.workdir / "audit.log"

    def binary(self, name: str) -> str:
        """Path of one of the built binaries."""
        return str(self.bindir / name)

    def start(self, node: bool = True) -> None:
        """Start every component and wait until the cluster is usable; with ``node`` (and
        :attr:`images`), begin the real node's start in the background (:meth:`start_node`).

        Raises:
            ControlPlaneError: a component exited or did not become ready in time.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            self.holder = Holder(self.workdir / "namespace", SERVICE_CIDR,
                                 (SERVICE_CIDR, POD_CIDR, f"{NODE_IP}/32"))
            self.holder.start()
            self.url = f"https://127.0.0.1:{self.holder.forward(6443)}"
            self._pki()
            etcd = self._start_etcd()
            self._start_apiserver(etcd)
            self._wait(deadline, "kube-apiserver", self._apiserver_ready)
            self._start_controllers()
            self._create_nodes()
            self._wait(deadline, "the default ServiceAccount", self._default_service_account)
            self._wait(deadline, "Ready kwok nodes", self._nodes_ready)
            if node and self.images is not None:
                self.start_node()
        except BaseException:
            self.stop()
            raise

    def start_node(self) -> None:
        """Begin the real node's start in a thread of its own (:meth:`wait_node` waits for
        it); nothing when it has begun already or there are no :attr:`images`."""
        if self._node_start is not None or self.images is None:
            return
        assert self.holder is not None and self._authority is not None
        self.node = Node(self.holder, self.bindir, containerd_bindir(), self.workdir / "node",
                         self._authority, INNER_URL, self.pause_image, self.images)
        self._node_start = threading.Thread(target=self._start_node, daemon=True,
                                            name="real-node-start")
        self._node_start.start()

    def _start_node(self) -> None:
        """The node start's thread. It lives until :meth:`stop` has ended the node: Linux ends
        a child started with :func:`~.procs.end_with_parent` when the thread that started it
        ends."""
        assert self.node is not None
        try:
            self.node.start(self._nodes_ready)
        except BaseException as exc:  # wait_node raises it in the test that needs the node
            self._node_error = exc
        finally:
            self._node_started.set()
        self._node_released.wait()

    def wait_node(self) -> Node:
        """The real node, once its start has ended (begun here when :meth:`start` did not).

        Raises:
            NodeError: this control plane has no real node, or it failed to start (the cause
                attached).
        """
        self.start_node()
        if self.node is None or self._node_start is None:
            raise NodeError("this control plane was started without a real node")
        if not self._node_started.wait(self.node.start_bound_s() + 60):
            raise NodeError("the real node's start never ended")
        if self._node_error is not None:
            raise NodeError(f"the real node did not start: {self._node_error}"
                            ) from self._node_error
        return self.node

    def stop(self) -> None:
        """End every process this control plane started, newest first, by PID, each before
        the next (an API server whose etcd is gone hangs in its graceful shutdown): the real
        node first (once its start has ended), the holder and its namespace last."""
        if self._node_start is not None and self.node is not None:
            self._node_started.wait(self.node.start_bound_s() + 60)
        if self.node is not None:
            self.node.stop()
        if self._node_start is not None:
            self._node_released.set()
            self._node_start.join(10)
        for _, proc in reversed(self._procs):
            end(proc)
        self._procs.clear()
        if self.holder is not None:
            self.holder.stop()

    def kubectl(self, *args: str, identity: str = "admin", input: str | None = None,
                check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the built ``kubectl`` as ``identity``; text in and out.

        Raises:
            subprocess.CalledProcessError: ``check`` and a non-zero exit (stderr attached).
        """
        return subprocess.run(
            [self.binary("kubectl"), "--kubeconfig", str(self.identities[identity].kubeconfig),
             *args], input=input, capture_output=True, text=True, check=check, timeout=timeout)

    def token_identity(self, name: str, *, namespace: str, service_account: str,
                       duration_s: int = 7200, inner: bool = False) -> Identity:
        """A kubeconfig that authenticates with a bound token of a ServiceAccount (what a pod
        running under it presents), from the TokenRequest API; valid ``duration_s`` seconds.
        With ``inner``, for a process inside the namespace (:data:`INNER_URL`).

        Raises:
            subprocess.CalledProcessError: kubectl could not create the token.
        """
        token = self.kubectl("create", "token", service_account, "-n", namespace,
                             f"--duration={duration_s}s").stdout.strip()
        user = f"system:serviceaccount:{namespace}:{service_account}"
        identity = Identity(user, self._kubeconfig(name, {"token": token}, namespace=namespace,
                                                   server=INNER_URL if inner else None))
        self.identities[name] = identity
        return identity

    # --- internals -----------------------------------------------------------------------

    def _pki(self) -> None:
        folder = self.workdir / "pki"
        folder.mkdir(exist_ok=True)
        authority = self._authority = pki.Authority(folder)
        self._serving = authority.serving(
            "apiserver", dns=["localhost", "kubernetes", "kubernetes.default",
                              "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
            ips=["127.0.0.1", "10.96.0.1", NODE_IP])
        # What the API server presents to kubelets (kubectl logs, exec): an admin of its own.
        self._kubelet_client = authority.client("apiserver-kubelet-client",
                                                user="kube-apiserver-kubelet-client",
                                                groups=("system:masters",))
        self._sa_key = pki.signing_key(folder)
        # The aggregation layer (metrics.k8s.io, custom.metrics.k8s.io): the API server proxies
        # to an extension API server with a client certificate of a CA of its own, which the
        # extension trusts for the X-Remote-* headers naming the user.
        (folder / "front-proxy").mkdir(exist_ok=True)
        self._front_proxy = pki.Authority(folder / "front-proxy", "tailguard-front-proxy-ca")
        self._proxy_client = self._front_proxy.client("front-proxy-client",
                                                      user=FRONT_PROXY_CLIENT)
        for name, user, groups in (
                ("admin", "tailguard-test-admin", ("system:masters",)),
                ("kube-controller-manager", "system:kube-controller-manager", ()),
                ("kube-scheduler", "system:kube-scheduler", ()),
                # kwok plays the kubelets of many nodes; the Node authorizer only lets a kubelet
                # touch its own node, so kwok runs as an admin of its own name.
                ("kwok", "kwok-controller", ("system:masters",))):
            pair = authority.client(name, user=user, groups=groups)
            credentials = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
            self.identities[name] = Identity(user, self._kubeconfig(name, credentials))
            self._inner[name] = self._kubeconfig(f"{name}.inner", credentials, server=INNER_URL)

    def _kubeconfig(self, name: str, user: dict[str, str], namespace: str = "default",
                    server: str | None = None) -> Path:
        """A kubeconfig for the host's side (the forwarder) or, with ``server``, for
        components inside the namespace."""
        path = self.workdir / f"{name}.kubeconfig"
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "test", "cluster": {
                "server": server or self.url,
                "certificate-authority": str(self.workdir / "pki" / "ca.crt")}}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name,
                                                     "namespace": namespace}}],
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _spawn(self, name: str, args: Iterable[str]) -> subprocess.Popen[bytes]:
        assert self.holder is not None
        proc = self.holder.spawn([self.binary(name.split("#")[0]), *args],
                                 log=self.workdir / "logs" / f"{name}.log", cwd=self.workdir)
        self._procs.append((name, proc))
        return proc

    def _start_etcd(self) -> str:
        client, peer = 2379, 2380
        url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            "--name=test", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296"])
        return url

    def _start_apiserver(self, etcd: str) -> None:
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        self._spawn("kube-apiserver", [
            f"--etcd-servers={etcd}",
            "--bind-address=0.0.0.0", f"--secure-port={INNER_URL.rsplit(':', 1)[1]}",
            # The node address: the kubernetes Service's endpoint, which pods reach.
            f"--advertise-address={NODE_IP}",
            f"--kubelet-client-certificate={self._kubelet_client.cert}",
            f"--kubelet-client-key={self._kubelet_client.key}",
            f"--kubelet-certificate-authority={self.ca}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--tls-cert-file={self._serving.cert}",
            f"--tls-private-key-file={self._serving.key}",
            f"--client-ca-file={self.ca}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--service-account-issuer={SERVICE_ISSUER}",
            f"--service-account-key-file={self._sa_key.cert}",
            f"--service-account-signing-key-file={self._sa_key.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
            "--allow-privileged=true", f"--cert-dir={self.workdir / 'pki'}",
            f"--requestheader-client-ca-file={self._front_proxy.pair.cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self._proxy_client.cert}",
            f"--proxy-client-key-file={self._proxy_client.key}",
            # To an APIService's endpoints, not its ClusterIP: the extension servers run
            # before (and without) the real node's kube-proxy.
            "--enable-aggregator-routing=true",
            "--profiling=false", "-v=1"])

    def _start_controllers(self) -> None:
        kcm = self._inner["kube-controller-manager"]
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kcm}",
            "--bind-address=127.0.0.1", "--secure-port=0",  # no HTTPS: no port to race for
            f"--root-ca-file={self.ca}",
            f"--service-account-private-key-file={self._sa_key.key}",
            "--use-service-account-credentials=true", "--leader-elect=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period_s}s",
            "--controllers=*", "--profiling=false", "-v=1"])
        scheduler = self._inner["kube-scheduler"]
        self._spawn("kube-scheduler", [
            f"--kubeconfig={scheduler}",
            "--bind-address=127.0.0.1", "--secure-port=0",  # no HTTPS: no port to race for
            "--leader-elect=false", "--profiling=false", "-v=1"])
        self._spawn("kwok", [
            f"--kubeconfig={self._inner['kwok']}",
            f"--config={self.bindir / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--node-lease-duration-seconds=40", f"--cidr={KWOK_POD_CIDR}",
            "--node-ip=10.240.0.1", "--server-address=127.0.0.1:10247"])

    def _create_nodes(self) -> None:
        for name in NODES:
            node = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name,
                             "annotations": {KWOK_NODE_ANNOTATION: "fake",
                                             "node.alpha.kubernetes.io/ttl": "0"},
                             "labels": {"kubernetes.io/hostname": name, "type": "kwok",
                                        "kubernetes.io/os": "linux",
                                        "kubernetes.io/arch": "amd64"}},
                # Room for hundreds of runtime pods (kwok's own default size): nothing here
                # runs them, and tests make pods wait by cordoning, not by filling nodes.
                "status": {"allocatable": NODE_SIZE, "capacity": NODE_SIZE},
            }
            self.kubectl("create", "-f", "-", input=json.dumps(node))

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        while True:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {proc.returncode} while waiting for {what}; "
                        f"see {self.workdir / 'logs' / (name + '.log')}:\n{self._tail(name)}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {what}; logs in "
                                        f"{self.workdir / 'logs'}")
            time.sleep(0.2)

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.workdir / "logs" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def _apiserver_ready(self) -> bool:
        pki_dir = self.workdir / "pki"
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, ValueError):
            return False

    def _get_json(self, *args: str) -> Any:
        done = self.kubectl("get", *args, "-o", "json", check=False)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def _default_service_account(self) -> bool:
        return self._get_json("serviceaccount", "default", "-n", "default") is not None

    def _nodes_ready(self) -> bool:
        nodes = (self._get_json("nodes") or {}).get("items", [])
        if len(nodes) < len(NODES) + (self.node is not None):
            return False
        for node in nodes:
            conditions = {c["type"]: c["status"] for c in node["status"].get("conditions", [])}
            taints = [t["key"] for t in node["spec"].get("taints", [])]
            if conditions.get("Ready") != "True" or "node.kubernetes.io/not-ready" in taints:
                return False
        return True



def bindir(tag: str) -> Path:
    """The folder of built binaries for ``tag``: ``$TAILGUARD_KUBE_BIN`` when set (``make test``
    sets it after building), else whatever ``hack/kube/build.py`` builds or finds cached.

    Raises:
        ControlPlaneError: the build failed or Go is missing (the message says which).
    """
    explicit = os.environ.get("TAILGUARD_KUBE_BIN")
    if explicit:
        return Path(explicit)
    script = REPO / "hack" / "kube" / "build.py"
    done = subprocess.run([shutil.which("python3") or "python3", str(script), "--tag", tag],
                          stdout=subprocess.PIPE, text=True)  # progress goes to our stderr
    if done.returncode != 0:
        raise ControlPlaneError(f"{script} failed (exit {done.returncode}); see its last line "
                                "above")
    return Path(done.stdout.strip().splitlines()[-1])
