"""Fashion-MNIST as numpy arrays, read straight from the IDX gz files.

The files come from the Debian package `dataset-fashion-mnist`; `FASHION_MNIST_DIR` points
elsewhere. Where the package is absent, `load_test_sample()` reads the first 1000 test images
shipped beside this file, so tests and the load test still have real images.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import Literal

import numpy as np

DEBIAN_PACKAGE = "dataset-fashion-mnist"
DATA_DIR = Path(os.environ.get("FASHION_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
TEST_SAMPLE_PATH = Path(__file__).with_name("fashion_mnist_test_sample.npz")

# IDX magic: two zero bytes, a type code (0x08 = uint8), then the number of dimensions.
_IMAGES_MAGIC = 0x00000803  # 3 dims: (N, 28, 28)
_LABELS_MAGIC = 0x00000801  # 1 dim: (N,)
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}

Split = Literal["train", "test"]


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """One IDX file as a uint8 array of the shape its header declares."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: install the Debian package `{DEBIAN_PACKAGE}` "
            f"(apt-get install {DEBIAN_PACKAGE}) or set FASHION_MNIST_DIR to a folder holding it"
        )
    with gzip.open(path, "rb") as f:
        data = bytearray(f.read())  # a bytearray, so the arrays are writable (torch.from_numpy warns otherwise)
    # Header: big-endian uint32 magic, then one big-endian uint32 size per dimension.
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: IDX magic {found:#010x}, expected {magic:#010x}")
    ndim = magic & 0xFF
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, body holds {body.size} bytes")
    return body.reshape(shape)


def load_split(split: Split, data_dir: Path | str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 28, 28), labels int64 (N,)); N is 60000 for train, 10000 for test."""
    if split not in _FILES:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    root = Path(data_dir) if data_dir is not None else DATA_DIR
    images_name, labels_name = _FILES[split]
    images = _read_idx(root / images_name, _IMAGES_MAGIC)
    labels = _read_idx(root / labels_name, _LABELS_MAGIC).astype(np.int64)
    if images.shape[0] != labels.shape[0] or images.shape[1:] != (28, 28):
        raise ValueError(f"{root}: {split} images {images.shape} do not match labels {labels.shape}")
    return images, labels


def load_test_sample() -> tuple[np.ndarray, np.ndarray]:
    """The shipped first 1000 test images: (uint8 (1000, 28, 28), int64 (1000,))."""
    with np.load(TEST_SAMPLE_PATH) as data:
        return data["images"], data["labels"]
