"""Whether this machine can build the front door's C (door.c, grpc.c): shared by its HTTP, gRPC and GPU tests without
importing their clients (the GPU machine has no tritonclient)."""

from __future__ import annotations

import os
import shutil
import subprocess


def door_toolchain() -> str | None:
    """What the server lacks to build door.c and grpc.c (a C compiler, nghttp2's headers), or None."""
    if shutil.which("cc") is None:
        return "no C compiler (cc)"
    probe = subprocess.run(["cc", "-E", "-x", "c", "-", "-o", os.devnull], input="#include <nghttp2/nghttp2.h>\n",
                           capture_output=True, text=True)  # fmt: skip
    return None if probe.returncode == 0 else "no nghttp2 headers"
