"""Baseline: a plain FastAPI app that calls the model once per request (no batching).

What a first attempt at serving the forest usually looks like: a pydantic request model, a
synchronous route (FastAPI runs it in its thread pool), one ``predict_proba`` call per request.
Serves KServe v1 ``POST /v1/models/ref:predict`` with ``{"instances": [[20 floats]]}`` and answers
``{"predictions": [label]}``. Runs in the project's own environment (FastAPI, uvicorn).

    .venv/bin/python benchmarks/peers/fastapi_plain.py --model /abs/model.joblib --port 9300
"""

from __future__ import annotations

import argparse

import joblib
import numpy as np
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from threadpoolctl import threadpool_limits


class PredictRequest(BaseModel):
    """KServe v1 request: ``instances`` is a list of rows, each a list of 20 floats."""

    instances: list[list[float]]


def build_app(model_path: str) -> FastAPI:
    """The app serving the joblib model at ``model_path``, one model call per request."""
    model = joblib.load(model_path)
    model.set_params(n_jobs=1)
    classes = np.asarray(model.classes_)
    app = FastAPI()

    @app.post("/v1/models/ref:predict")
    def predict(request: PredictRequest) -> dict[str, list[int]]:
        proba = model.predict_proba(np.asarray(request.instances, dtype=np.float64))
        return {"predictions": classes.take(proba.argmax(axis=1)).tolist()}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    threadpool_limits(limits=1)
    uvicorn.run(build_app(args.model), host=args.host, port=args.port, log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
