"""The front door's C side as a shared library: the one the settings name, or door.c, grpc.c and launch.c built
once with cc at first use, cached under the sources' hash (app/ops/c_library.py). The container image builds it at
image build time and names it in CGSERVE_FRONT_DOOR_LIBRARY.
"""

from __future__ import annotations

from pathlib import Path

from app.ops.c_library import BuildError, built_library

HERE = Path(__file__).parent
SOURCES = (HERE / "door.c", HERE / "grpc.c", HERE / "launch.c")  # and door.h, which they include
# HTTP/2 for grpc.c: Debian's libnghttp2-dev to build, libnghttp2-14 to run; launch.c opens CUDA's driver at run time.
LIBRARIES = ("-lnghttp2", "-ldl", "-lm")

__all__ = ["BuildError", "door_library"]


def door_library(configured: Path | None) -> Path:
    if configured is not None:
        if not configured.is_file():
            raise BuildError(f"front_door_library {configured} is not a file")
        return configured
    return built_library(
        "frontdoor",
        SOURCES,
        headers=(HERE / "door.h",),
        libraries=LIBRARIES,
        no_compiler=" for front_door_port: install one (apt install gcc libnghttp2-dev), or build it elsewhere and "
        "set front_door_library",
        hint=lambda stderr: " (nghttp2's headers: apt install libnghttp2-dev)" if "nghttp2" in stderr else "",
    )
