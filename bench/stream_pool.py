"""Which CUDA streams the GPU JPEG path shares with ResNet-50's engine, in torch's stream pool.

torch hands out its streams from a pool: 32 a priority a device, round robin, to every torch.cuda.Stream() (the
engines', the GPU decoder's) and to libraries (torchvision's JPEG decoder takes one at its first decode). A process
that has taken more than 32 gets streams already in use. torchvision ends every batch's decode in a
cudaStreamSynchronize of its stream, holding its lock: on the engine's stream, that wait would take in every
ResNet-50 batch queued there. In the server one decode at a time took 85–107 µs a photo where the decoder alone
took 70–76 (bench/results/HISTORY.md, run 47); a shared stream is one possible cause this tells.

It builds what the server builds, in the server's order (the engine by its factory, inductor's compile included,
then the GPU decoder), decodes one photo, and reports each stream's place in the pool's ring and which of them are
one stream. torchvision's stream is found from the ring: the stream taken just before its first decode is the one
before it.

    python3 bench/stream_pool.py --out $OUT/stream-pool.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from bench.resnet50_e2e import EXAMPLE, build_service_engine

POOL = 32  # c10's kStreamsPerPool: streams a priority a device


def ring(device: torch.device) -> list[int]:
    """The pool's normal-priority streams on `device` (their cudaStream_t), in the order it hands them out, from the
    next one on. Taking all 32 leaves the pool where it was."""
    return [torch.cuda.Stream(device).cuda_stream for _ in range(POOL)]


def shared(streams: dict[str, int]) -> list[list[str]]:
    """The names that are one stream, each group of two or more."""
    by_handle: dict[int, list[str]] = defaultdict(list)
    for name, handle in streams.items():
        by_handle[handle].append(name)
    return [names for names in by_handle.values() if len(names) > 1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--buckets", default="1,8,32,64,128")
    p.add_argument("--nvjpeg", default="torchvision", help="the GPU decoder's kind: torchvision or direct")
    args = p.parse_args()
    import torchvision.io

    from app.codecs.gpu_jpeg import GpuJpegDecoder
    from loadtest.photos import encode, synthetic_photo

    device = torch.device(args.device)
    repository = Path(tempfile.mkdtemp(prefix="stream-pool-")) / "repository"
    shutil.copytree(EXAMPLE, repository / "resnet50")
    before_build = ring(device)
    engine = build_service_engine(repository, args.buckets, args.device).engine
    # How many streams the engine's build took (inductor's compile, the capture included), as a place in the ring:
    # their number less a multiple of 32.
    taken_by_build = before_build.index(torch.cuda.Stream(device).cuda_stream)
    decoder = GpuJpegDecoder(args.device, nvjpeg=args.nvjpeg)
    order = ring(device)  # the 32 streams, from the next one the pool will hand out
    streams = {
        "engine": engine._stream.cuda_stream,
        "decoder resize and copy": decoder._stream.cuda_stream,
        "decoder's outputs (torchvision)": decoder._decode_stream.cuda_stream,
    }
    # torchvision's decoder is made at its first decode and takes the pool's next stream: order[0] (ring() left the
    # pool where it found it), unless an earlier decode in this process made it.
    photo = torch.frombuffer(bytearray(encode(synthetic_photo(500, 375, seed=1), quality=90)), dtype=torch.uint8)
    with torch.cuda.device(device):
        torchvision.io.decode_jpeg([photo], device=device)
    after = torch.cuda.Stream(device).cuda_stream
    streams["torchvision's decoder"] = order[0]
    record = {
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "streams_the_engine_build_took_mod_32": taken_by_build,
        "torchvision_took_one_stream": after == order[1],  # else its place is not order[0]: read nothing into it
        "ring_places": {name: order.index(handle) if handle in order else None for name, handle in streams.items()},
        "one_stream": shared(streams),
    }
    engine.close()
    decoder.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
