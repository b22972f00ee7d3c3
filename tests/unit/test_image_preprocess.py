"""preprocess_tensor / preprocess_batch (the GPU decoder's resize and crop, here on the CPU) against Pillow's, in
app/codecs/bodies.py."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from app.codecs.bodies import decode_image
from app.codecs.preprocess import preprocess_batch, preprocess_tensor
from app.repository import read_repository
from app.repository.model_config import ModelConfig, Preprocess
from app.repository.model_spec import ModelSpec
from loadtest.photos import encode, synthetic_photo

EXAMPLES = Path(__file__).resolve().parents[2] / "models" / "examples" / "repository"
RESNET50 = next(spec for spec in read_repository(EXAMPLES) if spec.name == "resnet50")  # resize 256, crop 224
NO_LIMIT = 1 << 30


def spec_with(input_shape: tuple[int, int, int], **preprocess: int) -> ModelSpec:
    config = ModelConfig(
        format="python", factory="m:f", input_shape=input_shape, labels=["a", "b"], preprocess=Preprocess(**preprocess)
    )
    return ModelSpec("m", Path("."), config, ("a", "b"))


def full_size_tensor(data: bytes, color: str = "RGB") -> torch.Tensor:
    """(C, H, W) uint8 as a full-size decoder (nvJPEG) gives it: Pillow without draft mode."""
    pixels = np.array(Image.open(io.BytesIO(data)).convert(color))
    return torch.from_numpy(pixels.reshape(*pixels.shape[:2], -1)).permute(2, 0, 1).contiguous()


def level_difference(data: bytes, spec: ModelSpec) -> np.ndarray:
    pillow = decode_image(data, max_pixels=NO_LIMIT, spec=spec)[0].astype(np.int16)  # (C, h, w)
    tensor = preprocess_tensor(full_size_tensor(data, spec.config.color), spec).numpy().astype(np.int16)
    assert tensor.shape == pillow.shape == spec.input_shape
    return np.abs(pillow - tensor)


@pytest.mark.parametrize("size", [(500, 375), (375, 500), (1920, 1080), (200, 150), (100, 90)])
def test_resize_and_crop_agree_with_pillow_within_one_level(size: tuple[int, int]) -> None:
    # PNG: both sides see the same pixels, so only the resize and crop can differ.
    difference = level_difference(encode(synthetic_photo(*size), "PNG"), RESNET50)
    assert difference.max() <= 1 and difference.mean() < 0.25


def test_a_large_jpeg_differs_by_pillows_reduced_scale_decode_only() -> None:
    # Pillow decodes a 1920×1080 JPEG at 1/4 scale (draft mode) before resizing; a full-size
    # decode then resize differs mostly at sharp edges: 0.6 levels on average when measured.
    difference = level_difference(encode(synthetic_photo(1920, 1080), quality=90), RESNET50)
    assert difference.mean() < 1.0


@pytest.mark.parametrize(
    ("shape", "preprocess", "image_size"),
    [
        ((3, 40, 40), {"crop": 40}, (30, 20)),  # crop larger than the image: zero padding, as Pillow's crop
        ((3, 32, 48), {"resize": 64, "crop": 40}, (120, 90)),  # crop then a final resize to 48×32
        ((1, 28, 28), {}, (280, 280)),  # the seed CNN's grey path: a final resize only
    ],
)
def test_padding_crops_and_final_resizes_follow_pillow(
    shape: tuple[int, int, int], preprocess: dict[str, int], image_size: tuple[int, int]
) -> None:
    spec = spec_with(shape, **preprocess)
    difference = level_difference(encode(synthetic_photo(*image_size), "PNG"), spec)
    # The final resize is bicubic against Pillow's Lanczos: close, not identical.
    assert difference.mean() < 1.5


def test_a_wrong_tensor_is_refused_with_the_expected_shape() -> None:
    with pytest.raises(ValueError, match=r"expected a \(3, H, W\) uint8 image, got \(1, 10, 10\)"):
        preprocess_tensor(torch.zeros(1, 10, 10, dtype=torch.uint8), RESNET50)


def test_a_batch_of_one_size_equals_each_image_on_its_own() -> None:
    # The GPU decoder resizes same-size images together: the batch must not mix them (antialias,
    # padding and rounding are per image).
    images = torch.stack([full_size_tensor(encode(synthetic_photo(500, 375, seed=i), "PNG")) for i in range(3)])
    batch = preprocess_batch(images, RESNET50)  # (3, 3, 224, 224)
    assert batch.shape == (3, *RESNET50.input_shape)
    for image, row in zip(images, batch, strict=True):
        assert torch.equal(row, preprocess_tensor(image, RESNET50))


def test_a_wrong_batch_is_refused_with_the_expected_shape() -> None:
    with pytest.raises(ValueError, match=r"expected \(k, 3, H, W\) uint8 images, got \(3, 10, 10\)"):
        preprocess_batch(torch.zeros(3, 10, 10, dtype=torch.uint8), RESNET50)
