"""How many images one v2 request may carry, and the body or message that takes: one answer for both protocols.

Triton's `max_batch_size` (the model configuration's) is the largest batch a client may send in one request, and its
clients act on it: perf_analyzer takes `-b` up to it, and a chunking client splits at it. So it is what a request
here can carry: the largest bucket (a larger batch is split across batches, but a client that asks is told the
graphs' size), at most CGSERVE_MAX_INSTANCES (more is refused). And a request of that many images must fit through
either protocol: Triton's clients send FP32 unless told otherwise, 4 bytes a value, so the v2 infer body over HTTP
and the message over gRPC both take that many FP32 images and their framing, where CGSERVE_MAX_BODY_BYTES is less:
in the binary form over HTTP (JSON's numbers take five times the bytes, and decode to ten times more: those bodies
keep CGSERVE_MAX_BODY_BYTES), and never past CGSERVE_MAX_INFLIGHT_BYTES, which no body could then be admitted within
(start-up warns where a model's batch would want more).
"""

from __future__ import annotations

import logging

from app.config import Settings
from app.repository import ModelConfigError, read_repository
from app.repository.model_spec import ModelSpec

log = logging.getLogger(__name__)
# Room for a request's framing around its tensor bytes: the v2 inference header's JSON, or a ModelInferRequest's
# fields (perf_analyzer's 32 ResNet-50 images: 19,267,584 bytes of FP32 in a message of 19,267,681).
FRAMING_BYTES = 2**20
FP32_BYTES = 4


def max_batch_size(buckets: tuple[int, ...], max_instances: int) -> int:
    """Triton's max_batch_size for a model served at `buckets`: the largest bucket, or CGSERVE_MAX_INSTANCES where
    that is less."""
    return min(max(buckets), max_instances)


def fp32_batch_bytes(settings: Settings, spec: ModelSpec) -> int:
    """A request of max_batch_size FP32 images of `spec`, with its framing."""
    batch = max_batch_size(spec.config.buckets or settings.buckets, settings.max_instances)
    return batch * spec.pixels * FP32_BYTES + FRAMING_BYTES


def infer_body_limit(settings: Settings, specs: list[ModelSpec]) -> int:
    """The largest v2 binary infer body (HTTP) or message (gRPC) taken in: CGSERVE_MAX_BODY_BYTES, or where more the
    largest of `specs`' fp32_batch_bytes, up to CGSERVE_MAX_INFLIGHT_BYTES."""
    largest = max((fp32_batch_bytes(settings, spec) for spec in specs), default=0)
    return max(settings.max_body_bytes, min(largest, settings.max_inflight_bytes))


def repository_infer_body_limit(settings: Settings) -> int:
    """infer_body_limit for the models the repository holds at start-up. A model loaded later with larger images
    than any of them is held to this limit too: the gRPC server's options are fixed once it starts, and HTTP keeps
    the same limit. An unreadable repository counts no model: start-up names its problems."""
    try:
        specs = read_repository(settings.model_repository)
    except (ModelConfigError, OSError):
        specs = []
    for spec in specs:
        if (wanted := fp32_batch_bytes(settings, spec)) > settings.max_inflight_bytes:
            log.warning(
                "%s: a request of max_batch_size FP32 images takes %d bytes, more than "
                "CGSERVE_MAX_INFLIGHT_BYTES (%d): such a request is refused with 413; send UINT8 pixels, or "
                "raise the setting",
                spec.name,
                wanted,
                settings.max_inflight_bytes,
            )
    return infer_body_limit(settings, specs)
