"""uvicorn's configuration for the service: the guarded protocol and the timeouts of the settings."""

from __future__ import annotations

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
    }


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(app, **uvicorn_options(settings))
