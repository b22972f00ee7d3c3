"""What two hostile images cost before and after their mends (eighteenth session), on the CPU, in one run.

- A progressive JPEG of 20,000 scans, 1024×1024 grey (tests/hostile_images.py's scan_bomb): Pillow's decode of it
  (what a decode thread spent before the scan limit), against decode_image's refusal now.
- The shipped 1000 Fashion-MNIST test images as 16-bit grey PNGs (each value × 257): the seed CNN's accuracy on
  decode_image's pixels now, on Pillow's convert("L") of them (what decode_image did before: clipped at 255), and
  on the same images as 8-bit PNGs.

    PYTHONPATH=. python3 bench/hostile_images.py --out bench/results/<name>.json
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from app.codecs.bodies import decode_image
from app.config import DEFAULT_REPOSITORY
from app.errors import InputError
from app.repository import read_repository
from loadtest.photos import encode
from models.cnn import load_model
from models.fashion_mnist import load_test_sample
from tests.hostile_images import scan_bomb

LIMIT = 1024 * 1024


def scan_bomb_seconds(scans: int) -> dict[str, float]:
    bomb = scan_bomb(scans, side=1024)
    started = time.perf_counter()
    with Image.open(io.BytesIO(bomb)) as image:
        image.load()
    pillow_s = time.perf_counter() - started
    spec = next(iter(read_repository(DEFAULT_REPOSITORY)))
    started = time.perf_counter()
    try:
        decode_image(bomb, max_pixels=LIMIT, spec=spec)
        refusal = ""
    except InputError as error:
        refusal = str(error)
    return {"bytes": len(bomb), "pillow_decode_s": pillow_s, "refused_s": time.perf_counter() - started,
            "refusal": refusal}  # fmt: skip


@torch.inference_mode()
def accuracy(pixels: np.ndarray, labels: np.ndarray) -> float:
    """(N, 28, 28) uint8 → the seed CNN's share right."""
    scores = load_model()(torch.from_numpy(pixels).unsqueeze(1).float().div_(255.0))
    return float((scores.argmax(1).numpy() == labels).mean())


def sixteen_bit_accuracy() -> dict[str, float]:
    images, labels = load_test_sample()
    spec = next(iter(read_repository(DEFAULT_REPOSITORY)))
    pngs8 = [encode(image, "PNG") for image in images]
    pngs16 = [encode(image.astype(np.uint16) * 257, "PNG") for image in images]

    def decoded(pngs: list[bytes]) -> np.ndarray:
        return np.stack([decode_image(png, max_pixels=LIMIT, spec=spec)[0, 0] for png in pngs])

    clipped = np.stack([np.asarray(Image.open(io.BytesIO(png)).convert("L")) for png in pngs16])
    return {
        "images": len(images),
        "png8": accuracy(decoded(pngs8), labels),
        "png16_now": accuracy(decoded(pngs16), labels),
        "png16_clipped_before": accuracy(clipped, labels),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    result = {"command": "PYTHONPATH=. python3 bench/hostile_images.py --out " + str(a.out),
              "scan_bomb_20000": scan_bomb_seconds(20_000), "sixteen_bit_png": sixteen_bit_accuracy()}  # fmt: skip
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
