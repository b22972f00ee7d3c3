"""The front door's life in the process that holds the engines: opened with the models, before readiness,
counted while it serves, drained and closed before the batchers stop. Its answers to the v2 metadata GETs and
gRPC's metadata calls are set here, and set afresh every second."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from typing import TYPE_CHECKING

import numpy as np
import orjson

from app.access.tokens import load_tokens
from app.codecs.uploads import PacedDecoder, RowWritingDecoder
from app.config import Settings
from app.errors import ServiceError
from app.front_door.answers import JSON_HEAD, status_line
from app.front_door.door import GRPC_CODE_NAMES, MAX_GETS, Door, Limits
from app.front_door.feeder import FORM, GRPC_FORM, PROTOCOL, V2_FORM, Feeder
from app.front_door.launcher import CLOSE_MARGIN_S, Launcher
from app.front_door.library import door_library
from app.http.answer import error_answer
from app.ops import metrics
from app.ops.connection_budgets import connection_budgets
from app.ops.listening import stop_queueing
from app.protocols.v2 import tensors
from app.protocols.v2.rest import config_body, metadata_body
from app.service import Service

if TYPE_CHECKING:
    from app.front_door.grpc_calls import GrpcRows

log = logging.getLogger(__name__)
# The door's HTTP refusals by status → cgserve_rejections_total's reason, as the service's port counts the same
# refusals. 503 is left out: the door gives it for two causes (its connections, its bytes in flight) that it does not
# count apart.
REJECTION_REASONS = {400: "invalid_input", 401: "unauthorized", 404: "invalid_route", 405: "invalid_route",
                     408: "request_timeout", 411: "invalid_input", 413: "body_too_large", 415: "invalid_input",
                     422: "invalid_input", 431: "invalid_input"}  # fmt: skip
TEND_EVERY_S = 1.0  # how often the C side's refusals are counted and its GET answers set afresh
DRAIN_POLL_S = 0.01  # how often a drain looks whether every request is answered and every connection closed


def door_buffers(settings: Settings, *, paced_launches: int) -> int:
    """The bulks door.c holds (MOST_ROWS × C×H×W bytes each, touched as rows come): one for each batch in flight and
    one to fill; and where the GPU decoder paces bulks of JPEGs (feeder.py), launching `paced_launches` batches at
    once (0: no such decoder), room for those too: at each launch about one being decoded and one whose rows wait for
    the model, and one waiting for a launch. Nothing else bounds the bulks the decoder paces: once every buffer is
    held, rows wait in C until one is released."""
    return settings.in_flight + 1 + (2 * paced_launches + 1 if paced_launches else 0)


def pin_buffers(service: Service, door: Door) -> list[np.ndarray]:
    """The door's buffers registered for the GPU decoder to write photos' pixels into (jpeg_pinned_rows), those it
    registered; none where there is no such decoder. Locks their pages: a second or so for ResNet-50's 1.8 GB."""
    decoder = service.jpeg_decoder
    if not service.settings.jpeg_pinned_rows or not isinstance(decoder, RowWritingDecoder):
        return []
    pinned = [rows for rows in door.buffers if decoder.pin(rows)]
    log.info("front door: %d of its %d buffers pinned (%d MB) for the GPU decoder's copies", len(pinned),
             len(door.buffers), sum(rows.nbytes for rows in pinned) >> 20)  # fmt: skip
    return pinned


def attach(service: Service) -> None:
    """Open the front door with `service`'s models and close it before its batchers, where front_door_port is
    set and the engines are this process's (the one worker, or the engine process)."""
    if not service.settings.front_door_port or service.engine_link is not None:
        return
    doors: list[FrontDoor] = []

    async def opened() -> None:
        doors.append(await FrontDoor.open(service))

    async def stopped() -> None:
        for door in doors:
            await door.stop(service.settings.shutdown_timeout_s)

    def stop_accepting() -> None:
        for door in doors:
            door.stop_accepting()

    service.on_started.append(opened)
    service.on_stop_accepting.append(stop_accepting)
    service.on_stop.append(stopped)


