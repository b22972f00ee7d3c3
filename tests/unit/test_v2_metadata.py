"""The v2 metadata tells clients what to send: model.toml's input_datatype (issue 26.2), and how many images one
request may carry (max_batch_size), which the v2 infer body limit then takes."""

from __future__ import annotations

import dataclasses

import pytest

from app.config import Settings
from app.engines.factory import EngineOptions
from app.protocols.v2.batch_limits import FRAMING_BYTES, infer_body_limit
from app.protocols.v2.tensors import model_config, model_metadata
from tests.seed_model import seed_spec


def served_at(buckets: tuple[int, ...]) -> EngineOptions:
    """The options a model is served with, at `buckets`."""
    return EngineOptions(
        engine="eager", devices=("cpu",), dtype="fp32", channels_last=False, compile="none", compile_mode="",
        compile_strict=False, buckets=buckets, max_delay_ms=1.0, providers=(),
    )  # fmt: skip


@pytest.mark.parametrize("datatype", ["UINT8", "FP32"])
def test_metadata_and_config_declare_the_model_tomls_input_datatype(datatype: str) -> None:
    spec = seed_spec()
    spec = dataclasses.replace(spec, config=spec.config.model_copy(update={"input_datatype": datatype}))
    assert model_metadata(spec, "p")["inputs"][0]["datatype"] == datatype
    assert model_config(spec, served_at((1, 8)), 1024)["input"][0]["data_type"] == f"TYPE_{datatype}"


def test_the_shipped_seed_cnn_asks_for_uint8_pixels() -> None:
    assert seed_spec().config.input_datatype == "UINT8"


def test_length_prefixed_bytes_elements() -> None:
    from app.errors import InputError
    from app.protocols.v2.tensors import length_prefixed

    raw = b"".join(len(e).to_bytes(4, "little") + e for e in (b"png", b"", b"jpeg!"))
    assert length_prefixed(raw, most=3) == [b"png", b"", b"jpeg!"]
    for broken in (raw[:-1], raw + b"\x01\x00"):
        with pytest.raises(InputError):
            length_prefixed(broken, most=3)


def test_more_bytes_elements_than_a_request_may_hold_are_refused_before_they_are_split() -> None:
    from app.errors import InputError
    from app.protocols.v2.tensors import length_prefixed

    flood = bytes(4 * 65_536)  # 65,536 empty elements in 256 KB
    with pytest.raises(InputError) as refused:
        length_prefixed(flood, most=1024)
    assert refused.value.status == 413 and "more than 1024 elements" in str(refused.value)


def test_max_batch_size_is_what_one_request_may_carry() -> None:
    """The largest bucket, but CGSERVE_MAX_INSTANCES where that is less: it said 128 where 17 images were refused."""
    spec = seed_spec()
    assert model_config(spec, served_at((1, 8, 128)), 1024)["max_batch_size"] == 128
    assert model_config(spec, served_at((1, 8, 128)), 16)["max_batch_size"] == 16


def test_the_v2_infer_body_limit_takes_max_batch_size_fp32_images_of_the_largest_model() -> None:
    spec = seed_spec()  # 1×28×28: 32 FP32 images are 100,352 bytes, under the default
    settings = Settings()
    assert infer_body_limit(settings, [spec]) == settings.max_body_bytes
    wide = dataclasses.replace(
        spec, config=spec.config.model_copy(update={"input_shape": (3, 224, 224)})
    )  # ResNet's:: 128 FP32 images are 77 MB
    assert infer_body_limit(settings, [spec, wide]) == 128 * 3 * 224 * 224 * 4 + FRAMING_BYTES
    assert infer_body_limit(Settings(max_instances=8), [wide]) == settings.max_body_bytes  # 8 fit in 16 MiB


def test_the_v2_infer_body_limit_never_passes_the_bytes_in_flight_budget() -> None:
    """Past it no body is admitted however idle the server: it answered 503 to every attempt."""
    spec = seed_spec()
    wide = dataclasses.replace(spec, config=spec.config.model_copy(update={"input_shape": (3, 512, 512)}))
    settings = Settings(max_inflight_bytes=64 * 2**20)  # 128 FP32 images of 3×512×512 are 403 MB
    assert infer_body_limit(settings, [wide]) == 64 * 2**20


def test_the_preferred_batch_sizes_stop_at_max_batch_size() -> None:
    """Triton refuses a configuration that prefers a batch larger than its max_batch_size."""
    config = model_config(seed_spec(), served_at((1, 8, 32, 128)), 16)
    assert config["max_batch_size"] == 16 and config["dynamic_batching"]["preferred_batch_size"] == [1, 8]
