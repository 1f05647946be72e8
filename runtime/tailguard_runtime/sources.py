"""Model files fetched over HTTP(S) and kept in a cache keyed by their SHA-256.

``https://host/path`` may point anywhere; ``http://`` only to a loopback host or a
cluster-internal ``*.svc`` name (:func:`check_url`), since a plain-HTTP download can be altered
on the way and a joblib file is code. Every URL model names its ``sha256``, and nothing is
opened before that checksum passed:

1. ``<cache>/<sha256>.joblib`` already there with that checksum: used as it is (a second
   ``tailguard up``, or a restarted container, downloads nothing).
2. Otherwise one GET, redirects followed by hand and only to ``https://`` (at most
   :attr:`FetchSettings.max_redirects`), streamed into a temporary file beside the cache entry
   while its size is counted against ``maxBytes`` and its SHA-256 computed; the file is renamed
   into place only when the checksum matches.
3. A failure that may pass (no answer, DNS, a stall, a cut TLS stream, 5xx, 408, 429) is
   tried again after 1 s, 2 s, 4 s (``FetchSettings.backoff_s`` doubled), up to
   ``FetchSettings.attempts`` in all; one that will not (404, an untrusted certificate, the
   size cap, a wrong checksum, a redirect to ``http://``, an attempt past its deadline) is
   final.

Every failure is a :class:`~tailguard_runtime.errors.ModelFetchError` whose ``cause`` names it
(``ModelNotFound``, ``ModelTooLarge``, ...; :data:`~tailguard_runtime.errors.MODEL_CAUSES`). URLs are
shown without their query string and user info (a presigned URL's token is a secret).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import ipaddress
import logging
import os
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping
from urllib.parse import urlsplit

import certifi
import httpx

from tailguard_runtime.errors import ModelFetchError, ModelLoadError
from tailguard_runtime.settings import MODEL_CA_FILE_ENV, MODEL_CACHE_ENV
from tailguard_runtime.uris import URL_SCHEMES, shown

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 16


@dataclass(frozen=True)
class FetchSettings:
    """Where fetched models are kept and how hard a fetch tries. Times in seconds."""

    cache_dir: Path
    ca_file: Path | None = None
    """PEM bundle trusted besides the public CAs (certifi's), e.g. a private CA's certificate."""
    connect_timeout_s: float = 10.0
    """Longest wait for a connection (and its TLS handshake) to a host."""
    stall_timeout_s: float = 30.0
    """Longest wait for the next bytes of an answer (httpx's read timeout)."""
    deadline_s: float = 600.0
    """Longest one attempt may take, however steadily bytes trickle in."""
    attempts: int = 4
    """Attempts in all for a failure that may pass (the first one included)."""
    backoff_s: float = 1.0
    """Wait before the second attempt; doubled before each later one."""
    max_redirects: int = 5
    """Most redirects followed in one attempt (each to ``https://`` only)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FetchSettings:
        """Read ``TAILGUARD_MODEL_CACHE`` (default ``$XDG_CACHE_HOME/tailguard/models``, else
        ``~/.cache/tailguard/models``), ``TAILGUARD_MODEL_CA_FILE``,
        ``TAILGUARD_MODEL_STALL_TIMEOUT_S`` and ``TAILGUARD_MODEL_FETCH_ATTEMPTS``.

        Raises:
            ModelLoadError: a timeout or attempt count that is not a positive number.
        """
        env = os.environ if environ is None else environ
        cache = env.get(MODEL_CACHE_ENV) or str(
            Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tailguard" / "models")
        made = cls(cache_dir=Path(cache),
                   ca_file=Path(env[MODEL_CA_FILE_ENV]) if env.get(MODEL_CA_FILE_ENV) else None)
        stall = env.get("TAILGUARD_MODEL_STALL_TIMEOUT_S")
        attempts = env.get("TAILGUARD_MODEL_FETCH_ATTEMPTS")
        try:
            if stall is not None:
                made = dataclasses.replace(made, stall_timeout_s=float(stall))
            if attempts is not None:
                made = dataclasses.replace(made, attempts=int(attempts))
        except ValueError:
            raise ModelLoadError(
                f"TAILGUARD_MODEL_STALL_TIMEOUT_S={stall!r} / TAILGUARD_MODEL_FETCH_ATTEMPTS="
                f"{attempts!r}: expected a positive number of seconds and a positive integer"
            ) from None
        if not (made.stall_timeout_s > 0 and made.attempts >= 1):
            raise ModelLoadError(f"TAILGUARD_MODEL_STALL_TIMEOUT_S={stall!r} / TAILGUARD_MODEL_"
                                 f"FETCH_ATTEMPTS={attempts!r}: both must be positive")
        return made


def http_allowed(host: str) -> bool:
    """Whether plain ``http://`` may reach ``host``: a loopback address or ``localhost``, or a
    cluster-internal Service name, ``NAME.NAMESPACE.svc`` or ``NAME.NAMESPACE.svc.cluster.local``
    (the default cluster domain; another one is not told from a public name)."""
    host = host.lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        labels = host.split(".")
        return all(labels) and labels[2:] in (["svc"], ["svc", "cluster", "local"])


def check_url(uri: str) -> None:
    """Refuse a URL no fetch may start from.

    Raises:
        ModelFetchError: cause ``ModelURLRefused``: not http(s), no host, or ``http://`` to a
            host :func:`http_allowed` refuses.
    """
    parts = urlsplit(uri)
    if parts.scheme not in URL_SCHEMES or not parts.hostname:
        raise ModelFetchError(f"{shown(uri)}: expected an https:// URL with a host",
                              "ModelURLRefused")
    try:
        parts.port
    except ValueError:
        raise ModelFetchError(f"{shown(uri)}: the port is not a number from 0 to 65535",
                              "ModelURLRefused") from None
    if parts.scheme == "http" and not http_allowed(parts.hostname):
        raise ModelFetchError(
            f"{shown(uri)}: http:// is allowed only to loopback or a cluster-internal *.svc "
            "host (a plain download can be altered on the way); use https://", "ModelURLRefused")


def file_digest(path: Path) -> str:
    """Lower-case hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(uri: str, sha256: str, max_bytes: int, settings: FetchSettings, *,
          sleep: Callable[[float], None] = time.sleep) -> Path:
    """The cached file of URL model ``uri`` whose SHA-256 is ``sha256``, downloaded first if
    the cache lacks it (the module docstring gives the steps). ``max_bytes`` caps the download,
    in bytes.

    Raises:
        ModelFetchError: as :data:`~tailguard_runtime.errors.MODEL_CAUSES` lists, after the
            attempts a transient one gets.
        ModelLoadError: the cache folder cannot be made or written.
    """
    check_url(uri)
    digest = sha256.lower()
    dest = settings.cache_dir / f"{digest}.joblib"
    try:
        if dest.is_file():
            if file_digest(dest) == digest:
                logger.info("model cached uri=%s path=%s", shown(uri), dest)
                return dest
            logger.warning("model cache entry %s does not match its name; fetching again", dest)
            dest.unlink(missing_ok=True)
        settings.cache_dir.mkdir(parents=True, exist_ok=True)
        _remove_stale_parts(settings.cache_dir, digest, settings.deadline_s)
    except OSError as exc:
        raise ModelLoadError(f"{shown(uri)}: model cache {settings.cache_dir}: {exc}") from None
    for attempt in range(1, settings.attempts + 1):
        try:
            started = time.monotonic()
            size = _download(uri, digest, max_bytes, settings, dest)
            logger.info("model fetched uri=%s bytes=%d seconds=%.2f attempt=%d", shown(uri),
                        size, time.monotonic() - started, attempt)
            return dest
        except ModelFetchError as exc:
            if not exc.transient:
                raise
            if attempt == settings.attempts:
                raise ModelFetchError(f"{exc.message} (after {attempt} attempts)", exc.cause,
                                      transient=True) from exc
            wait = settings.backoff_s * 2 ** (attempt - 1)
            logger.warning("model fetch failed (%s) attempt=%d/%d, next in %.0f s: %s",
                           exc.cause, attempt, settings.attempts, wait, exc.message)
            sleep(wait)
    raise AssertionError("unreachable")  # pragma: no cover


def _remove_stale_parts(folder: Path, digest: str, deadline_s: float) -> None:
    """Delete the temporary files of this checksum's downloads older than one attempt may last
    (a process killed mid-download leaves one; in a pod it would count against the emptyDir's
    size limit)."""
    now = time.time()
    for part in folder.glob(f".{digest}.*.part"):
        with contextlib.suppress(OSError):
            if now - part.stat().st_mtime > deadline_s:
                part.unlink()


def _tls_context(ca_file: Path | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certifi.where())
    if ca_file is not None:
        try:
            context.load_verify_locations(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise ModelFetchError(f"cannot read the CA bundle {ca_file}: {exc}",
                                  "ModelTLSError") from None
    return context


def _download(uri: str, digest: str, max_bytes: int, settings: FetchSettings,
              dest: Path) -> int:
    """One attempt: GET (following https redirects), stream to a temporary file, check,
    rename to ``dest``. Returns the byte count."""
    timeout = httpx.Timeout(settings.stall_timeout_s, connect=settings.connect_timeout_s)
    part = dest.with_name(f".{digest}.{os.getpid()}.part")
    deadline = time.monotonic() + settings.deadline_s
    url = uri
    try:
        with httpx.Client(verify=_tls_context(settings.ca_file), timeout=timeout,
                          follow_redirects=False) as client:
            for _ in range(settings.max_redirects + 1):
                with client.stream("GET", url,
                                   headers={"Accept-Encoding": "identity"}) as answer:
                    if answer.is_redirect:
                        url = _redirect_target(uri, answer)
                        continue
                    _check_answer(uri, answer, max_bytes)
                    size = _save(uri, answer, digest, max_bytes, part, deadline)
                    os.replace(part, dest)
                    return size
    except httpx.HTTPError as exc:
        raise _transport_error(uri, exc) from None
    except OSError as exc:
        raise ModelLoadError(f"{shown(uri)}: cannot write {part}: {exc}") from None
    finally:
        part.unlink(missing_ok=True)
    raise ModelFetchError(f"{shown(uri)}: more than {settings.max_redirects} redirects",
                          "ModelURLRefused")


def _redirect_target(uri: str, answer: httpx.Response) -> str:
    target = answer.next_request.url if answer.next_request is not None else None
    if target is None or target.scheme != "https":
        shown_target = "no Location" if target is None else shown(str(target))
        raise ModelFetchError(f"{shown(uri)}: redirect to {shown_target} refused: redirects "
                              "are followed only to https://", "ModelURLRefused")
    return str(target)


def _check_answer(uri: str, answer: httpx.Response, max_bytes: int) -> None:
    status = answer.status_code
    if status in (404, 410):
        raise ModelFetchError(f"{shown(uri)}: {status} {answer.reason_phrase} from "
                              f"{shown(str(answer.url))}", "ModelNotFound")
    if not 200 <= status < 300 or status == 204:
        raise ModelFetchError(f"{shown(uri)}: {status} {answer.reason_phrase} from "
                              f"{shown(str(answer.url))}", "ModelHTTPError",
                              transient=status >= 500 or status in (408, 429))
    announced = answer.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > max_bytes:
        raise ModelFetchError(f"{shown(uri)}: {announced} bytes announced, more than "
                              f"maxBytes {max_bytes}", "ModelTooLarge")


def _save(uri: str, answer: httpx.Response, digest: str, max_bytes: int, part: Path,
          deadline: float) -> int:
    checksum = hashlib.sha256()
    size = 0
    with part.open("wb") as fh:
        for chunk in answer.iter_bytes(CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise ModelFetchError(f"{shown(uri)}: more than maxBytes {max_bytes} bytes "
                                      "sent; download stopped", "ModelTooLarge")
            if time.monotonic() > deadline:
                raise ModelFetchError(f"{shown(uri)}: download still running after "
                                      "its deadline; stopped", "ModelFetchStalled")
            checksum.update(chunk)
            fh.write(chunk)
    if checksum.hexdigest() != digest:
        raise ModelFetchError(f"{shown(uri)}: sha256 mismatch: expected {digest}, the "
                              f"{size} bytes downloaded have {checksum.hexdigest()}; the file "
                              "was not opened", "ModelChecksumMismatch")
    return size


def _transport_error(uri: str, exc: Exception) -> ModelFetchError:
    """The :class:`ModelFetchError` an httpx transport error stands for."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 10:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return ModelFetchError(f"{shown(uri)}: no bytes for the stall timeout ({text})",
                               "ModelFetchStalled", transient=True)
    if any(isinstance(e, ssl.SSLCertVerificationError) for e in chain) \
            or "CERTIFICATE_VERIFY_FAILED" in text:
        return ModelFetchError(f"{shown(uri)}: TLS failed: {text}", "ModelTLSError")
    if any(isinstance(e, ssl.SSLError) for e in chain):  # a handshake or stream cut short
        return ModelFetchError(f"{shown(uri)}: TLS failed: {text}", "ModelTLSError",
                               transient=True)
    if any(isinstance(e, socket.gaierror) for e in chain) or "Name or service not known" in text:
        return ModelFetchError(f"{shown(uri)}: host not found: {text}", "ModelHostNotFound",
                               transient=True)
    return ModelFetchError(f"{shown(uri)}: {text}", "ModelUnreachable", transient=True)
