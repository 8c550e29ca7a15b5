"""PyTorch Lightning ``LightningCLI`` scripts (``framework: lightning``), on the framework seam.

The recipe carries the user's own launch (``python train.py fit --config config.yaml --data.batch_size 2 ...``)
verbatim, and the text of the config files it names. :mod:`~attune.frameworks.lightning.launch` reads it the way
jsonargparse does (config files at their position, later settings win, ``init_args`` transparent, ``=`` forms);
the tests check that reading against LightningCLI's own parser.

Knobs are LightningCLI settings in their own dotted names: ``data.batch_size`` (the per-process batch, with
``trainer.accumulate_grad_batches`` derived so the global batch = batch × accumulation × devices × nodes stays),
``trainer.devices`` (on a CPU: processes that Lightning's ddp strategy starts itself; only between several
processes, as one process reads the loader's own sampler and several a shuffling DistributedSampler), ``data.num_workers`` (where
the launch passes it), ``trainer.precision`` (numerics-changing: refused unless the owner lists ``precision`` in
``launch.numerics_opt_in``) and the ``OMP_NUM_THREADS`` environment. :meth:`LightningFramework.render` edits only
the tokens of a changed knob (a setting a config file decides is overridden by an appended flag, which the CLI reads
last; the file stays verbatim), so an unchanged recipe renders the user's argv exactly.

Everything else is the training contract (``seed_everything``, ``trainer.max_steps`` / ``max_epochs``, gradient
clipping, the launch's own precision, ``trainer.num_nodes``; every ``model.*``, ``optimizer.*``,
``lr_scheduler.*`` setting and the data module's other arguments) or frozen verbatim (the script, every other
setting, the config files, the environment); the gate refuses any change.

A trial adds instrumentation that does not change what is learned: attune's step probe (a Lightning callback, see
:mod:`~attune.frameworks.lightning.logs`), Lightning's CSV logger writing into the trial directory in place of the
launch's own logger, no progress bar, model summary or checkpoints, and Lightning's output directory in the trial
directory; config files are read from copies there. attune ends the trial after the
steps it measures: ``trainer.max_steps`` (which a schedule may read) is never touched.

Nothing here imports lightning or torch: versions come from package metadata.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from attune import registry
from attune.errors import RecipeError
from attune.frameworks.base import ContractField, Framework, Launch, LogParser, TrialLaunch
from attune.frameworks.common import (
    GLOBAL_BATCH_HINT,
    loader_worker_rules,
    micro_batch_layouts,
    micro_batch_rules,
    process_rules,
    recordable_env,
    repoint,
    same_value,
    thread_rules,
)
from attune.frameworks.discover import installed_version
from attune.frameworks.lightning import catalogue as cat
from attune.frameworks.lightning import settings
from attune.frameworks.lightning.launch import ACCEPTED, edit_settings, format_value, parse
from attune.frameworks.lightning.logs import LightningLogParser
from attune.frameworks.lightning.settings import Settings

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe
    from attune.trial import TrialRequest

NAME = "lightning"
RULES = {
    **micro_batch_rules(cat.BATCH),
    **process_rules(cat.DEVICES),
    **loader_worker_rules(cat.WORKERS),
    **thread_rules(cat.OMP_ENV),
}
#: the probe's module name in a trial directory, the callback the trial adds and the logger it runs with
PROBE_MODULE = "attune_lightning_probe"
PROBE_CALLBACK = f"{PROBE_MODULE}.AttuneStepProbe"
TRIAL_LOGGER = f"{PROBE_MODULE}.TrialLogger"
LOGS_ENV = "ATTUNE_LIGHTNING_LOGS"  # the probe module's ``LOGS_ENV``: where the trial logger writes
#: the trial's instrumentation settings (none changes what is learned)
TRIAL_SETTINGS: dict[str, Any] = {
    "trainer.enable_progress_bar": False,  # no redrawn progress line
    "trainer.enable_model_summary": False,  # no summary table before the first step
    # Lightning's CSV logger into the trial directory in place of the launch's own (TensorBoard, W&B, ...):
    # ``self.log`` and LearningRateMonitor work as in the user's run, and nothing goes to the user's log folders
    "trainer.logger": TRIAL_LOGGER,
}
#: environment variables of a launch that shape a run and are safe to record
_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "PL_", "GLOO_")
_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "MASTER_PORT")
#: top-level settings of LightningCLI (``fit`` subcommand) that ``--set NAME=VALUE`` may address
_NATIVE_HEADS = ("trainer", "model", "data", "optimizer", "lr_scheduler", "seed_everything", "ckpt_path")


def derived_accumulation(s: Settings, batch: int, devices: int) -> int:
    """Accumulation that keeps the launch's global batch at ``batch`` per process × ``devices`` × nodes (rounded
    down where it does not divide: the constraint and the contract then refuse the layout)."""
    return max(1, s.global_batch // (batch * devices * s.nodes))


class LightningFramework(Framework):
    name = NAME
    title = "PyTorch Lightning (your own LightningCLI script: python train.py fit --trainer.* --data.* ...)"
    versions = cat.VERSIONS
    distribution = "lightning"
    launch_based = True
    backends = ("local",)
    rules = RULES
    field_hints: ClassVar[dict[str, str]] = {"lightning.global_batch_size": GLOBAL_BATCH_HINT.format(knob=cat.BATCH)}

    def catalogue(self) -> Catalogue:
        return cat.build()

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        return micro_batch_layouts(recipe, cat.BATCH, avoid=avoid)

    # -- import ------------------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The user's launch → a recipe mapping: argv verbatim, the text of its config files, the installed
        lightning version, and every knob's value as the launch has it.

        ``options``: ``tokens_per_sample``, ``devices_per_node`` (default: the devices the launch uses),
        ``accelerator`` (default ``cpu``), ``name``, ``framework_version``."""
        options = dict(options or {})
        env = dict(env or {})
        argv = [str(a) for a in argv]
        files: dict[str, str] = {}
        while (missing := _missing_config(argv, files)) is not None:  # the config files' text, recorded
            files[missing] = _read(cwd, missing)
        accelerator = options.get("accelerator") or "cpu"
        s = settings.read_launch({"argv": argv, "files": files}, accelerator)
        knobs: dict[str, Any] = dict(s.knob_values)
        catalogue = cat.build()
        omp = env.get("OMP_NUM_THREADS", "")
        knobs[cat.OMP_ENV] = omp if omp in catalogue[cat.OMP_ENV].values else ""
        problems = [f"knobs.{k}: the launch has {format_value(v)}, outside the lightning catalogue's domain "
                    f"({', '.join(format_value(x) for x in catalogue[k].values)}); change it in your command to one "
                    "of those values before importing" for k, v in knobs.items() if catalogue[k].check_value(v)]
        if problems:
            raise RecipeError(f"cannot import `{' '.join(argv)}`:", problems)
        kept_env = recordable_env(env, _ENV_PREFIXES, _ENV_NAMES)
        version = options.get("framework_version") or installed_version("lightning") or \
            installed_version("pytorch-lightning")
        name = options.get("name") or f"{Path(str(cwd)).name or 'lightning'}-{Path(s.parsed.head.script).stem}".strip("-")
        return {
            "name": name,
            "framework": NAME,
            "launch": {"argv": argv, "env": kept_env, "cwd": str(cwd), "files": files, "framework_version": version,
                       "tokens_per_sample": options.get("tokens_per_sample")},
            "resources": {"accelerator": accelerator,
                          "devices_per_node": options.get("devices_per_node") or s.devices, "nodes": s.nodes},
            "knobs": knobs,
        }

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """``--set trainer.max_steps=100`` / ``model.learning_rate=1e-3``: a LightningCLI setting of the launch (not a
        knob's), edited on its command line (a setting a config file decides: overridden by an appended flag)."""
        launch = recipe_data.get("launch")
        key = name.split(".", 1)[0]
        if not isinstance(launch, dict) or key not in _NATIVE_HEADS or name in cat.build().knobs:
            return False  # knobs are set as knobs
        argv = [str(a) for a in launch.get("argv") or []]
        p = parse(argv, dict(launch.get("files") or {}))
        launch["argv"] = edit_settings(p, {name: value})
        return True

    # -- contract ----------------------------------------------------------------------------------------
    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """Contract settings (Lightning's defaults where absent), every model / optimizer / schedule / data
        setting, the derived global batch, and every other native setting of the launch frozen verbatim."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return {}  # check() reports why
        out: dict[str, ContractField] = {}
        for name, default in cat.CONTRACT.items():
            out[f"launch.args.{name}"] = ContractField(
                s.value(name), "contract",
                fix=f"--{name} is the launch's own setting (Lightning default {format_value(default)} where it is "
                    "not given); attune never changes it" + (
                        f" (the {cat.PRECISION} knob moves precision only with launch.numerics_opt_in: "
                        f"[{cat.PRECISION_CLASS}])" if name == cat.PRECISION else ""))
        section = sorted(k for k in s.native if k.split(".", 1)[0] in cat.CONTRACT_SECTIONS
                         and k not in cat.KNOB_SETTINGS and k not in cat.CONTRACT)
        for k in section:
            out[f"launch.args.{k}"] = ContractField(
                s.value(k), "contract", fix=f"--{k} is the script's own {k.split('.', 1)[0]} setting; attune never "
                                            "changes it")
        out["launch.learning_settings"] = ContractField(
            section, "contract", fix="the model, optimizer, schedule and data settings the launch gives (names) must "
                                     "stay as they are")
        batch, devices = int(recipe.knob(cat.BATCH)), int(recipe.knob(cat.DEVICES))
        acc = derived_accumulation(s, batch, devices)
        out["lightning.global_batch_size"] = ContractField(
            batch * acc * devices * s.nodes, "derived",
            depends_on=(f"knobs.{cat.BATCH}", f"knobs.{cat.DEVICES}", "launch.argv", "launch.files"),
            fix=f"The global batch ({cat.BATCH} × {cat.ACCUMULATION} × devices × nodes) must stay {s.global_batch}: "
                f"pick {cat.BATCH} and {cat.DEVICES} whose product divides it (the accumulation is derived), and keep "
                f"the launch's own --{cat.BATCH} / --{cat.ACCUMULATION} / --{cat.DEVICES}")
        frozen_fix = "attune only changes the knob-controlled settings of a launch"
        p = s.parsed
        assert recipe.launch is not None
        frozen = sorted(k for k in s.native if k not in cat.KNOB_SETTINGS and k not in cat.CONTRACT
                        and k not in section)
        out["launch.launcher"] = ContractField(list(p.argv[:p.head.script_index]), "frozen", fix=frozen_fix)
        out["launch.script"] = ContractField(p.head.script, "frozen", fix=frozen_fix)
        out["launch.subcommand"] = ContractField(p.subcommand, "frozen", fix=frozen_fix)
        out["launch.options"] = ContractField(frozen, "frozen", fix="the launch's other settings (names) must stay "
                                              "as they are; " + frozen_fix)
        for k in frozen:
            out[f"launch.args.{k}"] = ContractField(s.value(k), "frozen", fix=frozen_fix)
        out["launch.positionals"] = ContractField([t for _, t in p.positionals], "frozen", fix=frozen_fix)
        out["launch.env"] = ContractField(dict(sorted(recipe.launch.env.items())), "frozen", fix=frozen_fix)
        out["launch.cwd"] = ContractField(recipe.launch.cwd, "frozen", fix=frozen_fix)
        out["launch.config_files"] = ContractField(dict(sorted(recipe.launch.files.items())), "frozen",
                                                   fix="config files the launch names are carried verbatim")
        return out

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        if recipe.launch is None or recipe.launch.tokens_per_sample is None:
            return None
        try:
            return settings.read(recipe).global_batch * recipe.launch.tokens_per_sample
        except RecipeError:
            return None

    def check(self, recipe: Recipe) -> list[str]:
        try:
            settings.read(recipe)
        except RecipeError as err:
            text = str(err)
            return [text if text.startswith("launch") else f"launch.argv: {text}"]
        return []

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        """What would fail a local trial before it starts: python not on PATH or without lightning, the script or
        working directory missing."""
        problems = super().preflight(recipe, backend)
        if problems or recipe.launch is None:
            return problems
        try:
            s = settings.read(recipe)
        except RecipeError as err:
            return [f"launch.argv: {err}"]
        argv0 = recipe.launch.argv[0]
        interpreter = argv0 if "/" in argv0 else shutil.which(argv0)
        if interpreter is None or not Path(interpreter).exists():
            problems.append(f"launch.argv: {argv0} is not found here; activate the environment that has lightning "
                            "before running attune")
        elif not _finds(interpreter, ("lightning", "pytorch_lightning")):
            problems.append(f"launch.argv: {argv0} runs {interpreter}, which cannot import lightning; activate the "
                            "training environment (or put its bin directory first on PATH) before running attune")
        cwd = Path(recipe.launch.cwd or ".")
        if not cwd.is_dir():
            problems.append(f"launch.cwd: {cwd} does not exist here (relative paths are read from the directory "
                            "attune runs in)")
        elif not s.parsed.head.module and not (cwd / s.parsed.head.script).is_file():
            problems.append(f"launch.argv: the training script {s.parsed.head.script} does not exist in {cwd}")
        return problems

    # -- render ------------------------------------------------------------------------------------------
    def render(self, recipe: Recipe) -> Launch:
        """The user's launch with only the knob-controlled tokens changed (an unchanged recipe: its argv)."""
        return render_launch(recipe)

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        """``render`` plus the probe and quiet output; config files read from copies in the trial directory; ended
        by attune after ``request.steps`` optimizer steps (``trainer.max_steps`` stays: it may set the schedule)."""
        s = settings.read(recipe)
        probe_dir = trial_dir / "attune-probe"
        instrumentation: dict[str, Any] = dict(TRIAL_SETTINGS)
        instrumentation["trainer.default_root_dir"] = str(trial_dir / "lightning")
        if not _has_checkpoint_callback(s):
            instrumentation["trainer.enable_checkpointing"] = False
        launch = render_launch(recipe, instrumentation=instrumentation, trial_dir=trial_dir)
        argv = [*launch.argv, f"--trainer.callbacks+={PROBE_CALLBACK}"]
        files = dict(launch.files)
        files[str(probe_dir / f"{PROBE_MODULE}.py")] = (Path(__file__).parent / "probe.py").read_text()
        env = dict(launch.env)
        path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(probe_dir), path) if x)
        env["PYTHONUNBUFFERED"] = "1"
        env[LOGS_ENV] = str(trial_dir / "lightning-logs")
        notes = [f"--trainer.callbacks+={PROBE_CALLBACK} (one line per optimizer step; {probe_dir})"]
        notes += [f"--{k} {format_value(v)}" for k, v in instrumentation.items()]
        if s.parsed.configs:
            notes.append(f"(config files read from copies under {trial_dir / 'lightning-files'})")
        if "OMP_NUM_THREADS" in launch.env and (recipe.launch is None or "OMP_NUM_THREADS" not in recipe.launch.env):
            notes.append(f"OMP_NUM_THREADS={launch.env['OMP_NUM_THREADS']}")
        return TrialLaunch(Launch(argv=tuple(argv), env=env, files=files, cwd=launch.cwd),
                           stop_after_steps=request.steps, instrumentation=tuple(notes))

    # -- logs --------------------------------------------------------------------------------------------
    def parser(self, recipe: Recipe) -> LogParser:
        return LightningLogParser(tokens_per_sample=recipe.launch.tokens_per_sample if recipe.launch else None)

    #: what the Trainer reports that must stay the baseline's (its own count of what it trains)
    reported_contract = ("global_batch", "samples_per_step", "max_steps", "max_epochs", "trainable_parameters",
                         "learning_rate", "estimated_stepping_batches")

    def report_problems(self, recipe: Recipe, reported: Mapping[str, Any]) -> list[str]:
        """The Trainer's own layout against what attune read from the launch: batch per process, accumulation,
        processes, global batch, precision (and the seed, where the launch fixes one)."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return []
        batch, devices = int(recipe.knob(cat.BATCH)), int(recipe.knob(cat.DEVICES))
        expected: dict[str, Any] = {"batch_size": batch, "accumulate_grad_batches": derived_accumulation(s, batch,
                                                                                                          devices),
                                    "world_size": devices * s.nodes, "global_batch": s.global_batch,
                                    "samples_per_step": s.global_batch,
                                    "precision": cat.normal_precision(recipe.knob(cat.PRECISION))}
        seed = s.value("seed_everything")
        if isinstance(seed, int) and not isinstance(seed, bool):
            expected["seed"] = str(seed)
        return [f"Lightning reported {name} = {reported[name]}, the recipe reads {value}"
                for name, value in expected.items() if name in reported and reported[name] != value]


# ---------------------------------------------------------------------------------------------- helpers

def _missing_config(argv: Sequence[str], files: Mapping[str, str]) -> str | None:
    """The first config file the launch names that ``files`` lacks."""
    from attune.frameworks.lightning.launch import CONFIG_FLAGS, split

    argv = list(argv)
    start = split(argv).args_start
    for i in range(start, len(argv)):
        tok = argv[i]
        spelling, eq, value = tok.partition("=")
        if spelling in CONFIG_FLAGS:
            path = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
            if path is not None and path not in files:
                return path
    return None


def _read(cwd: Path, path: str) -> str:
    full = Path(path) if Path(path).is_absolute() else Path(cwd) / path
    try:
        return full.read_text()
    except OSError as e:
        raise RecipeError(f"cannot read the config file {path} the launch names (in {cwd}): {e.strerror}") from None


@functools.lru_cache(maxsize=32)
def _finds(interpreter: str, modules: tuple[str, ...]) -> bool:
    """Whether ``interpreter`` finds any of ``modules`` (``find_spec``, nothing imported); true when it cannot be
    asked."""
    code = f"import importlib.util, sys; sys.exit(0 if any(importlib.util.find_spec(m) for m in {modules!r}) else 3)"
    try:
        done = subprocess.run([interpreter, "-c", code], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return True
    return done.returncode != 3


def _has_checkpoint_callback(s: Settings) -> bool:
    """Whether the launch configures a ModelCheckpoint itself (then ``enable_checkpointing false`` would make
    Lightning refuse the run; its checkpoints go under the trial's ``default_root_dir`` unless it names a dirpath)."""
    return any(k.startswith("trainer.callbacks") and "Checkpoint" in str(v) for k, v in s.native.items())


def render_launch(recipe: Recipe, *, instrumentation: Mapping[str, Any] | None = None,
                  trial_dir: Path | None = None) -> Launch:
    """The recipe's launch with its knobs applied (and ``instrumentation`` settings set).

    A knob setting the command line decides keeps its position and spelling; one a config file decides (or that
    is not set) is appended as ``--name value``. The accumulation is re-derived when the batch or the device count
    moves. With ``trial_dir`` config files are written there and the argument list points at the copies."""
    s = settings.read(recipe)
    assert recipe.launch is not None
    knobs = recipe.effective_knobs
    own = s.knob_values
    changes: dict[str, Any] = {}
    for knob in cat.FLAG_KNOBS:
        new = knobs[knob]
        if not same_value(new, own[knob]):
            changes[knob] = new
    batch, devices = int(cast(int, knobs[cat.BATCH])), int(cast(int, knobs[cat.DEVICES]))
    if batch != s.batch or devices != s.devices:
        if s.global_batch % (batch * devices * s.nodes):
            raise RecipeError(f"{cat.BATCH} {batch} × {devices} devices × {s.nodes} nodes does not divide the "
                              f"launch's global batch {s.global_batch}")
        acc = derived_accumulation(s, batch, devices)
        if acc != s.accumulation:
            changes[cat.ACCUMULATION] = acc
    changes.update(instrumentation or {})
    argv = edit_settings(s.parsed, changes) if changes else list(s.parsed.argv)
    env = dict(recipe.launch.env)
    if knobs[cat.OMP_ENV]:
        env["OMP_NUM_THREADS"] = str(knobs[cat.OMP_ENV])
    elif recipe.resources.accelerator == "cpu" and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, recipe.resources.devices_per_node // devices))
    files = dict(recipe.launch.files)
    if trial_dir is not None and files:
        copies = {name: str(trial_dir / "lightning-files" / f"{i}-{Path(name).name}")
                  for i, name in enumerate(files)}
        argv = [repoint(tok, copies) for tok in argv]
        files = {copies[name]: text for name, text in files.items()}
    return Launch(argv=tuple(argv), env=env, files=files, cwd=recipe.launch.cwd)


FRAMEWORK = registry.register(LightningFramework())

__all__ = ["ACCEPTED", "FRAMEWORK", "PROBE_CALLBACK", "PROBE_MODULE", "RULES", "TRIAL_LOGGER", "TRIAL_SETTINGS",
           "LightningFramework", "derived_accumulation", "render_launch"]
