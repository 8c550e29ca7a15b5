"""A toy framework from outside attune (``framework: toy``): one package and one ``register`` call, nothing else.

Its launch is ``PYTHON train.py --steps N --chunk K [--lr X --seed S --tokens T ...]`` (``tests/frameworks/toy/
train.py``); the one knob is ``chunk`` (how many micro-calls share one host overhead: a pure reordering of the
same work, so ``preserving``); every other setting is contract (``steps``, ``lr``, ``seed``, ``tokens``) or frozen
(the interpreter, the script, any other option). The trainer prints one line per step with its own step time,
phase timers, loss and tokens, which :class:`ToyLogParser` reads.

Importing this module registers the framework; ``attune.registry.unregister("toy")`` forgets it.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attune import registry
from attune.errors import RecipeError
from attune.frameworks.base import ContractField, Framework, Launch, LogParser, Rule, Signature, Tier, TrialLaunch
from attune.recipe.catalogue import Catalogue, Knob, Semantics
from attune.trial import FailureKind

if TYPE_CHECKING:
    from attune.recipe.model import Recipe
    from attune.trial import TrialRequest

NAME = "toy"
CHUNK = "chunk"
TOKENS = "512"  # the trainer's default --tokens (tokens per step)
#: the trainer's own settings that decide what it learns, with the trainer's defaults
CONTRACT = {"steps": None, "lr": "0.05", "seed": "0", "tokens": TOKENS}
_STEP = re.compile(r"^toy step (\d+) time_s (\S+) compute_s (\S+) host_s (\S+) loss (\S+) tokens (\d+)")


def parse_launch(argv: Sequence[str]) -> tuple[int, dict[str, str]]:
    """``PYTHON SCRIPT --name value ...`` → (index of the script, option name → value as written)."""
    argv = [str(a) for a in argv]
    if len(argv) < 2 or not argv[1].endswith(".py"):
        raise RecipeError(f"not a toy launch: `{' '.join(argv)}`", ["PYTHON train.py --steps N [--chunk K]"])
    settings: dict[str, str] = {}
    rest = argv[2:]
    if len(rest) % 2:
        raise RecipeError(f"the toy launch's options come in `--name value` pairs: {' '.join(rest)}")
    for flag, value in zip(rest[::2], rest[1::2]):
        if not flag.startswith("--") or "=" in flag:
            raise RecipeError(f"the toy launch has {flag!r} where an option `--name` belongs")
        settings[flag[2:]] = value
    if "steps" not in settings:
        raise RecipeError("the toy launch needs --steps N (the run's length: it sets the schedule)")
    return 1, settings


def _settings(recipe: Recipe) -> dict[str, str]:
    assert recipe.launch is not None
    return parse_launch(recipe.launch.argv)[1]


class ToyLogParser(LogParser):
    """The trainer's step lines → step records (its own step time and phase timers); ``toy done`` → done."""

    signatures = (Signature(r"loss (nan|inf)\b", FailureKind.DIVERGED, "loss became NaN/Inf"),
                  Signature(r"\bMemoryError\b", FailureKind.OOM, "out of memory (host)"))

    def parse_line(self, line: str, t: float) -> None:
        if line.strip() == "toy done":
            self.done = True
            return
        m = _STEP.match(line)
        if m is None:
            return
        step, total, compute, host, loss, tokens = m.groups()
        self.steps.append({"step": int(step), "step_time_s": float(total), "tokens": int(tokens),
                           "loss": float(loss), "grad_norm": None, "peak_mem_mb": None,
                           "phases": {"compute": float(compute), "host": float(host)}})


