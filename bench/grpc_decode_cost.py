"""A gRPC ModelInferRequest's decode alone, in-process: the data plane's GrpcCodec work before the batcher.

One 3×224×224 UINT8 image (ResNet-50's 150 KB, as raw_input_contents) parsed once, then decoded over and
over as GrpcCodec.decode does it on the loop (the off-loop size check, then the input's checks and its
(1, 3, 224, 224) view), timed with timeit; the model a stand-in of that input (bench/grpc_cost.py's).
--tree runs another checkout's code (before and after a change, same machine, same session):

    PYTHONPATH=. python3 bench/grpc_decode_cost.py [--tree DIR] [--rounds 5] [--number 3000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import timeit
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, help="import the service's code from this checkout")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--number", type=int, default=3000)
    args = p.parse_args()
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    from app.protocols.v2 import grpc_server as g
    from app.protocols.v2.proto import grpc_predict_v2_pb2 as pb
    from app.repository import read_repository
    from bench.grpc_cost import infer_request, stand_in_repository

    (spec,) = read_repository(stand_in_repository(Path(tempfile.mkdtemp()), (3, 224, 224)))
    request = pb.ModelInferRequest.FromString(infer_request((3, 224, 224)).SerializeToString())
    if hasattr(g, "_raw_contents"):  # the raw bytes taken out of the message once (950eede)

        def decode() -> object:
            raw = g._raw_contents(request)
            assert g._payload_bytes(request, raw) < g.LARGE_JSON_BYTES
            return g._input(request, raw, spec, 1024)
    else:  # before: read from the message by the size check and again by the decode

        def decode() -> object:
            assert g._payload_bytes(request) < g.LARGE_JSON_BYTES  # type: ignore[call-arg]
            return g._input(request, spec, 1024)  # type: ignore[call-arg, arg-type]

    decode()
    for _ in range(args.rounds):
        print(f"{timeit.timeit(decode, number=args.number) / args.number * 1e6:.2f} µs a decode", flush=True)


if __name__ == "__main__":
    main()
