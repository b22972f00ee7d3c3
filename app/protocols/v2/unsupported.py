"""Triton's extensions this server does not implement, refused by name: what a Triton client asks for, and what
to use here instead. Before, an HTTP statistics call (GET /v2/models/stats) was read as the metadata of a model
named "stats" (404 "no model named 'stats'"), the others got the generic route 404, and gRPC's grpcio's own
UNIMPLEMENTED "Method not found!".

    UnsupportedExtensionError(extension)    501 / UNIMPLEMENTED, saying which extension and what instead
    HTTP_ROUTES                             (path under /v2, extension): the routes Triton serves them on
    UnsupportedMethods                      the gRPC methods of Triton's service that ours lacks, and any other
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.descriptor import ServiceDescriptor

from app.errors import ServiceError

METRICS = "the Prometheus metrics at GET /metrics (latency, queue wait, batch sizes, by model: docs/operations.md)"
INSTEAD = {
    "statistics": METRICS,
    "trace": "CGSERVE_TRACING (OpenTelemetry spans of each request: docs/operations.md)",
    "logging": "CGSERVE_LOG_LEVEL and CGSERVE_ACCESS_LOG at start-up",
    "system_shared_memory": "the tensors in the request itself (binary_data over HTTP, raw_input_contents over gRPC)",
    "cuda_shared_memory": "the tensors in the request itself (binary_data over HTTP, raw_input_contents over gRPC)",
}
HTTP_ROUTES = [
    ("/models/stats", "statistics"),
    ("/models/{name}/stats", "statistics"),
    ("/models/{name}/versions/{version}/stats", "statistics"),
    ("/trace/setting", "trace"),
    ("/models/{name}/trace/setting", "trace"),
    ("/logging", "logging"),
    ("/systemsharedmemory/{rest:path}", "system_shared_memory"),
    ("/cudasharedmemory/{rest:path}", "cuda_shared_memory"),
]
GRPC_METHODS = {
    "ModelStatistics": "statistics",
    "TraceSetting": "trace",
    "LogSettings": "logging",
    "SystemSharedMemoryStatus": "system_shared_memory",
    "SystemSharedMemoryRegister": "system_shared_memory",
    "SystemSharedMemoryUnregister": "system_shared_memory",
    "CudaSharedMemoryStatus": "cuda_shared_memory",
    "CudaSharedMemoryRegister": "cuda_shared_memory",
    "CudaSharedMemoryUnregister": "cuda_shared_memory",
}


class UnsupportedExtensionError(ServiceError):
    status = 501
    code = "not_implemented"
    reason = "not_implemented"

    def __init__(self, extension: str) -> None:
        message = f"Triton's {extension} extension is not implemented by this server"
        super().__init__(message, expected=INSTEAD[extension])


class UnsupportedMethods(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc has no types
    """After the services' own handlers: any other method of Triton's service is UNIMPLEMENTED saying which
    extension it belongs to, or that the service has no such method, with the methods it has."""

    def __init__(self, served: ServiceDescriptor) -> None:
        self.served = served  # given, not imported: this module loads no protobuf (tritonclient's share its names)

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        service, _, method = str(handler_call_details.method).lstrip("/").partition("/")
        if service != self.served.full_name:
            return None  # grpcio's own UNIMPLEMENTED: not a service of ours at all
        if method in GRPC_METHODS:
            text = UnsupportedExtensionError(GRPC_METHODS[method]).text()
        else:
            methods = ", ".join(known.name for known in self.served.methods)
            text = f"{service} has no method {method[:64]!r}; expected one of {methods}"

        async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, text)

        # As a stream's: refused at once, nothing read (a unary handler would wait for the message first).
        return grpc.stream_unary_rpc_method_handler(refuse)
