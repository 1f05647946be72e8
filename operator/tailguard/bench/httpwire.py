"""The load generator's side of HTTP/1.1 on the wire: an incremental response parser.

Only what a load generator needs from an answer: its status code and where its body ends
(``Content-Length``, chunked transfer encoding, bodiless statuses), and whether the server asked
to close the connection; and, when asked, the value of one header. Pure: bytes in, status codes
out. Used by :mod:`~tailguard.bench.loadgen`.
"""

from __future__ import annotations


class ResponseParser:
    """Incremental HTTP/1.1 response parser: status code and body end, nothing else.

    :meth:`feed` returns the status codes of the responses completed by the bytes given.
    Handles ``Content-Length``, chunked bodies (trailers skipped) and bodiless statuses; ``close``
    is set once a response carried ``Connection: close``. With ``capture`` (lower-case header
    names), ``captured`` holds those headers' values in the last response head read, in the
    same order (None: absent).
    Raises ValueError on malformed input.
    """

    __slots__ = ("buf", "status", "remaining", "chunked", "in_body", "close", "capture",
                 "captured")

    def __init__(self, capture: tuple[bytes, ...] = ()) -> None:
        self.capture = capture
        self.captured: list[str | None] = [None] * len(capture)
        self.buf = bytearray()
        self.status = 0
        self.remaining = 0
        self.chunked = False
        self.in_body = False
        self.close = False

    def feed(self, data: bytes) -> list[int]:
        """Add ``data``; return the status codes of the responses it completed, in order."""
        buf = self.buf
        buf += data
        done: list[int] = []
        while True:
            if not self.in_body:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return done
                self._headers(bytes(buf[:end]))
                del buf[:end + 4]
                if self.status < 200 or self.status in (204, 304):
                    if self.status >= 200:
                        done.append(self.status)
                    continue
                self.in_body = True
            if self.chunked:
                if not self._chunks():
                    return done
            else:
                if len(buf) < self.remaining:
                    return done
                del buf[:self.remaining]
            self.in_body = False
            done.append(self.status)

    def _headers(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        if not lines[0].startswith(b"HTTP/1.") or len(lines[0]) < 12:
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        self.status = int(lines[0][9:12])
        self.remaining, self.chunked = 0, False
        self.captured = [None] * len(self.capture)
        for line in lines[1:]:
            key, _, value = line.partition(b":")
            key = key.strip().lower()
            if key == b"content-length":
                self.remaining = int(value)
            elif key == b"transfer-encoding":
                self.chunked = b"chunked" in value.lower()
            elif key == b"connection":
                self.close = self.close or b"close" in value.lower()
            elif key in self.capture:
                self.captured[self.capture.index(key)] = value.strip().decode("latin-1")

    def _chunks(self) -> bool:
        """Consume whole chunks; True once the last chunk and the trailers are consumed."""
        buf = self.buf
        while True:
            if self.remaining > 0:  # inside a chunk: its data plus the CRLF after it
                if len(buf) < self.remaining:
                    return False
                del buf[:self.remaining]
                self.remaining = 0
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return False
            size = int(bytes(buf[:line_end]).split(b";", 1)[0], 16)
            if size > 0:
                del buf[:line_end + 2]
                self.remaining = size + 2
                continue
            pos = line_end + 2
            while True:
                nxt = buf.find(b"\r\n", pos)
                if nxt < 0:
                    return False
                if nxt == pos:
                    del buf[:nxt + 2]
                    return True
                pos = nxt + 2
