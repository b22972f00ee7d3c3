"""The service's /predict answer for each row of a bulk, built for the k rows at once.

Python's thread answers every request the front door takes, so what it spends a row is the design's
ceiling: for a model of class scores, one orjson call for the k rows, not k calls of encode_predictions.
"""

from __future__ import annotations

import numpy as np
import orjson

from app.codecs.bodies import encode_predictions
from app.repository.model_spec import ModelSpec


class Answers:
    """encode_predictions' answer of one row, for each of k rows."""

    def __init__(self, spec: ModelSpec, engine: str) -> None:
        self.spec, self.engine = spec, engine
        self.at_once = spec.layout.default  # class scores only; named outputs go row by row
        if self.at_once:
            head = orjson.dumps({"model": spec.name, "engine": engine, "postprocess": spec.config.postprocess})
            self.prefix = head[:-1] + b',"predictions":[{"label":'
            self.names = [b',"class_name":' + orjson.dumps(name) + b',"scores":[' for name in spec.class_names]

    def __call__(self, scores: np.ndarray) -> list[bytes]:
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
