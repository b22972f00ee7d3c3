"""app/engines/model_input.py: uint8 pixels become exactly the float32 intensities the host would
make of them (numpy's u8 * float32(1/255)), so a raw body and its JSON twin get the same answer."""

from __future__ import annotations

import numpy as np
import torch

from app.engines.model_input import ModelInput


def test_every_pixel_value_becomes_the_hosts_float32_intensity() -> None:
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 1, 16, 16)
    got = ModelInput(None, None)(torch.from_numpy(pixels))
    assert got.dtype == torch.float32
    np.testing.assert_array_equal(got.numpy(), pixels * np.float32(1 / 255))


def test_pixels_and_their_intensities_normalise_alike() -> None:
    normalise = ModelInput((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    pixels = np.random.default_rng(0).integers(0, 256, (2, 3, 8, 8), dtype=np.uint8)
    from_pixels = normalise(torch.from_numpy(pixels))
    from_floats = normalise(torch.from_numpy(pixels * np.float32(1 / 255)))
    torch.testing.assert_close(from_pixels, from_floats, rtol=0, atol=0)
