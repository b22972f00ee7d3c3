"""Named outputs (model.toml's [[outputs]]): the probe's checks at load, one line per problem naming the
file and the key; a packed row cut back into each output exactly; the CPU engine's outputs equal the
model's own; through the engine process: tests/integration/test_named_outputs_grpc.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from app.engines.cpu_eager import CpuEagerEngine
from app.repository import ModelConfigError, load_model, read_repository
from app.repository.outputs import OutputLayout
from tests.output_models import COMMON, TOMLS, eager, images, write_repository

LINE = "class M(torch.nn.Module):\n    def forward(self, x):\n        return {}\n\ndef build():\n    return M()\n"


def source(returned: str) -> str:
    """model.py of a model returning `returned` (an expression of x, the (B, 3, 16, 16) batch)."""
    return "import torch\n\n" + LINE.format(returned)


FEATURES = "x.flatten(1)[:, :4]"
BAD = [
    # (case, model.toml after COMMON, what the model returns, key, words)
    ("a tuple named once", '[[outputs]]\nname = "a"\n', f"({FEATURES}, {FEATURES})", "outputs",
     "a tuple of 2 tensors"),
    ("a dict's keys differ", '[[outputs]]\nname = "a"\n[[outputs]]\nname = "c"\n',
     f'{{"a": {FEATURES}, "b": {FEATURES}}}', "outputs", "['a', 'b']"),
    ("a tuple without [[outputs]]", 'labels = ["0", "1", "2", "3"]\n', f"({FEATURES}, {FEATURES})", "format",
     "[[outputs]]"),
    ("datatype differs", '[[outputs]]\nname = "a"\ndatatype = "FP32"\n', f"{FEATURES}.long()", "outputs.a",
     "INT64"),
    ("shape differs", '[[outputs]]\nname = "a"\nshape = [5]\n', FEATURES, "outputs.a", "[4] per image"),
    ("batch not first", '[[outputs]]\nname = "a"\n', f"{FEATURES}.repeat(2, 1)", "outputs.a",
     "the batch must be its first dimension"),
    ("shape follows the batch", '[[outputs]]\nname = "a"\n', "x.new_zeros(len(x), len(x))", "outputs.a",
     "must not depend on the batch"),
    ("integer beyond float32", '[[outputs]]\nname = "a"\n', "torch.full((len(x), 2), 2**25)", "outputs.a",
     "2**24"),
    ("class scores not one per label", 'labels = ["a", "b"]\n[[outputs]]\nname = "s"\nclasses = true\n', FEATURES,
     "outputs.s", "len(labels) = 2"),
    ("a dtype we cannot serve", '[[outputs]]\nname = "a"\n', "x.flatten(1)[:, :2].to(torch.complex64)",
     "outputs.a", "complex64"),
]  # fmt: skip

CONFIG = [
    ("two class outputs", 'labels = ["a"]\n[[outputs]]\nname = "a"\nclasses = true\n[[outputs]]\nname = "b"\n'
     "classes = true\n", "outputs", "at most one"),
    ("labels with nothing to label", 'labels = ["a"]\n[[outputs]]\nname = "a"\n', "labels", "nothing to label"),
    ("class scores without labels", '[[outputs]]\nname = "a"\nclasses = true\n', "labels", "needs one label"),
    ("softmax of no class scores", 'postprocess = "softmax"\n[[outputs]]\nname = "a"\n', "postprocess",
     "applies to class scores"),
    ("a name /predict uses", 'labels = ["a"]\n[[outputs]]\nname = "t"\nclasses = true\n[[outputs]]\n'
     'name = "scores"\n', "outputs", "rename"),
    ("repeated names", '[[outputs]]\nname = "a"\n[[outputs]]\nname = "a"\n', "outputs", "repeat"),
    ("a bad name", '[[outputs]]\nname = "a b"\n', "outputs.0.name", "pattern"),
    ("an unknown datatype", '[[outputs]]\nname = "a"\ndatatype = "FP64"\n', "outputs.0.datatype", "FP32"),
    ("no labels and no outputs", "", "labels", "one label per class"),
]  # fmt: skip


def problems_of(folder: Path, toml: str, returned: str) -> list[str]:
    (folder / "m").mkdir(parents=True)
    (folder / "m" / "model.py").write_text(source(returned))
    (folder / "m" / "model.toml").write_text(COMMON + 'factory = "model:build"\n' + toml)
    with pytest.raises(ModelConfigError) as raised:
        for spec in read_repository(folder):
            load_model(spec)
    return raised.value.problems


@pytest.mark.parametrize(("case", "toml", "returned", "key", "words"), BAD, ids=[case[0] for case in BAD])
def test_outputs_that_differ_from_model_toml_are_refused_at_load(
    tmp_path: Path, case: str, toml: str, returned: str, key: str, words: str
) -> None:
    (problem,) = problems_of(tmp_path, toml, returned)
    assert problem.startswith(f"{tmp_path / 'm' / 'model.toml'}: {key}: "), problem
    assert words in problem, problem


@pytest.mark.parametrize(("case", "toml", "key", "words"), CONFIG, ids=[case[0] for case in CONFIG])
def test_malformed_outputs_are_refused_when_read(tmp_path: Path, case: str, toml: str, key: str, words: str) -> None:
    problems = problems_of(tmp_path, toml, FEATURES)
    assert any(p.startswith(f"{tmp_path / 'm' / 'model.toml'}: {key}: ") and words in p for p in problems), problems


def test_an_onnx_files_outputs_are_its_names(tmp_path: Path) -> None:
    onnx = pytest.importorskip("onnxruntime")
    del onnx
    import torch

    from tests.output_models import module

    write_repository(tmp_path, ("detector",))
    folder = tmp_path / "onnx"
    folder.mkdir()

    class Ordered(torch.nn.Module):  # an ONNX graph's outputs are a sequence, named at export
        def __init__(self) -> None:
            super().__init__()
            self.detector = module("detector", tmp_path)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            found = self.detector(x)
            return found["boxes"], found["scores"], found["labels"]

    torch.onnx.export(
        Ordered().eval(), (torch.rand(1, 3, 16, 16),), str(folder / "m.onnx"), input_names=["x"],
        output_names=["boxes", "scores", "labels"], dynamic_axes={"x": {0: "n"}, "boxes": {0: "n"},
        "scores": {0: "n"}, "labels": {0: "n"}}, dynamo=False,
    )  # fmt: skip
    toml = 'format = "onnx"\nfile = "m.onnx"\ninput_shape = [3, 16, 16]\nbuckets = [1, 4]\n'
    (folder / "model.toml").write_text(toml + '[[outputs]]\nname = "labels"\n[[outputs]]\nname = "boxes"\n')
    (spec,) = [spec for spec in read_repository(tmp_path) if spec.name == "onnx"]
    loaded = load_model(spec)
    assert loaded.spec.layout.names == ("labels", "boxes")  # model.toml's order; "scores" goes unserved
    assert loaded.spec.layout.outputs[0].datatype == "INT64"
    from app.engines.onnx_runtime import OnnxRuntimeEngine

    engine = OnnxRuntimeEngine(loaded.spec, (1, 4), providers=("CPUExecutionProvider",))
    got = run(engine, images(3))
    want = eager("detector", tmp_path, images(3).astype(np.float32) / 255)
    cut = loaded.spec.layout.cut(got)
    np.testing.assert_array_equal(cut["labels"], want["labels"])
    np.testing.assert_allclose(cut["boxes"], want["boxes"], rtol=1e-5, atol=1e-5)


def test_integers_and_booleans_come_back_exactly() -> None:
    layout = OutputLayout.of(
        [("count", (), "INT64", False), ("flags", (2,), "BOOL", False), ("x", (1,), "FP32", False)]
    )
    counts = np.array([0, -(2**24), 2**24 - 1], dtype=np.int64)
    flags = np.array([[True, False], [False, False], [True, True]])
    x = np.array([[0.1], [0.2], [0.3]], dtype=np.float32)
    rows = np.concatenate([counts[:, None].astype(np.float32), flags.astype(np.float32), x], axis=1)
    cut = layout.cut(rows)
    assert cut["count"].dtype == np.int64 and (cut["count"] == counts).all()
    assert cut["flags"].dtype == np.bool_ and (cut["flags"] == flags).all()
    assert cut["x"].shape == (3, 1) and (cut["x"] == x).all()


def run(engine: object, pixels: np.ndarray) -> np.ndarray:
    slot = engine.slots[0]  # type: ignore[attr-defined]
    slot.inputs["uint8"][: len(pixels)] = pixels
    asyncio.run(engine.run(slot, 4, "uint8"))  # type: ignore[attr-defined]
    engine.close()  # type: ignore[attr-defined]
    return slot.outputs[: len(pixels)].copy()  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", list(TOMLS))
def test_the_cpu_engine_packs_every_output_as_the_model_gives_it(tmp_path: Path, kind: str) -> None:
    write_repository(tmp_path, (kind,))
    (spec,) = read_repository(tmp_path)
    loaded = load_model(spec)
    pixels = images(3, seed=1)
    got = loaded.spec.layout.cut(run(CpuEagerEngine(loaded.module, loaded.spec, (1, 4)), pixels))  # type: ignore[arg-type]
    want = eager(kind, tmp_path, pixels.astype(np.float32) / 255)
    assert set(got) == set(want)
    for name, values in want.items():
        assert got[name].dtype == values.dtype and got[name].shape == values.shape, name
        np.testing.assert_allclose(got[name], values, rtol=1e-5, atol=1e-6, err_msg=name)
