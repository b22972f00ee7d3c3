"""A model's versions: numbered folders DIR/<name>/<v>/, and which of them are served.

    DIR/<name>/model.toml        shared by every version (or one model.toml inside each version)
    DIR/<name>/1/…, <name>/2/…   each version's files (`file`, `weights`, a factory's module)

As Triton: a version is a folder named by a positive integer; other folders are ignored. A model
folder without one is the unversioned model of before, served as version "1" from the folder
itself. Which versions are served is model.toml's `version_policy`, Triton's three policies:

    version_policy = { latest = { num_versions = 1 } }   # the default: the newest n
    version_policy = { all = {} }
    version_policy = { specific = { versions = [1, 3] } }
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

UNVERSIONED = "1"  # the version of a model folder that holds no version folders


class Latest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    num_versions: Annotated[int, Field(ge=1)] = 1


class All(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Specific(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    versions: Annotated[tuple[Annotated[int, Field(ge=1)], ...], Field(min_length=1)]


class VersionPolicy(BaseModel):
    """Exactly one of latest, all, specific (Triton's ModelVersionPolicy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    latest: Latest | None = None
    all: All | None = None
    specific: Specific | None = None

    @model_validator(mode="after")
    def _one(self) -> Self:
        chosen = [key for key in ("latest", "all", "specific") if getattr(self, key) is not None]
        if len(chosen) != 1:
            raise ValueError(
                f"give exactly one of latest, all, specific; got {chosen or 'none'} "
                "(e.g. { latest = { num_versions = 1 } })"
            )
        return self

    def select(self, available: list[int]) -> tuple[list[int], list[int]]:
        """(the versions served, newest first; the versions asked for that have no folder)."""
        newest_first = sorted(available, reverse=True)
        if self.latest is not None:
            return newest_first[: self.latest.num_versions], []
        if self.all is not None:
            return newest_first, []
        assert self.specific is not None
        wanted = set(self.specific.versions)
        return [v for v in newest_first if v in wanted], sorted(wanted - set(available))


DEFAULT_POLICY = VersionPolicy(latest=Latest())


def version_folders(model: Path) -> dict[int, Path]:
    """Version number → its folder: the sub-folders named by a positive integer (Triton's rule)."""
    found = {}
    for sub in model.iterdir():
        if sub.is_dir() and sub.name.isascii() and sub.name.isdigit() and sub.name == str(int(sub.name) or ""):
            found[int(sub.name)] = sub
    return found
