"""A real Kubernetes node inside the test cluster's namespace: containerd with runc and the CNI
``bridge`` plugin, the upstream kubelet, and the upstream kube-proxy.

:class:`Node` runs each as a child process inside a :class:`~.holder.Holder`, as a cluster
built by hand runs them:

- **containerd** (2.x, built from a pinned module by ``hack/containerd/build.py``, with its
  runc shim and ``ctr``; CRI plugin) keeps its root, state and socket under the node's folder
  and reads no host configuration; pods run with Debian's ``runc``;
  ``restrict_oom_score_adj`` is on because this VM lacks ``CAP_SYS_RESOURCE`` (without it
  every sandbox fails); the sandbox image is the project's own ``pause`` (there is no
  registry: images are OCI archives imported with ``ctr``).
- **CNI**: pods get :data:`POD_CIDR` on a bridge, the node's side being the gateway, with
  hairpin on so a pod reaches itself through its Service.
- **kubelet** authenticates as ``system:node:NAME`` (group ``system:nodes``, so the Node
  authorizer and ``NodeRestriction`` apply), uses cgroupfs under a cgroup root of its own
  (made here and removed at :meth:`Node.stop`), and registers with the label
  ``type=real`` and the taint :data:`TAINT`, so only pods that ask for the real node land on
  it: the kwok nodes keep every other test's pods.
- **kube-proxy** (iptables mode, as ``system:kube-proxy``) writes the Service rules inside the
  namespace, so ClusterIPs answer there; it is told to leave the host's conntrack limits alone.

Stopping ends, by PID: kube-proxy and the kubelet, then every process in the node's cgroups
(the containers), then the runc shims of this containerd, then containerd; then it removes the
cgroups. The namespace goes with the holder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from harness.hack import built

from . import pki
from .holder import NODE_IP, Holder
from .procs import end

NAME = "tailguard-node-0"
POD_CIDR = "10.244.0.0/24"
TAINT = {"key": "tailguard.dev/node", "value": "real", "effect": "NoSchedule"}
"""Keeps pods off the real node unless they tolerate it (the chart's values do, when a test
installs it for the real node)."""
LABELS = {"type": "real"}
CNI_BIN = Path("/usr/lib/cni")
"""Where Debian's ``containernetworking-plugins`` puts ``bridge``, ``host-local`` and
``loopback``."""
KUBELET_PORT = 10250
START_TIMEOUT_S = 120.0
"""How long containerd has to answer after its start, and the node to be Ready after the
kubelet's (s)."""
IMPORT_TIMEOUT_S = 300.0
"""How long one ``ctr images import`` may take (s)."""
CPU_SHARES = 4096
"""The CPU weight of the node's cgroup root, which holds its pods (cgroup v1 ``cpu.shares``;
the default, and a busy process's, is 1024). The node stands in for a machine of its own, but
its pods share this host's two cores with everything else: at the default weight, four busy
processes beside them (a test of the suite on the other worker) left the pods a fifth of the
CPU, a runtime's event loop lagged 2.5 s at a time, and admitted requests waited out their
deadlines in the HPA's scale-out test. At this weight, beside the same four, its event-loop
lag p99 was 30 ms and nothing failed. (At 16384, in one run, a test on the other worker was
starved in turn: its clients sent too slowly.) What the pods leave idle goes to the rest."""


class NodeError(RuntimeError):
    """A node component failed to start or to become ready (the message names it and its log)."""


def containerd_bindir() -> Path:
    """The folder of ``containerd``, its runc shim and ``ctr``: ``$TAILGUARD_CONTAINERD_BIN``
    when set, else what ``hack/containerd/build.py`` builds or finds cached
    (:func:`~harness.hack.built`).

    Raises:
        NodeError: the build failed or Go is missing.
    """
    return built("TAILGUARD_CONTAINERD_BIN", "containerd", NodeError)


