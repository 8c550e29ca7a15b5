"""`attune tune`'s progress: a live panel on a terminal (checked in a real tmux pane), plain lines elsewhere."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest
import yaml

from attune.testing.factories import tiny_recipe_dict
from attune.testing.procs import wait_for


def test_plain_lines_when_not_a_terminal(tmp_path):
    d = tiny_recipe_dict()
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(d))
    res = subprocess.run([sys.executable, "-m", "attune", "tune", "benchmarks/suite/01-llama3.2-1b-h100x8.yaml",
                          "--backend", "sim", "--budget", "20", "--max-trials", "4", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, env={"ATTUNE_LESSONS": "off", "PATH": "/usr/bin"})
    assert res.returncode == 0, res.stderr
    assert "… trial #1 baseline" in res.stdout and "\x1b[" not in res.stdout  # no escape codes in a log
    assert "stopped:" in res.stdout


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_live_panel_in_a_terminal(tmp_path):
    """While a real trial runs, the terminal shows the panel: the trial with its elapsed time and the budget bar."""
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(tiny_recipe_dict()))
    session = f"attune-progress-{time.monotonic_ns()}"
    rc = tmp_path / "rc"
    # the shell stays after the run (its exit status in rc) so that the pane can still be read when it failed
    cmd = (f"cd {tmp_path} && OMP_NUM_THREADS=1 ATTUNE_LESSONS=off {sys.executable} -m attune tune r.yaml "
           f"--budget 0.05 --max-trials 3 --out run; echo $? > rc.tmp && mv rc.tmp rc; sleep 3600")
    tmux = ["tmux", "-L", session]  # a server of its own: the test's environment, ended with the test
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "50", cmd], check=True, timeout=60)

    def screen(history: bool = False) -> str:
        args = ["-S", "-500"] if history else []
        return subprocess.run([*tmux, "capture-pane", "-p", *args, "-t", session], capture_output=True, text=True,
                              timeout=60).stdout

    def ended() -> str | None:
        if rc.exists():
            return rc.read_text().strip()
        if not screen():  # the session is gone: nothing more will show
            raise AssertionError("the tmux session ended before the run did")
        return None

    try:
        live = wait_for(lambda: (lambda s: s if "accelerator-hours" in s and "#2 baseline" in s else None)(screen()),
                        240, "the live panel during the second baseline")
        assert "█" in live or "░" in live  # the budget bar
        assert "best" in live and "trial" in live  # the panel rows
        # a loaded machine (a CI build beside it) took over 300 s for these three real trials
        try:
            status = wait_for(ended, 480, "the run to finish")
        except TimeoutError as err:
            raise AssertionError(f"{err}; the terminal shows:\n{screen(history=True)}") from None
        done = screen(history=True)
        assert status == "0", f"the run exited {status}; the terminal shows:\n{done}"
        assert "best recipe:" in done and "accelerator-hours" in done, done  # the summary table
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=60)
