"""Where a batch of JPEG uploads spends its time in the GPU decoder (app/codecs/gpu_jpeg.py), stage by stage.

The service's JPEG uploads reach ~0.1× of ResNet-50's engine peak (run 21a: 2,256 img/s at 256
connections, handler 127 ms of which 0.3 ms queue wait: the requests wait for the decoder). This
times, on the device, one batch of k photos (loadtest/photos.py, 500×375, quality 90, resnet50's
preprocess) through each stage the decoder runs, and then the whole decoder under --clients uploads
in flight:

  decode     torchvision.io.decode_jpeg([k tensors], device): nvJPEG (its hardware engine where the
             GPU has one), host parse and its own stream synchronize included
  resize     per image: preprocess_tensor, k times (the decoder before 367b6d7)
  resize_batched   preprocess_batch on the stacked (k, C, H, W): what the decoder does now
  copy_out   (k, C, 224, 224) → pinned host
  decoder    GpuJpegDecoder.decode from --clients coroutines for --seconds: img/s and mean batch,
             at each --max-batches, and at each --busy-gpu fraction: a thread keeping the device that
             busy with ResNet-50 (torchvision's, fp16, batch 64, one CUDA graph replay at a time on a
             stream of its own), as the engine's batches keep it in the server. In the server the
             decoder's batches took 11 ms for ~32 photos (run 28a) where they take ~2.4 alone (run 21b):
             is it the device the decoder shares?

Stage times are wall-clock medians with the device synchronized around each (a benchmark's own
synchronize; the service never calls one). Writes <out>/jpeg-stages.json.

    python3 bench/jpeg_stages.py --out $OUT/jpeg-stages
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from app.codecs.preprocess import preprocess_batch, preprocess_tensor
from app.repository import read_repository
from loadtest.photos import encode, synthetic_photo

ROOT = Path(__file__).resolve().parents[1]


def timed(run: Callable[[], object], repeats: int) -> float:
    """Median ms of `run`, the device synchronized before and after each."""
    times = []
    for _ in range(repeats + 2):  # two warm-ups
        torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times[2:]), 3)


def stages(photos: list[bytes], spec: Any, device: torch.device, k: int, repeats: int) -> dict[str, float]:
    import torchvision.io

    encoded = [torch.frombuffer(bytearray(photos[i % len(photos)]), dtype=torch.uint8) for i in range(k)]
    mode = torchvision.io.ImageReadMode.RGB
    decoded = torchvision.io.decode_jpeg(encoded, mode=mode, device=device)  # k (3, 375, 500) uint8
    stacked = torch.stack(decoded)
    pixels = preprocess_batch(stacked, spec)
    host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
    result = {
        "decode": timed(lambda: torchvision.io.decode_jpeg(encoded, mode=mode, device=device), repeats),
        "resize": timed(lambda: [preprocess_tensor(image, spec) for image in decoded], repeats),
        "resize_batched": timed(lambda: preprocess_batch(torch.stack(decoded), spec), repeats),
        "copy_out": timed(lambda: host.copy_(pixels, non_blocking=True), repeats),
    }
    result["per_image_ms"] = {name: round(ms / k, 4) for name, ms in result.items()}  # type: ignore[assignment]
    return result


class BusyGpu:
    """A thread replaying ResNet-50 (fp16, (batch, 3, 224, 224)) as one CUDA graph on its own stream, two replays
    at a time, then sleeping, so that the device is busy `fraction` of the time; waits on a blocking event (no
    spinning core, no device-wide synchronize)."""

    def __init__(self, device: torch.device, fraction: float, batch: int = 64) -> None:
        import torchvision

        # The graph reads the weights and the input where they were at capture: they must live as long as it does
        # (as locals they were freed when __init__ returned, and the replays read blocks the allocator gave others).
        self.model = torchvision.models.resnet50().to(device, torch.half).eval().to(memory_format=torch.channels_last)
        images = torch.randn(batch, 3, 224, 224, device=device, dtype=torch.half)
        self.images = images.contiguous(memory_format=torch.channels_last)
        self.fraction, self.stream, self.graph = fraction, torch.cuda.Stream(device), torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.stream(self.stream):
            for _ in range(3):  # cuDNN's choices before the capture
                self.model(self.images)
        self.stream.synchronize()
        with torch.no_grad(), torch.cuda.graph(self.graph, stream=self.stream):
            self.model(self.images)
        self.graph.replay()  # the first replay uploads the graph: not one of the timed ones
        self.stream.synchronize()
        # busy_s: wall time from each pair of replays' launch to its event seen on this thread (the GIL's waits
        # included), what the duty is kept by; device_s: the second replay of each pair timed on the device by CUDA
        # events, what replay_ms_since reports. It is queued behind the first, so a wait for the GIL between its
        # start event and its launch leaves no gap on the stream to be counted (run 47a's direct threads may have
        # made such gaps: bench/results/2026-12-05-run47-h100-jpeg-in-process-launches-gil.md). Another stage's
        # kernels slow it; another thread's Python does not, unless it delays the launch past the first replay.
        self.stop, self.busy_s, self.device_s, self.pairs = threading.Event(), 0.0, 0.0, 0  # pairs: timed replays
        self.thread = threading.Thread(target=self._run, name="busy-gpu", daemon=True)

    def _run(self) -> None:
        began, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True, blocking=True)
        while not self.stop.is_set():
            started = time.perf_counter()
            with torch.cuda.stream(self.stream):
                self.graph.replay()  # the stream's work while this thread records `began` and launches the next
                began.record(self.stream)
                self.graph.replay()
                done.record(self.stream)
            done.synchronize()
            busy = time.perf_counter() - started
            device_s = began.elapsed_time(done) / 1e3
            self.busy_s, self.device_s, self.pairs = self.busy_s + busy, self.device_s + device_s, self.pairs + 1
            time.sleep(busy * (1 - self.fraction) / self.fraction)

    def replay_window(self) -> tuple[float, int]:
        """Where the replays stand now, for replay_ms_since."""
        return self.device_s, self.pairs

    def replay_ms_since(self, window: tuple[float, int]) -> float | None:
        """The timed replays' mean time on the device since `window` (CUDA events around the second of each pair),
        ms; None if none ended."""
        device_s, pairs = self.device_s - window[0], self.pairs - window[1]
        return round(device_s / pairs * 1e3, 3) if pairs else None

    def __enter__(self) -> BusyGpu:
        self.started = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        self.duty = self.busy_s / (time.perf_counter() - self.started)


def stage_sums() -> dict[str, tuple[float, float]]:
    """The decoder's histograms now, (sum, count) by name: a batch's stages, its whole time, an upload's wait."""
    from app.ops import metrics

    sums: dict[str, tuple[float, float]] = {}
    for histogram in (metrics.GPU_JPEG_STAGE, metrics.GPU_JPEG_BATCH_SECONDS, metrics.GPU_JPEG_WAIT):
        for family in histogram.collect():
            for sample in family.samples:
                if sample.name.endswith(("_sum", "_count")):
                    name = sample.labels.get("stage", family.name)
                    total, count = sums.get(name, (0.0, 0.0))
                    is_sum = sample.name.endswith("_sum")
                    sums[name] = (total + sample.value, count) if is_sum else (total, sample.value)
    return sums


