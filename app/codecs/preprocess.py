"""A decoded image tensor → the model's (C, H, W) uint8 pixels, by its [preprocess], on any device.

The same steps as app/codecs/bodies.py's Pillow path, on torch tensors, so that JPEGs decoded on the
GPU are resized and cropped there too: shorter side → `resize` (bilinear with antialias, the
filter Pillow's BILINEAR downscale uses: torch's antialias was written to match it), centre
`crop` (zero-padded where the image is smaller, as Pillow's crop pads), then a final resize to
the input size if the two still differ (bicubic with antialias standing in for Pillow's LANCZOS).

It differs from Pillow's path by design in one place: Pillow decodes a JPEG at reduced scale
(draft mode, DCT-domain scaling) and shrinks by a whole factor first (reducing_gap); here the
full-size image is filtered at once. tests/unit/test_image_preprocess.py measures what that costs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from app.repository.model_spec import ModelSpec


def shorter_side_size(height: int, width: int, resize: int) -> tuple[int, int]:
    """(H, W) after scaling the shorter side to `resize`, rounded as the Pillow path rounds."""
    scale = resize / min(height, width)
    return max(1, round(height * scale)), max(1, round(width * scale))


def preprocess_tensor(image: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """(C, H, W) uint8 of any size → (C, h, w) uint8 of the model's input, on the image's device: preprocess_batch
    of one image, for the tests and benches that measure one (the GPU decoder resizes a batch's at once)."""
    c = spec.input_shape[0]
    if image.dim() != 3 or image.shape[0] != c or image.dtype != torch.uint8:
        raise ValueError(f"expected a ({c}, H, W) uint8 image, got {tuple(image.shape)} {image.dtype}")
    return preprocess_batch(image.unsqueeze(0), spec)[0]


def preprocess_batch(images: torch.Tensor, spec: ModelSpec) -> torch.Tensor:
    """(k, C, H, W) uint8, k images of one size → (k, C, h, w) uint8 of the model's input, on their
    device: the same few kernels for k images as for one (each image is filtered on its own)."""
    c, h, w = spec.input_shape
    if images.dim() != 4 or images.shape[1] != c or images.dtype != torch.uint8:
        raise ValueError(f"expected (k, {c}, H, W) uint8 images, got {tuple(images.shape)} {images.dtype}")
    resize, crop = spec.preprocess.resize, spec.preprocess.crop
    x = images.float()  # interpolate wants floats
    if resize:
        size = shorter_side_size(x.shape[2], x.shape[3], resize)
        x = F.interpolate(x, size=size, mode="bilinear", antialias=True, align_corners=False)
    if crop:
        # Pillow's box (left, top) = ((W − crop) // 2, (H − crop) // 2), negative for a small image;
        # F.pad with negative widths crops and with positive ones pads zeros: both in one call.
        top, left = (x.shape[2] - crop) // 2, (x.shape[3] - crop) // 2
        x = F.pad(x, (-left, left + crop - x.shape[3], -top, top + crop - x.shape[2]))
    if tuple(x.shape[2:]) != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bicubic", antialias=True, align_corners=False)
    return x.round_().clamp_(0, 255).to(torch.uint8)  # (k, C, h, w)
