"""DeepSpeed training launches (``framework: deepspeed``), on the framework seam.

The recipe carries the user's own launch: a script that calls ``deepspeed.initialize`` with a JSON config
(``deepspeed --num_gpus N train.py --deepspeed_config ds.json``, ``torchrun ... train.py --deepspeed_config
ds.json``), or an HF Trainer script given ``--deepspeed ds.json`` (then the config's ``"auto"`` values come from the
``TrainingArguments`` flags: :mod:`~attune.frameworks.deepspeed.settings` resolves both). Knobs are the config's
ZeRO and batch-split keys, the launcher's process count and the OpenMP threads. :meth:`DeepSpeedFramework.render`
rewrites only the config keys a knob changed (re-deriving ``gradient_accumulation_steps`` so ``train_batch_size``
stays) and only the launcher token of the process count, so an unchanged recipe renders the user's argv and
config byte for byte. The contract is ``train_batch_size``, the optimizer and scheduler sections, gradient
clipping, the fp16/bf16/autocast/data-type sections and the script's seed flags (HF mode: the Trainer's contract
flags too); every other key, flag, the launcher, environment and working directory are frozen.

Trials run a copy of the config in the trial directory with logging instrumentation that changes nothing learned
(``steps_per_print: 1`` and ``log_level: "info"``, so DeepSpeed logs every step; monitors off), and attune ends them
after the steps the measurement needs. On a CPU machine (``DS_ACCELERATOR=cpu``) DeepSpeed compiles a small
shared-memory comm op with g++ on first use: trials point ``TORCH_EXTENSIONS_DIR`` at one cache directory so it is
built once, not once per trial.

Nothing here imports deepspeed, transformers or torch (discovery does, when asked).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from attune import frameworks
from attune.errors import RecipeError
from attune.frameworks.base import (
    ContractField,
    Framework,
    Launch,
    LogParser,
    Observation,
    Rule,
    SetupStep,
    Tier,
    TrialLaunch,
    moved,
    only_moves,
    reported_mismatches,
)
from attune.frameworks.common import (
    GLOBAL_BATCH_HINT,
    micro_batch_layouts,
    micro_batch_rules,
    recordable_env,
    repoint,
    same_value,
)
from attune.frameworks.deepspeed import catalogue as cat
from attune.frameworks.deepspeed import config as dsconfig
from attune.frameworks.deepspeed import settings
from attune.frameworks.deepspeed.config import AUTO, REMOVE
from attune.frameworks.deepspeed.launch import ACCEPTED, NPROC_OPTION, parse
from attune.frameworks.deepspeed.logs import DeepSpeedLogParser, HFDeepSpeedLogParser
from attune.frameworks.deepspeed.settings import Settings
from attune.frameworks.hf.launch import Edit, edit_options, format_value

if TYPE_CHECKING:
    from attune.frameworks.discover import Discovery
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe
    from attune.trial import Measurement, TrialRequest

_MEM = "memory_capacity"

RULES = {
    **micro_batch_rules(cat.MICRO),
    (cat.NPROC, "up"): Rule(Tier.SCALE, 0.3, {"compute_bound": 0.35, "host_overhead": 0.3}),
    (cat.NPROC, "down"): Rule(Tier.SCALE, 0.0, {"communication": 0.05}),
    # a lower ZeRO stage communicates less (no parameter gathers at 0-2, no gradient partitioning at 0-1)
    (cat.STAGE, "down"): Rule(Tier.SCALE, 0.12, {"communication": 0.25, "host_overhead": 0.15}, (_MEM,),
                              memory=+1),
    (cat.STAGE, "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    (cat.OVERLAP, "enable"): Rule(Tier.OVERLAP, 0.03, {"communication": 0.1}, memory=+1),
    (cat.OVERLAP, "disable"): Rule(Tier.OVERLAP, 0.0, {_MEM: 0.05}, memory=-1),
    (cat.CONTIGUOUS, "enable"): Rule(Tier.OVERLAP, 0.01, {"host_overhead": 0.03}),
    (cat.CONTIGUOUS, "disable"): Rule(Tier.OVERLAP, 0.0),
    (cat.REDUCE_BUCKET, "up"): Rule(Tier.OVERLAP, 0.03, {"communication": 0.1, "host_overhead": 0.05}, memory=+1),
    (cat.REDUCE_BUCKET, "down"): Rule(Tier.OVERLAP, 0.0, {_MEM: 0.05}, memory=-1),
    (cat.ALLGATHER_BUCKET, "up"): Rule(Tier.OVERLAP, 0.02, {"communication": 0.08}, memory=+1),
    (cat.ALLGATHER_BUCKET, "down"): Rule(Tier.OVERLAP, 0.0, {_MEM: 0.05}, memory=-1),
    (cat.PREFETCH, "up"): Rule(Tier.OVERLAP, 0.03, {"communication": 0.1, "host_overhead": 0.05}, memory=+1),
    (cat.PREFETCH, "down"): Rule(Tier.OVERLAP, 0.0, {_MEM: 0.05}, memory=-1),
    (cat.PERSISTENCE, "up"): Rule(Tier.OVERLAP, 0.03, {"host_overhead": 0.08, "communication": 0.05}, memory=+1),
    (cat.PERSISTENCE, "down"): Rule(Tier.OVERLAP, 0.0, {_MEM: 0.05}, memory=-1),
    (cat.OMP_ENV, "up"): Rule(Tier.MICRO, 0.04, {"compute_bound": 0.08}),
    (cat.OMP_ENV, "down"): Rule(Tier.MICRO, 0.01, {"host_overhead": 0.02}),
}

#: config keys every trial sets (logging only: what is learned does not change)
TRIAL_KEYS: dict[str, Any] = {"steps_per_print": 1, "log_level": "info"}
#: monitors a trial turns off where the config turns them on (they write to the user's directories or services)
MONITORS = ("tensorboard", "wandb", "csv_monitor", "comet", "comms_logger")
#: environment variables of a launch that shape a run and are safe to record (never tokens or keys)
_ENV_PREFIXES = ("DS_", "NCCL_", "TORCH_NCCL_", "ACCELERATE_", "CCL_")
_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "LOCAL_SIZE", "TORCH_EXTENSIONS_DIR")
#: HF Trainer flags whose values the hf mode derives from the micro-batch knob
_HF_BATCH = ("per_device_train_batch_size", "gradient_accumulation_steps")


def extensions_dir() -> str:
    """Where DeepSpeed's JIT-built ops (the CPU shared-memory comm op) are cached across trials."""
    from platformdirs import user_cache_dir

    return str(Path(user_cache_dir("attune")) / "torch_extensions")


