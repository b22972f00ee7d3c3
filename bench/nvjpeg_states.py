"""nvJPEG's hardware decoder called directly, a state a thread, against torchvision's decode_jpeg: does a
second decoder state decode more photos a second, beside a busy device?

torchvision decodes one batch at a time in a process (a lock over the batch, then a synchronize of its
stream); app/codecs/nvjpeg.py gives each launch thread a state of its own. This measures, for each
--threads count, T threads each decoding batches of --batch photos (loadtest/photos.py, 500×375,
quality 90) for --seconds, each waiting for its own batch's event before its next (asleep: a blocking
event), as the launch threads do. --batch may list sizes, taken in turn: the server's batches vary with the
load, and a batch larger than the state's buffers makes nvJPEG reallocate them (a cudaFree waits for the device):

  torchvision   torchvision.io.decode_jpeg([k tensors], device) from every thread (its lock: one at a time)
  direct        app/codecs/nvjpeg.py's BatchDecoder, one a thread, its stream at each of --priorities
  direct-pre    the same, each state preallocated (BatchDecoder.preallocate) for the largest --batch of
                --preallocate's WIDTHxHEIGHT (with --preallocate; the device memory it took is recorded)
  direct-handles  direct, but each thread's state made from a handle of its own (NvJpeg()), where the server's
                states share one: whether the handle serializes their hardware decodes (run 60 saw the JPEG
                engines half busy while the server's three states were the limit; run 61: it does not, the
                shared handle as fast or faster at 2-4 threads)

img/s and the process's CPU µs a photo, idle and at each --busy-gpu fraction (jpeg_stages.py's BusyGpu:
ResNet-50 replays keeping the device that busy, as the engine does in the server). Beside a busy device each point
also gives ResNet-50's mean replay time on the device while it decoded (`busy_queued_replay_ms`: CUDA events around
the second of two queued replays, so that a wait for the GIL before its launch is not counted; run 46e's
`busy_replay_ms` was wall time on BusyGpu's thread, and run 47a's timed a lone replay, host gaps included), and
`busyF-queued-replay-ms-alone` the same with no decoder: which of the two stages slows the other on one device.

First it checks the direct decoder's pixels against torchvision's, photo by photo, for the kinds of JPEG
uploads bring (4:2:0, 4:2:2, 4:4:4, grayscale, odd sizes, progressive: the hardware refuses the last,
which the decoder hands to torchvision), in RGB and in gray: the same library, so the same levels.

    python3 bench/nvjpeg_states.py --out $OUT/nvjpeg-states
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from app.codecs.nvjpeg import UNSUPPORTED, NvJpeg, photo_size
from bench.jpeg_stages import BusyGpu
from loadtest.photos import encode, synthetic_photo


def equality(nvjpeg: NvJpeg, device: torch.device) -> dict[str, Any]:
    """Per kind of photo and mode: the largest level difference from torchvision's decode, or what happened."""
    import torchvision.io

    photo = synthetic_photo(500, 375, seed=1)
    odd = synthetic_photo(333, 251, seed=2)
    kinds = {
        "420": encode(photo, quality=90),
        "422": encode(photo, quality=90, subsampling=1),
        "444": encode(photo, quality=90, subsampling=0),
        "gray": encode(Image.fromarray(photo).convert("L"), quality=90),
        "odd-333x251": encode(odd, quality=75),
        "tiny-28x28": encode(synthetic_photo(28, 28, seed=3), quality=90),
        "progressive": encode(photo, quality=90, progressive=True),
    }
    decoder = nvjpeg.decoder(device)
    out: dict[str, Any] = {}
    for gray, mode in ((False, torchvision.io.ImageReadMode.RGB), (True, torchvision.io.ImageReadMode.GRAY)):
        buffers = [bytearray(data) for data in kinds.values()]
        images, done = decoder.decode(buffers, gray=gray)
        done.synchronize()
        for (name, data), image in zip(kinds.items(), images, strict=True):
            key = f"{name}-{'gray' if gray else 'rgb'}"
            if isinstance(image, str):
                out[key] = "unsupported: torchvision's" if image == UNSUPPORTED else image
                continue
            reference = torchvision.io.decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode,
                                                   device=device)  # fmt: skip
            if reference.shape != image.shape:
                out[key] = f"shape {tuple(image.shape)} against torchvision's {tuple(reference.shape)}"
                continue
            out[key] = int((image.int() - reference.int()).abs().max())
    return out


