"""The C sources the service builds at first use ship in its wheel: a wheel without launch.c could not start the
front door (FileNotFoundError at start-up, an operator review), where the repository's checkout could."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from app.codecs.nvjpeg import HEADERS_SOURCE
from app.front_door.library import HERE, SOURCES

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_built_at_first_use_is_package_data() -> None:
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    built = [*SOURCES, HERE / "door.h", HEADERS_SOURCE]
    for source in built:
        package = ".".join(source.parent.relative_to(ROOT).parts)
        patterns = package_data.get(package, [])
        assert any(fnmatch.fnmatch(source.name, pattern) for pattern in patterns), (source, package, patterns)
