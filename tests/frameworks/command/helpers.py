"""Recipes of `command` launches for the tests: the nanoGPT-style example and declarations written inline."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from attune import frameworks
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.testing.logs import feed as feed  # re-exported for the tests here

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "nanogpt"
#: the example's deliberately poor command line (run.sh's)
POOR = ["python", "train.py", "--batch_size=1", "--gradient_accumulation_steps=32", "--compile=False",
        "--max_iters=5000"]


def command() -> Any:
    return frameworks.get("command")


def example_declaration() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLE / "knobs.yaml").read_text())


def declaration(**changes: Any) -> dict[str, Any]:
    """The example's declaration with top-level entries replaced (None removes one)."""
    out = copy.deepcopy(example_declaration())
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def imported(argv: list[str], cwd: Path | str = EXAMPLE, *, decl: dict[str, Any] | None = None,
             env: dict[str, str] | None = None, **options: Any) -> dict[str, Any]:
    options.setdefault("devices_per_node", 2)
    return command().import_launch(list(argv), cwd=Path(cwd), env={"OMP_NUM_THREADS": "1"} if env is None else env,
                                   options={"declaration": decl or example_declaration(), **options})


def recipe(argv: list[str] = POOR, cwd: Path | str = EXAMPLE, **kw: Any) -> Recipe:
    return parse_recipe(imported(argv, cwd, **kw))


def with_argv(r: Recipe, argv: list[str]) -> dict[str, Any]:
    """``r`` as a mapping whose launch runs ``argv`` instead (a candidate that edits the user's command)."""
    data = r.model_dump(mode="python")
    data["launch"]["argv"] = list(argv)
    return data



def example_copy(tmp_path: Path) -> Path:
    work = tmp_path / "nanogpt"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("out", "run", "__pycache__"))
    return work


def cli_env() -> dict[str, str]:
    """The environment `attune` runs in for these tests: this interpreter's python first on PATH, no lessons."""
    root = str(Path(__file__).resolve().parents[3])  # this checkout's attune, whatever directory a test runs in
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "ATTUNE_LESSONS": "off", "PYTHONPATH": path}


#: a nanoGPT-shaped script without torch (settings as globals, config files and --key=value as nanoGPT reads them)
NANOSHAPE = FIXTURES / "nanoshape"


def nanoshape_copy(tmp_path: Path, *, tokens_per_sample: bool = True) -> Path:
    """A copy of the nanoGPT-shaped fixture in ``tmp_path`` (its declaration without ``tokens_per_sample`` when
    told), for commands that write beside it."""
    work = tmp_path / "nanoshape"
    shutil.copytree(NANOSHAPE, work, ignore=shutil.ignore_patterns("__pycache__"))
    if not tokens_per_sample:
        data = yaml.safe_load((work / "knobs.yaml").read_text())
        data.pop("tokens_per_sample")
        (work / "knobs.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return work


def attune_cli(*args: str, cwd: Path, timeout: float = 300, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """``python -m attune ARGS`` in ``cwd``, as a user runs it (on a terminal wide enough that no message wraps)."""
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd,
                          env={**cli_env(), "COLUMNS": "400", **(env or {})}, timeout=timeout)
