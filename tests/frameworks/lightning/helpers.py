"""Recipes of LightningCLI launches for the tests: import a command line the way `attune import --framework
lightning` does, run LightningCLI's own parser on it, and run real trials of examples/lightning."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from attune import frameworks
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe
from attune.testing.trials import backend as backend  # re-exported for the tests here
from attune.testing.trials import request as request

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "lightning"
FIXTURES = Path(__file__).parent / "fixtures"


def cmd(text: str) -> list[str]:
    """A command line written as one string, split on spaces."""
    return text.split()


#: examples/lightning/run.sh's command (tests check that they agree)
POOR = cmd("python train.py fit --config config.yaml --trainer.devices 1 --data.batch_size 1 "
           "--trainer.accumulate_grad_batches 32 --data.num_workers 0")
#: the module name the example's train.py is imported under here (the real parser's class paths name it)
EXAMPLE_MODULE = "attune_lightning_example_train"


def lightning() -> Any:
    return frameworks.get("lightning")


def imported(argv: list[str] | str, cwd: Path | str = EXAMPLE, *, env: dict[str, str] | None = None,
             **options: Any) -> dict[str, Any]:
    argv = argv.split() if isinstance(argv, str) else list(argv)
    options.setdefault("framework_version", "2.6.6")
    return lightning().import_launch(argv, cwd=Path(cwd), env=env or {}, options=options)


def recipe(argv: list[str] | str, cwd: Path | str = EXAMPLE, **options: Any) -> Recipe:
    return parse_recipe(imported(argv, cwd, **options))


def with_argv(r: Recipe, argv: list[str] | str) -> dict[str, Any]:
    """``r`` as a mapping whose launch runs ``argv`` instead (a candidate that edits the user's command)."""
    data = r.model_dump(mode="python")
    data["launch"]["argv"] = argv.split() if isinstance(argv, str) else list(argv)
    return data


def swap(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def feed(parser: Any, text: str, dt: float = 0.5, t0: float = 100.0) -> Any:
    """Feed every line of ``text``, line ``i`` arriving at ``t0 + (i + 1) * dt``."""
    for i, line in enumerate(text.splitlines(keepends=True)):
        parser.feed(line, t0 + (i + 1) * dt)
    return parser


def run_sh_argv() -> list[str]:
    text = (EXAMPLE / "run.sh").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("exec "))
    return line.split()[1:]


# -- LightningCLI's own parser -----------------------------------------------------------------------------

def example_module() -> Any:
    """examples/lightning/train.py, imported (once) under :data:`EXAMPLE_MODULE`."""
    if EXAMPLE_MODULE not in sys.modules:
        spec = importlib.util.spec_from_file_location(EXAMPLE_MODULE, EXAMPLE / "train.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[EXAMPLE_MODULE] = module
        spec.loader.exec_module(module)
    return sys.modules[EXAMPLE_MODULE]


def lightning_config(args: list[str], cwd: Path, **cli: Any) -> dict[str, Any]:
    """The configuration LightningCLI itself builds from ``args`` (what follows the script), run in ``cwd``:
    its ``--print_config`` output, with the example's model and data module (``cli``: LightningCLI options)."""
    from lightning.pytorch.cli import LightningCLI

    module = example_module()
    out = io.StringIO()
    old, old_argv = Path.cwd(), sys.argv
    os.chdir(cwd)
    sys.argv = ["train.py"]  # as the script sees it (LightningCLI warns when pytest's own arguments are there)
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            LightningCLI(module.TinyGPT, module.TokenData, args=[*args, "--print_config"], **cli)
    finally:
        os.chdir(old)
        sys.argv = old_argv
    config = yaml.safe_load(out.getvalue())
    assert isinstance(config, dict), f"LightningCLI printed no configuration for {args}: {out.getvalue()[-500:]}"
    return config


def lookup(config: dict[str, Any], key: str) -> Any:
    """A dotted setting of a LightningCLI configuration (``init_args`` levels looked through)."""
    node: Any = config
    for part in key.split("."):
        if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
            node = node["init_args"]
        node = node[part]
    return node


# -- real trials -------------------------------------------------------------------------------------------



def example_copy(tmp_path: Path) -> Path:
    """A copy of examples/lightning in ``tmp_path`` (so a trial's leftovers are findable)."""
    work = tmp_path / "lightning-example"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("lightning_logs", "runs", "run", "__pycache__"))
    return work


def example_recipe(tmp_path: Path, **knobs: Any) -> Recipe:
    """The example's poor launch, run from a copy of the example in ``tmp_path``."""
    r = recipe(POOR, example_copy(tmp_path), env={"OMP_NUM_THREADS": "1"}, devices_per_node=2)
    return r.with_knobs(**knobs) if knobs else r
