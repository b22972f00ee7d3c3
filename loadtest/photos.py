"""Photo-like test images, made here (no data set to fetch): the JPEG decoders' tests and benchmark.

A photo has smooth shading, sharp-edged objects and sensor noise; each of those stresses another
part of a JPEG decoder and resizer (low frequencies, ringing at edges, high frequencies).
`fashion_photo` upscales a real Fashion-MNIST test image into an RGB photo of a garment, so the
classifier sees the kind of picture it was made for.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def synthetic_photo(width: int, height: int, seed: int = 0) -> np.ndarray:
    """(height, width, 3) uint8: colour gradients, a dozen solid discs and Gaussian noise (σ 6 levels)."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:height, 0:width]
    y, x = rows / max(width, height), cols / max(width, height)
    image = np.stack(
        [128 + 100 * np.sin(6 * x + 2 * y), 128 + 100 * np.cos(4 * y - 3 * x), 128 + 90 * np.sin(9 * x * y)], axis=-1
    )
    for _ in range(12):
        cx, cy, radius = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(1, max(2, width / 5))
        image[(cols - cx) ** 2 + (rows - cy) ** 2 < radius**2] = rng.uniform(0, 255, 3)
    image += rng.normal(0, 6, image.shape)
    photo: np.ndarray = np.clip(image, 0, 255).astype(np.uint8)
    return photo


def fashion_photo(image: np.ndarray, width: int, height: int, seed: int = 0) -> np.ndarray:
    """A (28, 28) grey Fashion-MNIST image → (height, width, 3) uint8: upscaled (bicubic), tinted, on noise."""
    rng = np.random.default_rng(seed)
    side = min(width, height)
    garment = np.asarray(Image.fromarray(image).resize((side, side), Image.Resampling.BICUBIC), dtype=np.float64)
    canvas = np.zeros((height, width, 3))
    top, left = (height - side) // 2, (width - side) // 2
    canvas[top : top + side, left : left + side] = garment[..., None] * rng.uniform(0.6, 1.0, 3)
    canvas += rng.normal(0, 4, canvas.shape)
    return np.clip(canvas, 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray | Image.Image, format: str = "JPEG", **options: object) -> bytes:
    """(H, W, 3) or (H, W) uint8, or a Pillow image (a CMYK one) → the file's bytes, e.g. encode(p, quality=90)."""
    image = pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels)
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()
