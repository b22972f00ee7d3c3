"""Each request's answer for the k rows of a piece, built for the k rows at once where it can be.

Python's thread answers every request the front door takes, so what it spends a row is the design's
ceiling: for POST /predict of a model of class scores, one orjson call for the k rows, not k calls of
encode_predictions. A v2 request's answer is the HTTP port's codec's, row by row.
"""

from __future__ import annotations

import numpy as np
import orjson

from app.codecs.bodies import encode_predictions
from app.protocols.v2.rest import Asked, V2Codec
from app.service import ServedModel

JSON_HEAD = b"content-type: application/json\r\n"


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

    def __call__(self, scores: np.ndarray, asked: list[Asked | None] | None) -> tuple[list[bytes], list[bytes]]:
        """(k, width) float32 scores → k bodies and their header lines; `asked`: each v2 request's answer as it
        asked (None: a POST /predict one), or None where all are POST /predict."""
        if asked is None:
            return self.predictions(scores), [JSON_HEAD] * len(scores)
        bodies, heads = [], []
        for i, wanted in enumerate(asked):
            if wanted is None:
                bodies.append(self.predictions(scores[i : i + 1])[0])
                heads.append(JSON_HEAD)
            else:
                answer = self.v2.encode(scores[i : i + 1], wanted, self.served, self.engine)
                bodies.append(answer.body)
                heads.append(head_lines(answer.headers))
        return bodies, heads

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
