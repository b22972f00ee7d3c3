"""nvImageCodec's decoders beside torchvision's nvJPEG: a batch's time, its CPU and the GIL it holds.

The engine process decodes every worker's JPEG uploads (app/codecs/gpu_jpeg.py, torchvision's
batched decode_jpeg) and reached 0.32× of ResNet-50's engine peak on the H200 with ~1.8 cores
busy: the process, not the device, is the limit. What a decoder costs that process is its CPU a
photo and how long it holds the GIL (what the event loop, which batches and answers, cannot run
meanwhile). This times one batch of k photos (loadtest/photos.py, 500×375, quality 90) through:

  torchvision      torchvision.io.decode_jpeg([k uint8 tensors], device): the service's decoder
  nvimgcodec-<kind>  nvidia.nvimgcodec.Decoder(backends=[kind]).decode([k CodeStreams]), planar RGB,
                   each Image as a (3, H, W) tensor on the device (its __cuda_array_interface__);
                   kinds: hw (HW_GPU_ONLY: the GPU's JPEG engines), gpu (GPU_ONLY: CUDA Huffman),
                   hybrid (HYBRID_CPU_GPU)

and for each: the wall-clock median ms until the batch's work on the device is done (waited for on
a blocking event: the thread sleeps), the process's CPU µs a photo (every thread, time.process_time),
the ms of the batch a Python thread counting beside it could not run (the GIL held by the call, or
the main thread's wait to take it back), and the largest difference from torchvision's pixels
(run 26d: 93–130 levels for nvImageCodec, whose colour conversion or upsampling differs; not studied).
Run 26d's figures came from an earlier version whose torch.cuda.synchronize spun a core: its CPU a
photo was wall time ÷ k, and its GIL shares were diluted by the probe.

--busy-gpu 0.5,0.9 times each decoder again beside a thread keeping the device that busy with ResNet-50,
as the engine keeps it in the server: torchvision runs nvJPEG on a stream of PyTorch's low-priority
pool (run 28b: a quarter of its rate lost at half duty), where the GPU's JPEG engines (hw) decode
off the SMs and nvImageCodec takes a stream of ours (hw-high: torch's highest priority).

nvImageCodec is not a dependency: `pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg` (the H200
has no network: wheels carried, bench/results/README.md's run 26d says how). Without it only
torchvision runs. Writes <out>/jpeg-hw-decode.json.

    python3 bench/jpeg_hw_decode.py --out $OUT/jpeg-hw-decode
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.jpeg_stages import BusyGpu
from loadtest.photos import encode, synthetic_photo


class GilProbe:
    """A Python thread counting as fast as it can while switched on: its count during a call against its
    count with the main thread asleep says how much of the call's time it could not run (the GIL held by
    the call). Off while wall and CPU are timed: it would take the GIL from them."""

    def __init__(self) -> None:
        self.count = 0
        self.on = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop:
            self.on.wait()
            self.count += 1

    def idle_rate(self, seconds: float) -> float:
        self.on.set()
        start, began = self.count, time.perf_counter()
        time.sleep(seconds)
        rate = (self.count - start) / (time.perf_counter() - began)
        self.on.clear()
        return rate

    def close(self) -> None:
        self._stop = True
        self.on.set()
        self._thread.join()


def finished(stream: torch.cuda.Stream) -> None:
    """Wait for `stream`'s work asleep: torch.cuda.synchronize spins a core (run 26d's CPU figures were
    its spinning, wall time ÷ k), a blocking event's wait does not."""
    done = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
    done.record(stream)
    done.synchronize()


def measured(
    run: Callable[[], object], stream: torch.cuda.Stream, k: int, repeats: int, probe: GilProbe, idle_rate: float
) -> dict[str, float]:
    """Median wall ms of `run` (until its work on `stream`, where it leaves its output, is done), CPU µs a
    photo (the probe off), and the ms of a batch the probe could not run (a second pass, the probe on: the
    GIL held by the call, or the time the main thread waited to take it back from the probe)."""
    walls, cpus, held = [], [], []
    for i in range(repeats + 2):  # two warm-ups
        finished(stream)
        cpu, started = time.process_time(), time.perf_counter()
        run()
        finished(stream)
        if i >= 2:
            walls.append((time.perf_counter() - started) * 1000)
            cpus.append((time.process_time() - cpu) / k * 1e6)
    probe.on.set()
    try:
        for _ in range(repeats):
            finished(stream)
            count, started = probe.count, time.perf_counter()
            run()
            finished(stream)
            ran = (probe.count - count) / idle_rate
            held.append(max(0.0, time.perf_counter() - started - ran) * 1000)
    finally:
        probe.on.clear()
    return {
        "wall_ms": round(statistics.median(walls), 3),
        "cpu_us_a_photo": round(statistics.median(cpus), 1),
        "probe_held_off_ms": round(statistics.median(held), 3),
    }


