"""Reading the API server's audit log: who wrote what.

The control plane's audit policy logs every write at the ``Metadata`` level, and every request
of the chart's ServiceAccounts (the operator's reads too) at the ``Request`` level (with the
body it sent), synchronously
(``--audit-log-mode=blocking``): a request the API server has answered is already in the file.
A long-running watch is logged when it starts and again when it ends.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class Write:
    """One audited request: the verb, the user, the object (resource, namespace, name,
    subresource), the HTTP status code of the answer and, where logged, the body."""

    verb: str
    user: str
    resource: str
    namespace: str
    name: str
    subresource: str
    code: int
    uri: str = ""
    """The request URI, query included (``?labelSelector=...``)."""
    body: Any = None
    """The request body (a create's object, a patch), where the policy logs it."""
    user_agent: str = ""
    """The request's ``User-Agent``."""
    received: float = 0.0
    """When the API server received the request (``requestReceivedTimestamp``), Unix s."""

    @property
    def target(self) -> str:
        """``resource/name`` (``/subresource``), for messages."""
        tail = f"/{self.subresource}" if self.subresource else ""
        return f"{self.resource}/{self.name}{tail}"


class AuditLog:
    """A reader that remembers where it is: :meth:`mark` then :meth:`writes` since the mark."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def mark(self) -> int:
        """The current end of the log (a byte offset). It may fall inside an event the API
        server is still writing; :meth:`requests` leaves that event out (its request came
        before the mark)."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def writes(self, since: int = 0, *, user: str | None = None,
               namespace: str | None = None) -> list[Write]:
        """Audited writes after offset ``since`` (by ``user`` and in ``namespace`` if given)."""
        return [r for r in self.requests(since, user=user, namespace=namespace)
                if r.verb in WRITE_VERBS]

    def requests(self, since: int = 0, *, user: str | None = None,
                 namespace: str | None = None) -> list[Write]:
        """Every audited request after offset ``since``, reads included (the policy logs the
        reads of the chart's ServiceAccounts only).

        Raises:
            FileNotFoundError: the API server has not written the log yet.
        """
        found = []
        with open(self.path, "rb") as fh:
            if since > 0:
                fh.seek(since - 1)
                if fh.read(1) != b"\n" and not fh.readline().endswith(b"\n"):
                    return found  # the event the mark fell inside is still being written
            for line in fh:
                if not line.endswith(b"\n"):
                    break  # a line being written; the next read sees it whole
                event: dict[str, Any] = json.loads(line)
                ref = event.get("objectRef") or {}
                request = Write(verb=event["verb"], user=event["user"].get("username", ""),
                                resource=ref.get("resource", ""),
                                namespace=ref.get("namespace", ""), name=ref.get("name", ""),
                                subresource=ref.get("subresource", ""),
                                code=int((event.get("responseStatus") or {}).get("code", 0)),
                                uri=event.get("requestURI", ""),
                                body=event.get("requestObject"),
                                user_agent=event.get("userAgent", ""),
                                received=_unix(event.get("requestReceivedTimestamp")))
                if (user is None or request.user == user) and \
                        (namespace is None or request.namespace == namespace):
                    found.append(request)
        return found


def _unix(stamp: str | None) -> float:
    """An audit event's RFC 3339 time (microseconds, ``Z``) as Unix seconds; 0 without one."""
    if not stamp:
        return 0.0
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
