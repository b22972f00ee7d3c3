"""The service's /predict answer for each row of a bulk, built for the k rows at once.

Python's thread answers every request the front door takes, so what it spends a row is the design's
ceiling: one orjson call for the k rows, not k calls of encode_predictions.
"""

from __future__ import annotations

import numpy as np
import orjson

from app.codecs.bodies import encode_predictions
from app.repository.model_spec import ModelSpec


class Answers:
    """encode_predictions' answer of one row, for each of k rows (models of class scores: `check` says so)."""

    def __init__(self, spec: ModelSpec, engine: str) -> None:
        head = orjson.dumps({"model": spec.name, "engine": engine, "postprocess": spec.config.postprocess})
        self.prefix = head[:-1] + b',"predictions":[{"label":'
        self.names = [b',"class_name":' + orjson.dumps(name) + b',"scores":[' for name in spec.class_names]
        self.spec, self.engine = spec, engine

    def __call__(self, scores: np.ndarray) -> list[bytes]:
        """(k, classes) float32 → k answers, byte for byte encode_predictions' of each row alone."""
        labels = scores.argmax(axis=1).tolist()
        rows = orjson.dumps(scores, option=orjson.OPT_SERIALIZE_NUMPY)[2:-2].split(b"],[")  # b"[[…],[…]]"
        return [
            b"%s%d%s%s]}]}" % (self.prefix, label, self.names[label], row)
            for label, row in zip(labels, rows, strict=True)
        ]

    def check(self) -> None:
        """ValueError where a byte differs from encode_predictions' (a model with named outputs, say)."""
        scores = np.random.default_rng(0).random((3, len(self.names)), dtype=np.float32)
        mine = self(scores)
        theirs = [encode_predictions(scores[i : i + 1], model=self.spec.name, engine=self.engine, spec=self.spec)
                  for i in range(3)]  # fmt: skip
        if mine != theirs:
            raise ValueError(f"the bulk answers differ from encode_predictions': {mine[0]!r} != {theirs[0]!r}")
