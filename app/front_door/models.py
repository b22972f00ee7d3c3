"""Which model each row of a bulk is for, and that model's parts at the front door.

The door takes one image's pixels for any model whose input is an image of the shape its rows were opened for
(the default model's): POST /predict is the default model's; a v2 infer names its model in its path (door.c puts
"<name>[/versions/<version>]" before its JSON header); a gRPC call in its model_name and model_version fields. A
bulk's rows are grouped by the model they name, each group queued on that model's batcher and answered in its
model's words. A model that is not served, or takes images of another shape, is refused as the service's port
would refuse it, or with what to do instead.

A client sends the same fields with every call, so a gRPC call's model is read once per distinct request (its id
cut off: grpc_calls.py), and each model's parts (its answers, and the checks of its v2 headers and gRPC requests)
are made once per served model and version, again when it is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from app.batching.batcher import Batcher
from app.errors import InputError, NotReadyError, ServiceError
from app.front_door.answers import Answers
from app.front_door.door import GRPC, V2, model_and_header
from app.front_door.v2_headers import V2Headers
from app.protocols.v2.rest import V2Codec
from app.service import ServedModel, Service

if TYPE_CHECKING:  # loaded where the door serves gRPC (server.py)
    from app.front_door.grpc_calls import GrpcAnswers, GrpcHeaders, GrpcRows

Key = tuple[str, str | None] | None  # (name, version or None) as the request names its model; None: the default


@dataclass(frozen=True, eq=False)
class DoorModel:
    """A served model's parts at the door: where its rows go and how they are checked and answered."""

    served: ServedModel
    batcher: Batcher
    answers: Answers
    v2: V2Headers
    grpc: tuple[GrpcHeaders, GrpcAnswers] | None  # None: the door serves no gRPC

    @property
    def name(self) -> str:
        return self.served.spec.name


@dataclass(frozen=True, eq=False)
class Group:
    """A bulk's rows for one model (`rows`: their indices, in order), or for a model refused with `error`."""

    rows: np.ndarray
    model: DoorModel | None
    error: ServiceError | None = None


class DoorModels:
    def __init__(self, service: Service, shape: tuple[int, int, int], v2: V2Codec,
                 grpc: GrpcRows | None = None) -> None:  # fmt: skip
        self.service, self.shape, self.v2, self.grpc = service, shape, v2, grpc
        self._parts: dict[ServedModel, DoorModel] = {}  # each served model's (and version's) once made

    def default(self) -> DoorModel:
        """The default model's parts; a ServiceError where it is not ready or no longer takes the door's images."""
        served = self.service.model(None)
        if served.spec.input_shape != self.shape:
            raise NotReadyError(
                f"the default model {served.spec.name} now takes {served.spec.input_shape} images and the front "
                f"door was opened for {self.shape}: send to the HTTP port, or restart the server"
            )
        return self._model(served)

    def named(self, name: str, version: str | None) -> DoorModel:
        """The named model's parts (its `version`, else its newest); a ServiceError as the service's port answers an
        unknown one, or where its images are not the door's."""
        served = self.service.model(name, version)
        if served.spec.input_shape != self.shape:
            raise InputError(
                f"the model {name} takes {served.spec.input_shape} images; this front door takes those of "
                f"{self.shape} only",
                expected=f"requests for {name} on the service's ports",
            )
        return self._model(served)

    def groups(self, count: int, kinds: np.ndarray | None, headers: list[bytes] | None
               ) -> tuple[list[Group], list[bytes] | None]:  # fmt: skip
        """A bulk's `count` rows grouped by model, and its headers as each model's checks read them (a v2
        request's without its model). A group's error is the one its rows are answered with."""
        if kinds is None or headers is None or not (named := (kinds == V2) | (kinds == GRPC)).any():
            return [self._group(np.arange(count), None)], headers
        headers = list(headers)
        keys: dict[Key, list[int]] = {}
        for i in np.flatnonzero(named).tolist():
            key: Key
            if kinds[i] == V2:
                name, version, headers[i] = model_and_header(headers[i])
                key = (name, version)
            else:  # a request that does not parse goes to the default model, whose check says what is wrong with it
                assert self.grpc is not None, "grpc.c takes no call where the door serves no gRPC"
                key = self.grpc.model_of(headers[i])
            keys.setdefault(key, []).append(i)
        if (rest := np.flatnonzero(~named)).size:
            keys[None] = [*keys.get(None, []), *rest.tolist()]
        return [self._group(np.sort(np.array(rows)), key) for key, rows in keys.items()], headers

    def _group(self, rows: np.ndarray, key: Key) -> Group:
        try:
            return Group(rows, self.default() if key is None else self.named(*key))
        except ServiceError as error:
            return Group(rows, None, error)

    def _model(self, served: ServedModel) -> DoorModel:
        found = self._parts.get(served)
        if found is not None and found.batcher is served.batcher:
            served.ready_batcher()  # not ready (a failure, a broken device): refused as the port refuses it
            return found
        batcher = served.ready_batcher()
        assert isinstance(batcher, Batcher), "the front door runs in the process of the engines"
        if len(self._parts) > 2 * len(self.service.models):  # some were replaced or unloaded since: let go
            self._parts = {old: parts for old, parts in self._parts.items() if self._serving(old)}
        grpc = None if self.grpc is None else self.grpc.parts(served)
        answers = Answers(served, batcher.engines[0].name, self.v2)
        made = DoorModel(served, batcher, answers, V2Headers(self.v2, served.spec), grpc)
        self._parts[served] = made
        return made

    def _serving(self, served: ServedModel) -> bool:
        name = served.spec.name
        return self.service.models.get(name) is served or served in self.service.versions.get(name, {}).values()
