"""The engine process's socket: length-prefixed frames, one kind byte each.

worker → engine: HELLO (nothing), SEGMENT (JSON: index, path, size), INFER (a fixed header),
                 UPLOADS (a fixed header, then each image's length: a request's encoded JPEGs, one after
                 the other in a segment, decoded by the GPU's decoder and inferred, one trip),
                 CONTROL (JSON: a model control call, index, load or unload, and its id),
                 APPLIED (JSON: the generation of the latest MODELS frame this worker now serves)
engine → worker: MODELS (JSON: the models and versions served, each with the id its INFER frames
                 name, whether JPEGs are decoded on the GPU here; or the start-up failure), at
                 HELLO and again to every worker whenever a load or unload changed them,
                 RESULT (a fixed header, then float32 probabilities or a JSON error; for UPLOADS
                 also "nvJPEG refused one of them": the worker decodes them with Pillow),
                 CONTROLLED (JSON: the control call's id and its answer or error), once every
                 worker has APPLIED the MODELS frame its change sent
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import numpy as np
import orjson

from app.errors import ServiceError

HELLO, MODELS, SEGMENT, INFER, RESULT, UPLOADS, CONTROL, CONTROLLED, APPLIED = range(9)
PREFIX = struct.Struct("<BI")  # kind, payload length
# id, deadline (time.monotonic(), system-wide on Linux), dtype, served model's id, (k, C, H, W), segment
INFER_HEADER = struct.Struct("<QdBxxxIIIIII")
# id, outcome, rows, classes, the engine's queued rows and rows/s for the model (the workers' admission)
RESULT_HEADER = struct.Struct("<QBxxxIIId")
# RESULT's outcome: a JSON error follows; the (rows, classes) scores follow; UPLOADS nvJPEG refused every image of:
# the worker decodes them (nothing follows); UPLOADS of which nvJPEG refused some: refusal_flags(k) then the
# scores of the rest follow (PARTLY_REFUSED)
FAILED, ANSWERED, REFUSED, PARTLY_REFUSED = range(4)
# id, deadline, served model's id, images k, segment; then the k images' byte lengths, upload_lengths(k)
UPLOADS_HEADER = struct.Struct("<QdIII")


def refusal_flags_size(k: int) -> int:
    """Bytes of a PARTLY_REFUSED answer's flags, one an image of the frame (1: nvJPEG refused it), padded to
    8 so that the float32 scores after them are aligned."""
    return -(-k // 8) * 8


def upload_lengths(k: int) -> struct.Struct:
    return struct.Struct(f"<{k}I")  # compiled each frame: a fraction of a µs


DTYPES = (np.dtype(np.uint8), np.dtype(np.float32))


def frame(kind: int, payload: bytes = b"") -> bytes:
    return PREFIX.pack(kind, len(payload)) + payload


def json_frame(kind: int, value: Any) -> bytes:
    return frame(kind, orjson.dumps(value))


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """(kind, payload); asyncio.IncompleteReadError at the end of the stream."""
    kind, length = PREFIX.unpack(await reader.readexactly(PREFIX.size))
    return kind, await reader.readexactly(length) if length else b""


def error_fields(error: ServiceError) -> dict[str, Any]:
    return {"status": error.status, "code": error.code, "reason": error.reason, "message": error.message,
            "expected": error.expected, "headers": error.headers}  # fmt: skip


def error_payload(error: ServiceError) -> bytes:
    return orjson.dumps(error_fields(error))


class EngineProcessError(ServiceError):
    """An error the engine process answered, as it answered it (status, code, reason, headers)."""

    def __init__(self, payload: bytes | dict[str, Any]) -> None:
        fields = orjson.loads(payload) if isinstance(payload, bytes) else payload
        super().__init__(fields["message"], expected=fields["expected"], headers=fields["headers"])
        self.status, self.code, self.reason = fields["status"], fields["code"], fields["reason"]
