"""The CPU eager engine: what padding rows hold never changes the real rows' answers."""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from app.engines.cpu_eager import CpuEagerEngine
from app.model_spec import FASHION_CNN
from models.cnn import WEIGHTS_PATH, load_model


def test_padding_rows_never_change_real_rows() -> None:
    engine = CpuEagerEngine(FASHION_CNN.build(WEIGHTS_PATH), FASHION_CNN, (1, 8))
    slot = engine.new_slot()
    rng = np.random.default_rng(0)
    real = rng.random((3, 1, 28, 28), dtype=np.float32)
    answers = []
    for padding in (np.zeros((5, 1, 28, 28), np.float32), rng.random((5, 1, 28, 28), dtype=np.float32)):
        slot.inputs[:3], slot.inputs[3:8] = real, padding
        asyncio.run(engine.run(slot, 8))
        answers.append(slot.outputs[:3].copy())
    engine.close()
    np.testing.assert_array_equal(answers[0], answers[1])
    with torch.inference_mode():
        want = torch.softmax(load_model()(torch.from_numpy(real)), dim=1).numpy()
    np.testing.assert_allclose(answers[0], want, rtol=1e-4, atol=1e-6)