def nvimgcodec_decode(
    kind: str, device: torch.device, stream: torch.cuda.Stream
) -> Callable[[list[bytes]], list[torch.Tensor]] | str:
    """A function decoding a batch to (3, H, W) uint8 tensors on `device` with nvImageCodec's `kind` backend,
    its output ordered on `stream`, or why there is none."""
    try:
        from nvidia import nvimgcodec
    except ImportError as error:
        return f"nvimgcodec not installed: {error}"
    kinds = {"hw": "HW_GPU_ONLY", "gpu": "GPU_ONLY", "hybrid": "HYBRID_CPU_GPU"}
    backend = nvimgcodec.Backend(getattr(nvimgcodec.BackendKind, kinds[kind]))
    decoder = nvimgcodec.Decoder(device_id=device.index or 0, backends=[backend])
    params = nvimgcodec.DecodeParams(color_spec=nvimgcodec.ColorSpec.SRGB, sample_format=nvimgcodec.SampleFormat.P_RGB)

    def decode(photos: list[bytes]) -> list[torch.Tensor]:
        images = decoder.decode(
            [nvimgcodec.CodeStream(p) for p in photos], params=params, cuda_stream=stream.cuda_stream
        )
        if any(image is None for image in images):
            raise RuntimeError(
                f"nvimgcodec's {kind} backend decoded {sum(i is not None for i in images)} of {len(images)}"
            )
        tensors = [torch.as_tensor(image, device=device) for image in images]  # planar: (3, H, W) uint8
        return [t if t.shape[0] == 3 else t.permute(2, 0, 1) for t in tensors]  # (H, W, 3) where interleaved

    return decode


def nvimgcodec_version() -> str | None:
    try:
        from nvidia import nvimgcodec
    except ImportError:
        return None
    return str(nvimgcodec.__version__)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--batches", default="1,32,128")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--kinds", default="hw,gpu,hybrid", help="nvImageCodec's backends; hw-high: hw on a "
                        "high-priority stream of ours, ahead of the busy device's kernels")  # fmt: skip
    parser.add_argument("--busy-gpu", default="0", help="for each fraction, a thread keeps the device that "
                        "busy with ResNet-50 meanwhile (jpeg_stages.py's BusyGpu), as the engine does")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torchvision.io

    device = torch.device(args.device)
    photos = [encode(synthetic_photo(500, 375, seed=i), quality=90) for i in range(16)]
    record: dict[str, Any] = {
        "command": "python3 bench/jpeg_hw_decode.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "photos": "loadtest/photos.py synthetic_photo 500×375, quality 90, 16 seeds",
        "torchvision": torchvision.__version__,
        "nvimgcodec": nvimgcodec_version(),
        "points": {},
    }
    sys.setswitchinterval(0.001)  # the service's (CGSERVE_SWITCH_INTERVAL_MS): how long a thread holds the GIL
    probe = GilProbe()
    idle_rate = probe.idle_rate(0.5)
    record["probe_idle_counts_a_s"] = round(idle_rate)
    # name → (decode, the stream its output is ordered on)
    decoders: dict[str, tuple[Callable[[list[bytes]], list[torch.Tensor]], torch.cuda.Stream]] = {}
    mode = torchvision.io.ImageReadMode.RGB
    current = torch.cuda.current_stream(device)

    def torchvision_decode(batch: list[bytes]) -> list[torch.Tensor]:
        encoded = [torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in batch]
        return list(torchvision.io.decode_jpeg(encoded, mode=mode, device=device))  # the current stream waits

    decoders["torchvision"] = (torchvision_decode, current)
    high = torch.cuda.Stream(device, priority=-1)  # torch's highest: ahead of every stream at priority 0
    for name in args.kinds.split(","):
        kind, stream = (name.removesuffix("-high"), high) if name.endswith("-high") else (name, current)
        try:
            made = nvimgcodec_decode(kind, device, stream)
        except Exception as error:  # a backend this build or GPU does not offer
            made = f"{type(error).__name__}: {error}"[:500]
        if isinstance(made, str):
            record["points"][f"nvimgcodec-{name}"] = {"error": made}
            continue
        decoders[f"nvimgcodec-{name}"] = (made, stream)
    try:
        for fraction in map(float, args.busy_gpu.split(",")):
            busy = BusyGpu(device, fraction) if fraction > 0 else contextlib.nullcontext()
            with busy:
                for k in map(int, args.batches.split(",")):
                    batch = [photos[i % len(photos)] for i in range(k)]
                    reference = torchvision_decode(batch)
                    for name, (decode, stream) in decoders.items():
                        key = f"{name}-k{k}" + (f"-busy{fraction:g}" if fraction > 0 else "")
                        try:
                            out = decode(batch)
                            point: dict[str, Any] = measured(
                                partial(decode, batch), stream, k, args.repeats, probe, idle_rate
                            )
                            point["max_level_difference"] = max(
                                int((a.int() - b.int()).abs().max()) for a, b in zip(out, reference, strict=True)
                            )
                        except Exception as error:  # a backend this GPU lacks, a refused photo: the rest go on
                            point = {"error": f"{type(error).__name__}: {error}"[:500]}
                        record["points"][key] = point
                        print(f"{key}: {point}", flush=True)
            if isinstance(busy, BusyGpu):
                record[f"busy{fraction:g}_duty"] = round(busy.duty, 3)
                print(f"busy {fraction:g}: device duty {busy.duty:.3f}", flush=True)
    finally:
        probe.close()
    (args.out / "jpeg-hw-decode.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
