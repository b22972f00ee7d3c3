"""C sources built once into a shared library with the system's compiler, cached under their hash.

Built at first use, as torch inductor builds its C++ kernels, into ~/.cache/cgserve under a name holding the
hash of the sources, the compiler's name, the flags and the libraries (a change to any is built again), and moved
into place whole, so that processes starting together never load a half-written file. Used for the front door
(app/front_door/library.py) and the direct nvJPEG decoder's header loop (app/codecs/nvjpeg.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

FLAGS = ("-O2", "-shared", "-fPIC", "-pthread")


class BuildError(RuntimeError):
    """A library could not be built: no compiler, or it failed (the message says which, with its output)."""


def built_library(stem: str, sources: Sequence[Path], *, headers: Sequence[Path] = (), libraries: Sequence[str] = (),
                  no_compiler: str = "", hint: Callable[[str], str] | None = None) -> Path:  # fmt: skip
    """The library `stem`-<hash>.so built from `sources` (and `headers`, which they include) with `libraries`
    linked, from the cache where it is there. BuildError where there is no compiler (`no_compiler` says what to do)
    or it fails (`hint(stderr)` adds what to install)."""
    # What makes the library: the sources, and how they are built (another flag or library is another build).
    recipe = b"".join(path.read_bytes() for path in (*sources, *headers))
    recipe += "\0".join((os.environ.get("CC", "cc"), *FLAGS, *libraries)).encode()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cgserve"
    built = cache / f"{stem}-{hashlib.sha256(recipe).hexdigest()[:16]}.so"
    if built.is_file():
        return built
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        raise BuildError(f"no C compiler (cc) is on PATH to build {', '.join(map(str, sources))}{no_compiler}")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=cache, suffix=".so", delete=False) as partial:
        pass
    try:
        names = [str(path) for path in sources]
        done = subprocess.run([compiler, *FLAGS, "-o", partial.name, *names, *libraries], capture_output=True,
                              text=True)  # fmt: skip
        if done.returncode != 0:
            extra = hint(done.stderr) if hint is not None else ""
            raise BuildError(f"{compiler} could not build {' '.join(names)}{extra}:\n{done.stderr.strip()}")
        os.replace(partial.name, built)  # whole, or not there
    finally:
        Path(partial.name).unlink(missing_ok=True)
    return built
