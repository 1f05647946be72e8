"""Ports on this machine."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listened on a moment ago (the kernel's choice for
    port 0). Another process may take it before the caller binds it; callers that must not
    race bind port 0 themselves and read the port back."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
