"""The shipped seed CNN as the service sees it: its spec from the default repository's model.toml."""

from __future__ import annotations

from functools import cache

from app.config import DEFAULT_REPOSITORY
from app.repository import read_repository
from app.repository.model_spec import ModelSpec


@cache
def seed_spec() -> ModelSpec:
    (spec,) = read_repository(DEFAULT_REPOSITORY)
    return spec
