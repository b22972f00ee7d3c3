"""model.toml: every mistake a user can make is reported with the file and the key to fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from app import config
from app.config import DEFAULT_REPOSITORY, Settings
from app.errors import error_line
from app.repository import ModelConfigError, load_model, read_repository
from app.service import prepare_models
from models.cnn import WEIGHTS_PATH
from tests.model_exports import LABELS, torchscript

# The seed's weights, copied into each test model's folder (a model's files lie inside its folder).
WEIGHTS = WEIGHTS_PATH.name
GOOD = f'format = "python"\nfactory = "models.cnn:FashionCNN"\nweights = "{WEIGHTS}"\ninput_shape = [1, 28, 28]\n'
TEN_LABELS = LABELS + "\n"

BAD_MODELS = [
    # (case, model.toml, extra files, key in the message, words in the message)
    ("malformed", "format = python", {}, "not valid TOML", ""),
    ("unknown key", GOOD + TEN_LABELS + "batch_size = 8\n", {}, "batch_size",
     "unknown key (a typo?); model.toml's keys"),
    ("misspelt key", GOOD + TEN_LABELS.replace("labels", "lables"), {}, "lables", "did you mean 'labels'?"),
    ("misspelt table key", GOOD + TEN_LABELS + '[preprocess]\ncolour = "RGB"\n', {}, "preprocess.colour",
     "did you mean 'color'?; expected one of color, resize, crop, mean, std"),
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
        f'weights = "{WEIGHTS}"\n', "") + TEN_LABELS,
     {"model.py": "import torch\n\ndef build():\n    return torch.nn.Identity()\n"}, "format", "[2, 1, 28, 28]"),
    ("labels count", GOOD + 'labels = ["a", "b", "c"]\n', {}, "labels", "3 labels for a model with 10 outputs"),
    ("corrupt weights", GOOD.replace(WEIGHTS, "bad.pt") + TEN_LABELS, {"bad.pt": "not torch"},
     "weights", "bad.pt"),
    ("input_shape in H, W, C", GOOD.replace("[1, 28, 28]", "[28, 28, 1]") + TEN_LABELS, {}, "input_shape",
     "input_shape is C, H, W: [1, 28, 28]?"),
    # A blank line was skipped: every later class was named as the next one (class 8 served as "nine").
    ("blank label line", GOOD + 'labels = "labels.txt"\n', {"labels.txt": "zero\n\ntwo\nthree\n"}, "labels",
     "labels.txt has blank lines [2] before its last label"),
    # A key its format never reads was ignored: a torchscript model given weights served the file's own.
    ("a key of another format", f'format = "torchscript"\nfile = "model.pt"\nweights = "{WEIGHTS}"\n'
     'input_shape = [1, 28, 28]\n' + TEN_LABELS, {"model.pt": ""}, "weights",
     'format "torchscript" does not read this key (format "torchvision" or "python" does)'),
    ("arguments for a python model", GOOD + TEN_LABELS + "arguments = { num_classes = 10 }\n", {}, "arguments",
     'format "python" does not read this key'),
]  # fmt: skip


@pytest.mark.parametrize(("case", "toml", "files", "key", "words"), BAD_MODELS, ids=[c[0] for c in BAD_MODELS])
def test_each_bad_model_toml_is_reported_with_file_and_key(
    tmp_path: Path, case: str, toml: str, files: dict[str, str], key: str, words: str
) -> None:
    folder = tmp_path / "mymodel"
    folder.mkdir()
    (folder / "model.toml").write_text(toml)
    shutil.copy(WEIGHTS_PATH, folder / WEIGHTS)
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


def test_start_up_reports_one_models_load_problem_beside_anothers_model_toml_problem(tmp_path: Path) -> None:
    """A model whose model.toml reads cleanly is still loaded and checked (here: its labels against its
    outputs) when another model's model.toml has a problem: one run shows both."""
    seed_folder(tmp_path / "counted", GOOD + 'labels = ["a", "b", "c"]\n')
    seed_folder(tmp_path / "typo", GOOD + TEN_LABELS + "batch_size = 8\n")
    with pytest.raises(ModelConfigError) as raised:
        prepare_models(Settings(device="cpu", model_repository=tmp_path, default_model="counted"))
    assert sorted(problem.split(": ")[1] for problem in raised.value.problems) == ["batch_size", "labels"]


