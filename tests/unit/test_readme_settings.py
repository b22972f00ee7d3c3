"""README's configuration table names every setting, as `serve --help` does: neither drifts from Settings."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_setting_has_a_row_in_the_readme() -> None:
    text = README.read_text()
    missing = [
        name
        for name in Settings.model_fields
        if f"| `CGSERVE_{name.upper()}` | `--{name.replace('_', '-')}` |" not in text
    ]
    assert not missing, f"README's Configuration table lacks {missing}"
