"""Closed-loop HTTP load for `scripts/kind-demo.sh load`: WORKERS threads POST one JSON body
to URL, one new connection per request, until SECONDS have passed.

    python scripts/kind-load.py URL SECONDS WORKERS BODY

The demo runs it with `python -c` in a pod of the runtime image (so the demo pulls no other
image), which is why it uses the standard library only. A new connection per request lets the
Service spread requests over the replicas the HPA adds (a keep-alive client stays on the pod
it first reached). Every 10 s, and at the end, it prints one line: the seconds elapsed and the
count of replies so far by HTTP status (connection errors by exception name).
"""

import collections
import sys
import threading
import time
import urllib.error
import urllib.request

REPORT_SECONDS = 10.0


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python kind-load.py URL SECONDS WORKERS BODY", file=sys.stderr)
        return 2
    url, seconds, workers, body = argv[0], float(argv[1]), int(argv[2]), argv[3].encode()
    start = time.monotonic()
    end = start + seconds
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def send() -> None:
        while time.monotonic() < end:
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as reply:
                    reply.read()
                    code = str(reply.status)
            except urllib.error.HTTPError as exc:
                code = str(exc.code)
            except OSError as exc:
                code = type(exc).__name__
                time.sleep(0.1)  # a refused connection would otherwise spin
            with lock:
                counts[code] += 1

    def report() -> None:
        with lock:
            line = " ".join(f"{code}={n}" for code, n in sorted(counts.items()))
        print(f"t={time.monotonic() - start:.0f}s {line or 'no replies yet'}", flush=True)

    threads = [threading.Thread(target=send, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        time.sleep(min(REPORT_SECONDS, max(0.05, end - time.monotonic())))
        if time.monotonic() < end:
            report()
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
