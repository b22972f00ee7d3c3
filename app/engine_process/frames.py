"""The engine process's socket: length-prefixed frames, one kind byte each.

worker → engine: HELLO (nothing), SEGMENT (JSON: index, path, size), INFER (a fixed header),
                 DECODE (a fixed header: an upload's encoded bytes in a segment, for the GPU's decoder),
                 CONTROL (JSON: a model control call, index, load or unload, and its id),
                 APPLIED (JSON: the generation of the latest MODELS frame this worker now serves)
engine → worker: MODELS (JSON: the models and versions served, each with the id its INFER frames
                 name, whether JPEGs are decoded on the GPU here; or the start-up failure), at
                 HELLO and again to every worker whenever a load or unload changed them,
                 RESULT (a fixed header, then float32 probabilities or a JSON error),
                 DECODED (a fixed header: the pixels' shape, written into the DECODE's segment; or
                 nvJPEG refused the image; or a JSON error),
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

HELLO, MODELS, SEGMENT, INFER, RESULT, DECODE, DECODED, CONTROL, CONTROLLED, APPLIED = range(10)
PREFIX = struct.Struct("<BI")  # kind, payload length
# id, deadline (time.monotonic(), system-wide on Linux), dtype, served model's id, (k, C, H, W), segment
INFER_HEADER = struct.Struct("<QdBxxxIIIIII")
# id, ok, rows, classes, the engine's queued rows and rows/s for the model (the workers' admission)
RESULT_HEADER = struct.Struct("<QBxxxIIId")
# id, served model's id, encoded bytes, segment
DECODE_HEADER = struct.Struct("<QIII")
# id, outcome (DECODED_OK, DECODE_REFUSED: nvJPEG refused it, Pillow decodes it; DECODE_FAILED: a JSON
# error follows), the (1, C, H, W) pixels' C, H, W
DECODED_HEADER = struct.Struct("<QBxxxIII")
DECODED_OK, DECODE_REFUSED, DECODE_FAILED = range(3)
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
