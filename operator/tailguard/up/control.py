"""What ``tailguard up`` leaves on disk for the ``tailguard`` command: one control file per run.

A running ``tailguard up`` writes ``<state dir>/<name>-<port>.json`` =
``{"name", "port", "pid", "secret"}`` (mode 0600, in a 0700 folder) and removes it when it
stops. ``tailguard rollback NAME`` finds it by service name (and port) and sends ``secret`` as
``Authorization: Bearer``; see :mod:`tailguard_runtime.http.control` for why the control route
needs one. The state dir is ``$TAILGUARD_STATE_DIR``, else ``$XDG_RUNTIME_DIR/tailguard`` (the
per-user runtime folder of the XDG Base Directory spec), else
``$XDG_STATE_HOME/tailguard`` (default ``~/.local/state/tailguard``).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ControlFile:
    """One run's control file: the service ``name``, its ``port``, the ``pid`` of the
    ``tailguard up`` process and its ``secret``; ``path`` is where it was read or written."""

    name: str
    port: int
    pid: int
    secret: str
    path: Path


def state_dir() -> Path:
    """The folder of the control files (see the module docstring for the order)."""
    if os.environ.get("TAILGUARD_STATE_DIR"):
        return Path(os.environ["TAILGUARD_STATE_DIR"])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "tailguard"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tailguard"


def new_secret() -> str:
    """A fresh per-run secret: 32 random bytes, URL-safe base64 (:func:`secrets.token_urlsafe`)."""
    return secrets.token_urlsafe(32)


def write_control_file(name: str, port: int, secret: str) -> ControlFile:
    """Write this run's control file, readable by this user only, replacing a stale one.

    Raises:
        OSError: the state dir cannot be created or written.
    """
    folder = state_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"{name}-{port}.json"
    temporary = folder / f".{name}-{port}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"name": name, "port": port, "pid": os.getpid(), "secret": secret}, fh)
    os.replace(temporary, path)
    return ControlFile(name, port, os.getpid(), secret, path)


def remove_control_file(control: ControlFile) -> None:
    """Remove ``control``'s file if it is still this run's (another run may have replaced it)."""
    found = read_control_file(control.path)
    if found is not None and found.secret == control.secret:
        control.path.unlink(missing_ok=True)


def read_control_file(path: Path) -> ControlFile | None:
    """The control file at ``path``; ``None`` when it is missing or unreadable."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        return ControlFile(str(doc["name"]), int(doc["port"]), int(doc["pid"]),
                           str(doc["secret"]), path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_control_file(name: str, port: int | None) -> ControlFile | None:
    """The control file of the ``tailguard up`` serving ``name`` on ``port``; with ``port``
    ``None``, the one for the default port 8080, else the only one for ``name``. ``None`` when
    there is no such file (or, without a port, several)."""
    folder = state_dir()
    if port is not None:
        return read_control_file(folder / f"{name}-{port}.json")
    default = read_control_file(folder / f"{name}-8080.json")
    if default is not None:
        return default
    found = [f for p in sorted(folder.glob(f"{name}-*.json"))
             if (f := read_control_file(p)) is not None and f.name == name]
    return found[0] if len(found) == 1 else None
