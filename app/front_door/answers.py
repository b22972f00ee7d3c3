"""Each request's answer for the k rows of a piece, built for the k rows at once where it can be.

Python's thread answers every request the front door takes, so what it spends a row is the design's
ceiling: for POST /predict of a model of class scores, one orjson call for the k rows, not k calls of
encode_predictions. A v2 request's answer is the HTTP port's codec's; where its outputs are all binary
values (perf_analyzer's and Triton's clients' usual ask), its JSON header is the same for every row but for
the id, so the rows of a piece share one header built once and each gets its own values' bytes.
"""

from __future__ import annotations

from collections import defaultdict
from http import HTTPStatus

import numpy as np
import orjson

from app.codecs.bodies import encode_predictions
from app.protocols.v2 import tensors
from app.protocols.v2.rest import HEADER_LENGTH, Asked, V2Codec
from app.repository.model_spec import ModelSpec
from app.service import ServedModel

JSON_HEAD = b"content-type: application/json\r\n"
BINARY_HEAD = b"inference-header-content-length: %d\r\ncontent-type: application/octet-stream\r\n"  # V2Codec's


def status_line(status: int) -> bytes:
    """An answer's status as door.c writes it after "HTTP/1.1 ": b"503 Service Unavailable"."""
    return b"%d %s" % (status, HTTPStatus(status).phrase.encode())


def head_lines(headers: list[tuple[bytes, bytes]]) -> bytes:
    """An answer's header lines as door.c writes them after its status line."""
    return b"".join(b"%s: %s\r\n" % header for header in headers)


class Answers:
    """The HTTP port's answer to each request of a piece: POST /predict's, or the v2 infer's as it asked."""

    def __init__(self, served: ServedModel, engine: str, v2: V2Codec) -> None:
        self.served, self.spec, self.engine, self.v2 = served, served.spec, engine, v2
        spec = served.spec
        self.at_once = spec.layout.default  # class scores only; named outputs go row by row
        if self.at_once:
            head = orjson.dumps({"model": spec.name, "engine": engine, "postprocess": spec.config.postprocess})
            self.prefix = head[:-1] + b',"predictions":[{"label":'
            self.names = [b',"class_name":' + orjson.dumps(name) + b',"scores":[' for name in spec.class_names]
        self._binary: dict[tuple[tensors.Wanted, ...], BinaryAnswers | None] = {}  # None: not all binary values

    def __call__(self, scores: np.ndarray, asked: list[Asked | None] | None) -> tuple[list[bytes], list[bytes]]:
        """(k, width) float32 scores → k bodies and their header lines; `asked`: each v2 request's answer as it
        asked (None: a POST /predict one), or None where all are POST /predict."""
        if asked is None:
            return self.predictions(scores), [JSON_HEAD] * len(scores)
        bodies: list[bytes] = [b""] * len(scores)
        heads: list[bytes] = [b""] * len(scores)
        groups: dict[tuple[tensors.Wanted, ...], list[int]] = defaultdict(list)  # the v2 rows, by what they ask
        for i, wanted in enumerate(asked):
            if wanted is None:
                bodies[i], heads[i] = self.predictions(scores[i : i + 1])[0], JSON_HEAD
            else:
                groups[wanted.outputs].append(i)
        for outputs, rows in groups.items():
            binary = self._binary_answers(outputs, scores[rows[:1]])
            if binary is not None:
                ids = [asked[i].id for i in rows]  # type: ignore[union-attr]
                for i, body, head in zip(rows, *binary(scores[rows], ids), strict=True):
                    bodies[i], heads[i] = body, head
                continue
            for i in rows:
                answer = self.v2.encode(scores[i : i + 1], asked[i], self.served, self.engine)  # type: ignore[arg-type]
                bodies[i], heads[i] = answer.body, head_lines(answer.headers)
        return bodies, heads

    def _binary_answers(self, outputs: tuple[tensors.Wanted, ...], row: np.ndarray) -> BinaryAnswers | None:
        if outputs not in self._binary:
            self._binary[outputs] = BinaryAnswers.made(self, outputs, row)
        return self._binary[outputs]

    def predictions(self, scores: np.ndarray) -> list[bytes]:
        """(k, width) float32 → k answers, byte for byte encode_predictions' of each row alone."""
        if not self.at_once:
            return [self._one(scores[i : i + 1]) for i in range(len(scores))]
        labels = scores.argmax(axis=1).tolist()
        rows = orjson.dumps(scores, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2].split(b"],[")  # b"[[…],[…]]"
        return [
            b"%s%d%s%s]}]}" % (self.prefix, label, self.names[label], row)
            for label, row in zip(labels, rows, strict=True)
        ]

    def _one(self, row: np.ndarray) -> bytes:
        return encode_predictions(row, model=self.spec.name, engine=self.engine, spec=self.spec)


class BinaryAnswers:
    """The v2 answers of rows that asked for `outputs`, every one binary values: one JSON header for them all
    (the id put in where a request has one), then each row's values as little-endian bytes."""

    MARK = "front-door-template-id"  # an id to check the template with

    def __init__(self, spec: ModelSpec, outputs: tuple[tensors.Wanted, ...], header: bytes) -> None:
        self.spec, self.outputs = spec, outputs
        # {"model_name":…,"model_version":…,"outputs":[…][,"id":…]}: infer_answer's order, the id last
        self.before_id = header[:-1]

    @classmethod
    def made(cls, answers: Answers, outputs: tuple[tensors.Wanted, ...], row: np.ndarray) -> BinaryAnswers | None:
        """The template for `outputs`, checked against the codec's own answer for `row` with and without an id;
        None where the outputs are not all binary values, or the two differ (each row is then encoded alone)."""
        if not all(want.binary and not want.classes for want in outputs):
            return None
        plain = answers.v2.encode(row, Asked(None, outputs), answers.served, answers.engine)
        length = int(dict(plain.headers)[HEADER_LENGTH.encode()])
        template = cls(answers.spec, outputs, plain.body[:length])
        for request_id in (None, cls.MARK):
            want = answers.v2.encode(row, Asked(request_id, outputs), answers.served, answers.engine)
            (body,), (head,) = template(row, [request_id])
            if (body, head) != (want.body, head_lines(want.headers)):
                return None
        return template

    def __call__(self, scores: np.ndarray, ids: list[str | None]) -> tuple[list[bytes], list[bytes]]:
        """(k, width) scores and each row's id → k bodies and their header lines."""
        k = len(scores)
        raws = [tensors.raw_bytes(*answered) for answered in tensors.answer_tensors(self.spec, scores, self.outputs)]
        widths = [len(raw) // k for raw in raws]  # each output's bytes a row
        bodies, heads = [], []
        for i, request_id in enumerate(ids):
            header = self.before_id
            if request_id is not None:
                header += b',"id":' + orjson.dumps(request_id)
            header += b"}"
            values = b"".join(raw[i * width : (i + 1) * width] for raw, width in zip(raws, widths, strict=True))
            bodies.append(header + values)
            heads.append(BINARY_HEAD % len(header))
        return bodies, heads
