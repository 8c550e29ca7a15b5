"""Published Megatron-family launches for the tests, imported the way `attune import --framework megatron` does."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from attune import frameworks
from attune.recipe.io import parse_recipe
from attune.recipe.model import Recipe

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parent / "fixtures"
MLM = ROOT / "examples" / "megatron-lm"
BRIDGE = ROOT / "examples" / "megatron-bridge"
NEMO = ROOT / "examples" / "nemo"


def argv_of(script: Path) -> list[str]:
    """The command a launch script ``exec``s, as the argument list the launcher receives."""
    text = re.sub(r"\\\n", " ", script.read_text())
    for line in text.splitlines():
        if line.startswith("exec "):
            return shlex.split(line)[1:]
    raise AssertionError(f"{script} has no exec line")


def env_of(script: Path) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)=(\S+)$", script.read_text(), flags=re.MULTILINE))


def megatron() -> Any:
    return frameworks.get("megatron")


def imported(argv: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None, **options: Any) -> dict[str, Any]:
    return megatron().import_launch(list(argv), cwd=cwd, env=env or {}, options=options)


def recipe(argv: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None, **options: Any) -> Recipe:
    return parse_recipe(imported(argv, cwd, env, **options))


def mlm(name: str = "llama3_8b_h100_fp8.sh") -> Recipe:
    script = MLM / name
    return recipe(argv_of(script), MLM, env_of(script), framework_version="0.20.0")


def bridge_yaml(name: str = "llama3_8b_pretrain_8gpu_h100_bf16.yaml", nodes: int = 1) -> Recipe:
    return recipe(bridge_argv(name, nodes), BRIDGE, framework_version="0.7.0")


def bridge_argv(name: str, nodes: int = 1) -> list[str]:
    return ["torchrun", "--nproc_per_node", "8", "--nnodes", str(nodes), "tutorials/recipes/llama/02_pretrain_with_yaml.py",
            "--config-file", name]


NEMO_8B = ["nemo", "llm", "pretrain", "--factory", "llama3_8b", "trainer.strategy.tensor_model_parallel_size=2", "trainer.strategy.context_parallel_size=2", "data.micro_batch_size=1", "data.global_batch_size=512", "-y"]


def nemo(argv: list[str] | None = None) -> Recipe:
    return recipe(argv or NEMO_8B, ROOT, framework_version="2.4.0")


def changed_tokens(before: list[str] | tuple[str, ...], after: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(tokens removed, tokens added) between two argument lists, position by position where lengths agree."""
    import difflib

    removed, added = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=list(before), b=list(after), autojunk=False).get_opcodes():
        if op != "equal":
            removed += list(before[i1:i2])
            added += list(after[j1:j2])
    return removed, added


def changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    return changed_tokens(before.splitlines(), after.splitlines())
