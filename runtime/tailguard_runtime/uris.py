"""How a model URI is shown: a URL without what may be secret in it. Pure; no I/O.

A presigned URL (S3, GCS, Azure) carries its signature in the query string, and a URL may carry
a password before its host. Log lines, errors, response headers, conditions and the SLO
guard's record name a model by :func:`shown`, never by the URI as written.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

URL_SCHEMES = ("https", "http")


def is_url(uri: str) -> bool:
    """Whether a model ``uri`` is downloaded (its scheme is one of :data:`URL_SCHEMES`)."""
    return urlsplit(uri).scheme in URL_SCHEMES


def claim_of(uri: str) -> str | None:
    """The PersistentVolumeClaim a ``pvc://CLAIM/path`` model names, else ``None``."""
    parts = urlsplit(uri)
    return parts.netloc if parts.scheme == "pvc" else None


def shown(uri: str) -> str:
    """An http(s) ``uri`` without user info, query string and fragment; any other URI as it
    is. A port that is not a number is left out (the fetch refuses such a URL)."""
    parts = urlsplit(uri)
    if parts.scheme not in URL_SCHEMES:
        return uri
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
