"""uvicorn's configuration for the service: the guarded protocol, the timeouts of the settings, and TLS.

TLS is uvicorn's own (its ssl_* options: the listening socket's transport is asyncio's SSL
transport); the protocol and the inline path above it see the same data_received and write calls
either way, so they run on it unchanged.
"""

from __future__ import annotations

import ssl
from typing import Any

import uvicorn

from app.config import Settings
from app.http import protocol
from app.http.protocol import DrainingHttpProtocol
from app.http.server_options import UVICORN_OPTIONS


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """What uvicorn.Config and uvicorn.run take, in one process and in workers alike."""
    protocol.check_server()  # one line and exit 1 where the installed uvicorn lacks what the protocol overrides
    return {
        **UVICORN_OPTIONS,
        # httptools, with connection, header and body limits, closing connections cleanly on shutdown
        "http": DrainingHttpProtocol,
        "log_level": settings.log_level,
        "timeout_keep_alive": settings.keepalive_timeout_s,
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
        **tls_options(settings),
    }


def tls_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's ssl_* options: none without a certificate; with a client CA, clients must present one it signed."""
    if settings.tls_cert_file is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(settings.tls_cert_file), "ssl_keyfile": str(settings.tls_key_file)}
    if settings.tls_client_ca_file is not None:
        options |= {"ssl_ca_certs": str(settings.tls_client_ca_file), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(app, **uvicorn_options(settings))
