"""The reference model served by mosec 0.9.8, for comparison (runs in benchmarks/.venvs/mosec).

One model worker process with dynamic batching of up to 32 rows, waiting at most 5 ms for
batch-mates; JSON in, JSON out through mosec's default (de)serialization. Route
``POST /inference``. One request carries one row: ``{"x": [20 floats]}``; the answer is
``{"predict": label, "predict_proba": [p0, p1]}`` (both from one ``predict_proba`` pass, the
same work the tailguard runtime does per row).

    benchmarks/.venvs/mosec/bin/python benchmarks/peers/mosec_server.py --model /abs/model.joblib \\
        --address 127.0.0.1 --port 9100 [--max-batch-size 32] [--max-wait-ms 5]

Every other option is mosec's own (``--timeout``, ``--log-level``...).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from mosec import Server, Worker

MODEL_ENV = "TAILGUARD_BENCH_MODEL"


class ForestWorker(Worker):
    """Loads the joblib model once per worker process and predicts a batch of rows per call."""

    def __init__(self) -> None:
        super().__init__()
        import joblib
        import numpy as np
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1)
        self.np = np
        self.model = joblib.load(os.environ[MODEL_ENV])
        if "n_jobs" in self.model.get_params():
            self.model.set_params(n_jobs=1)
        self.classes = np.asarray(self.model.classes_)

    def forward(self, data: list[dict[str, Any]]) -> list[dict[str, Any]]:  # type: ignore[override]
        """``data``: one ``{"x": [20 floats]}`` per request of the batch; one answer each."""
        x = self.np.asarray([item["x"] for item in data], dtype=self.np.float64)
        proba = self.model.predict_proba(x)
        labels = self.classes.take(proba.argmax(axis=1)).tolist()
        return [{"predict": label, "predict_proba": row}
                for label, row in zip(labels, proba.tolist())]


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", required=True, help="absolute path of the joblib model file")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=int, default=5)
    args, _ = parser.parse_known_args()  # the rest are mosec's own options
    os.environ[MODEL_ENV] = os.path.abspath(args.model)
    server = Server()
    server.append_worker(ForestWorker, num=1, max_batch_size=args.max_batch_size,
                         max_wait_time=args.max_wait_ms)
    server.run()


if __name__ == "__main__":
    main()