def _seed_flags(native: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in native if k in cat.SEED_FLAG or k.endswith("_seed"))


#: ZeRO settings that only shape communication between ranks
_ZERO_COMM = ("zero_optimization.overlap_comm", "zero_optimization.reduce_bucket_size",
              "zero_optimization.allgather_bucket_size", "zero_optimization.stage3_prefetch_bucket_size",
              "zero_optimization.stage3_param_persistence_threshold")

class DeepSpeedFramework(Framework):
    name = "deepspeed"
    title = "DeepSpeed (your own script and JSON config: deepspeed / torchrun launch, or HF Trainer --deepspeed)"
    versions = cat.VERSIONS
    distribution = "deepspeed"
    launch_based = True
    backends = ("local",)
    rules = RULES
    phase_keys: ClassVar[dict[str, str]] = {"fwd": "forward", "bwd_inner": "backward", "bwd_allreduce": "dp_comm",
                                            "step": "optimizer"}
    field_hints: ClassVar[dict[str, str]] = {"deepspeed.global_batch_size": GLOBAL_BATCH_HINT.format(knob=cat.MICRO)}

    def catalogue(self) -> Catalogue:
        return cat.build()

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        return micro_batch_layouts(recipe, cat.MICRO, avoid=avoid)

    def discover(self) -> Discovery:
        """Every setting of the installed DeepSpeed's config, classified (imports deepspeed)."""
        from attune.frameworks.deepspeed.discover import discover

        return discover(self)

    # -- import ------------------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The user's launch → a recipe mapping: argv verbatim, the DeepSpeed config's text, the installed
        deepspeed version, and every knob's value as the launch has it.

        ``options``: ``tokens_per_sample``, ``devices_per_node``, ``accelerator`` (default ``cpu``), ``name``,
        ``framework_version``, ``config_flag`` (the script flag naming the config, where it is not one of
        ``--deepspeed_config`` / ``--deepspeed`` / ``--ds_config``)."""
        from attune.frameworks.discover import installed_version

        options = dict(options or {})
        env = dict(env or {})
        argv = [str(a) for a in argv]
        parsed = parse(argv, config_flag=options.get("config_flag"))
        path = parsed.config_path
        if path is None:
            raise RecipeError(f"cannot import `{' '.join(argv)}`: it names no DeepSpeed config; accepted forms:",
                              list(ACCEPTED))
        full = Path(path) if Path(path).is_absolute() else Path(cwd) / path
        try:
            text = full.read_text()
        except OSError as err:
            raise RecipeError(f"cannot read the DeepSpeed config {path} (in {cwd}): {err.strerror}") from None
        files = {path: text}
        version = options.get("framework_version") or installed_version("deepspeed")
        kept_env = recordable_env(env, _ENV_PREFIXES, _ENV_NAMES)
        accelerator = options.get("accelerator") or "cpu"
        from attune.recipe.model import NativeLaunch

        launch = NativeLaunch(argv=tuple(argv), env=kept_env, cwd=str(cwd), files=files, framework_version=version,
                              tokens_per_sample=options.get("tokens_per_sample"))
        dpn = options.get("devices_per_node")
        s = settings.read_launch(launch, accelerator=accelerator, devices_per_node=int(dpn or os.cpu_count() or 1))
        if s.problem:
            raise RecipeError(f"cannot import `{' '.join(argv)}`: {s.problem.removeprefix('launch.files: ')}")
        knobs = dict(s.knob_values)
        catalogue = cat.build()
        omp = env.get("OMP_NUM_THREADS", "")
        knobs[cat.OMP_ENV] = omp if omp in catalogue[cat.OMP_ENV].values else ""
        problems = []
        for k, v in knobs.items():
            if k in s.auto_knobs:
                knobs[k] = catalogue[k].default  # "auto": pinned by a constraint, the knob is a placeholder
                continue
            if catalogue[k].check_value(v):
                problems.append(f"knobs.{k}: the launch has {v!r}, outside the deepspeed catalogue's domain "
                                f"({', '.join(map(str, catalogue[k].values))}); change it in your "
                                f"{'command' if k in (cat.NPROC, cat.OMP_ENV) else 'DeepSpeed config'} to one of "
                                "those values before importing")
        if problems:
            raise RecipeError(f"cannot import `{' '.join(argv)}`:", problems)
        name = options.get("name") or f"{Path(str(cwd)).name or 'deepspeed'}-{Path(parsed.script).stem}".strip("-")
        return {
            "name": name,
            "framework": "deepspeed",
            "launch": {"argv": list(argv), "env": kept_env, "cwd": str(cwd), "files": files,
                       "framework_version": version, "tokens_per_sample": options.get("tokens_per_sample")},
            "resources": {"accelerator": accelerator, "devices_per_node": int(dpn or s.nproc),
                          "nodes": s.nnodes},
            "knobs": knobs,
        }

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """``--set train_batch_size=64`` / ``--set optimizer.params.lr=1e-3`` / ``--set seed=7``: set a DeepSpeed
        config key (dotted path) or a flag of the script (HF mode: a TrainingArguments flag) in place."""
        launch = recipe_data.get("launch")
        catalogue = cat.build()
        if not isinstance(launch, dict) or name in catalogue or name in cat.KNOB_KEYS:
            return False  # knobs (and the keys knobs control) are set as knobs
        argv = [str(a) for a in launch.get("argv") or []]
        files = dict(launch.get("files") or {})
        try:
            parsed = parse(argv, files=tuple(files))
        except RecipeError:
            return False
        path = parsed.config_path
        native = parsed.settings()
        if name in native or (name in _hf_fields() and path is not None and path in files and
                              settings.is_hf(parsed, dsconfig.load(path, files[path]))):
            edit = Edit(argv)
            edit_options(edit, parsed.options, {name: REMOVE if value is None else value})
            launch["argv"] = edit.result()
            return True
        if path is None or path not in files:
            return False
        try:
            data = dsconfig.load(path, files[path])
        except RecipeError:
            return False
        if not (dsconfig.lookup(data, name)[0] or _is_config_key(name)):
            return False
        files[path] = dsconfig.rewrite(path, files[path], {name: REMOVE if value is None else value})
        launch["files"] = files
        return True

    # -- contract ----------------------------------------------------------------------------------------
    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """Contract keys (resolved, DeepSpeed defaults where absent), the derived batch, and every other config
        key, script flag and part of the launch frozen verbatim."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return {}  # check() reports why
        out: dict[str, ContractField] = {}
        keep = "attune never changes it"
        out["deepspeed.train_batch_size"] = ContractField(
            s.train_batch, "contract", fix=f"train_batch_size is the launch's own batch ({s.train_batch} samples per "
                                           f"optimizer step); {keep}")
        flat = dsconfig.flatten(s.resolved)
        for key, default in cat.CONTRACT_DEFAULTS.items():
            head = key.split(".")[0]
            if not any(p == key or p.startswith(key + ".") for p in flat) and not (
                    head != key and isinstance(flat.get(head), (str, int, float))):
                flat.setdefault(key, default)
        contract_paths = sorted(p for p in flat if p.split(".")[0] in cat.CONTRACT_KEYS and p != cat.TRAIN_BATCH)
        for p in contract_paths:
            out[f"deepspeed.config.{p}"] = ContractField(
                flat[p], "contract", fix=f"{p} is the DeepSpeed config's own setting"
                f"{' (resolved from the TrainingArguments)' if s.mode == 'hf' and dsconfig.get(s.raw, p) == AUTO else ''}"
                f"; {keep}")
        mb, nproc = int(recipe.knob(cat.MICRO)), int(recipe.knob(cat.NPROC))
        acc = max(1, s.train_batch // (mb * nproc * s.nnodes))
        out["deepspeed.global_batch_size"] = ContractField(
            mb * acc * nproc * s.nnodes, "derived",
            depends_on=(f"knobs.{cat.MICRO}", f"knobs.{cat.NPROC}", "launch.argv", "launch.files"),
            fix=f"The global batch ({cat.MICRO} × {cat.ACCUMULATION} × processes) must stay {s.train_batch}: pick "
                f"{cat.MICRO} and {cat.NPROC} whose product divides it (the accumulation is derived)")
        frozen_fix = "attune only changes the knob-controlled keys of a DeepSpeed config and the launcher's process count"
        raw_flat = dsconfig.flatten(s.raw)
        frozen = sorted(p for p in raw_flat if p.split(".")[0] not in cat.CONTRACT_KEYS and p not in cat.KNOB_KEYS
                        and p != cat.TRAIN_BATCH)
        for p in frozen:
            out[f"deepspeed.config.{p}"] = ContractField(raw_flat[p], "frozen", fix=frozen_fix)
        out["deepspeed.config_keys"] = ContractField(
            sorted(p for p in raw_flat if p not in cat.KNOB_KEYS), "frozen",
            fix="the DeepSpeed config's keys (names) must stay as they are: a key added or removed changes a "
                f"DeepSpeed default; {frozen_fix}")
        parsed = s.parsed
        native = parsed.settings()
        hf_contract = _hf_contract(native) if s.mode == "hf" else {}
        for name, value in hf_contract.items():
            out[f"launch.args.{name}"] = ContractField(value, "contract", fix=f"--{name} is the launch's own setting; "
                                                                               f"{keep}")
        for name in _seed_flags(native):
            if name not in hf_contract:
                out[f"launch.args.{name}"] = ContractField(native[name], "contract",
                                                           fix=f"--{name} seeds the run; {keep}")
        skip = {*hf_contract, *_seed_flags(native)} | (set(_HF_BATCH) if s.mode == "hf" else set())
        if parsed.config_option is not None:
            skip.add(parsed.config_option.name)
        others = sorted(k for k in native if k not in skip)
        for name in others:
            out[f"launch.args.{name}"] = ContractField(native[name], "frozen", fix=frozen_fix)
        out["launch.options"] = ContractField(sorted(native), "frozen", fix="the script's flags (names) must stay as "
                                              "they are; " + frozen_fix)
        out["launch.launcher"] = ContractField(parsed.launcher_tokens(), "frozen", fix=frozen_fix)
        out["launch.script"] = ContractField(parsed.script, "frozen", fix=frozen_fix)
        out["launch.config_path"] = ContractField(s.config_path, "frozen", fix=frozen_fix)
        out["launch.positionals"] = ContractField([t for _, t in parsed.positionals], "frozen", fix=frozen_fix)
        assert recipe.launch is not None
        out["launch.env"] = ContractField(dict(sorted(recipe.launch.env.items())), "frozen", fix=frozen_fix)
        out["launch.cwd"] = ContractField(recipe.launch.cwd, "frozen", fix=frozen_fix)
        out["launch.other_files"] = ContractField(
            {k: v for k, v in sorted(recipe.launch.files.items()) if k != s.config_path}, "frozen",
            fix="files the launch names besides its DeepSpeed config are carried verbatim")
        return out

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        if recipe.launch is None or recipe.launch.tokens_per_sample is None:
            return None
        try:
            return settings.read(recipe).train_batch * recipe.launch.tokens_per_sample
        except RecipeError:
            return None

    def setup(self, recipe: Recipe, *, python: str = sys.executable) -> SetupStep | None:
        """On CPU, DeepSpeed JIT-builds its shared-memory comm op the first time a job starts (minutes on a small
        machine): built once here, into the cache every trial uses, instead of inside the first trial."""
        if recipe.resources.accelerator != "cpu":
            return None
        return SetupStep(what="DeepSpeed's CPU shared-memory comm op (JIT build, cached for every trial)",
                         argv=(python, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"),
                         env={"TORCH_EXTENSIONS_DIR": extensions_dir(), "DS_ACCELERATOR": "cpu"})

    def cannot_matter(self, best: Recipe, candidate: Recipe, measured: Measurement | None) -> str | None:
        change = moved(best, candidate)
        world = int(candidate.knob(cat.NPROC)) * candidate.resources.nodes
        if world == 1 and only_moves(change, _ZERO_COMM):
            return (f"{', '.join(change)}: the job runs one process, so ZeRO has nothing to reduce, gather or "
                    "overlap across ranks")
        return None

    def check(self, recipe: Recipe) -> list[str]:
        problems: list[str] = []
        try:
            settings.read(recipe)
        except RecipeError as err:
            text = str(err)
            problems.append(text if text.startswith("launch") else f"launch.argv: {text}")
        catalogue = recipe.catalogue
        explorable = getattr(catalogue, "explorable", {})
        for name in getattr(recipe.tuning, "explore", ()):
            if name in explorable:
                continue
            if name in catalogue.knobs:
                problems.append(f"tuning.explore: {name} is a curated knob, tuned without exploring; remove it")
            elif name.split(".")[0] in cat.CONTRACT_KEYS or name in (cat.TRAIN_BATCH, cat.ACCUMULATION):
                problems.append(f"tuning.explore: {name} is part of the training contract and is never explored")
            else:
                problems.append(f"tuning.explore: {name!r} is no unclassified DeepSpeed setting with a finite domain "
                                f"(bool, enum or number); `attune knobs --framework deepspeed --discover` lists them")
        return problems

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        problems = super().preflight(recipe, backend)
        if problems or recipe.launch is None:
            return problems
        import shutil

        argv0 = recipe.launch.argv[0]
        if "/" not in argv0 and shutil.which(argv0) is None:
            problems.append(f"launch.argv: {argv0} is not on PATH here; activate the environment that has deepspeed")
        cwd = Path(recipe.launch.cwd or ".")
        try:
            s = settings.read(recipe)
        except RecipeError:
            return problems
        if s.problem:
            problems.append(s.problem)
        script = cwd / s.parsed.script
        if not s.parsed.module and not script.is_file():
            problems.append(f"launch.argv: the training script {s.parsed.script} does not exist in {cwd}")
        if recipe.resources.accelerator == "cpu" and recipe.launch.env.get("DS_ACCELERATOR", os.environ.get(
                "DS_ACCELERATOR", "cpu")) != "cpu":
            problems.append("launch.env: a cpu recipe needs DS_ACCELERATOR=cpu")
        return problems

    # -- render ------------------------------------------------------------------------------------------
    def render(self, recipe: Recipe) -> Launch:
        """The user's launch with only the knob-controlled keys and tokens changed (an unchanged recipe: its
        argv and config file, byte for byte)."""
        return render_launch(recipe)

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        """``render`` plus logging instrumentation, the config in a copy under the trial directory; run in the
        launch's own directory and ended by attune after ``request.steps`` logged steps."""
        s = settings.read(recipe)
        launch = render_launch(recipe, trial_dir=trial_dir, instrument=True)
        notes = [f"{k}: {format_value(v) if not isinstance(v, str) else repr(v)}" for k, v in TRIAL_KEYS.items()]
        notes += [f"{m}.enabled: false" for m in MONITORS if dsconfig.get(s.raw, f"{m}.enabled") is True]
        notes.append(f"(in a copy of {s.config_path} under the trial directory)")
        if s.mode == "hf":
            from attune.frameworks.hf import TRIAL_FLAGS

            notes += [f"--{k} {format_value(v)}" for k, v in TRIAL_FLAGS.items()]
        env = {**launch.env, "PYTHONUNBUFFERED": "1"}
        if "TORCH_EXTENSIONS_DIR" not in env and "TORCH_EXTENSIONS_DIR" not in os.environ:
            env["TORCH_EXTENSIONS_DIR"] = extensions_dir()
            notes.append(f"TORCH_EXTENSIONS_DIR={env['TORCH_EXTENSIONS_DIR']} (JIT-built ops cached across trials)")
        return TrialLaunch(Launch(argv=launch.argv, env=env, files=launch.files, cwd=launch.cwd),
                           stop_after_steps=request.steps, instrumentation=tuple(notes))

    # -- logs --------------------------------------------------------------------------------------------
    def collect(self, parser: LogParser, trial_dir: Path) -> Observation:
        return _collect(parser, trial_dir)

    #: what DeepSpeed's config dump (and, under the HF Trainer, the Trainer's start-up lines) report that must stay
    #: the baseline's run's: the global batch, clipping, precision, the optimizer and its learning rate, the scheduler
    reported_contract = ("train_batch_size", "gradient_clipping", "fp16_enabled", "bf16_enabled", "optimizer_name",
                         "optimizer_lr", "scheduler_name", "total_train_batch_size", "total_optimization_steps",
                         "trainable_parameters")

    def report_problems(self, recipe: Recipe, reported: Mapping[str, Any]) -> list[str]:
        """DeepSpeed's own resolved batch triple and world size against what attune read from the launch and the
        trial's knobs (a misread config, an ``auto`` resolved otherwise, a launcher that started other processes)."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return []
        mb, nproc = int(recipe.knob(cat.MICRO)), int(recipe.knob(cat.NPROC))
        world = nproc * s.nnodes
        expected = {"train_batch_size": s.train_batch, "train_micro_batch_size_per_gpu": mb,
                    "gradient_accumulation_steps": max(1, s.train_batch // (mb * world)), "world_size": world}
        return reported_mismatches("DeepSpeed", expected, reported)

    def parser(self, recipe: Recipe) -> LogParser:
        tps = recipe.launch.tokens_per_sample if recipe.launch else None
        try:
            s = settings.read(recipe)
        except RecipeError:
            return DeepSpeedLogParser(train_batch=1, tokens_per_sample=tps)
        if s.mode == "hf":
            return HFDeepSpeedLogParser(global_batch=s.train_batch, tokens_per_sample=tps)
        return DeepSpeedLogParser(train_batch=s.train_batch, tokens_per_sample=tps)


def _collect(parser: LogParser, trial_dir: Path) -> Observation:
    flush = getattr(parser, "flush", None)
    if callable(flush):
        flush()  # the last step, where the output ended before its loss line
    return Observation(steps=list(parser.steps), errors=list(parser.errors), done=parser.done,
                       first_error=parser.first_error_line, reported=dict(parser.reported))


def _hf_fields() -> frozenset[str]:
    from attune.frameworks.hf.fields import training_argument_fields

    return training_argument_fields()


def _is_config_key(name: str) -> bool:
    """A key path DeepSpeed 0.19.8 reads (per the recorded schema), or one under a free-form section."""
    from attune.frameworks.deepspeed import schema

    names = {s.name for s in schema.settings()} | {a for s in schema.settings() for a in s.aliases}
    if name in names:
        return True
    return any(name.startswith(prefix + ".") for prefix in ("optimizer.params", "scheduler.params", "pipeline"))


def _hf_contract(native: Mapping[str, Any]) -> dict[str, Any]:
    """The HF Trainer's contract flags of an hf-mode launch (HF defaults where absent)."""
    from attune.frameworks.hf import catalogue as hfcat
    from attune.frameworks.hf import settings as hfs

    out = {}
    for name, (kind, default) in hfcat.CONTRACT.items():
        out[name] = hfs.typed(name, kind, native[name]) if name in native else (
            hfs.to_number(default) if kind == "float" else default)
    return out


def _edit_launcher(edit: Edit, s: Settings, nproc: int) -> None:
    p = s.parsed
    if nproc == s.nproc:
        return
    if p.launcher == "python":
        edit.insert.setdefault(p.script_index, []).extend(
            ["-m", "torch.distributed.run", *(["--standalone"] if s.nnodes == 1 else []), "--nproc_per_node",
             str(nproc)])
        return
    names = NPROC_OPTION[p.launcher]
    opt = p.launcher_option(*names)
    switch = next((o for o in p.launcher_options if o.name in ("m", "module")), None)
    at = switch.start if switch is not None else p.script_index
    if opt is not None:
        tokens = [f"{opt.spelling}={nproc}"] if opt.inline else [opt.spelling, str(nproc)]
        edit.replace[opt.start] = (opt.end, tokens)
    else:
        edit.insert.setdefault(at, []).extend([f"--{names[0]}", str(nproc)])


def render_launch(recipe: Recipe, *, trial_dir: Path | None = None, instrument: bool = False) -> Launch:
    """The recipe's launch with its knobs applied.

    Config knobs rewrite their key in the config (in the spelling the config uses; ``overlap_comm: null`` removes
    the key, DeepSpeed's default); the micro-batch knob also re-derives ``gradient_accumulation_steps`` where the
    config states it (or where it lacks ``train_batch_size``), so ``train_batch_size`` stays. Under the HF Trainer
    the micro-batch is ``--per_device_train_batch_size`` / ``--gradient_accumulation_steps`` (and the config keys too
    where they are numbers, not ``"auto"``). The process count edits the launcher (deepspeed ``--num_gpus``,
    torchrun ``--nproc_per_node``, accelerate ``--num_processes``; python becomes ``python -m
    torch.distributed.run``). With ``trial_dir`` the config is written there and the argument list points at the
    copy; ``instrument`` adds the trial's logging keys (and the HF Trainer's logging flags)."""
    s = settings.read(recipe)
    assert recipe.launch is not None and s.config_path is not None
    p = s.parsed
    knobs = recipe.effective_knobs
    own = s.knob_values
    changes: dict[str, Any] = {}
    for knob in cat.CONFIG_KNOBS:
        if knob == cat.MICRO or same_value(knobs[knob], own[knob]):
            continue
        changes[s.spelling(knob)] = REMOVE if knobs[knob] is None else knobs[knob]
    explorable = getattr(recipe.catalogue, "explorable", {})
    for name, value in recipe.knobs.items():  # exploratory knobs the recipe sets (null: as the launch has it)
        if name in explorable and value is not None:
            changes[name] = value
    flags: dict[str, Any] = {}
    mb, nproc = int(cast(int, knobs[cat.MICRO])), int(cast(int, knobs[cat.NPROC]))
    if mb != s.micro or nproc != s.nproc:
        world = nproc * s.nnodes
        if s.train_batch % (mb * world):
            raise RecipeError(f"{cat.MICRO} {mb} × {nproc} processes × {s.nnodes} nodes does not divide "
                              f"train_batch_size {s.train_batch}")
        acc = s.train_batch // (mb * world)
        raw_tb = dsconfig.lookup(s.raw, cat.TRAIN_BATCH)
        if s.mode == "hf":
            flags.update({"per_device_train_batch_size": mb, "gradient_accumulation_steps": acc})
            for key, value in ((cat.MICRO, mb), (cat.ACCUMULATION, acc)):
                found, old = dsconfig.lookup(s.raw, key)
                if found and old != AUTO:
                    changes[key] = value
        else:
            if mb != s.micro:
                changes[cat.MICRO] = mb
            has_acc = dsconfig.lookup(s.raw, cat.ACCUMULATION)[0]
            # DeepSpeed derives the accumulation from train_batch_size and the micro-batch where the config
            # states no accumulation; without train_batch_size the accumulation is what keeps the batch
            if (has_acc and acc != s.accumulation) or (not has_acc and not raw_tb[0]):
                changes[cat.ACCUMULATION] = acc
    if instrument:
        changes.update(TRIAL_KEYS)
        for m in MONITORS:
            if dsconfig.get(s.raw, f"{m}.enabled") is True:
                changes[f"{m}.enabled"] = False
        if s.mode == "hf":
            from attune.frameworks.hf import TRIAL_FLAGS

            flags.update(TRIAL_FLAGS)
            if trial_dir is not None:
                flags["output_dir"] = str(trial_dir / "hf-output")
    files = dict(recipe.launch.files)
    files[s.config_path] = dsconfig.rewrite(s.config_path, files[s.config_path], changes)
    edit = Edit(list(p.argv))
    if flags:
        edit_options(edit, p.options, flags)
    env = dict(recipe.launch.env)
    if knobs[cat.OMP_ENV]:
        env["OMP_NUM_THREADS"] = str(knobs[cat.OMP_ENV])
    _edit_launcher(edit, s, nproc)
    cpu = recipe.resources.accelerator == "cpu"
    if cpu:
        env.setdefault("DS_ACCELERATOR", "cpu")
        if "OMP_NUM_THREADS" not in env:
            env["OMP_NUM_THREADS"] = str(max(1, recipe.resources.devices_per_node // nproc))
    argv = edit.result()
    if trial_dir is not None:
        copies = {name: str(trial_dir / "ds-files" / Path(name).name) for name in files}
        argv = [repoint(tok, copies) for tok in argv]
        files = {copies[name]: text for name, text in files.items()}
    return Launch(argv=tuple(argv), env=env, files=files, cwd=recipe.launch.cwd)


FRAMEWORK = frameworks.register(DeepSpeedFramework())

__all__ = ["FRAMEWORK", "MONITORS", "RULES", "TRIAL_KEYS", "DeepSpeedFramework", "extensions_dir", "render_launch"]
