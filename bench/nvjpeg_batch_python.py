"""The direct decoder's Python a batch, held with the GIL, as it was before run 47 (written out here) and as it is
(app/codecs/nvjpeg.py's first_byte, image_descriptors and plane_views, called).

Run 47c's py-spy --gil had the direct decoder's launch threads holding the GIL a third of the time. Three of the
lines it named are timed here, on the CPU (no nvJPEG is called), for a batch of --photos 500×375 photos:

  address       an upload's first byte: (c_ubyte * length).from_buffer, a ctypes array type made for each new
                length (every real upload has its own), against c_char.from_buffer
  descriptors   the batch's nvjpegImage_t: a field at a time through ctypes, against one (k, 8) uint64 array
  views         a (3, 375, 500) view of the decoded block a photo: a slice and a view each, against one view,
                slice and unbind for a batch of one size

Medians of --repeats, ms a batch; writes <out>.

    PYTHONPATH=. python3 bench/nvjpeg_batch_python.py --out bench/results/2026-12-05-cpu-nvjpeg-batch-python.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from app.codecs.nvjpeg import ALIGN, _Image, first_byte, image_descriptors, plane_views

CHANNELS, HEIGHT, WIDTH = 3, 375, 500


def median_ms(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--photos", type=int, default=128)
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    k = args.photos
    size = CHANNELS * HEIGHT * WIDTH
    padded = (size + ALIGN - 1) // ALIGN * ALIGN
    buffer = bytearray(200_000)
    lengths = iter(range(50_000, 50_000 + k * (args.repeats + 1)))  # a new length for every upload, as in serving

    def address_by_length() -> None:
        for _ in range(k):
            ctypes.addressof((ctypes.c_ubyte * next(lengths)).from_buffer(buffer))

    def address_by_char() -> None:
        for _ in range(k):
            first_byte(buffer)

    offsets, base = [n * padded for n in range(k)], 1 << 40

    def descriptors_by_field() -> None:
        outputs = (_Image * k)()
        for n, offset in enumerate(offsets):
            for c in range(CHANNELS):
                outputs[n].channel[c] = base + offset + c * HEIGHT * WIDTH
                outputs[n].pitch[c] = WIDTH

    shapes = [(HEIGHT, WIDTH)] * k

    def descriptors_by_array() -> None:
        image_descriptors(base, offsets, shapes, CHANNELS)

    block = torch.empty(k * padded, dtype=torch.uint8)

    def views_a_photo() -> None:
        [block[offset : offset + size].view(CHANNELS, HEIGHT, WIDTH) for offset in offsets]

    def views_a_batch() -> None:
        plane_views(block, offsets, shapes, CHANNELS)

    record = {
        "command": f"PYTHONPATH=. python3 bench/nvjpeg_batch_python.py --out {args.out} --photos {k} "
        f"--repeats {args.repeats}",
        "machine": f"{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}",
        "ms_a_batch": {
            "address": {
                "array type a length": median_ms(address_by_length, args.repeats),
                "c_char": median_ms(address_by_char, args.repeats),
            },
            "descriptors": {
                "a field at a time": median_ms(descriptors_by_field, args.repeats),
                "one array": median_ms(descriptors_by_array, args.repeats),
            },
            "views": {
                "a slice and a view a photo": median_ms(views_a_photo, args.repeats),
                "one size, one call": median_ms(views_a_batch, args.repeats),
            },
        },
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["ms_a_batch"], indent=1))


if __name__ == "__main__":
    main()