def rate(kind: str, nvjpeg: NvJpeg, device: torch.device, photos: list[bytes], threads: int, batches: list[int],
         seconds: float, priority: int = 0, preallocate: tuple[int, int] | None = None
         ) -> dict[str, float]:  # fmt: skip
    """Photos a second and CPU µs a photo, `threads` threads each decoding batches of `batches`' sizes in turn,
    the direct decoder's streams at torch.cuda.Stream's `priority` (torchvision's decode runs on a stream of its
    own), its states preallocated for the largest batch of `preallocate`'s (width, height) where given."""
    import torchvision.io

    mode = torchvision.io.ImageReadMode.RGB
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)
    free_before = _free_after_torch_s_cache(device)

    def run(n: int) -> None:
        buffers = [bytearray(photos[(n + i) % len(photos)]) for i in range(max(batches))]
        tensors = [torch.frombuffer(b, dtype=torch.uint8) for b in buffers]
        with torch.cuda.device(device):  # the handle, the state, its stream and its preallocation on --device
            own = NvJpeg() if kind == "direct-handles" else None  # closed as the thread ends
            decoder = (own or nvjpeg).decoder(device, priority) if kind.startswith("direct") else None
            if decoder is not None and preallocate is not None:
                decoder.preallocate(max(batches), *preallocate)
            stream = torch.cuda.Stream(device, priority=priority)

        def one_batch(k: int) -> None:
            if decoder is not None:
                _, done = decoder.decode(buffers[:k], gray=False)
            else:
                torchvision.io.decode_jpeg(tensors[:k], mode=mode, device=device)  # our stream waits for its own
                done = torch.cuda.Event(blocking=True)
                done.record(stream)
            done.synchronize()

        with torch.cuda.device(device), torch.cuda.stream(stream):
            for k in batches[:1] * 3:  # warm-up at the first size only: later sizes meet the state as serving does
                one_batch(k)
            start.wait()
            turn = n  # the threads' sizes out of step, as launches' are
            while not stop.is_set():
                k = batches[turn % len(batches)]
                one_batch(k)
                counts[n] += k
                turn += 1
        if own is not None:
            own.close()

    workers = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    cpu, began = time.process_time(), time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    decoded = sum(counts)
    # nvJPEG's own allocations (its states live until the handle closes), not torch's cached blocks
    taken_mb = (free_before - _free_after_torch_s_cache(device)) / 2**20
    return {"images_per_s": round(decoded / elapsed, 1), "cpu_us_a_photo": round(cpu / max(decoded, 1) * 1e6, 1),
            "device_mb_taken": round(taken_mb)}  # fmt: skip


def _free_after_torch_s_cache(device: torch.device) -> int:
    """The device's free bytes once its work is done and torch's caching allocator has let its idle blocks go."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--batch", default="64", help="photos a batch; several, e.g. 16,128,40: taken in turn")
    parser.add_argument("--preallocate", default="", help="WIDTHxHEIGHT: also the direct-pre kind")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--busy-gpu", default="0,0.6")
    parser.add_argument("--busy-batch", type=int, default=64, help="ResNet-50's rows a replay beside the decoders "
                        "(the server's engine replays 128 at 1024 connections)")  # fmt: skip
    parser.add_argument(
        "--priorities", default="0", help="the direct decoder's stream priorities, e.g. 0,-1 (lower is sooner)"
    )
    parser.add_argument(
        "--kinds",
        default="torchvision,direct,direct-pre",
        help="which kinds, in this order (direct-pre needs --preallocate): torchvision, direct, direct-pre, "
        "direct-handles",
    )
    args = parser.parse_args()
    known = ("torchvision", "direct", "direct-pre", "direct-handles")
    if unknown := set(args.kinds.split(",")) - set(known):
        parser.error(f"--kinds: {', '.join(sorted(unknown))} not one of {', '.join(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    import torchvision

    device = torch.device(args.device)
    nvjpeg = NvJpeg()
    flags = vars(args).items()
    record: dict[str, Any] = {
        "command": "python3 bench/nvjpeg_states.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in flags),
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "libnvjpeg": nvjpeg.library.path,
        "photos": "loadtest/photos.py synthetic_photo 500×375, quality 90, 16 seeds",
    }
    record["max_level_difference_from_torchvision"] = equality(nvjpeg, device)
    print(json.dumps(record, indent=1), flush=True)
    photos = [encode(synthetic_photo(500, 375, seed=i), quality=90) for i in range(16)]
    batches = [int(k) for k in args.batch.split(",")]
    preallocate = photo_size(args.preallocate)
    points: dict[str, Any] = {}
    for fraction in map(float, args.busy_gpu.split(",")):
        busy = BusyGpu(device, fraction, args.busy_batch) if fraction > 0 else None
        with busy or contextlib.nullcontext():
            if busy is not None:  # ResNet-50's replays with no decoder beside them: busy_queued_replay_ms's baseline
                alone = busy.replay_window()
                time.sleep(args.seconds)
                points[f"busy{fraction:g}-queued-replay-ms-alone"] = busy.replay_ms_since(alone)
            for threads in map(int, args.threads.split(",")):
                priorities = [int(p) for p in args.priorities.split(",")]
                kinds = [
                    (kind, priority)
                    for kind in args.kinds.split(",")
                    for priority in ([0] if kind == "torchvision" else priorities)
                    if kind != "direct-pre" or preallocate
                ]
                for kind, priority in kinds:
                    key = f"{kind}-t{threads}" + (f"-p{priority}" if priority else "")
                    key += f"-busy{fraction:g}" if busy else ""
                    size = preallocate if kind == "direct-pre" else None
                    window = busy.replay_window() if busy else None
                    points[key] = rate(kind, nvjpeg, device, photos, threads, batches, args.seconds, priority, size)
                    if busy is not None and window is not None:  # does this decoder slow ResNet-50's, as they slow it?
                        points[key]["busy_queued_replay_ms"] = busy.replay_ms_since(window)
                    print(key, points[key], flush=True)
        if busy is not None:
            points[f"busy{fraction:g}-duty"] = round(busy.duty, 3)
    record["points"] = points
    (args.out / "nvjpeg-states.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
