"""TF32 is a switch of the whole process: decided once from every model's dtype, checked per engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from app.engines import precision


@pytest.fixture(autouse=True)
def undecided(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(precision, "_tf32", None)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=torch.backends.cudnn.allow_tf32):
        matmul = torch.backends.cuda.matmul.allow_tf32
        yield
        torch.backends.cuda.matmul.allow_tf32 = matmul


@pytest.mark.parametrize(
    ("dtypes", "tf32"), [(["fp16", "bf16"], True), (["fp32", "fp16"], False), (["fp16", "fp32"], False)]
)
def test_tf32_only_where_no_model_runs_fp32(dtypes: list[str], tf32: bool) -> None:
    precision.decide(dtypes)
    assert torch.backends.cudnn.allow_tf32 is tf32
    assert torch.backends.cuda.matmul.allow_tf32 is tf32
    for dtype in dtypes:
        precision.require(dtype)  # every model the decision was made for fits it


def test_an_fp32_engine_after_an_fp16_one_is_refused_not_silently_tf32() -> None:
    precision.require("fp16")  # an engine built on its own decides for itself
    assert torch.backends.cudnn.allow_tf32
    with pytest.raises(RuntimeError, match=r"fp32 model .* TF32.*set this model.s dtype"):
        precision.require("fp32")


def test_an_fp16_engine_may_join_an_fp32_process() -> None:
    precision.require("fp32")
    precision.require("fp16")
    assert not torch.backends.cudnn.allow_tf32
