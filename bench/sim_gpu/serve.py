"""`app.cli` with the GPU JPEG decoder's stand-in (jpeg_decoder.py) as the service's decoder, on a CPU machine.

    python3 -m bench.sim_gpu.serve serve --device cpu --workers 1 --model-repository <a repository of
        bench/sim_gpu/timed_photos> --front-door-port 8431 ...

One process only (--workers 1, no engine process): the stand-in is put where the service starts its decoder.
"""

from __future__ import annotations

import sys
from typing import Any

import app.service
from app.cli import main
from bench.sim_gpu.jpeg_decoder import TimedJpegDecoder


def start_timed_decoder(setting: str, device: str, *, max_batch: int, launches: int, nvjpeg: str,
                        **_: Any) -> TimedJpegDecoder:  # fmt: skip
    return TimedJpegDecoder((3, 224, 224), max_batch=max_batch, launches=launches, nvjpeg=nvjpeg)


if __name__ == "__main__":
    app.service.start_jpeg_decoder = start_timed_decoder  # type: ignore[assignment]
    sys.exit(main(sys.argv[1:]))
