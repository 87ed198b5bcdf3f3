"""`stasis --help` fits a screen, as `gh`'s and `docker`'s do: every command in a panel, in one line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stasis.cli.overview import OVERVIEW

pytestmark = pytest.mark.fast


def test_the_front_page_fits_a_screen_with_one_line_per_command() -> None:
    shown = subprocess.run([sys.executable, "-m", "stasis", "--help"], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "100", "TERM": "dumb"}).stdout  # fmt: skip
    lines = shown.splitlines()
    assert len(lines) <= 60, shown
    for panel, commands in OVERVIEW.items():
        assert panel in shown
        for name, line in commands.items():
            assert any(row.split()[1:2] == [name] and line in row for row in lines if "│" in row), name
