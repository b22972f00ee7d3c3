"""The front door's C side as a shared library: the one the settings name, or door.c and grpc.c built once with cc.

Built at first use, as torch inductor builds its C++ kernels, into ~/.cache/cgserve under a name
holding the sources' hash (a changed source is built again) and moved into place whole, so that
processes starting together never load a half-written file. The container image builds it at
image build time and names it in CGSERVE_FRONT_DOOR_LIBRARY.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = (HERE / "door.c", HERE / "grpc.c")  # and door.h, which both include
FLAGS = ("-O2", "-shared", "-fPIC", "-pthread")
LIBRARIES = ("-lnghttp2",)  # HTTP/2 for grpc.c: Debian's libnghttp2-dev to build, libnghttp2-14 to run


class BuildError(RuntimeError):
    """The door could not be built: no compiler, or it failed (the message says which, with its output)."""


def door_library(configured: Path | None) -> Path:
    if configured is not None:
        if not configured.is_file():
            raise BuildError(f"front_door_library {configured} is not a file")
        return configured
    source = b"".join(path.read_bytes() for path in (*SOURCES, HERE / "door.h"))
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cgserve"
    built = cache / f"frontdoor-{hashlib.sha256(source).hexdigest()[:16]}.so"
    if built.is_file():
        return built
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise BuildError(
            "front_door_port is set and no C compiler (cc) is on PATH to build app/front_door/door.c: install one "
            "(apt install gcc libnghttp2-dev), or build it elsewhere and set front_door_library"
        )
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, suffix=".so", delete=False) as partial:
        pass
    try:
        sources = [str(path) for path in SOURCES]
        done = subprocess.run([compiler, *FLAGS, "-o", partial.name, *sources, *LIBRARIES], capture_output=True,
                              text=True)  # fmt: skip
        if done.returncode != 0:
            hint = " (nghttp2's headers: apt install libnghttp2-dev)" if "nghttp2" in done.stderr else ""
            raise BuildError(f"{compiler} could not build {' '.join(sources)}{hint}:\n{done.stderr.strip()}")
        os.replace(partial.name, built)  # whole, or not there
    finally:
        Path(partial.name).unlink(missing_ok=True)
    return built