class ToyFramework(Framework):
    name = NAME
    title = "toy trainer (a test's framework from outside attune)"
    versions = ">=0"
    distribution = "PyYAML"  # any installed distribution: a plug-in's own version is what its cards record
    launch_based = True
    backends = ("local",)
    rules = {(CHUNK, "up"): Rule(Tier.SCALE, 0.1, {"host_overhead": 0.3}),
             (CHUNK, "down"): Rule(Tier.MICRO, 0.0)}
    phase_keys = {"compute": "compute", "host": "host"}

    def catalogue(self) -> Catalogue:
        return Catalogue(framework=NAME, versions=self.versions, knobs={CHUNK: Knob(
            name=CHUNK, type="int", values=(1, 2, 4), default=1, semantics=Semantics.PRESERVING,
            description="micro-calls that share one host overhead (same work, reordered); addresses host overhead")})

    # -- import / render ----------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        options = dict(options or {})
        argv = [str(a) for a in argv]
        script, settings = parse_launch(argv)
        knob = self.catalogue()[CHUNK]
        try:
            chunk = int(settings.get(CHUNK, str(knob.default)))
        except ValueError:
            chunk = -1
        if knob.check_value(chunk):
            raise RecipeError(f"knobs.{CHUNK}: the launch has --chunk {settings.get(CHUNK)}: {knob.check_value(chunk)}")
        return {"name": options.get("name") or f"toy-{Path(argv[script]).stem}", "framework": NAME,
                "launch": {"argv": argv, "cwd": str(cwd), "env": {}},
                "resources": {"accelerator": "cpu", "nodes": 1, "devices_per_node": 1},
                "knobs": {CHUNK: chunk}, "tuning": {"search_space": [CHUNK]}}

    def render(self, recipe: Recipe) -> Launch:
        assert recipe.launch is not None
        argv = list(recipe.launch.argv)
        value = str(recipe.knob(CHUNK))
        if "--chunk" in argv[2:]:
            argv[argv.index("--chunk", 2) + 1] = value
        elif value != str(self.catalogue()[CHUNK].default):
            argv += ["--chunk", value]
        return Launch(argv=tuple(argv), env=dict(recipe.launch.env), files=dict(recipe.launch.files),
                      cwd=recipe.launch.cwd)

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        """The rendered launch, cut to the request's steps by the trainer itself (``--stop-after``: ``--steps``, the
        run's length, is untouched), so the trial ends by itself as the reference trainer's do."""
        launch = self.render(recipe)
        return TrialLaunch(Launch(argv=(*launch.argv, "--stop-after", str(request.steps)), env=launch.env,
                                  files=launch.files, cwd=launch.cwd),
                           stop_after_steps=None, instrumentation=(f"--stop-after {request.steps}",))

    # -- contract -----------------------------------------------------------------------------------------
    def check(self, recipe: Recipe) -> list[str]:
        try:
            _settings(recipe)
        except RecipeError as err:
            return [f"launch.argv: {err}"]
        return []

    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        try:
            settings = _settings(recipe)
        except RecipeError:
            return {}
        fix = "the toy launch's own setting; attune only changes --chunk"
        out = {f"toy.{k}": ContractField(settings.get(k, default), "contract", fix=fix) for k, default in CONTRACT.items()}
        assert recipe.launch is not None
        out["launch.script"] = ContractField(list(recipe.launch.argv[:2]), "frozen", fix=fix)
        out["launch.options"] = ContractField({k: v for k, v in settings.items() if k not in CONTRACT and k != CHUNK},
                                              "frozen", fix=fix)
        return out

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        try:
            return int(_settings(recipe).get("tokens") or TOKENS)
        except (RecipeError, ValueError):
            return None

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        problems = super().preflight(recipe, backend)
        assert recipe.launch is not None
        script = Path(recipe.launch.cwd or ".") / recipe.launch.argv[1]
        if not script.is_file():
            problems.append(f"launch.argv: {script} does not exist")
        return problems

    # -- logs ---------------------------------------------------------------------------------------------
    def parser(self, recipe: Recipe) -> LogParser:
        return ToyLogParser()


FRAMEWORK = registry.register(ToyFramework())
