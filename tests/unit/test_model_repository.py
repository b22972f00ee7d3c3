"""model.toml: every mistake a user can make is reported with the file and the key to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import DEFAULT_REPOSITORY, Settings
from app.repository import ModelConfigError, load_model, read_repository
from app.service import prepare_models
from models.cnn import WEIGHTS_PATH
from tests.model_exports import LABELS

GOOD = f'format = "python"\nfactory = "models.cnn:FashionCNN"\nweights = "{WEIGHTS_PATH}"\ninput_shape = [1, 28, 28]\n'
TEN_LABELS = LABELS + "\n"

BAD_MODELS = [
    # (case, model.toml, extra files, key in the message, words in the message)
    ("malformed", "format = python", {}, "not valid TOML", ""),
    ("unknown key", GOOD + TEN_LABELS + "batch_size = 8\n", {}, "batch_size", "unknown key"),
    ("missing format", TEN_LABELS + "input_shape = [1, 28, 28]\n", {}, "format", "Field required"),
    ("unknown format", GOOD.replace('"python"', '"caffe"') + TEN_LABELS, {}, "format", "torchscript"),
    ("missing file", 'format = "torchscript"\nfile = "model.pt"\ninput_shape = [1, 28, 28]\n' + TEN_LABELS, {},
     "file", "does not exist"),
    ("file key missing", 'format = "onnx"\ninput_shape = [1, 28, 28]\n' + TEN_LABELS, {}, "file", "needs this key"),
    ("random weights not allowed", 'format = "torchvision"\narchitecture = "resnet18"\ninput_shape = [3, 64, 64]\n'
     + TEN_LABELS, {}, "weights", "allow_random_weights"),
    ("missing labels file", GOOD + 'labels = "labels.txt"\n', {}, "labels", "does not exist"),
    ("bad mean", GOOD + TEN_LABELS + "[preprocess]\nmean = [0.5, 0.5, 0.5]\n", {}, "preprocess.mean", "3 values"),
    ("bad colour", GOOD + TEN_LABELS + '[preprocess]\ncolor = "RGB"\n', {}, "preprocess.color", "channels"),
    ("bad bucket", GOOD + TEN_LABELS + "buckets = [0, 4]\n", {}, "buckets", "positive"),
    ("bad factory", GOOD.replace("models.cnn:FashionCNN", "nowhere:build") + TEN_LABELS, {}, "factory",
     "No module named 'nowhere'"),
    ("not a module", GOOD.replace("models.cnn:FashionCNN", "model:build") + TEN_LABELS,
     {"model.py": "def build():\n    return 42\n"}, "factory", "not a torch.nn.Module"),
    ("output not (B, classes)", GOOD.replace("models.cnn:FashionCNN", "model:build").replace(
        f'weights = "{WEIGHTS_PATH}"\n', "") + TEN_LABELS,
     {"model.py": "import torch\n\ndef build():\n    return torch.nn.Identity()\n"}, "format", "[2, 1, 28, 28]"),
    ("labels count", GOOD + 'labels = ["a", "b", "c"]\n', {}, "labels", "3 labels for a model with 10 outputs"),
    ("corrupt weights", GOOD.replace(str(WEIGHTS_PATH), "bad.pt") + TEN_LABELS, {"bad.pt": "not torch"},
     "weights", "bad.pt"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "toml", "files", "key", "words"), BAD_MODELS, ids=[c[0] for c in BAD_MODELS])
def test_each_bad_model_toml_is_reported_with_file_and_key(
    tmp_path: Path, case: str, toml: str, files: dict[str, str], key: str, words: str
) -> None:
    folder = tmp_path / "mymodel"
    folder.mkdir()
    (folder / "model.toml").write_text(toml)
    for name, text in files.items():
        (folder / name).write_text(text)
    with pytest.raises(ModelConfigError) as raised:
        for spec in read_repository(tmp_path):
            load_model(spec)
    (problem,) = raised.value.problems
    assert problem.startswith(f"{folder / 'model.toml'}: {key}"), problem
    assert words in problem, problem


def test_every_problem_of_every_model_is_reported_at_once(tmp_path: Path) -> None:
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.toml").write_text(GOOD + 'labels = ["a"]\nbatch = 1\n')
    (tmp_path / "three").mkdir()  # no model.toml
    with pytest.raises(ModelConfigError) as raised:
        read_repository(tmp_path)
    assert len(raised.value.problems) == 3


def test_the_shipped_repository_serves_the_seed_cnn_by_default() -> None:
    ((model, options),) = prepare_models(Settings(device="cpu"))
    assert model.spec.name == "fashion-cnn" and options.engine == "eager"
    assert read_repository(DEFAULT_REPOSITORY)[0].class_names[9] == "Ankle boot"


def test_a_default_model_that_is_not_in_the_repository_is_refused() -> None:
    with pytest.raises(ModelConfigError, match="CGSERVE_DEFAULT_MODEL: 'resnet'"):
        prepare_models(Settings(device="cpu", default_model="resnet"))


def test_labels_from_a_file_and_preprocess_for_rgb(tmp_path: Path) -> None:
    folder = tmp_path / "rgb"
    folder.mkdir()
    (folder / "labels.txt").write_text("cat\n\ndog\n")
    (folder / "model.py").write_text(
        "import torch\n\ndef build():\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 2))\n"
    )
    (folder / "model.toml").write_text(
        'format = "python"\nfactory = "model:build"\ninput_shape = [3, 8, 8]\nlabels = "labels.txt"\n'
        "[preprocess]\nresize = 10\ncrop = 8\nmean = [0.5, 0.5, 0.5]\nstd = [0.25, 0.25, 0.25]\n"
    )
    (spec,) = read_repository(tmp_path)
    assert spec.class_names == ("cat", "dog") and spec.config.color == "RGB"
    assert load_model(spec).spec is spec