def test_buckets_past_the_machines_memory_name_the_model_and_key(tmp_path: Path) -> None:
    """A bucket of millions of images stopped start-up with numpy's MemoryError, naming neither model nor key."""
    seed_folder(tmp_path / "huge", GOOD + TEN_LABELS + "buckets = [1, 100000000]\n")
    with pytest.raises(ModelConfigError) as raised:
        prepare_models(Settings(device="cpu", model_repository=tmp_path))
    (problem,) = raised.value.problems
    assert problem.startswith(f"{tmp_path / 'huge' / 'model.toml'}: buckets: the largest bucket, 100000000"), problem
    assert "GiB of host memory" in problem and "use smaller buckets" in problem, problem
    seed_folder(tmp_path / "plain" / "seed")
    with pytest.raises(ModelConfigError, match="CGSERVE_BUCKETS: the largest bucket"):  # the setting, where it decides
        prepare_models(Settings(device="cpu", model_repository=tmp_path / "plain", buckets="1,100000000"))


def test_the_front_door_with_several_models_and_no_default_is_refused_before_the_server_listens(
    tmp_path: Path,
) -> None:
    """It used to start, log each model ready, then exit 1 with "none is the default" as the door opened."""
    for name in ("one", "two"):
        seed_folder(tmp_path / name)
    with pytest.raises(ModelConfigError, match=r"CGSERVE_FRONT_DOOR_PORT: .* set CGSERVE_DEFAULT_MODEL"):
        prepare_models(Settings(device="cpu", model_repository=tmp_path, front_door_port=19999))
    assert len(prepare_models(Settings(device="cpu", model_repository=tmp_path, front_door_port=19999,
                                       default_model="two"))) == 2  # fmt: skip


