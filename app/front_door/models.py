"""Which model each row of a bulk is for, and that model's parts at the front door.

The door takes one image's pixels for any model whose input is an image of the shape its rows were opened for
(the default model's): POST /predict is the default model's; a v2 infer names its model in its path (door.c puts
"<name>[/versions/<version>]" before its JSON header); a gRPC call in its model_name and model_version fields. A
bulk's rows are grouped by the served model they name (one group however they name it: /predict, by name, by
name and version), each group queued on that model's batcher and answered in its model's words. A model that is
not served, or takes images of another shape, is refused as the service's port would refuse it, or with what to
do instead.

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
    """A served model's parts at the door: how its rows are checked and answered. Its batcher is not among them: a
    version replaced or unloaded lets its batcher and engines go (app/service.py's retire), and a part kept here must
    not hold them."""

    served: ServedModel
    answers: Answers
    v2: V2Headers
    grpc: tuple[GrpcHeaders, GrpcAnswers] | None  # None: the door serves no gRPC

    @property
    def name(self) -> str:
        return self.served.spec.name


@dataclass(frozen=True, eq=False)
class Group:
    """A bulk's rows for one model (`rows`: their indices, in order) and its batcher as the bulk was taken, or rows
    for a model refused with `error`."""

    rows: np.ndarray
    model: DoorModel | None
    batcher: Batcher | None = None
    error: ServiceError | None = None


class DoorModels:
    def __init__(self, service: Service, shape: tuple[int, int, int], v2: V2Codec,
                 grpc: GrpcRows | None = None) -> None:  # fmt: skip
        self.service, self.shape, self.v2, self.grpc = service, shape, v2, grpc
        self._parts: dict[ServedModel, DoorModel] = {}  # each served model's (and version's) once made

    def default(self) -> ServedModel:
        """The default model; a ServiceError where it no longer takes the door's images."""
        served = self.service.model(None)
        if served.spec.input_shape != self.shape:
            raise NotReadyError(
                f"the default model {served.spec.name} now takes {served.spec.input_shape} images and the front "
                f"door was opened for {self.shape}: send to the HTTP port, or restart the server"
            )
        return served

    def named(self, name: str, version: str | None) -> ServedModel:
        """The named model (its `version`, else its newest); a ServiceError as the service's port answers an unknown
        one, or where its images are not the door's."""
        served = self.service.model(name, version)
        if served.spec.input_shape != self.shape:
            raise InputError(
                f"the model {name} takes {served.spec.input_shape} images; this front door takes those of "
                f"{self.shape} only",
                expected=f"requests for {name} on the service's ports",
            )
        return served

    def groups(self, count: int, kinds: np.ndarray | None, headers: list[bytes] | None
               ) -> tuple[list[Group], list[bytes] | None]:  # fmt: skip
        """A bulk's `count` rows grouped by the model each names (requests that name one model differently, by
        /predict, by name, by name and version, are one group), and its headers as each model's checks read them
        (a v2 request's without its model). A group's error is the one its rows are answered with."""
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
        groups: dict[int, Group] = {}  # by the served model (an error: by its key), so that one model is one group
        for key, rows in keys.items():
            group = self._group(np.sort(np.array(rows)), key)
            mine = id(group.model.served) if group.model is not None else id(group)
            if mine in groups:
                both = np.sort(np.concatenate((groups[mine].rows, group.rows)))
                group = Group(both, group.model, group.batcher)
            groups[mine] = group
        return list(groups.values()), headers

    def _group(self, rows: np.ndarray, key: Key) -> Group:
        try:  # unknown, not ready (a failure, a broken device), or of other images: as the port refuses it
            served = self.default() if key is None else self.named(*key)
            batcher = served.ready_batcher()
        except ServiceError as error:
            return Group(rows, None, error=error)
        assert isinstance(batcher, Batcher), "the front door runs in the process of the engines"
        return Group(rows, self._model(served, batcher.engines[0].name), batcher)

    def _model(self, served: ServedModel, engine: str) -> DoorModel:
        """`served`'s parts, made again where its engine (which the answers name) changed."""
        found = self._parts.get(served)
        if found is not None and found.answers.engine == engine:
            return found
        self._parts = {old: parts for old, parts in self._parts.items() if not old.retired}  # replaced, unloaded
        grpc = None if self.grpc is None else self.grpc.parts(served)
        made = DoorModel(served, Answers(served, engine, self.v2), V2Headers(self.v2, served.spec), grpc)
        self._parts[served] = made
        return made
