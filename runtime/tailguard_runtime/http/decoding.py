"""The decode thread and the bodies waiting for it.

Large and compressed bodies are inflated and parsed off the event loop, in one thread
(:data:`~tailguard_runtime.http.app.INLINE_DECODE_BYTES`). Its queue was unbounded and every job
ran: 40 parse bombs sent and abandoned kept the thread busy for about 25 s after their clients
had gone, and every request behind them met its deadline in the queue. Here the queue is bounded
in bytes, and a job whose client has left or whose deadline has passed is dropped when its turn
comes, unrun.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import Callable, TypeVar

from tailguard_runtime.errors import DecodeLate, IncompleteBody, Overloaded

T = TypeVar("T")

DECODE_QUEUE_BYTES = 16 * 1024 * 1024
"""Body bytes that may wait for (or be in) the decode thread at once: about 0.25 s of parsing
at the 67 MB/s measured for orjson on an FP64 tensor body on this project's 2-core test machine
(a 1.1 MB body of 2,000 x 64 values in 17 ms). A body is always taken when the queue is empty,
so the largest valid request is never refused for its size alone."""


class DecodeQueue:
    """One decode thread; at most :data:`DECODE_QUEUE_BYTES` of bodies queued for it.

    ``max_bytes``: the bound (bytes of the bodies as received, compressed or not).
    """

    def __init__(self, max_bytes: int = DECODE_QUEUE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.queued_bytes = 0
        """Bytes of the bodies submitted and not finished (or dropped) yet."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailguard-decode")

    async def run(self, decode: Callable[[], T], size: int, deadline: float,
                  client_gone: Callable[[], bool]) -> T:
        """``decode()`` in the decode thread, for a body of ``size`` bytes.

        ``deadline`` (``perf_counter`` seconds): past it, the job is dropped when its turn
        comes. ``client_gone``: read in the decode thread when the job's turn comes; True
        drops it (its connection is closed, nobody reads the answer).

        Raises:
            Overloaded: 429 ``decode_queue_full``: the queue already holds bodies and this one
                would take it past ``max_bytes``.
            IncompleteBody: the client left before the job's turn.
            DecodeLate: the deadline passed before the job's turn (504
                ``decode_deadline``).
            Exception: whatever ``decode`` raises.
        """
        if self.queued_bytes and self.queued_bytes + size > self.max_bytes:
            raise Overloaded(f"decode queue full: {self.queued_bytes} bytes of request bodies "
                             f"waiting to be parsed (limit {self.max_bytes})", 1,
                             "decode_queue_full")
        self.queued_bytes += size
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._thread, _when_due, decode, deadline, client_gone)
        finally:
            self.queued_bytes -= size


def _when_due(decode: Callable[[], T], deadline: float, client_gone: Callable[[], bool]) -> T:
    """``decode()``, unless the job is no longer wanted when the decode thread reaches it."""
    if client_gone():
        raise IncompleteBody("the connection closed before the request body was parsed")
    if perf_counter() >= deadline:
        raise DecodeLate("the request's deadline passed while its body waited to be parsed")
    return decode()
