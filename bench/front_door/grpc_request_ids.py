"""Python's time a front-door gRPC call, checking its request (app/front_door/grpc_calls.py's GrpcHeaders), for calls
that each carry a new id (as perf_analyzer's and Triton's clients send them where ids are asked) and for calls
without one. CPU only; no server: the per-call cost on the event loop that answers every door call.

    PYTHONPATH=. python3 bench/front_door/grpc_request_ids.py --layout id-first     # today's grpc.c
    PYTHONPATH=<older tree> python3 bench/front_door/grpc_request_ids.py --layout field-order  # before 2026-12-04's

--layout: how grpc.c hands the request's fields over: its id's field first (id-first), or in the order the client
serialized them (field-order, grpc.c before it moved the id).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from types import SimpleNamespace
from typing import Any

from app.front_door.grpc_calls import GrpcHeaders
from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb
from tests.seed_model import seed_spec


class OneModel:
    def __init__(self) -> None:
        self.served = SimpleNamespace(spec=seed_spec())
        self.settings = SimpleNamespace(max_instances=128)

    def model(self, name: str | None, version: str | None = None) -> Any:
        return self.served


def request(request_id: str | None, layout: str) -> bytes:
    tensor = pb.ModelInferRequest.InferInputTensor(name="input", datatype="UINT8", shape=[1, 1, 28, 28])
    outputs = [pb.ModelInferRequest.InferRequestedOutputTensor(name="probabilities")]
    fields = pb.ModelInferRequest(model_name="fashion-cnn", inputs=[tensor], outputs=outputs)
    if request_id is None:
        return fields.SerializeToString()
    if layout == "id-first":
        return pb.ModelInferRequest(id=request_id).SerializeToString() + fields.SerializeToString()
    fields.id = request_id
    return fields.SerializeToString()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layout", choices=("id-first", "field-order"), required=True)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    service = OneModel()
    figures: dict[str, list[float]] = {"with ids": [], "without": []}
    for repeat in range(args.repeats):
        known = GrpcHeaders(service, service.served)  # type: ignore[arg-type]
        numbered = [request(f"{repeat}-{i}", args.layout) for i in range(args.calls)]
        plain = request(None, args.layout)
        known(numbered[0])
        known(plain)
        for name, calls in (("with ids", numbered), ("without", [plain] * args.calls)):
            started = time.perf_counter()
            for call in calls:
                known(call)
            figures[name].append((time.perf_counter() - started) / args.calls * 1e6)
    summary = {name: {"median_us": round(statistics.median(v), 3), "each_us": [round(x, 3) for x in v]}
               for name, v in figures.items()}  # fmt: skip
    print(json.dumps({"layout": args.layout, "calls": args.calls, **summary}))


if __name__ == "__main__":
    main()
