"""The CPU eager engine: what padding rows hold never changes the real rows' answers."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from app.engines.cpu_eager import CpuEagerEngine
from models.cnn import load_model
from tests.seed_model import seed_spec


def test_padding_rows_never_change_real_rows() -> None:
    engine = CpuEagerEngine(load_model(), seed_spec(), (1, 8))
    slot = engine.slots[0]
    rng = np.random.default_rng(0)
    real = rng.random((3, 1, 28, 28), dtype=np.float32)
    answers = []
    for padding in (np.zeros((5, 1, 28, 28), np.float32), rng.random((5, 1, 28, 28), dtype=np.float32)):
        slot.inputs["float32"][:3], slot.inputs["float32"][3:8] = real, padding
        asyncio.run(engine.run(slot, 8, "float32"))
        answers.append(slot.outputs[:3].copy())
    engine.close()
    np.testing.assert_array_equal(answers[0], answers[1])
    with torch.inference_mode():
        want = torch.softmax(load_model()(torch.from_numpy(real)), dim=1).numpy()
    np.testing.assert_allclose(answers[0], want, rtol=1e-4, atol=1e-6)


def test_uint8_pixels_give_the_same_answer_as_their_float_intensities() -> None:
    engine = CpuEagerEngine(load_model(), seed_spec(), (4,))
    pixels = np.random.default_rng(1).integers(0, 256, (4, 1, 28, 28), dtype=np.uint8)
    slot = engine.slots[0]
    slot.inputs["uint8"][:] = pixels
    asyncio.run(engine.run(slot, 4, "uint8"))
    from_pixels = slot.outputs.copy()
    slot.inputs["float32"][:] = pixels.astype(np.float32) * np.float32(1 / 255)
    asyncio.run(engine.run(slot, 4, "float32"))
    engine.close()
    np.testing.assert_array_equal(from_pixels, slot.outputs)