@dataclass
class Node:
    """One real node run from ``bindir`` (``kubelet``, ``kube-proxy``) and
    ``containerd_bindir`` (``containerd``, ``containerd-shim-runc-v2``, ``ctr``) in
    ``workdir``, inside ``holder``, joining the API server at ``server`` (a URL valid inside
    the namespace)."""

    holder: Holder
    bindir: Path
    containerd_bindir: Path
    workdir: Path
    authority: pki.Authority
    server: str
    pause_image: str
    images: list[Path]
    _procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    cgroup_root: str = field(default_factory=lambda: f"/tailguard-node-{uuid.uuid4().hex[:8]}")

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def start_bound_s(self) -> float:
        """The longest :meth:`start` can take before it raises (s): its steps' own limits."""
        return 2 * START_TIMEOUT_S + IMPORT_TIMEOUT_S * len(self.images)

    def start(self, ready: Callable[[], bool]) -> None:
        """Start containerd (and import the images), the kubelet and kube-proxy; return when
        ``ready()`` (the caller's check that the Node is Ready) holds.

        Raises:
            NodeError: a component exited, an import failed, containerd did not answer within
                :data:`START_TIMEOUT_S` of its start, an image import took
                :data:`IMPORT_TIMEOUT_S`, or the node was not Ready :data:`START_TIMEOUT_S`
                after the kubelet started. Each step has its own time: beside another suite
                the imports alone took two minutes, and a deadline for the whole start ran
                out as the kubelet started.
        """
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self._cgroups_make()
        self._start_containerd(time.monotonic() + START_TIMEOUT_S)
        for archive in self.images:
            try:
                done = self.ctr("images", "import", str(archive), check=False,
                                timeout=IMPORT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise NodeError(f"ctr images import {archive} took over {IMPORT_TIMEOUT_S:g} s"
                                ) from None
            if done.returncode != 0:
                raise NodeError(f"ctr images import {archive} failed: {done.stderr.strip()}")
        self._start_kubelet()
        self._wait(time.monotonic() + START_TIMEOUT_S, "the node to be Ready", ready)
        self._start_kube_proxy()

    def ctr(self, *args: str, check: bool = True, timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
        """``ctr`` against this node's containerd, in the ``k8s.io`` namespace the CRI uses.

        Raises:
            subprocess.CalledProcessError: ``check`` and a non-zero exit.
        """
        return self.holder.run([str(self.containerd_bindir / "ctr"), "--address",
                                str(self.socket), "-n", "k8s.io", *args],
                               check=check, timeout=timeout)

    def stop(self) -> None:
        """End every process of the node and its containers by PID, then remove its cgroups."""
        by_name = dict(self._procs)
        for name in ("kube-proxy", "kubelet"):
            if name in by_name:
                end(by_name[name])
        for _ in range(3):  # containers, then whatever they started while being killed
            for pid in self._cgroup_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        for pid in self._shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if "containerd" in by_name:
            end(by_name["containerd"])
        self._procs.clear()
        self._cgroups_remove()

    # --- containerd ------------------------------------------------------------------------

    def _start_containerd(self, deadline: float) -> None:
        cni_conf = self.workdir / "cni"
        cni_conf.mkdir(exist_ok=True)
        (cni_conf / "10-tailguard.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "tailguard",
            "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True,
                         "ipMasq": False, "hairpinMode": True,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                                  "routes": [{"dst": "0.0.0.0/0"}],
                                  "dataDir": str(self.workdir / "ipam")}}],
        }))
        images, runtime = "plugins.'io.containerd.cri.v1.images'", \
            "plugins.'io.containerd.cri.v1.runtime'"
        config = self.workdir / "containerd.toml"
        config.write_text("\n".join([
            "version = 4",  # containerd 2.4's own (``containerd config default``)
            f"root = '{self.workdir / 'containerd-root'}'",
            f"state = '{self.workdir / 'containerd-state'}'",
            "imports = []",  # its default reads /etc/containerd/conf.d/*.toml of the host
            # Plugins that would reach for host folders or devices nothing here uses.
            "disabled_plugins = ['io.containerd.internal.v1.opt', "
            "'io.containerd.snapshotter.v1.aufs', 'io.containerd.snapshotter.v1.btrfs', "
            "'io.containerd.snapshotter.v1.zfs', 'io.containerd.snapshotter.v1.devmapper']",
            # version 4 configures its servers as plugins
            "[plugins.'io.containerd.server.v1.grpc']", f"  address = '{self.socket}'",
            "[plugins.'io.containerd.server.v1.ttrpc']", f"  address = '{self.socket}.ttrpc'",
            "[plugins.'io.containerd.server.v1.debug']", f"  address = '{self.socket}.debug'",
            "[plugins.'io.containerd.server.v1.metrics']", "  address = ''",
            f"[{images}]", "  snapshotter = 'overlayfs'",
            f"[{images}.pinned_images]", f"  sandbox = '{self.pause_image}'",
            f"[{runtime}]", "  restrict_oom_score_adj = true", "  disable_apparmor = true",
            f"[{runtime}.containerd]", "  default_runtime_name = 'runc'",
            f"[{runtime}.containerd.runtimes.runc]", "  runtime_type = 'io.containerd.runc.v2'",
            f"[{runtime}.containerd.runtimes.runc.options]", "  SystemdCgroup = false",
            f"[{runtime}.cni]", f"  bin_dirs = ['{CNI_BIN}']", f"  conf_dir = '{cni_conf}'",
            "",
        ]))
        # containerd finds its shim on its PATH
        path = f"{self.containerd_bindir}{os.pathsep}{os.environ.get('PATH', '')}"
        self._spawn("containerd", [str(self.containerd_bindir / "containerd"), "--config",
                                   str(config)], env={**os.environ, "PATH": path})
        self._wait(deadline, "containerd", lambda: self.ctr("version", check=False,
                                                            timeout=10).returncode == 0)

    def _shim_pids(self) -> list[int]:
        """The runc shims serving this node's containerd (their command line names its
        socket); they outlive containerd unless ended."""
        found = []
        address = str(self.socket).encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                    if argv[0].endswith(b"containerd-shim-runc-v2") and address in argv:
                        found.append(int(entry.name))
        return found

    # --- kubelet and kube-proxy ----------------------------------------------------------

    def _start_kubelet(self) -> None:
        folder = self.workdir / "kubelet"
        folder.mkdir(exist_ok=True)
        client = self.authority.client(f"kubelet-{NAME}", user=f"system:node:{NAME}",
                                       groups=("system:nodes",))
        serving = self.authority.serving(f"kubelet-serving-{NAME}", dns=[NAME],
                                         ips=[NODE_IP])
        kubeconfig = self._kubeconfig("kubelet", client)
        (self.workdir / "resolv.conf").write_text("options ndots:1\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.authority.pair.cert)}},
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(serving.cert), "tlsPrivateKeyFile": str(serving.key),
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup_root,
            # This VM has the hybrid cgroup v1 layout, and swap may be on.
            "failCgroupV1": False, "failSwapOn": False,
            # Only read the kernel settings (the holder shows the expected ones): never write.
            "protectKernelDefaults": True,
            "syncFrequency": "5s", "clusterDomain": "cluster.local",
            "resolvConf": str(self.workdir / "resolv.conf"),
            "podLogsDir": str(self.workdir / "pod-logs"),
            "volumePluginDir": str(self.workdir / "volume-plugins"),
            # A shared disk's free space is not this node's to defend: evict only when nearly
            # full, and never collect the imported images (nothing could pull them back).
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "registerNode": True,
            "registerWithTaints": [TAINT], "maxPods": 60,
        }
        path = self.workdir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        labels = ",".join(f"{k}={v}" for k, v in LABELS.items())
        self._spawn("kubelet", [
            str(self.bindir / "kubelet"), f"--config={path}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={NAME}", f"--node-ip={NODE_IP}",
            f"--root-dir={folder}", f"--cert-dir={self.workdir / 'kubelet-pki'}",
            f"--node-labels={labels}", "-v=1"])

    def _start_kube_proxy(self) -> None:
        pair = self.authority.client("kube-proxy", user="system:kube-proxy")
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self._kubeconfig("kube-proxy", pair))},
            "mode": "iptables", "hostnameOverride": NAME, "clusterCIDR": POD_CIDR,
            "bindAddress": "0.0.0.0", "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # 0 = leave the host-wide conntrack table size and timeouts as they are.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }
        path = self.workdir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [str(self.bindir / "kube-proxy"), f"--config={path}", "-v=1"])

    def _kubeconfig(self, name: str, pair: pki.KeyPair) -> Path:
        path = self.workdir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "test", "cluster": {
                "server": self.server,
                "certificate-authority": str(self.authority.pair.cert)}}],
            "users": [{"name": name, "user": {"client-certificate": str(pair.cert),
                                              "client-key": str(pair.key)}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}]}))
        path.chmod(0o600)
        return path

    # --- cgroups -------------------------------------------------------------------------

    def _hierarchies(self) -> list[Path]:
        """The cgroup v1 hierarchies (and the v2 one of a hybrid layout) this host mounts."""
        top = Path("/sys/fs/cgroup")
        return [d for d in sorted(top.iterdir()) if (d / "cgroup.procs").is_file()
                and not d.is_symlink()]

    def _cgroups_make(self) -> None:
        """Make the kubelet's cgroup root in every hierarchy (it refuses to start without),
        with the CPU weight :data:`CPU_SHARES`."""
        for hierarchy in self._hierarchies():
            mine = hierarchy / self.cgroup_root.lstrip("/")
            mine.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # v1 cpuset children start empty
                if (mine / knob).is_file() and not (mine / knob).read_text().strip():
                    (mine / knob).write_text((hierarchy / knob).read_text())
            if (mine / "cpu.shares").is_file():
                (mine / "cpu.shares").write_text(str(CPU_SHARES))
            if (mine / "cpu.weight").is_file():  # cgroup v2's scale, as runc converts shares
                (mine / "cpu.weight").write_text(str(1 + (CPU_SHARES - 2) * 9999 // 262142))

    def _cgroup_pids(self) -> list[int]:
        found: set[int] = set()
        for hierarchy in self._hierarchies():
            mine = hierarchy / self.cgroup_root.lstrip("/")
            for folder in _folders_deepest_first(mine):
                with contextlib.suppress(OSError):
                    found.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        found.discard(os.getpid())
        return sorted(found)

    def _cgroups_remove(self) -> None:
        for hierarchy in self._hierarchies():
            mine = hierarchy / self.cgroup_root.lstrip("/")
            for folder in _folders_deepest_first(mine):
                for _ in range(25):  # a killed process leaves its cgroup a moment later
                    try:
                        folder.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.2)

    # --- processes -----------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None
               ) -> subprocess.Popen[bytes]:
        proc = self.holder.spawn(argv, log=self.logs / f"{name}.log", cwd=self.workdir,
                                 env=env)
        self._procs.append((name, proc))
        return proc

    def _wait(self, deadline: float, what: str, ready: Callable[[], bool]) -> None:
        while True:
            for name, proc in self._procs:
                if proc.poll() is not None:
                    tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise NodeError(f"{name} exited with {proc.returncode} while waiting for "
                                    f"{what}; see {self.logs / (name + '.log')}:\n{tail}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise NodeError(f"timed out waiting for {what}; logs in {self.logs}")
            time.sleep(0.2)


def _folders_deepest_first(top: Path) -> list[Path]:
    """``top`` and every folder below it, children before parents (none if ``top`` is gone).
    A cgroup that disappears during the walk (its last process just left) is skipped."""
    return [Path(folder) for folder, _, _ in os.walk(top, topdown=False)]
