"""Fixtures of the CLI tests: a finished simulated run to point commands at."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner


@pytest.fixture(scope="session")
def sim_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`attune tune` of a suite recipe on the simulator, four trials (seconds)."""
    from attune.cli import app

    out = tmp_path_factory.mktemp("sim-run") / "run"
    res = CliRunner().invoke(app, ["tune", "benchmarks/suite/01-llama3.2-1b-h100x8.yaml", "--backend", "sim",
                                   "--budget", "20", "--max-trials", "4", "--out", str(out)],
                             env={"ATTUNE_LESSONS": "off"})
    assert res.exit_code == 0, res.output
    return out