def test_a_device_problem_is_reported_beside_the_models_problems(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a machine where device cuda:0 is a problem")
    seed_folder(tmp_path / "typo", GOOD + TEN_LABELS + "batch_size = 8\n")
    with pytest.raises(ModelConfigError) as raised:
        prepare_models(Settings(model_repository=tmp_path, device="cuda:0"))
    assert [problem.split(":")[0] for problem in raised.value.problems] == [str(tmp_path / "typo" / "model.toml"),
                                                                          "device cuda"]  # fmt: skip


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
    (folder / "labels.txt").write_text("cat\n dog \n\n\n")  # blank lines at its end are left out
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


def seed_folder(folder: Path, toml: str = GOOD + TEN_LABELS) -> Path:
    """The seed CNN in `folder`: its model.toml and its weights beside it."""
    folder.mkdir(parents=True)
    (folder / "model.toml").write_text(toml)
    shutil.copy(WEIGHTS_PATH, folder / WEIGHTS)
    return folder


# --- one model in the folder itself: KServe's storageUri layout ----------------------------------


def test_a_folder_holding_model_toml_is_one_model_named_after_the_inference_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = seed_folder(tmp_path / "models")
    (folder / "code").mkdir()  # what else a storageUri holds is not a model of its own
    monkeypatch.setenv("INFERENCE_SERVICE_NAME", "my-classifier")
    (spec,) = read_repository(folder)
    assert (spec.name, spec.folder, spec.class_names[9]) == ("my-classifier", folder, "Ankle boot")
    assert load_model(spec).spec is spec


def test_a_single_model_folder_without_the_service_name_is_named_after_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INFERENCE_SERVICE_NAME", raising=False)
    (spec,) = read_repository(seed_folder(tmp_path / "fashion"))
    assert spec.name == "fashion"


def test_an_inference_service_name_that_is_no_url_name_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INFERENCE_SERVICE_NAME", "my classifier")
    with pytest.raises(ModelConfigError, match="INFERENCE_SERVICE_NAME: a model's name 'my classifier'"):
        read_repository(seed_folder(tmp_path / "models"))


def test_the_repository_defaults_to_kserves_mount_where_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CGSERVE_MODEL_REPOSITORY", raising=False)
    mount = tmp_path / "mnt" / "models"
    monkeypatch.setattr(config, "KSERVE_MODELS", mount)
    assert Settings(_env_file=None).model_repository == DEFAULT_REPOSITORY  # type: ignore[call-arg]
    seed_folder(mount)
    assert Settings(_env_file=None).model_repository == mount  # type: ignore[call-arg]
    # Set, the setting wins over the mount.
    assert Settings(_env_file=None, model_repository=DEFAULT_REPOSITORY).model_repository == DEFAULT_REPOSITORY  # type: ignore[call-arg]


# --- the repository stays inside its folders ----------------------------------------------------


def test_a_labels_file_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("password\n")
    folder = seed_folder(tmp_path / "repository" / "seed", GOOD + 'labels = "../../secret.txt"\n')
    with pytest.raises(ModelConfigError) as raised:
        read_repository(folder.parent)
    (problem,) = raised.value.problems
    assert problem.startswith(f"{folder / 'model.toml'}: labels: '../../secret.txt'"), problem
    assert "out of the model's folder" in problem and "password" not in problem


def weights_outside(tmp_path: Path, how: str) -> str:
    """A weights value that reaches the seed's weights out of the model folder `how`."""
    outside = tmp_path / "elsewhere" / WEIGHTS
    outside.parent.mkdir()
    shutil.copy(WEIGHTS_PATH, outside)
    if how == "absolute":
        return str(outside)
    if how == "dot-dot":
        return f"../../elsewhere/{WEIGHTS}"
    (tmp_path / "repository" / "seed").mkdir(parents=True)
    (tmp_path / "repository" / "seed" / "link.pt").symlink_to(outside)
    return "link.pt"


@pytest.mark.parametrize("how", ["absolute", "dot-dot", "symlink"])
def test_weights_outside_the_model_folder_are_refused(tmp_path: Path, how: str) -> None:
    value = weights_outside(tmp_path, how)
    folder = tmp_path / "repository" / "seed"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.toml").write_text(GOOD.replace(WEIGHTS, value) + TEN_LABELS)
    (spec,) = read_repository(folder.parent)
    with pytest.raises(ModelConfigError) as raised:
        load_model(spec)
    (problem,) = raised.value.problems
    assert problem.startswith(f"{folder / 'model.toml'}: weights: {value!r}"), problem
    assert "out of the model's folder" in problem, problem


def test_a_file_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    folder = seed_folder(tmp_path / "repository" / "seed", 'format = "torchscript"\nfile = "../../model.pt"\n'
                         "input_shape = [1, 28, 28]\n" + TEN_LABELS)  # fmt: skip
    (tmp_path / "model.pt").write_bytes(b"whatever it holds is not opened")
    (spec,) = read_repository(folder.parent)
    with pytest.raises(ModelConfigError, match=r"model\.toml: file: '\.\./\.\./model\.pt' is a path"):
        load_model(spec)


def test_a_symlink_that_stays_inside_the_model_folder_is_served(tmp_path: Path) -> None:
    folder = seed_folder(tmp_path / "repository" / "seed", GOOD.replace(WEIGHTS, "current.pt") + TEN_LABELS)
    (folder / "current.pt").symlink_to(folder / WEIGHTS)
    (spec,) = read_repository(folder.parent)
    assert load_model(spec).spec is spec


@pytest.mark.parametrize("name", ["evil\n", "evil\r", "ev\til", "-dash"])
def test_a_model_folder_name_with_control_characters_is_refused(tmp_path: Path, name: str) -> None:
    seed_folder(tmp_path / name)
    with pytest.raises(ModelConfigError) as raised:
        read_repository(tmp_path)
    (problem,) = raised.value.problems
    assert "is its URL name" in problem and "\n" not in problem, problem


@pytest.mark.parametrize("factory", ["builtins:exit", "sys:exit"])
def test_a_factory_that_exits_is_a_model_problem_not_an_exit(tmp_path: Path, factory: str) -> None:
    seed_folder(tmp_path / "seed", GOOD.replace("models.cnn:FashionCNN", factory) + TEN_LABELS)
    (spec,) = read_repository(tmp_path)
    with pytest.raises(ModelConfigError, match=r"seed/model\.toml: factory: SystemExit"):
        load_model(spec)


def test_weights_cut_short_say_so_and_how_many_bytes_were_read(tmp_path: Path) -> None:
    """A weights file still being copied in (a poll sees it half-written) was reported as torch's bare
    "OSError: [Errno 22] Invalid argument"."""
    folder = seed_folder(tmp_path / "repository" / "seed")
    whole = WEIGHTS_PATH.read_bytes()
    (folder / WEIGHTS).write_bytes(whole[: len(whole) // 2])
    (spec,) = read_repository(folder.parent)
    with pytest.raises(ModelConfigError) as raised:
        load_model(spec)
    (problem,) = raised.value.problems
    assert problem.startswith(f"{folder / 'model.toml'}: weights: {WEIGHTS}: "), problem
    assert f"{len(whole) // 2:,} bytes" in problem and "cut short or still being written" in problem, problem


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all " * 200], ids=["empty", "not torch's"])
def test_an_empty_or_foreign_weights_file_is_not_told_to_use_another_torch_save_format(
    tmp_path: Path, content: bytes
) -> None:
    """An empty file (a copy begun) and one of other bytes got torch's advice to save with
    _use_new_zipfile_serialization=True, which misleads (a review)."""
    folder = seed_folder(tmp_path / "repository" / "seed")
    (folder / WEIGHTS).write_bytes(content)
    (spec,) = read_repository(folder.parent)
    with pytest.raises(ModelConfigError) as raised:
        load_model(spec)
    (problem,) = raised.value.problems
    assert f"not a file torch.save wrote whole ({len(content):,} bytes: cut short or still being written?)" in problem


def test_weights_of_another_model_name_the_keys_that_differ(tmp_path: Path) -> None:
    folder = seed_folder(tmp_path / "repository" / "seed")
    torch.save({"other.weight": torch.zeros(2)}, folder / WEIGHTS)
    (spec,) = read_repository(folder.parent)
    with pytest.raises(ModelConfigError) as raised:
        load_model(spec)
    (problem,) = raised.value.problems
    assert "do not fit the model" in problem and "other.weight" in problem, problem


def test_a_whole_file_torch_refuses_is_not_said_to_be_cut_short(tmp_path: Path) -> None:
    """A pickled module (torch.save(model)) is whole: it was told to wait for a copy that had ended."""
    folder = seed_folder(tmp_path / "repository" / "seed")
    torch.save(torch.nn.Linear(2, 2), folder / WEIGHTS)
    (spec,) = read_repository(folder.parent)
    with pytest.raises(ModelConfigError) as raised:
        load_model(spec)
    (problem,) = raised.value.problems
    assert "torch.load (weights_only) refused it" in problem and "cut short" not in problem, problem


def test_a_torchscript_model_given_the_wrong_channels_names_the_cause(tmp_path: Path) -> None:
    """TorchScript's message is a traceback whose last words are the cause: the line was cut at 300 characters,
    in the traceback, and the cause (the channels the model expects) never reached the operator."""
    folder = torchscript(tmp_path / "repository")
    toml = folder / "model.toml"
    toml.write_text(toml.read_text().replace("input_shape = [1, 28, 28]", "input_shape = [3, 28, 28]"))
    (spec,) = read_repository(folder.parent)
    with pytest.raises(ModelConfigError) as raised:
        prepare_models(config.Settings(model_repository=folder.parent, device="cpu"))
    (problem,) = raised.value.problems
    assert "input_shape: the model fails on a" in problem and "channels" in problem, problem
    assert len(problem) < 700, problem
    assert spec.input_shape == (3, 28, 28)


def test_error_line_keeps_the_head_and_the_tail_of_a_long_message() -> None:
    line = error_line(RuntimeError("Traceback " + "frame " * 200 + "expected 3 channels, got 1"))
    assert line.startswith("RuntimeError: Traceback frame") and line.endswith("expected 3 channels, got 1")
    assert " … " in line and len(line) < 440
