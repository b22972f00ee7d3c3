"""An ONNX model whose input differs from model.toml's input_shape: the message names the dimension."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from app.repository import ModelConfigError, load_model, read_repository


def pooling_model(path: Path, input_dims: list[int | str]) -> None:
    """x (N, C, H, W) → global average pool → (N, C): a classifier of C classes, in ONNX."""
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["logits"]),
        ],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, input_dims)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", input_dims[1]])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def serve(tmp_path: Path, input_dims: list[int | str], input_shape: list[int]) -> None:
    folder = tmp_path / "pool"
    folder.mkdir()
    pooling_model(folder / "model.onnx", input_dims)
    labels = [str(i) for i in range(input_dims[1] if isinstance(input_dims[1], int) else 1)]
    (folder / "model.toml").write_text(
        f'format = "onnx"\nfile = "model.onnx"\ninput_shape = {input_shape}\nlabels = {labels}\n'
    )
    (spec,) = read_repository(tmp_path)
    load_model(spec)


def test_a_different_height_and_width_are_named_not_blamed_on_the_batch(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError) as raised:
        serve(tmp_path, ["N", 1, 32, 32], [1, 28, 28])
    (problem,) = raised.value.problems
    assert "input_shape: " in problem and "height 28 in model.toml, 32 in the model" in problem, problem
    assert "width 28 in model.toml, 32 in the model" in problem and "dynamic batch" not in problem, problem


def test_a_matching_input_is_served(tmp_path: Path) -> None:
    serve(tmp_path, ["N", 1, 28, 28], [1, 28, 28])
