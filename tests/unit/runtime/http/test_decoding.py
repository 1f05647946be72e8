"""The decode queue: bounded in bytes; a job whose client left, or whose deadline passed,
before its turn is dropped unrun."""

from __future__ import annotations

import asyncio
import threading
from time import perf_counter
from typing import Any

import pytest

from tailguard_runtime.errors import DecodeLate, IncompleteBody, Overloaded
from tailguard_runtime.http.decoding import DecodeQueue

FAR = 1e12  # a deadline that never passes


def test_jobs_run_in_turn_and_return_their_result() -> None:
    async def main() -> list[int]:
        queue = DecodeQueue(max_bytes=100)
        return list(await asyncio.gather(*(queue.run(lambda i=i: i * i, 10, perf_counter() + FAR,
                                                     lambda: False) for i in range(5))))
    assert asyncio.run(main()) == [0, 1, 4, 9, 16]


def test_a_job_whose_client_left_or_deadline_passed_before_its_turn_never_runs() -> None:
    ran: list[str] = []
    release = threading.Event()
    gone = {"left": False}

    async def main() -> list[Any]:
        queue = DecodeQueue(max_bytes=100)
        blocker = queue.run(lambda: release.wait(10) and ran.append("blocker"), 1,
                            perf_counter() + FAR, lambda: False)
        left = queue.run(lambda: ran.append("left"), 1, perf_counter() + FAR,
                         lambda: gone["left"])
        late = queue.run(lambda: ran.append("late"), 1, perf_counter() + 0.05, lambda: False)
        kept = queue.run(lambda: ran.append("kept"), 1, perf_counter() + FAR, lambda: False)
        tasks = [asyncio.ensure_future(c) for c in (blocker, left, late, kept)]
        await asyncio.sleep(0.2)  # the late one's deadline passes while the blocker runs
        gone["left"] = True
        release.set()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = asyncio.run(main())
    assert ran == ["blocker", "kept"]
    assert isinstance(results[1], IncompleteBody)
    assert isinstance(results[2], DecodeLate) and results[2].status_code == 504
    assert results[2].reason == "decode_deadline"


def test_the_queue_is_bounded_in_bytes_but_always_takes_one_body() -> None:
    release = threading.Event()

    async def main() -> None:
        queue = DecodeQueue(max_bytes=100)
        first = asyncio.ensure_future(queue.run(lambda: release.wait(10), 150,
                                                perf_counter() + FAR, lambda: False))
        await asyncio.sleep(0)
        assert queue.queued_bytes == 150  # over the bound, alone: taken
        with pytest.raises(Overloaded) as info:
            await queue.run(lambda: None, 1, perf_counter() + FAR, lambda: False)
        assert info.value.reason == "decode_queue_full" and info.value.status_code == 429
        release.set()
        await first
        assert queue.queued_bytes == 0
        await queue.run(lambda: None, 60, perf_counter() + FAR, lambda: False)

    asyncio.run(main())
