"""Bad input and a hostile machine get a clear message and an exit code, never a traceback or a hang: a full disk
mid-run, a read-only run directory, numbers no integer holds, YAML nested thousands deep, non-UTF-8 cards,
a device given as a recipe, a negative trial count. Each case crashed or hung the earlier main. The commands run
as a user runs them (`python -m attune ...`, a real process); the full disk and the read-only directory are real
mounts (a 256 KiB tmpfs, a read-only bind mount) where the machine allows mounting."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from attune.errors import RecipeError
from attune.frameworks.hf.settings import read_launch
from attune.recipe.model import NativeLaunch

SUITE = "benchmarks/suite/01-llama3.2-1b-h100x8.yaml"
ROOT = Path(__file__).resolve().parents[2]


def attune(*args: object, timeout: float = 120, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ATTUNE_LESSONS": "off", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "attune", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env, stdin=subprocess.DEVNULL)


def no_traceback(res: subprocess.CompletedProcess[str]) -> str:
    out = res.stdout + res.stderr
    assert "Traceback" not in out, out[-3000:]
    return " ".join(out.split())


def _mount(*args: str) -> bool:
    if shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *args], capture_output=True, timeout=30).returncode == 0


@pytest.fixture()
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)):
        pytest.skip("this machine does not allow mounting a tmpfs (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


@pytest.fixture()
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("done") / "run"
    res = attune("tune", SUITE, "--backend", "sim", "--budget", "20", "--max-trials", "4", "--out", out)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


@pytest.fixture()
def read_only(sim_run: Path, tmp_path: Path) -> Iterator[Path]:
    view = tmp_path / "ro"
    view.mkdir()
    if not (_mount("--bind", str(sim_run), str(view)) and _mount("-o", "remount,bind,ro", str(view))):
        subprocess.run(["umount", "-l", str(view)], capture_output=True, timeout=30)
        pytest.skip("this machine does not allow a read-only bind mount (needs root)")
    try:
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], capture_output=True, timeout=30)


@pytest.mark.slow
def test_a_full_disk_mid_run_is_a_message_and_the_journal_resumes(tiny_disk: Path, tmp_path: Path):
    run = tiny_disk / "run"
    res = attune("tune", SUITE, "--backend", "sim", "--budget", "200", "--out", run)
    flat = no_traceback(res)
    assert res.returncode == 4 and "No space left on device" in flat and "--resume" in flat, flat
    # what was written is not lost: moved to a roomier disk, the run resumes from its journal
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    before = [json.loads(line) for line in (moved / "journal.jsonl").read_text().splitlines()
              if line.strip().endswith("}")]
    assert before, "the journal kept nothing"
    again = attune("tune", "--resume", moved, "--max-trials", "6")
    assert again.returncode in (0, 3), no_traceback(again)


@pytest.mark.slow
@pytest.mark.parametrize("command", [["report"], ["card"]])
def test_a_read_only_run_directory_is_a_message(read_only: Path, tmp_path: Path, command: list[str]):
    args = [*command, read_only] if command == ["report"] else [*command, read_only, "--out", read_only / "cards"]
    res = attune(*args)
    flat = no_traceback(res)
    assert res.returncode != 0 and "Read-only file system" in flat and "writable" in flat, flat


@pytest.mark.parametrize("value", ["1e400", "-1e400", "nan", "inf", "1e999999"])
def test_a_number_no_integer_holds_is_a_message(value: str):
    launch = NativeLaunch(argv=("python", "train.py", "--gradient_accumulation_steps", value))
    with pytest.raises(RecipeError, match="expected an integer"):
        read_launch(launch)


def test_the_issues_overflowing_import_is_a_message(tmp_path: Path):
    res = attune("import", "--framework", "hf", "--", "python", "train.py", "--gradient_accumulation_steps", "1e400",
                 cwd=tmp_path)
    flat = no_traceback(res)
    assert res.returncode == 2 and "expected an integer" in flat, flat


def _deep(levels: int) -> str:
    return "a: " + "[" * levels + "]" * levels + "\n"


@pytest.mark.parametrize("command", ["validate", "card check"])
def test_yaml_nested_thousands_deep_is_a_message(tmp_path: Path, command: str):
    path = tmp_path / "deep.yaml"
    path.write_text(_deep(5000))
    res = attune(*command.split(), path)
    flat = no_traceback(res)
    assert res.returncode != 0 and "nested too deeply" in flat, flat


@pytest.mark.parametrize("command", ["card check", "leaderboard build"])
def test_a_non_utf8_file_among_the_cards_is_named(tmp_path: Path, command: str):
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "latin1.yaml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    extra = ["--out", tmp_path / "site"] if command == "leaderboard build" else []
    res = attune(*command.split(), cards, *extra)
    flat = no_traceback(res)
    assert res.returncode != 0 and "latin1.yaml" in flat and "not UTF-8" in flat, flat
    assert "['" not in flat  # a list of problems, not a Python repr


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_given_as_a_recipe_is_refused_not_read_forever(device: str):
    res = attune("validate", device, timeout=60)
    flat = no_traceback(res)
    assert res.returncode != 0 and "not a regular file" in flat, flat


def test_a_fifo_given_as_a_recipe_is_refused_not_waited_on(tmp_path: Path):
    fifo = tmp_path / "recipe.yaml"
    os.mkfifo(fifo)
    res = attune("validate", fifo, timeout=60)
    assert res.returncode != 0 and "not a regular file" in no_traceback(res)


@pytest.mark.parametrize("flag, value", [("--max-trials", "-1"), ("--tokens-per-sample", "0")])
def test_negative_counts_are_refused_before_anything_runs(tmp_path: Path, flag: str, value: str):
    res = attune("tune", SUITE, "--backend", "sim", "--budget", "20", flag, value, "--out", tmp_path / "run")
    flat = no_traceback(res)
    assert res.returncode == 2 and flag in flat, flat
    assert not (tmp_path / "run").exists()


def test_the_deep_yaml_is_also_refused_inside_a_recipe_mapping(tmp_path: Path):
    data = yaml.safe_load(_deep(50))  # deep but parsable: the recipe model refuses it by field, no recursion
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    res = attune("validate", path)
    assert res.returncode != 0 and "Traceback" not in res.stdout + res.stderr