async def decoder_rate(photos: list[bytes], spec: Any, device: str, clients: int, seconds: float, max_batch: int,
                       nvjpeg: str = "torchvision") -> dict[str, Any]:  # fmt: skip
    from app.codecs.gpu_jpeg import GpuJpegDecoder

    decoder = GpuJpegDecoder(device, max_batch=max_batch, nvjpeg=nvjpeg)
    done = 0
    stop = time.monotonic() + seconds

    async def client(i: int) -> None:
        nonlocal done
        while time.monotonic() < stop:
            await decoder.decode(photos[(i + done) % len(photos)], spec)
            done += 1

    try:
        await asyncio.gather(*(client(i) for i in range(clients)))  # warm-up: the first launches
        done, stop = 0, time.monotonic() + seconds
        launched = (decoder.batches_launched, decoder.images_launched)
        before = stage_sums()
        started = time.monotonic()
        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.monotonic() - started
    finally:
        decoder.close()
    batches, images = decoder.batches_launched - launched[0], decoder.images_launched - launched[1]
    after = stage_sums()
    stage_ms = {name: round((after[name][0] - s) / max(after[name][1] - n, 1) * 1000, 3) for name, (s, n) in
                before.items()}  # fmt: skip
    return {
        "nvjpeg": decoder.nvjpeg,
        "launches": decoder.launches,  # the decoder's own count where none was asked for (3 direct, 2 torchvision)
        "stage_ms": stage_ms,
        "images_per_s": round(done / elapsed, 1),
        "mean_batch": round(images / max(batches, 1), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--batches", default="1,8,32,128")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--max-batches", default="32,128")
    parser.add_argument("--busy-gpu", default="0", help="fractions of the time the device is kept busy, e.g. 0,0.5")
    parser.add_argument("--nvjpeg", default="direct,torchvision", help="the decoder's CGSERVE_JPEG_NVJPEG values")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sys.setswitchinterval(0.001)  # the service's (CGSERVE_SWITCH_INTERVAL_MS): the launch threads' turns at the GIL
    spec = next(s for s in read_repository(ROOT / "models/examples/repository") if s.name == "resnet50")
    photos = [encode(synthetic_photo(500, 375, seed=i), quality=90) for i in range(16)]
    device = torch.device(args.device)
    flags = vars(args).items()
    record: dict[str, Any] = {
        "command": " ".join(["python3 bench/jpeg_stages.py", *(f"--{k.replace('_', '-')} {v}" for k, v in flags)]),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "photos": "loadtest/photos.py synthetic_photo 500×375, quality 90, 16 seeds",
        "stages_ms": {},
        "decoder": {},
    }
    for k in map(int, args.batches.split(",")):
        record["stages_ms"][f"k{k}"] = stages(photos, spec, device, k, args.repeats)
        print(f"k={k}: {record['stages_ms'][f'k{k}']}", flush=True)
    for fraction in map(float, args.busy_gpu.split(",")):
        for max_batch in map(int, args.max_batches.split(",")):
            for nvjpeg in args.nvjpeg.split(","):
                busy = BusyGpu(device, fraction) if fraction > 0 else None
                with busy or contextlib.nullcontext():
                    rate = asyncio.run(
                        decoder_rate(photos, spec, args.device, args.clients, args.seconds, max_batch, nvjpeg)
                    )
                if busy is not None:  # its whole time: the decoder's warm-up and the measured seconds
                    rate |= {"busy_duty": round(busy.duty, 3), "busy_replays": 2 * busy.pairs}
                key = f"max_batch_{max_batch}" + (f"_busy_{fraction}" if busy else "") + f"_{nvjpeg}"
                record["decoder"][key] = rate
                print(f"decoder ({nvjpeg}), {args.clients} clients, max_batch {max_batch}, device busy {fraction}: "
                      f"{rate}", flush=True)  # fmt: skip
    (args.out / "jpeg-stages.json").write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
