"""CGSERVE_DEVICE: one device, all, or a list of GPUs; checked before the server listens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from app.config import Settings
from app.engines.factory import resolve_devices
from app.repository import ModelConfigError
from app.service import prepare_models


@pytest.mark.parametrize("value", ["auto", "cpu", "all", "cuda", "cuda:1", "cuda:0,cuda:1", "cuda:0, cuda:3"])
def test_accepted_device_settings(value: str) -> None:
    assert Settings(device=value).device == value.replace(" ", "")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu", "comma-separated list"),
        ("cuda:0,cpu", "comma-separated list"),
        ("cuda:0,", "comma-separated list"),
        ("cuda:1,cuda:1", "cuda:1 more than once"),
        ("cuda,cuda:0", "cuda:0 more than once"),
    ],
)
def test_bad_device_settings_say_what_is_accepted(value: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(device=value)


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch believes in two CUDA devices (resolve_devices only counts them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.mark.usefixtures("two_gpus")
@pytest.mark.parametrize(
    ("value", "devices"),
    [
        ("auto", ("cuda:0",)),
        ("all", ("cuda:0", "cuda:1")),
        ("cuda", ("cuda:0",)),
        ("cuda:1,cuda:0", ("cuda:1", "cuda:0")),
        ("cpu", ("cpu",)),
    ],
)
def test_device_settings_resolve_to_devices(value: str, devices: tuple[str, ...]) -> None:
    assert resolve_devices(value) == devices


@pytest.mark.usefixtures("two_gpus")
def test_a_gpu_torch_does_not_see_is_named() -> None:
    with pytest.raises(ModelConfigError, match="cuda:2 not present; torch sees 2 CUDA device"):
        resolve_devices("cuda:0,cuda:2")


def test_without_a_gpu_all_means_the_cpu_and_a_gpu_list_is_refused_before_the_server_listens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_devices("all") == ("cpu",)
    ((_, options),) = prepare_models(Settings(device="all"))
    assert options.devices == ("cpu",) and options.engine == "eager"
    with pytest.raises(ModelConfigError, match="torch sees no CUDA device") as refused:
        prepare_models(Settings(device="cuda:0,cuda:1"))
    assert len(refused.value.problems) == 1


def test_a_compile_cache_folder_that_cannot_be_made_is_an_error_naming_the_setting(tmp_path: Path) -> None:
    """It was a bare FileNotFoundError in the start-up log (the operator review)."""
    from app.engines.factory import use_compile_cache

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ValueError, match=r"CGSERVE_COMPILE_CACHE_DIR .*a-file/cache: the folder cannot be made \(.+\); "
                       "name a folder this process may write, or unset it"):  # fmt: skip
        use_compile_cache(Settings(compile_cache_dir=blocker / "cache"))
