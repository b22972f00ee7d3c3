"""The front door's v2 requests: each JSON inference header checked as the HTTP port checks it, once.

door.c takes POST /v2/models/<model>[/versions/<v>]/infer whose binary section is one image's uint8 pixels,
for any model of the door's images, and hands Python each request's JSON header (models.py takes the model's
name off its front first) (a Triton client's ~250 bytes: the input's name, shape, datatype and
binary_data_size, and the outputs it wants). A client sends the same header with every request, so a header
is checked once, by the HTTP port's own codec, and what it asks is looked up by its bytes from then on. But
for its "id": perf_analyzer's asynchronous mode numbers every request (run 36: each header checked afresh held
it to 0.47× of the engine's peak), so a header with an id is parsed (~2 µs) and looked up without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import orjson

from app.errors import InputError, ServiceError
from app.http.answer import HttpBody
from app.protocols.v2 import tensors
from app.protocols.v2.rest import Asked, V2Codec
from app.repository.model_spec import ModelSpec

T = TypeVar("T")
MOST_KNOWN = 1024  # distinct headers remembered (a client that sends a new id each time misses every time)


class KnownHeaders:
    """One model's door requests' headers (a v2 request's JSON, a gRPC call's other fields), each checked once with
    `probe` pixels decoded beside it and remembered by its bytes, or by its bytes without its id."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.image_shape = (1, *spec.input_shape)
        # Only a UINT8 input of one (C, H, W) image decodes back to these very bytes, which is what the door copied.
        self.probe = (np.arange(int(np.prod(spec.input_shape))) % 251).astype(np.uint8).tobytes()
        self.known: dict[bytes, Asked | ServiceError] = {}  # by the header's bytes: one without an id
        self.known_but_id: dict[bytes, Asked | ServiceError] = {}  # by its bytes once its id is taken out

    def as_copied(self, images: object) -> bool:
        """Whether a decode gave back the probe as it is: one (1, C, H, W) uint8 image."""
        return (isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.shape == self.image_shape
                and images.tobytes() == self.probe)  # fmt: skip


class V2Headers(KnownHeaders):
    """A header's answer as asked (`Asked`), or the error the HTTP port answers it, for one model."""

    def __init__(self, codec: V2Codec, spec: ModelSpec) -> None:
        super().__init__(spec)
        self.codec = codec

    def __call__(self, header: bytes) -> Asked | ServiceError:
        found = self.known.get(header)
        if found is not None:
            return found
        try:
            document = orjson.loads(header)
        except orjson.JSONDecodeError:
            document = None
        if not isinstance(document, dict) or "id" not in document:  # checked as it is, and known by its bytes
            return remember(self.known, header, lambda: self._check(header))
        request_id = document.pop("id")
        rest = orjson.dumps(document)
        found = remember(self.known_but_id, rest, lambda: self._check(rest))
        if isinstance(found, ServiceError) or request_id is None:  # "id": null, as none
            return found
        try:
            return dataclasses.replace(found, id=tensors.checked_id(request_id))
        except ServiceError as error:
            return error

    def _check(self, header: bytes) -> Asked | ServiceError:
        request = HttpBody(header + self.probe, "", "", str(len(header)))
        try:
            decoded = self.codec.decode_cheaply(request, self.spec)
        except ServiceError as error:  # what the HTTP port answers this request
            return error
        if decoded is None or not self.as_copied(decoded[0]):
            return InputError(
                "the front door takes one image's pixels as the one UINT8 input of the binary tensor extension",
                expected=f"an input of shape {list(self.image_shape)} and datatype UINT8; send any other "
                "tensor, or encoded images (BYTES), to the service's HTTP port",
            )
        return decoded[1]


def remember(known: dict[bytes, T], key: bytes, check: Callable[[], T]) -> T:
    """known[key], checked and kept where it is not yet (at most MOST_KNOWN kept)."""
    found = known.get(key)
    if found is None:
        if len(known) >= MOST_KNOWN:
            known.clear()
        found = known[key] = check()
    return found
