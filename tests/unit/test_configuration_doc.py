"""docs/configuration.md is app/config_doc.py's output for today's Settings, and README links to it.

A new or changed setting fails this test until the page is regenerated:
    python -m app.config_doc > docs/configuration.md     (or `make docs`)
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from app import config_doc
from app.cli import build_parser
from app.config import Settings

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"


def test_the_committed_page_is_the_generators_output() -> None:
    assert PAGE.read_text() == config_doc.render(), (
        "docs/configuration.md differs from Settings: run `python -m app.config_doc > docs/configuration.md`"
    )


def test_every_documented_flag_is_one_serve_takes() -> None:
    """The page derives flags as app/cli.py does; `serve --help` itself must list each of them."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = out.getvalue()
    missing = [
        config_doc.flag_name(name) for name in Settings.model_fields if config_doc.flag_name(name) not in help_text
    ]
    assert not missing, f"serve --help lacks {missing}"


def test_every_setting_has_a_row_with_its_env_name_and_flag() -> None:
    text = PAGE.read_text()
    missing = [
        name
        for name in Settings.model_fields
        if f"| `{config_doc.env_name(name)}` | `{config_doc.flag_name(name)}` |" not in text
    ]
    assert not missing, f"docs/configuration.md lacks rows for {missing}"


def test_the_page_names_no_machine_specific_path() -> None:
    assert str(ROOT) not in PAGE.read_text()


def test_the_readme_links_to_the_page() -> None:
    assert "(docs/configuration.md)" in (ROOT / "README.md").read_text()


def test_a_setting_of_fixed_choices_lists_them() -> None:
    """CGSERVE_LOG_LEVEL's description names none of its values: the page adds them."""
    row = next(line for line in config_doc.render().splitlines() if line.startswith("| `CGSERVE_LOG_LEVEL`"))
    assert "One of `debug`, `info`, `warning`, `error`." in row
