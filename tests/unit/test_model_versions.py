"""Numbered version folders and Triton's version_policy: which versions of a model are served."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.repository import ModelConfigError, read_repository
from app.repository.versions import VersionPolicy
from models.cnn import WEIGHTS_PATH
from tests.model_exports import LABELS

GOOD = (
    f'format = "python"\nfactory = "models.cnn:FashionCNN"\nweights = "{WEIGHTS_PATH.name}"\n'
    f"input_shape = [1, 28, 28]\n{LABELS}\n"
)


def versioned(tmp_path: Path, versions: list[int], policy: str = "", *, own_toml: bool = False) -> Path:
    """DIR/cnn/<v>/ holding the weights, and model.toml at DIR/cnn/ (or inside each version)."""
    model = tmp_path / "cnn"
    for version in versions:
        (model / str(version)).mkdir(parents=True)
        shutil.copy(WEIGHTS_PATH, model / str(version))
        if own_toml:
            (model / str(version) / "model.toml").write_text(GOOD + policy)
    if not own_toml:
        (model / "model.toml").write_text(GOOD + policy)
    return tmp_path


def served(tmp_path: Path) -> list[tuple[str, str]]:
    return [(spec.name, spec.version) for spec in read_repository(tmp_path)]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", ["3"]),  # Triton's default: the newest
        ("version_policy = { latest = { num_versions = 2 } }\n", ["3", "2"]),
        ("version_policy = { latest = { num_versions = 9 } }\n", ["3", "2", "1"]),
        ("version_policy = { all = {} }\n", ["3", "2", "1"]),
        ("version_policy = { specific = { versions = [1, 3] } }\n", ["3", "1"]),
    ],
)
def test_the_policy_chooses_the_versions(tmp_path: Path, policy: str, expected: list[str]) -> None:
    assert served(versioned(tmp_path, [1, 2, 3], policy)) == [("cnn", v) for v in expected]


def test_each_version_reads_its_own_files_and_names_its_model_toml(tmp_path: Path) -> None:
    versioned(tmp_path, [1, 2], "version_policy = { all = {} }\n")
    (tmp_path / "cnn" / "labels.txt").write_text("\n".join(f"class {i}" for i in range(10)))
    toml = tmp_path / "cnn" / "model.toml"
    toml.write_text(toml.read_text().replace("labels = [", 'labels = "labels.txt"\n# labels = ['))
    two, one = read_repository(tmp_path)
    assert (two.folder, one.folder) == (tmp_path / "cnn" / "2", tmp_path / "cnn" / "1")
    assert two.toml == toml and two.path(WEIGHTS_PATH.name) == tmp_path / "cnn" / "2" / WEIGHTS_PATH.name
    assert two.class_names[0] == "class 0"  # the shared labels.txt beside the shared model.toml


def test_a_model_toml_inside_each_version(tmp_path: Path) -> None:
    versioned(tmp_path, [1, 4], own_toml=True)
    (spec,) = read_repository(tmp_path)
    assert (spec.version, spec.toml) == ("4", tmp_path / "cnn" / "4" / "model.toml")


def test_an_unversioned_folder_is_version_1_as_before(tmp_path: Path) -> None:
    (tmp_path / "cnn").mkdir()
    shutil.copy(WEIGHTS_PATH, tmp_path / "cnn")
    (tmp_path / "cnn" / "model.toml").write_text(GOOD)
    (tmp_path / "cnn" / "notes").mkdir()  # not a number: not a version (Triton ignores it too)
    (spec,) = read_repository(tmp_path)
    assert (spec.version, spec.folder, spec.toml) == ("1", tmp_path / "cnn", tmp_path / "cnn" / "model.toml")


def test_a_specific_version_an_unversioned_folder_lacks_is_refused(tmp_path: Path) -> None:
    """It was served as version 1 without a word; [1] names what the folder is, and is served."""
    (tmp_path / "cnn").mkdir()
    shutil.copy(WEIGHTS_PATH, tmp_path / "cnn")
    (tmp_path / "cnn" / "model.toml").write_text(GOOD + "version_policy = { specific = { versions = [7] } }\n")
    with pytest.raises(ModelConfigError, match=r"versions \[7\] have no folder .* served as version 1"):
        read_repository(tmp_path)
    (tmp_path / "cnn" / "model.toml").write_text(GOOD + "version_policy = { specific = { versions = [1] } }\n")
    assert [spec.version for spec in read_repository(tmp_path)] == ["1"]


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ("version_policy = { specific = { versions = [2, 7] } }\n", "versions [7] have no folder"),
        ("version_policy = { latest = { num_versions = 0 } }\n", "version_policy.latest.num_versions"),
        ("version_policy = { all = {}, latest = {} }\n", "exactly one of latest, all, specific"),
        ("version_policy = { newest = {} }\n", "newest: unknown key (a typo?); expected one of latest, all, specific"),
        ('version_policy = "all"\n', "version_policy: expected a table: { latest = { num_versions = 1 } }, { all"),
    ],
)
def test_a_bad_policy_is_a_problem_naming_the_file(tmp_path: Path, policy: str, words: str) -> None:
    versioned(tmp_path, [1, 2], policy)
    with pytest.raises(ModelConfigError) as raised:
        read_repository(tmp_path)
    assert str(tmp_path / "cnn" / "model.toml") in str(raised.value) and words in str(raised.value)


def test_a_version_without_its_weights_names_both_folders(tmp_path: Path) -> None:
    versioned(tmp_path, [1])
    (tmp_path / "cnn" / "1" / WEIGHTS_PATH.name).unlink()
    with pytest.raises(ModelConfigError, match=r"does not exist in .*cnn/1 or .*cnn"):
        read_repository(tmp_path)


def test_policy_selection() -> None:
    assert VersionPolicy.model_validate({"latest": {}}).select([2, 10, 1]) == ([10], [])
    assert VersionPolicy.model_validate({"specific": {"versions": [1, 5]}}).select([1, 2]) == ([1], [5])
