"""Run by KServe's own Python client's venv (.venv-kserve, see tests/clients/kserve-requirements.txt)
against a served InferenceService: every path a KServe user takes, printed as one JSON object.

    .venv-kserve/bin/python tests/clients/kserve_client.py REST_PORT GRPC_PORT NAME ROWS_JSON

Readiness and predictions over KServe v1 (InferenceRESTClient, protocol v1), the Open Inference
Protocol v2 over REST (protocol v2) and over gRPC (InferenceGRPCClient), with the clients'
defaults. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import numpy as np
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig


def _request(name: str, rows: np.ndarray) -> InferRequest:
    tensor = InferInput("input-0", list(rows.shape), "FP64")
    tensor.set_data_from_numpy(rows)
    return InferRequest(model_name=name, infer_inputs=[tensor])


async def main(rest_port: int, grpc_port: int, name: str, rows: np.ndarray) -> dict[str, Any]:
    base = f"http://127.0.0.1:{rest_port}"
    out: dict[str, Any] = {}
    v1 = InferenceRESTClient(RESTConfig(protocol="v1"))
    try:
        out["v1_ready"] = await v1.is_model_ready(base, name)
        answer = await v1.infer(base, {"instances": rows.tolist()}, model_name=name)
        out["v1"] = answer["predictions"]
    finally:
        await v1.close()
    v2 = InferenceRESTClient(RESTConfig(protocol="v2"))
    try:
        out["v2_server_ready"] = await v2.is_server_ready(base)
        out["v2_ready"] = await v2.is_model_ready(base, name)
        answer = await v2.infer(base, _request(name, rows), model_name=name)
        out["v2"] = {o.name: o.as_numpy().tolist() for o in answer.outputs}
    finally:
        await v2.close()
    grpc = InferenceGRPCClient(f"127.0.0.1:{grpc_port}")
    try:
        out["grpc_ready"] = await grpc.is_model_ready(name)
        answer = await grpc.infer(_request(name, rows))
        out["grpc"] = {o.name: o.as_numpy().tolist() for o in answer.outputs}
    finally:
        await grpc.close()
    return out


if __name__ == "__main__":
    rest, grpc_port, model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    print(json.dumps(asyncio.run(main(rest, grpc_port, model,
                                      np.asarray(json.loads(sys.argv[4]), dtype=np.float64)))))