class FrontDoor:
    def __init__(self, service: Service, door: Door, listeners: list[socket.socket], wake: int, feeder: Feeder,
                 grpc: GrpcRows | None, pinned: list[np.ndarray]) -> None:  # fmt: skip
        self.service, self.door, self.listeners, self.wake, self.feeder = service, door, listeners, wake, feeder
        self.grpc = grpc  # the gRPC calls' parts, where the door serves gRPC
        self.pinned = pinned  # the door's buffers the GPU decoder writes pixels into directly (pin_buffers)
        self.refused: dict[tuple[str, str], int] = {}  # (format, code) → what was counted into Prometheus so far
        self.left_out: list[str] = []  # the models whose metadata the door's answers have no room for
        self.default_name = service.model(None).spec.name  # the default model: the door opened for its images
        self.launcher = Launcher(service, door, feeder.models.shape)  # bound at the first tend, once serving
        self._set_gets()
        self.counter = asyncio.create_task(self._tend_forever(), name="front-door-tending")
        asyncio.get_running_loop().add_reader(wake, self._woken)

    @classmethod
    async def open(cls, service: Service) -> FrontDoor:
        """The door on front_door_port, for the default model's images (its input shape decides a request's body)
        and every other model that takes them."""
        settings = service.settings
        default = service.model(None).spec
        shape = default.input_shape
        library = await asyncio.to_thread(door_library, settings.front_door_library)
        listener = socket.create_server((settings.host, settings.front_door_port), backlog=4096)
        listener.setblocking(False)
        grpc_listener, grpc = None, None
        if settings.front_door_grpc_port:
            # Loaded only where the door serves gRPC, as app/main.py loads the gRPC port's: the protocol's messages.
            from app.front_door.grpc_calls import GrpcRows

            grpc_listener = socket.create_server((settings.host, settings.front_door_grpc_port), backlog=4096)
            grpc_listener.setblocking(False)
            grpc = GrpcRows(service)
        limits = Limits(
            max_connections=connection_budgets(settings).door,  # its share of the process's descriptors
            keepalive_s=settings.keepalive_timeout_s,
            request_s=settings.header_timeout_s + settings.body_timeout_s,
            tokens=tuple(load_tokens(settings.auth_tokens, settings.auth_tokens_file)),
            max_bytes=settings.max_inflight_bytes,  # the door's own budget, beside the service's ports' one
            max_pixels=default.max_image_pixels(settings.max_image_pixels),  # the uploads nvJPEG is given
        )
        wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        paced = service.jpeg_decoder if isinstance(service.jpeg_decoder, PacedDecoder) else None
        door = Door(
            library,
            listener,
            threads=settings.front_door_threads,
            shape=shape,
            wake_fd=wake,
            buffers=door_buffers(settings, paced_launches=paced.launches if paced is not None else 0),
            path=b"/predict",
            full_rows=max(settings.buckets),
            limits=limits,
            grpc_listener=grpc_listener,
        )
        log.info(
            "front door on %s:%d: %d threads, POST /predict (%s) and /v2/models/<model>/infer with %s uint8 pixels "
            "(every model that takes them)",
            settings.host, settings.front_door_port, settings.front_door_threads, default.name,
            "×".join(map(str, shape)),
        )  # fmt: skip
        if grpc_listener is not None:
            log.info("front door gRPC on %s:%d: ModelInfer", settings.host, settings.front_door_grpc_port)
        listeners = [listener] if grpc_listener is None else [listener, grpc_listener]
        pinned = await asyncio.to_thread(pin_buffers, service, door)
        return cls(service, door, listeners, wake, Feeder(door, service, shape, settings, grpc), grpc, pinned)

    def _woken(self) -> None:  # a bulk turned non-empty, or reached a largest bucket
        try:
            os.eventfd_read(self.wake)
        except BlockingIOError:
            return
        self.feeder.pump()

    def stop_accepting(self) -> None:
        """The drain is over: no connection is taken from now on, as the service's port takes none. A connecting
        client's SYN goes unanswered until the listener closes (app/ops/listening.py), rather than its connection
        being accepted and then reset; the connections open are still answered (stop)."""
        for listener in self.listeners:
            stop_queueing(listener)
        self.door.drain()

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting; answer every request taken, each closing its connection; wait for idle connections to
        reach their keep-alive timeout (at most timeout_s in all), then close what is left."""
        self.door.drain()
        latest = time.monotonic() + timeout_s
        self.counter.cancel()
        await asyncio.gather(self.counter, return_exceptions=True)
        # Its rows answered (new ones go to the feeder), never bound again; a close the tend began is awaited.
        launcher_ended = await self.launcher.unbind(self.service.settings.batch_timeout_s + CLOSE_MARGIN_S,
                                                    for_good=True)  # fmt: skip
        while (not self.feeder.idle() or self.door.open_connections()) and time.monotonic() < latest:
            self.feeder.pump()
            await asyncio.sleep(DRAIN_POLL_S)
        asyncio.get_running_loop().remove_reader(self.wake)
        self.feeder.close()  # no bulk is taken from here on: none can start a decode while the buffers are unpinned
        self._count()
        if self.pinned and not await self._unpinned(max(0.0, latest - time.monotonic())):
            self.door.detach()
            return  # a decoder batch may still write the buffers: the door left open (and pinned) for the process's end
        if not launcher_ended:
            self.door.detach()
            return  # the launcher's thread may still answer through the door: left open for the process's end
        # Detached here, on the loop, where a batch that outlived the timeout may still answer: that answer then
        # finds the door gone, not freed under it. Freed on a thread: it joins the door's, up to one sweep's wait.
        await asyncio.to_thread(self.door.free, self.door.detach())
        for listener in self.listeners:
            listener.close()
        os.close(self.wake)

    async def _unpinned(self, timeout_s: float) -> bool:
        """The door's pinned buffers unregistered once no decoder batch can write their rows any more: bulks still
        decoding after the drain are stopped (their requests answered 503; the feeder, closed, takes no other),
        then every batch launched is waited for. False where the device is dead or that wait outlasts `timeout_s`:
        C must not free a row the device may still write, so the buffers are left as they are (the decoder told
        to leave them too) for the process's end."""
        decoder = self.service.jpeg_decoder
        assert isinstance(decoder, RowWritingDecoder)
        if self.service.device_dead:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                while self.feeder.decoding:  # each waits, in BulkImages.decode, for the launched batches with its rows
                    stopping = list(self.feeder.decoding)
                    for task in stopping:
                        task.cancel()
                    await asyncio.gather(*stopping, return_exceptions=True)
                await decoder.settled()  # the batches of bulks that ended without waiting: none is launched now
        except TimeoutError:
            log.warning("front door: the GPU decoder's batches outlasted the shutdown timeout; its buffers are left "
                        "allocated")  # fmt: skip
            decoder.abandon_pinned()
            return False
        for rows in self.pinned:
            await asyncio.to_thread(decoder.unpin, rows)  # a CUDA call that can wait: off the loop
        return True

    async def _tend_forever(self) -> None:
        with contextlib.suppress(Exception):  # a failed start-up is the service's to report
            await self.service.wait_started()  # ready from now on (the door opened before): its GETs say so at once
        self._set_gets()
        await self.launcher.tend()
        while True:
            await asyncio.sleep(TEND_EVERY_S)
            self._count()
            self._set_gets()
            await self.launcher.tend()

    def _set_gets(self) -> None:
        """The GETs a v2 client sends before its inferences (perf_analyzer reads the model's metadata and
        configuration from the address it is given), answered as the HTTP port answers them, a second stale at
        most: for the default model (what the port says of it, unloaded or not) and every model the door serves."""
        gets = [
            (b"/v2/health/live", *_answer(200, b'{"live":true}'), False),
            (b"/v2/health/ready", *_readiness(self.service.readiness()[0]), False),
            (b"/v2", *_answer(200, orjson.dumps(tensors.server_metadata())), True),
        ]
        grpc = self.grpc.server_gets() if self.grpc else []
        left_out = []
        here = self._served_here()
        for name in here:
            model = [get for version in self._versions(name) for get in self._model_gets(name, version)]
            model_grpc = self.grpc.model_gets(name, self._versions(name)) if self.grpc else []
            if len(gets) + len(grpc) + len(model) + len(model_grpc) > MAX_GETS:
                left_out.append(name)
                continue
            gets += model
            grpc += model_grpc
        # gRPC's ModelReady of the service's other models too, and of those left out above: the door answers one it
        # has not been given "not ready"
        for name in sorted(set(self.service.models) - set(here)) + left_out:
            ready = self.grpc.ready_gets(name, self._versions(name)) if self.grpc else []
            if len(gets) + len(grpc) + len(ready) > MAX_GETS:
                if name not in left_out:
                    left_out.append(name)
                continue
            grpc += ready
        if left_out != self.left_out:  # said once a change, not each second
            self.left_out = left_out
            if left_out:
                log.warning("front door: the v2 metadata of %s are the service's ports' only (it holds %d answers)",
                            ", ".join(left_out), MAX_GETS)  # fmt: skip
        self.door.set_gets(gets + grpc)

    def _versions(self, name: str) -> list[str]:
        """ "" (the model by name) and each version of it served now."""
        return ["", *sorted(self.service.versions.get(name, {}), key=int)]

    def _model_gets(self, name: str, version: str) -> list[tuple[bytes, bytes, bytes, bool]]:
        """GET /v2/models/<name>[/versions/<version>], its /config and /ready, as the HTTP port answers them (for a
        model unloaded since, what the port says of it)."""
        service = self.service
        path = f"/v2/models/{name}".encode() + (f"/versions/{version}".encode() if version else b"")
        try:
            served = service.model(name, version or None)
            metadata, config = _answer(200, metadata_body(service, served)), _answer(200, config_body(service, served))
            model_ready = _readiness(served.readiness()[0])
        except ServiceError as error:
            refused = error_answer(error, v2=True)
            metadata = config = model_ready = _answer(refused.status, refused.body)
        return [(path, *metadata, True), (path + b"/config", *config, True), (path + b"/ready", *model_ready, True)]

    def _served_here(self) -> list[str]:
        """The default model's name (the door opened for it), then every other served model whose images are the
        door's, by name."""
        shape = self.feeder.models.shape
        others = sorted(name for name, served in self.service.models.items()
                        if name != self.default_name and served.spec.input_shape == shape)  # fmt: skip
        return [self.default_name, *others]

    def _count(self) -> None:
        """The C side's refusals since the last count, into cgserve_requests (no model, none was looked up, but for a
        POST /predict of the wrong length)."""
        _, refused, _, v2 = self.door.counts()  # v2: among them, the v2 protocol's, counted as its answers are
        totals = {(FORM, str(code)): total - v2[code] for code, total in refused.items()}  # HTTP's by status
        totals |= {(V2_FORM, str(code)): total for code, total in v2.items()}
        totals |= {(GRPC_FORM, GRPC_CODE_NAMES[code]): total for code, total in enumerate(self.door.grpc_refusals())}
        for (form, code), total in totals.items():
            counted = self.refused.get((form, code), 0)
            if total > counted:
                # A 422 is a POST /predict body of the wrong length (a v2 request's is a 400): the default model's,
                # as the service's port counts it; every other refusal is before any model is looked up.
                model = self.default_name if (form, code) == (FORM, "422") else ""
                metrics.REQUESTS.labels(model=model, protocol=PROTOCOL, format=form, code=code).inc(total - counted)
                if form in (FORM, V2_FORM) and (reason := REJECTION_REASONS.get(int(code))):  # as the port counts them
                    metrics.reject(model, reason, total - counted)
                self.refused[(form, code)] = total


def _answer(status: int, body: bytes) -> tuple[bytes, bytes]:
    """A GET's status and header lines, and its JSON body, as door.c writes them."""
    return status_line(status) + b"\r\n" + JSON_HEAD, body


def _readiness(ready: bool) -> tuple[bytes, bytes]:
    return _answer(200 if ready else 503, orjson.dumps({"ready": ready}))
