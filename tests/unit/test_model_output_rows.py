"""A model that returns another count of rows than the batch it was given: refused for that batch, not served.

Before, the CPU engine wrote such an output into the batch's output rows as it came: softmax's and sigmoid's out=
shrank the view to the rows the model gave, leaving the other rows as the slot's previous batch left them (another
client's answers, served 200), and a copy broadcast one row over all; ONNX Runtime's numpy assignment broadcast it.
Now every engine checks each output is (batch, *its shape) before anything is written. An ONNX file whose batch
dimension is fixed is refused at load (it loaded, then failed every batch of another size).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch import nn

from app.engines.cpu_eager import CpuEagerEngine
from app.engines.onnx_runtime import OnnxRuntimeEngine
from app.engines.postprocess import ModelOutputError, packed
from app.repository import ModelConfigError, load_model, read_repository
from app.repository.outputs import OutputLayout
from models.cnn import load_model as seed_model
from tests.seed_model import seed_spec


class FirstRowAtFour(nn.Module):
    """The seed CNN, but a batch of 4 gets one row back (a model's bug that shows at one bucket only)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = seed_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.model(x)
        return y[:1] if x.shape[0] == 4 else y


@pytest.mark.parametrize("postprocess", ["softmax", "sigmoid", "none"])
def test_the_cpu_engine_refuses_a_batch_whose_output_has_other_rows(postprocess: str) -> None:
    spec = seed_spec()
    spec = dataclasses.replace(spec, config=spec.config.model_copy(update={"postprocess": postprocess}))
    engine = CpuEagerEngine(FirstRowAtFour().eval(), spec, (4, 8))
    slot = engine.slots[0]
    pixels = np.random.default_rng(0).integers(0, 256, (8, 1, 28, 28), dtype=np.uint8)
    slot.inputs["uint8"][:8] = pixels
    engine._forward(slot.inputs["uint8"][:8], slot.outputs)  # a batch of 8: served, its rows left in the slot
    earlier = slot.outputs.copy()
    with pytest.raises(ModelOutputError, match=r"shape \(1, 10\) for a batch of 4; expected \(4, 10\)"):
        engine._forward(slot.inputs["uint8"][:4], slot.outputs)
    np.testing.assert_array_equal(slot.outputs, earlier)  # nothing written: no stale or broadcast rows go out
    engine.close()


def test_packed_names_what_the_model_returned_instead() -> None:
    layout = OutputLayout.scores(10)
    with pytest.raises(ModelOutputError, match="returned a dict for a batch of 2; expected one \\(2, 10\\) tensor"):
        packed({"logits": torch.zeros(2, 10)}, layout, 2)
    with pytest.raises(ModelOutputError, match=r"shape \(10,\) for a batch of 2; expected \(2, 10\)"):
        packed(torch.zeros(10), layout, 2)
    # A model ending in .squeeze() gives (10,) for one image: its one row, served as it was before the check.
    assert packed(torch.arange(10.0), layout, 1).tolist() == [list(range(10))]
    named = OutputLayout.of([("scores", (10,), "FP32", True), ("box", (4,), "FP32", False)])
    with pytest.raises(ModelOutputError, match="returned 1 values; expected 2 tensors"):
        packed((torch.zeros(2, 10),), named, 2)
    with pytest.raises(ModelOutputError, match=r"box of shape \(2, 5\) for a batch of 2; expected \(2, 4\)"):
        packed((torch.zeros(2, 10), torch.zeros(2, 5)), named, 2)
    assert packed({"box": torch.ones(3, 4), "scores": torch.zeros(3, 10)}, named, 3).shape == (3, 14)


def onnx_model(path: Path, batch: int | str, first_row_only: bool) -> None:
    """x (N, 1, 28, 28) → global average pool → (N, 1) → a (N, 10) classifier; or its first row alone."""
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Tile", ["flat", "repeats"], ["all"]),
    ]
    inits = [helper.make_tensor("repeats", TensorProto.INT64, [2], [1, 10])]
    if first_row_only:
        nodes.append(helper.make_node("Slice", ["all", "starts", "ends", "axes"], ["logits"]))
        inits += [helper.make_tensor(name, TensorProto.INT64, [1], [v]) for name, v in (("starts", 0), ("ends", 1),
                                                                                         ("axes", 0))]  # fmt: skip
    else:
        nodes.append(helper.make_node("Identity", ["all"], ["logits"]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, 28, 28])
    logits = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 10])
    graph = helper.make_graph(nodes, "g", [x], [logits], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def onnx_folder(tmp_path: Path, batch: int | str, first_row_only: bool = False) -> Path:
    folder = tmp_path / "pool"
    folder.mkdir()
    onnx_model(folder / "model.onnx", batch, first_row_only)
    labels = [str(i) for i in range(10)]
    (folder / "model.toml").write_text(
        f'format = "onnx"\nfile = "model.onnx"\ninput_shape = [1, 28, 28]\nlabels = {labels}\n'
    )
    return tmp_path


def test_onnx_runtime_refuses_a_batch_whose_output_has_other_rows(tmp_path: Path) -> None:
    (spec,) = read_repository(onnx_folder(tmp_path, "N", first_row_only=True))
    engine = OnnxRuntimeEngine(spec, (4,), providers=("CPUExecutionProvider",))
    slot = engine.slots[0]
    slot.outputs[:] = 7.0
    with pytest.raises(ModelOutputError, match=r"shape \(1, 10\) for a batch of 4; expected \(4, 10\)"):
        engine._forward(slot.inputs["uint8"][:4], slot.outputs)
    assert (slot.outputs == 7.0).all()
    engine.close()


def test_an_onnx_file_with_a_fixed_batch_is_refused_at_load(tmp_path: Path) -> None:
    (spec,) = read_repository(onnx_folder(tmp_path, 2))
    with pytest.raises(ModelConfigError, match=r"takes batches of 2 only.*dynamic batch dimension"):
        load_model(spec)
