"""Fixtures shared by the report, card and leaderboard tests (each conftest imports them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.report.chromium import Browser, chromium_path
from tests.report.runs import scripted_run


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished scripted run (every trial fate) with its outputs, report.html included."""
    run_dir = tmp_path_factory.mktemp("recorded") / "tiny-scripted"
    scripted_run(run_dir)
    return run_dir


@pytest.fixture(scope="session")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go: $ATTUNE_SCREENSHOTS (kept for people to look at) or a temporary directory."""
    keep = os.environ.get("ATTUNE_SCREENSHOTS")
    if keep:
        d = Path(keep)
        d.mkdir(parents=True, exist_ok=True)
        return d
    return tmp_path_factory.mktemp("screenshots")


def _browser(offline: bool):
    if chromium_path() is None:
        pytest.skip("chromium is not installed (make chromium)")
    return Browser(offline=offline)


@pytest.fixture(scope="module")
def browser():
    b = _browser(offline=False)
    yield b
    b.close()


@pytest.fixture(scope="module")
def offline_browser():
    b = _browser(offline=True)
    yield b
    b.close()


