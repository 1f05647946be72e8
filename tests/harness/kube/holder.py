"""A private network and mount namespace for a whole test cluster, held open by one process.

:class:`Holder` starts ``unshare --net --mount --propagation private`` running a shell that
prepares the namespace and then sleeps; every component of the cluster is started inside it with
``nsenter --target PID --net --mount`` (not ``ip netns exec``, which remounts ``/sys`` and hides
the cgroup mounts the kubelet needs). Inside:

- ``lo`` is up and carries :data:`NODE_IP`, the address the API server advertises and the real
  node reports, so the ``kubernetes`` Service has a real endpoint;
- the Service CIDR is routed to ``lo`` with :data:`NODE_IP` as source, so processes in the
  namespace reach ClusterIPs once kube-proxy has written its rules;
- pods get addresses on a bridge (the CNI ``bridge`` plugin makes it); nothing has a route out;
- ``/run``, ``/var/lib/cni`` and ``/var/log/containers`` are private tmpfs mounts, so the
  container runtime's sockets, network namespaces, IP allocations and the kubelet's log links
  never reach the host's folders;
- the kernel settings the kubelet insists on (``vm.overcommit_memory=1``, ``kernel.panic=10``,
  ...) are read from files bind-mounted over ``/proc/sys`` inside the mount namespace: with
  ``protectKernelDefaults: true`` the kubelet only reads them and so never changes the host's.

The host reaches the namespace only through loopback forwarders (:mod:`.forward`): a listening
socket made on the host's ``127.0.0.1`` and served by a process inside, which connects to a
port on the namespace's own loopback. Ending the holder's PID (after every process started in
it) removes the namespace.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from .procs import end, end_with_parent

NODE_IP = "10.250.0.1"
"""The node's address, on ``lo`` inside the namespace (the API server advertises it too)."""

KUBELET_SYSCTLS = {
    "vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10,
    "kernel/panic_on_oops": 1, "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}
"""What the kubelet's container manager expects of ``/proc/sys`` (its ``setupKernelTunables``
in ``pkg/kubelet/cm/container_manager_linux.go``): with ``protectKernelDefaults`` any other
value stops it, without it the kubelet writes these host-wide."""

PRIVATE_TMPFS = ("/run", "/var/lib/cni", "/var/log/containers")
"""Host folders the container runtime, the CNI plugins and the kubelet write to whatever they
are told; each is a fresh tmpfs inside the mount namespace."""


class HolderError(RuntimeError):
    """The namespace could not be made, or a CIDR it would use is routed on the host."""


@dataclass
class Holder:
    """The process holding the namespace, and the processes started inside it.

    ``service_cidr`` is routed to ``lo`` inside; ``private_cidrs`` (the Service and pod
    CIDRs) must not be routed on the host (:meth:`start` checks).
    """

    workdir: Path
    service_cidr: str
    private_cidrs: tuple[str, ...]
    proc: subprocess.Popen[bytes] | None = None
    _forwarders: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the holder is not started"
        return self.proc.pid

    def start(self) -> None:
        """Make the namespace and wait until it is ready.

        Raises:
            HolderError: a CIDR is routed on the host, or the holder's setup failed.
        """
        refuse_routed(self.private_cidrs)
        self.workdir.mkdir(parents=True, exist_ok=True)
        shadow = self.workdir / "sysctl"
        shadow.mkdir(exist_ok=True)
        lines = ["set -e"]
        for folder in PRIVATE_TMPFS:
            lines += [f"mkdir -p {folder}", f"mount -t tmpfs -o mode=755 tailguard {folder}"]
        for key, value in KUBELET_SYSCTLS.items():
            path = shadow / key.replace("/", ".")
            path.write_text(f"{value}\n")
            lines.append(f"mount --bind {path} /proc/sys/{key}")
        lines += ["ip link set lo up", f"ip addr add {NODE_IP}/32 dev lo",
                  f"ip route add {self.service_cidr} dev lo src {NODE_IP}",
                  "echo ready", "exec sleep infinity"]
        log = open(self.workdir / "holder.log", "wb")  # noqa: SIM115 (child owns it)
        self.proc = subprocess.Popen(
            ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c",
             "\n".join(lines)], stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            preexec_fn=end_with_parent)
        log.close()
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        if first.strip() != b"ready":
            self.stop()
            raise HolderError("the namespace holder failed: "
                              + (self.workdir / "holder.log").read_text(errors="replace"))

    def command(self, argv: Iterable[str]) -> list[str]:
        """``argv`` run inside the namespace (network and mounts)."""
        return ["nsenter", f"--target={self.pid}", "--net", "--mount", "--", *argv]

    def run(self, argv: Iterable[str], *, check: bool = True, timeout: float = 60,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the namespace to completion; text in and out.

        Raises:
            subprocess.CalledProcessError: ``check`` and a non-zero exit.
        """
        return subprocess.run(self.command(argv), capture_output=True, text=True, check=check,
                              timeout=timeout, input=input)

    def spawn(self, argv: Iterable[str], *, log: Path, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the namespace, its output appended to ``log``; the process
        gets SIGTERM if the test run dies."""
        out = open(log, "ab")  # noqa: SIM115 (child owns it)
        try:
            return subprocess.Popen(self.command(argv), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                    preexec_fn=end_with_parent)
        finally:
            out.close()

    def forward(self, port: int) -> int:
        """A port on the host's ``127.0.0.1`` whose connections reach ``127.0.0.1:port``
        inside the namespace (:mod:`.forward`); returns the host port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        try:
            script = Path(__file__).with_name("forward.py")
            log = open(self.workdir / f"forward-{port}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                self.command([sys.executable, str(script), str(listener.fileno()), str(port)]),
                pass_fds=(listener.fileno(),), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, preexec_fn=end_with_parent)
            log.close()
            self._forwarders.append(proc)
            return int(listener.getsockname()[1])
        finally:
            listener.close()

    def stop(self) -> None:
        """End the forwarders, then the holder, by PID (the caller has ended the rest)."""
        for proc in [*self._forwarders, *([self.proc] if self.proc else [])]:
            end(proc, timeout=10)
        self._forwarders.clear()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def refuse_routed(cidrs: Iterable[str]) -> None:
    """Raise if the host has a route or an address inside any of ``cidrs`` (a default route
    does not count: it leads out, and nothing here is sent that way).

    Raises:
        HolderError: names the CIDR and the host's route that overlaps it.
    """
    nets = [ipaddress.ip_network(c) for c in cidrs]
    routes = json.loads(subprocess.run(["ip", "-j", "route", "show", "table", "all"],
                                       capture_output=True, text=True, check=True).stdout or "[]")
    addrs = json.loads(subprocess.run(["ip", "-j", "addr", "show"], capture_output=True,
                                      text=True, check=True).stdout or "[]")
    seen = [r["dst"] for r in routes if r.get("dst") not in (None, "default")
            and r.get("type") not in ("broadcast",)]
    seen += [f"{a['local']}/32" for link in addrs for a in link.get("addr_info", [])
             if a.get("family") == "inet"]
    for dst in seen:
        with contextlib.suppress(ValueError):
            route = ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False)
            for net in nets:
                if route.version == net.version and route.overlaps(net):  # type: ignore[arg-type]
                    raise HolderError(f"{net} is routed on this host ({dst}); the test cluster "
                                      "needs it private: pick another CIDR or remove the route")

