"""HuggingFace Transformers ``Trainer`` scripts (``framework: hf``), on the framework seam.

The recipe carries the user's own launch (``python train.py ...``, ``torchrun ... train.py ...``, ``accelerate
launch ... train.py ...``; flags or one JSON/YAML args file). Knobs are ``TrainingArguments`` flags and the
launcher's process count; :meth:`HFFramework.render` changes only those tokens (re-deriving
``--gradient_accumulation_steps`` so the global batch stays), so an unchanged recipe renders the user's argv
exactly. Everything else in the launch is contract (``learning_rate``, ``seed``, ``max_steps``, precision, ...)
or frozen verbatim, and the gate refuses any change to it.

Trials add logging instrumentation that does not change what is learned (``--logging_steps 1``, no checkpoints or
reporting, output in the trial directory) and are ended by attune after the steps the measurement needs: the
script's own ``max_steps`` (which sets the learning rate schedule) is never touched. Step times come from when each
step's log line arrives. A step's work is what both sides of a comparison do alike: its non-padding tokens where the
run counts them (TRL's SFT logs ``num_tokens``; an args-file launch asks the Trainer for ``non_padding`` counts),
else the fixed global batch (× ``tokens_per_sample``). Never the Trainer's ``all`` count: it includes the padding of
each micro-batch to its longest sample, so a larger per-device batch would "see" more tokens for the same samples
(:class:`~attune.frameworks.hf.logs.TokenUnit`).

TRL's training commands (``trl sft ...``, or a TRL script under any launcher) are hf launches too: their configs
extend ``TrainingArguments``; :mod:`attune.frameworks.hf.trl` reads what TRL adds (its own flags, accelerate options
among them, the ``--config`` YAML, TRL's defaults and contract).

Nothing here imports transformers or torch: versions come from package metadata.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
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
    Tier,
    TrialLaunch,
    bucket_cannot_matter,
    gradient_mb,
    moved,
    only_moves,
    reported_mismatches,
)
from attune.frameworks.cmdline import container_launch, set_container_argv
from attune.frameworks.common import (
    GLOBAL_BATCH_HINT,
    compile_rules,
    loader_worker_rules,
    micro_batch_layouts,
    micro_batch_rules,
    process_rules,
    recompute_rules,
    recordable_env,
    repoint,
    same_value,
    thread_rules,
)
from attune.frameworks.discover import installed_version
from attune.frameworks.hf import catalogue as cat
from attune.frameworks.hf import randomness, settings, trl
from attune.frameworks.hf import tensorboard as tb
from attune.frameworks.hf.fields import training_argument_fields
from attune.frameworks.hf.launch import (
    ACCEPTED,
    REMOVE,
    Edit,
    ParsedLaunch,
    default_args_path,
    edit_options,
    format_value,
    load_args_file,
    parse,
    rewrite_args_file,
)
from attune.frameworks.hf.logs import UNIT_KEY, HFLogParser, PodLogParser
from attune.frameworks.hf.settings import Settings

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe
    from attune.trial import Measurement, TrialRequest


RULES = {
    **micro_batch_rules(cat.PER_DEVICE),
    **process_rules(cat.NPROC),
    **recompute_rules(cat.CHECKPOINTING),
    **loader_worker_rules("dataloader_num_workers"),
    (cat.OPTIM, "up"): Rule(Tier.MICRO, 0.02, {"host_overhead": 0.08}),  # adamw_torch → adamw_torch_fused
    (cat.OPTIM, "down"): Rule(Tier.MICRO, 0.01, {"host_overhead": 0.03}),
    **compile_rules("torch_compile"),
    ("ddp_bucket_cap_mb", "up"): Rule(Tier.OVERLAP, 0.01, {"communication": 0.05}),
    ("ddp_bucket_cap_mb", "down"): Rule(Tier.OVERLAP, 0.01, {"communication": 0.05}),
    ("ddp_find_unused_parameters", "disable"): Rule(Tier.OVERLAP, 0.02, {"host_overhead": 0.05,
                                                                         "communication": 0.03}),
    ("ddp_find_unused_parameters", "enable"): Rule(Tier.OVERLAP, 0.0),
    ("dataloader_pin_memory", "enable"): Rule(Tier.OVERLAP, 0.005, {"data_loading": 0.05}),
    ("dataloader_pin_memory", "disable"): Rule(Tier.OVERLAP, 0.0),
    **thread_rules(cat.OMP_ENV),
}

#: logging instrumentation of every trial (none of it changes what is learned)
TRIAL_FLAGS: dict[str, Any] = {
    "logging_steps": 1,  # one log line per optimizer step: the step clock
    "logging_strategy": "steps",
    "logging_nan_inf_filter": False,  # log a NaN loss as NaN (HF would replace it by the running mean)
    "disable_tqdm": True,  # plain dict lines, no progress bar
    "save_strategy": "no",  # a trial writes no checkpoints
    "report_to": "none",  # and reports to no tracker
    "log_level": "info",  # the Trainer states its batch layout and step count: each trial is checked against it
}
#: a step's work in every step's line: the Trainer's count of non-padding tokens (``all``, what ``True`` means,
#: counts the padding of each micro-batch to its longest sample: more "tokens" for the same samples at a larger
#: per-device batch). The value exists from transformers 4.57 and only an args file can give it
#: (:func:`trial_token_flags`).
TOKEN_FLAGS: dict[str, Any] = {"include_num_input_tokens_seen": "non_padding"}
#: the log key of TRL's SFTTrainer's own cumulative count of non-padding tokens (trl 1.16 ``SFTTrainer.compute_loss``)
TRL_TOKEN_KEY = "num_tokens"
#: the first transformers release whose ``include_num_input_tokens_seen`` takes ``non_padding``
NON_PADDING_SINCE = (4, 57)
#: environment variables of a launch that shape a run and are safe to record (never tokens or keys)
_ENV_PREFIXES = ("ACCELERATE_", "NCCL_", "TORCH_NCCL_", "PET_")
_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF")
#: flags whose value is a config file the Trainer reads (carried in ``launch.files``, frozen by content)
_FILE_FLAGS = ("deepspeed", "fsdp_config", "accelerator_config")


def derived_accumulation(s: Settings, per_device: int, nproc: int) -> int:
    """Accumulation that keeps the launch's global batch at ``per_device`` × ``nproc`` processes per node
    (rounded down where it does not divide: the constraint and the contract then refuse the layout)."""
    world = nproc * s.nnodes
    return max(1, s.global_batch // (per_device * world))


class HFFramework(Framework):
    name = "hf"
    title = "HuggingFace Transformers Trainer (your own script: python / torchrun / accelerate launch)"
    versions = cat.VERSIONS
    distribution = "transformers"
    launch_based = True
    backends = ("local",)
    rules = RULES
    field_hints: ClassVar[dict[str, str]] = {"hf.global_batch_size": GLOBAL_BATCH_HINT.format(knob=cat.PER_DEVICE)}
    k8s = True

    def catalogue(self) -> Catalogue:
        return cat.build()

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        return micro_batch_layouts(recipe, cat.PER_DEVICE, avoid=avoid)

    def loss_resolution(self, recipe: Recipe, loss: float, reported: Mapping[str, Any] | None = None) -> float | None:
        """A local trial reads its losses unrounded from the Trainer's TensorBoard events (float32; see
        :mod:`attune.frameworks.hf.tensorboard`); otherwise from the printed line: transformers 5 prints four
        significant digits (``f"{v:.4g}"``), 4.x rounds to four decimals. Half the last unit is what a check cannot
        see."""
        if reported is not None and reported.get(tb.PRECISION_KEY) == tb.FULL:
            return tb.float32_resolution(loss)
        if _v5(recipe):
            return 0.5 * 10 ** (math.floor(math.log10(abs(loss))) - 3) if loss and math.isfinite(loss) else None
        return 0.5e-4

    def cannot_matter(self, best: Recipe, candidate: Recipe, measured: Measurement | None) -> str | None:
        change = moved(best, candidate)
        world = int(candidate.knob(cat.NPROC)) * candidate.resources.nodes
        if world == 1 and only_moves(change, ("ddp_bucket_cap_mb", "ddp_find_unused_parameters")):
            return (f"{', '.join(change)}: the job runs one process, so the Trainer does not wrap the model in DDP "
                    "(no gradient buckets, no unused-parameter search)")
        grads = gradient_mb(measured.reported.get("trainable_parameters")) if measured is not None else None
        return bucket_cannot_matter(change, "ddp_bucket_cap_mb", grads)

    # -- import ------------------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The user's launch → a recipe mapping: argv verbatim, the args file's (and config files') text,
        the installed transformers version, and every knob's value as the launch has it.

        ``options``: ``tokens_per_sample``, ``devices_per_node``, ``accelerator`` (default ``cpu``), ``name``,
        ``read_files`` (default true; false where the files live elsewhere, e.g. inside a container image)."""
        options = dict(options or {})
        env = dict(env or {})
        argv = [str(a) for a in argv]
        parsed = parse(argv)
        files: dict[str, str] = {}
        read_files = options.get("read_files", True)
        if parsed.args_file is not None:
            if not read_files:
                raise RecipeError(f"the launch reads its arguments from {parsed.args_file}, which attune cannot "
                                  "read here; pass the arguments as flags instead")
            files[parsed.args_file] = _read(cwd, parsed.args_file, "args file")
            parsed = parse(argv, files)
        if parsed.trl_config is not None:  # TRL's --config YAML: settings a flag overrides
            path = parsed.trl_config.values[0]
            if not read_files:
                raise RecipeError(f"the launch reads TRL settings from --config {path}, which attune cannot read "
                                  "here; pass them as flags instead")
            files[path] = _read(cwd, path, "TRL config file")
            parsed = parse(argv, files)
        if read_files and parsed.args_file is None and not parsed.module and parsed.launcher != "trl":
            default = default_args_path(parsed.script)  # read by HfArgumentParser before the command line
            if (cwd / default).is_file():
                files[default] = _read(cwd, default, "args file")
                parsed = parse(argv, files)
        if read_files:
            for path in _config_files(parsed):
                if (cwd / path).is_file():
                    files[path] = _read(cwd, path, "config file")
        config_names = ("config_file",) if parsed.launcher == "accelerate" else \
            trl.ACCELERATE_CONFIG_FLAGS if parsed.launcher == "trl" else ()
        opt = parsed.launcher_option(*config_names) if config_names else None
        if opt is not None and read_files and opt.values and (cwd / opt.values[0]).is_file():
            files[opt.values[0]] = _read(cwd, opt.values[0], "accelerate config file")
        version = options.get("framework_version") or installed_version("transformers")
        kept_env = recordable_env(env, _ENV_PREFIXES, _ENV_NAMES)
        from attune.recipe.model import NativeLaunch

        launch = NativeLaunch(argv=tuple(argv), env=kept_env, cwd=str(cwd), files=files, framework_version=version,
                              tokens_per_sample=options.get("tokens_per_sample") or _block_size(argv))
        s = settings.read_launch(launch)
        knobs = dict(s.knob_values)
        catalogue = cat.build()
        omp = env.get("OMP_NUM_THREADS", "")
        knobs[cat.OMP_ENV] = omp if omp in catalogue[cat.OMP_ENV].values else ""
        problems = [f"knobs.{k}: the launch has {format_value(v) if v is not None else 'null'}, outside the hf "
                    f"catalogue's domain ({', '.join(map(str, catalogue[k].values))}); change it in your command "
                    f"to one of those values before importing"
                    for k, v in knobs.items() if catalogue[k].check_value(v)]
        if problems:
            raise RecipeError(f"cannot import `{' '.join(argv)}`:", problems)
        nproc = s.nproc
        name = options.get("name") or f"{Path(str(cwd)).name or 'hf'}-{Path(parsed.script).stem}".strip("-")
        return {
            "name": name,
            "framework": "hf",
            "launch": {"argv": list(argv), "env": kept_env, "cwd": str(cwd), "files": files,
                       "framework_version": version, "tokens_per_sample": launch.tokens_per_sample},
            "resources": {"accelerator": options.get("accelerator") or "cpu",
                          "devices_per_node": options.get("devices_per_node") or nproc,
                          "nodes": s.nnodes},
            "knobs": knobs,
        }

    def import_container(self, container: Mapping[str, Any], *, job_spec: Mapping[str, Any] | None = None,
                         options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A Kubernetes training container (``command`` + ``args``, ``workingDir``, ``env``) → a recipe mapping.

        Files inside the image cannot be read, so the arguments must be flags. A PyTorchJob's
        ``nprocPerNode`` (``job_spec``) counts as the launch's process count where its torchrun sets none."""
        argv, env, cwd = container_launch(container, forms="the launch (python / torchrun / accelerate launch ...)")
        nproc = str((job_spec or {}).get("nprocPerNode", "")).strip()
        parsed = parse(argv)
        if nproc.isdigit() and parsed.launcher == "torchrun" and parsed.launcher_option("nproc_per_node") is None:
            env.setdefault("PET_NPROC_PER_NODE", nproc)  # what the training operator gives torchrun
        opts = {"read_files": False, **dict(options or {})}
        return self.import_launch(argv, cwd=cwd, env=env, options=opts)

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """``--set learning_rate=1e-3``: set a TrainingArguments flag of the launch (not a knob's) in place (a TRL
        launch: any flag of its command, ``packing`` too; in its ``--config`` file where only the file sets it)."""
        launch = recipe_data.get("launch")
        if not isinstance(launch, dict) or name in cat.build().knobs or name == cat.CHECKPOINTING_V5:
            return False  # knobs (and the flag the checkpointing knob controls) are set as knobs
        argv = [str(a) for a in launch.get("argv") or []]
        files = dict(launch.get("files") or {})
        try:
            parsed = parse(argv, files)
        except RecipeError:
            return False
        known = (trl.fields(parsed.trl) or frozenset()) if parsed.trl is not None else training_argument_fields()
        if name not in known and name not in parsed.settings():
            return False
        new = REMOVE if value is None else value
        if parsed.trl_config is not None:
            launch["argv"] = _edit_trl(parsed, files, {name: new})
            launch["files"] = files
        elif parsed.args_file is not None and parsed.args_file in files:
            files[parsed.args_file] = rewrite_args_file(parsed.args_file, files[parsed.args_file], {name: new})
            launch["files"] = files
        else:
            edit = Edit(argv)
            edit_options(edit, parsed.options, {name: new}, no_forms=parsed.no_forms)
            launch["argv"] = edit.result()
        return True

    # -- contract ----------------------------------------------------------------------------------------
    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """Contract settings (HF defaults where absent), the derived global batch, and every other native
        setting of the launch frozen verbatim."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return {}  # check() reports why
        out: dict[str, ContractField] = {}
        owner = f"TRL {s.trl}" if s.trl is not None else "HF"
        for name, (_, default) in s.contract_table.items():
            shown = "not fp16" if s.trl is not None and name == "bf16" else format_value(default)
            out[f"launch.args.{name}"] = ContractField(
                s.contract_value(name), "contract",
                fix=f"--{name} is the launch's own setting ({owner} default {shown} where it is not given); "
                    "attune never changes it")
        pd, nproc = int(recipe.knob(cat.PER_DEVICE)), int(recipe.knob(cat.NPROC))
        acc = derived_accumulation(s, pd, nproc)
        out["hf.global_batch_size"] = ContractField(
            pd * acc * nproc * s.nnodes, "derived",
            depends_on=(f"knobs.{cat.PER_DEVICE}", f"knobs.{cat.NPROC}", "launch.argv", "launch.files"),
            fix=f"The global batch (per-device × {cat.ACCUMULATION} × processes) must stay {s.global_batch}: "
                f"pick {cat.PER_DEVICE} and {cat.NPROC} whose product divides it "
                f"(the accumulation is derived), and keep the launch's own --{cat.PER_DEVICE} / "
                f"--{cat.ACCUMULATION}")
        frozen_fix = "attune only changes the knob-controlled flags of a launch"
        p = s.parsed
        out["launch.launcher"] = ContractField(p.launcher_tokens(), "frozen", fix=frozen_fix)
        out["launch.script"] = ContractField(f"-m {p.script}" if p.module else p.script, "frozen", fix=frozen_fix)
        frozen_names = sorted(k for k in s.native if k not in cat.KNOB_FLAGS and k not in s.contract_table)
        out["launch.options"] = ContractField(frozen_names, "frozen", fix="the launch's other flags (names) must "
                                              "stay as they are; " + frozen_fix)
        for k in frozen_names:
            out[f"launch.args.{k}"] = ContractField(s.native[k], "frozen", fix=frozen_fix)
        if p.args_file is not None:
            out["launch.args_file"] = ContractField(p.args_file, "frozen", fix=frozen_fix)
        out["launch.positionals"] = ContractField([t for _, t in p.positionals], "frozen", fix=frozen_fix)
        assert recipe.launch is not None
        out["launch.env"] = ContractField(dict(sorted(recipe.launch.env.items())), "frozen", fix=frozen_fix)
        out["launch.cwd"] = ContractField(recipe.launch.cwd, "frozen", fix=frozen_fix)
        out["launch.config_files"] = ContractField(
            {k: v for k, v in sorted(recipe.launch.files.items()) if k != p.args_file}, "frozen",
            fix="config files the launch names are carried verbatim")
        return out

    def compute_precision(self, recipe: Recipe) -> str:
        """bf16 or fp16 where the launch turns that mixed precision on (TRL's default: bf16 unless fp16), else
        fp32."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return "fp32"
        return next((name for name in ("bf16", "fp16") if s.contract_value(name) is True), "fp32")

    def random_stream_hazards(self, recipe: Recipe) -> list[str]:
        """Why another split of the global batch (per-device batch, processes) would train on another random stream,
        one readable line per cause: the model's dropout (its ``config.json`` beside the launch, or its type's
        defaults with ``--config_overrides``), NEFTune's noise, a TRL launch's LoRA dropout. Such a layout owes more
        than rounding drift; an empty list means attune read no such cause (a hub model's config is not read).
        See :mod:`attune.frameworks.hf.randomness`."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return []
        assert recipe.launch is not None
        return randomness.hazards(s.native, Path(recipe.launch.cwd or "."), trl=s.trl)

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        if recipe.launch is None or recipe.launch.tokens_per_sample is None:
            return None
        try:
            s = settings.read(recipe)
        except RecipeError:
            return None
        return s.global_batch * recipe.launch.tokens_per_sample

    def check(self, recipe: Recipe) -> list[str]:
        try:
            settings.read(recipe)
        except RecipeError as err:
            text = str(err)
            return [text if text.startswith("launch") else f"launch.argv: {text}"]
        return []

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        """What would fail a local trial before it starts: the launcher not on PATH, the script or working
        directory missing, half precision HF refuses on CPU."""
        problems = super().preflight(recipe, backend)
        if problems or recipe.launch is None:
            return problems
        import shutil

        try:
            s = settings.read(recipe)
        except RecipeError as err:
            return [f"launch.argv: {err}"]
        argv0 = recipe.launch.argv[0]
        if "/" in argv0 and not Path(argv0).exists():
            problems.append(f"launch.argv: {argv0} does not exist here")
        elif "/" not in argv0 and shutil.which(argv0) is None:
            problems.append(f"launch.argv: {argv0} is not on PATH here; activate the environment that has "
                            "transformers (and torch) before running attune")
        else:
            interpreter = _interpreter(argv0, s.parsed.launcher)
            for module in ("transformers", *(("trl",) if s.trl is not None else ())):
                if interpreter is not None and not _has_module(interpreter, module):
                    problems.append(f"launch.argv: {argv0} runs {interpreter}, which cannot import {module}; "
                                    "activate the training environment (or put its bin directory first on PATH) "
                                    "before running attune")
        cwd = Path(recipe.launch.cwd or ".")
        if not cwd.is_dir():
            problems.append(f"launch.cwd: {cwd} does not exist here (relative paths are read from the directory "
                            "attune runs in)")
        elif not s.parsed.module and s.parsed.launcher != "trl" and not (cwd / s.parsed.script).is_file():
            problems.append(f"launch.argv: the training script {s.parsed.script} does not exist in {cwd}")
        if recipe.resources.accelerator == "cpu":
            if s.contract_value("fp16") is True:
                problems.append("launch.args.fp16: HF Trainer refuses fp16 mixed precision on CPU; tune this launch "
                                "on a GPU recipe (resources.accelerator)")
            elif s.contract_value("bf16") is True and not s.use_cpu:
                problems.append("launch.args.bf16: on a machine without a GPU, HF Trainer runs bf16 only with "
                                "--use_cpu True (it raises 'Your setup doesn't support bf16/gpu')")
        return problems

    # -- render ------------------------------------------------------------------------------------------
    def render(self, recipe: Recipe) -> Launch:
        """The user's launch with only the knob-controlled tokens changed (an unchanged recipe: its argv)."""
        return render_launch(recipe)

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        """``render`` plus logging instrumentation; run in the launch's own directory, ended by attune after
        ``request.steps`` logged steps (the script's ``max_steps`` stays, it sets the LR schedule)."""
        s = settings.read(recipe)
        flags = {**TRIAL_FLAGS, **trial_token_flags(s, recipe), "output_dir": str(trial_dir / "hf-output")}
        flags.update(_side_effect_flags(s))
        env: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
        interpreter = _interpreter(s.parsed.argv[0], s.parsed.launcher)
        if interpreter is not None and _has_writer(interpreter):
            # full-precision losses for the loss check: the Trainer's own TensorBoard integration, to local files
            flags["report_to"] = "tensorboard"
            env[tb.TB_ENV] = str(trial_dir / tb.TB_DIR)
            if not _v5(recipe):
                flags["logging_dir"] = str(trial_dir / tb.TB_DIR)
        launch = render_launch(recipe, instrumentation=flags, trial_dir=trial_dir)
        notes = [f"--{k} {format_value(v)}" for k, v in flags.items()]
        env_notes = [f"{k}={v}" for k, v in {**launch.env, **env}.items()
                     if k in ("OMP_NUM_THREADS", "ACCELERATE_USE_CPU", tb.TB_ENV)
                     and (recipe.launch is None or k not in recipe.launch.env)]
        if flags["report_to"] == "none":
            notes.append("(losses as printed, to four significant digits: install tensorboardX in the training "
                         "environment for full-precision loss checks)")
        if s.parsed.args_file is not None:
            notes.append(f"(in a copy of {s.parsed.args_file} under the trial directory)")
        if s.parsed.trl_config is not None:
            notes.append(f"(TRL's --config {s.parsed.trl_config.values[0]}: a copy under the trial directory)")
        return TrialLaunch(Launch(argv=launch.argv, env={**launch.env, **env}, files=launch.files,
                                  cwd=launch.cwd),
                           stop_after_steps=request.steps, instrumentation=tuple(notes + env_notes))

    # -- logs --------------------------------------------------------------------------------------------
    def parser(self, recipe: Recipe) -> LogParser:
        return HFLogParser(**_parser_args(recipe))

    def collect(self, parser: LogParser, trial_dir: Path) -> Observation:
        """The printed step records, their losses replaced by the TensorBoard events' full-precision values where
        the trial wrote them and they agree with the printed ones (``reported["loss_precision"]`` says which)."""
        obs = super().collect(parser, trial_dir)
        obs.steps, precision = tb.merge_losses(obs.steps, tb.scalars(trial_dir / tb.TB_DIR))
        obs.reported[tb.PRECISION_KEY] = precision
        return obs

    #: what the Trainer reports that must stay the baseline's (HF's own count of what it trains), and the unit of the
    #: throughput (a trial that could not count non-padding tokens is never compared with one that did)
    reported_contract = ("total_train_batch_size", "total_optimization_steps", "trainable_parameters", UNIT_KEY)

    def report_problems(self, recipe: Recipe, reported: Mapping[str, Any]) -> list[str]:
        """The Trainer's own batch layout against what attune read from the launch: the batch per device, the
        accumulation and the global batch (a misread flag, an args file attune did not see, …)."""
        try:
            s = settings.read(recipe)
        except RecipeError:
            return []
        pd, nproc = int(recipe.knob(cat.PER_DEVICE)), int(recipe.knob(cat.NPROC))
        expected = {"per_device_train_batch_size": pd,
                    "gradient_accumulation_steps": derived_accumulation(s, pd, nproc),
                    "total_train_batch_size": s.global_batch}
        return reported_mismatches("HF", expected, reported, spaced=True)

    def pod_parser(self, recipe: Recipe) -> LogParser:
        return PodLogParser(**_parser_args(recipe))

    # -- Kubernetes --------------------------------------------------------------------------------------
    def patch_job(self, recipe: Recipe, job: dict[str, Any], container: dict[str, Any], *, steps: int,
                  metrics_port: int, linger_s: float) -> None:
        """The user's container with the change applied to its ``args`` (its image and command kept where the
        launch still starts with it), logging instrumentation added, and ``nprocPerNode`` for a PyTorchJob.
        Trials are measured from the pod log; the operator ends them after ``steps`` steps."""
        s = settings.read(recipe)
        if s.parsed.args_file is not None:
            raise RecipeError(f"the launch reads its arguments from {s.parsed.args_file} inside the image, which a "
                              "Kubernetes trial cannot change; pass the arguments as flags")
        flags = {**TRIAL_FLAGS, **_side_effect_flags(s)}  # flags only: no non_padding count (trial_token_flags)
        launch = render_launch(recipe, instrumentation=flags, k8s=True)
        argv = list(launch.argv)
        set_container_argv(container, argv)
        if job.get("kind") in (None, "PyTorchJob"):
            job.setdefault("spec", {})["nprocPerNode"] = str(int(recipe.knob(cat.NPROC)))
        values = {k: v for k, v in launch.env.items()
                  if recipe.launch is None or recipe.launch.env.get(k) != v}
        values["PYTHONUNBUFFERED"] = "1"
        env = [e for e in container.get("env") or [] if e.get("name") not in values]
        env += [{"name": k, "value": v} for k, v in sorted(values.items())]
        container["env"] = env


# ---------------------------------------------------------------------------------------------- helpers

def _read(cwd: Path, path: str, what: str) -> str:
    full = Path(path) if Path(path).is_absolute() else Path(cwd) / path
    try:
        return full.read_text()
    except OSError as err:
        raise RecipeError(f"cannot read the {what} {path} (in {cwd}): {err.strerror}") from None


def _interpreter(argv0: str, launcher: str) -> str | None:
    """The Python interpreter a launch's first token runs (torchrun / accelerate: their script's ``#!`` line)."""
    import shutil

    path = argv0 if "/" in argv0 else shutil.which(argv0)
    if path is None:
        return None
    if launcher == "python" or PurePosixPath(argv0).name.startswith("python"):
        return path
    try:
        with open(path, "rb") as f:
            first = f.readline(512).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    parts = first[2:].split()
    if parts and PurePosixPath(parts[0]).name == "env" and len(parts) > 1:
        return shutil.which(parts[1])
    return parts[0] if parts else None


def _has_module(interpreter: str, module: str) -> bool:
    """Whether ``interpreter`` finds ``module`` (without importing it); true when that cannot be told."""
    return _finds(interpreter, (module,), unknown=True)


def _has_writer(interpreter: str) -> bool:
    """Whether ``interpreter`` has a TensorBoard writer the Trainer's integration uses (told, not guessed: false
    when that cannot be told, so the trial keeps ``report_to none``)."""
    return _finds(interpreter, tb.WRITERS, unknown=False)


@functools.lru_cache(maxsize=32)
def _finds(interpreter: str, modules: tuple[str, ...], *, unknown: bool) -> bool:
    """Whether ``interpreter`` finds any of ``modules`` (``find_spec``, nothing imported); ``unknown`` when the
    interpreter cannot be asked."""
    import subprocess

    code = f"import importlib.util, sys; sys.exit(0 if any(importlib.util.find_spec(m) for m in {modules!r}) else 3)"
    try:
        done = subprocess.run([interpreter, "-c", code], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return unknown
    return done.returncode != 3 if unknown else done.returncode == 0


def _v5(recipe: Recipe) -> bool:
    return _version_at_least(recipe, (5,))


def _version_at_least(recipe: Recipe, release: tuple[int, ...]) -> bool:
    """Whether the launch's transformers is ``release`` or later (an unknown or unreadable version: the newest)."""
    version = (recipe.launch.framework_version if recipe.launch else None) or ""
    parts: list[int] = []
    for part in version.split(".")[:len(release)]:
        if not part.isdigit():
            return not parts or tuple(parts) >= release[:len(parts)]
        parts.append(int(part))
    return not parts or tuple(parts) >= release


def trial_token_flags(s: Settings, recipe: Recipe) -> dict[str, Any]:
    """A trial's request for the Trainer's count of non-padding tokens: only an args-file launch can make it
    (transformers 5.24 parses ``--include_num_input_tokens_seen`` on the command line as a bool, and a TRL
    ``--config`` value goes through the same type), and only from transformers 4.57 (older releases take a bool,
    whose ``True`` counts padding). Otherwise none: a step's work is then TRL's own count or the fixed global batch
    (:func:`count_key`)."""
    if s.parsed.args_file is not None and _version_at_least(recipe, NON_PADDING_SINCE):
        return dict(TOKEN_FLAGS)
    return {}


def count_key(s: Settings, recipe: Recipe) -> str | None:
    """The log key of a cumulative non-padding token count that a (local) trial of ``recipe`` prints, if any."""
    if trial_token_flags(s, recipe):
        return "num_input_tokens_seen"
    return TRL_TOKEN_KEY if s.trl == "sft" else None


def _config_files(parsed: ParsedLaunch) -> list[str]:
    native = parsed.settings()
    out = []
    for name in _FILE_FLAGS:
        value = native.get(name)
        if isinstance(value, str) and value and not value.lstrip().startswith("{"):
            out.append(value)
    return out


def _side_effect_flags(s: Settings) -> dict[str, Any]:
    """Flags a trial sets off because of what the user's launch does at its end or start (never learning)."""
    flags: dict[str, Any] = {}
    native = s.native
    for name in ("push_to_hub", "load_best_model_at_end"):
        if name in native:
            try:
                on = settings.to_bool(name, native[name])
            except RecipeError:
                on = True
            if on:
                flags[name] = False  # no hub repository for a trial; no best-model bookkeeping without saves
    return flags


def _parser_args(recipe: Recipe) -> dict[str, Any]:
    try:
        s = settings.read(recipe)
        gbs, key = s.global_batch, count_key(s, recipe)
    except RecipeError:
        gbs, key = 1, None
    return {"global_batch": gbs, "tokens_per_sample": recipe.launch.tokens_per_sample if recipe.launch else None,
            "count_key": key}


def render_launch(recipe: Recipe, *, instrumentation: Mapping[str, Any] | None = None,
                  trial_dir: Path | None = None, k8s: bool = False) -> Launch:
    """The recipe's launch with its knobs applied (and ``instrumentation`` flags set).

    Knob flags the launch has keep their position and spelling; ones it lacks are appended; a knob at its
    HF default (``null``) removes its flag. The process count edits the launcher: torchrun's
    ``--nproc_per_node``, accelerate's ``--num_processes``; a python launch with more than one process becomes
    ``python -m torch.distributed.run --standalone --nproc_per_node N``. With ``trial_dir`` the args file (and
    any config file) is written there and the argument list points at the copy, so a trial never overwrites the
    user's own files."""
    s = settings.read(recipe)
    assert recipe.launch is not None
    p = s.parsed
    knobs = recipe.effective_knobs
    own = s.knob_values
    changes: dict[str, Any] = {}
    aliases: dict[str, tuple[str, ...]] = {}
    for knob in cat.FLAG_KNOBS:
        new = knobs[knob]
        if same_value(new, own[knob]):
            continue
        if knob == cat.CHECKPOINTING:
            if p.has(cat.CHECKPOINTING_V5):
                flag = cat.CHECKPOINTING_V5
                aliases[flag] = (cat.CHECKPOINTING,)
            elif p.has(cat.CHECKPOINTING):
                flag = cat.CHECKPOINTING
            else:
                flag = settings.checkpointing_flag(recipe.launch.framework_version)
            changes[flag] = new
        else:
            changes[knob] = REMOVE if new is None else new
    pd, nproc = int(cast(int, knobs[cat.PER_DEVICE])), int(cast(int, knobs[cat.NPROC]))
    if pd != s.per_device or nproc != s.nproc:
        if s.global_batch % (pd * nproc * s.nnodes):
            raise RecipeError(f"{cat.PER_DEVICE} {pd} × {nproc} processes × {s.nnodes} nodes does not divide the "
                              f"launch's global batch {s.global_batch}")
        acc = derived_accumulation(s, pd, nproc)
        if acc != s.accumulation:
            changes[cat.ACCUMULATION] = acc
    flags = {**changes, **dict(instrumentation or {})}

    files = dict(recipe.launch.files)
    edit = Edit(list(p.argv))
    if p.args_file is not None:
        files[p.args_file] = rewrite_args_file(p.args_file, files[p.args_file], flags)
    elif p.trl_config is not None:
        edit = Edit(_edit_trl(p, files, flags, aliases=aliases))
        p = parse(edit.argv, files)  # token positions of the edited command (the launcher edit below uses them)
        s = replace(s, parsed=p)
    else:
        edit_options(edit, p.options, flags, aliases=aliases, no_forms=p.no_forms)

    env = dict(recipe.launch.env)
    if knobs[cat.OMP_ENV]:
        env["OMP_NUM_THREADS"] = str(knobs[cat.OMP_ENV])
    cpu = recipe.resources.accelerator == "cpu"
    _edit_launcher(edit, s, nproc, cpu=cpu, env=env, standalone=not k8s)
    if cpu and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, recipe.resources.devices_per_node // nproc))
    if cpu and nproc * s.nnodes > 1 and not s.use_cpu and "ACCELERATE_USE_CPU" not in env:
        # without use_cpu, accelerate on a machine with no GPU starts every process as its own 1-process run
        env["ACCELERATE_USE_CPU"] = "true"
    argv = edit.result()

    if trial_dir is not None and files:
        copies = {name: str(trial_dir / "hf-files" / Path(name).name) for name in files}
        if p.args_file is not None:
            copies[p.args_file] = str(trial_dir / "hf-args" / Path(p.args_file).name)
            files[p.args_file] = _repoint_file(p.args_file, files[p.args_file], copies)
        argv = [repoint(tok, copies) for tok in argv]
        files = {copies[name]: text for name, text in files.items()}
    return Launch(argv=tuple(argv), env=env, files=files, cwd=recipe.launch.cwd)


def _edit_trl(p: ParsedLaunch, files: dict[str, str], changes: Mapping[str, Any], *,
              aliases: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """A TRL launch with a ``--config`` file, ``changes`` applied: a setting only the config file gives is changed
    in (``files``') copy of that file, keeping its text; any other on the command line, which overrides the file
    (``TrlParser.parse_args_and_config``). Returns the new argument list; ``files`` is updated in place."""
    assert p.trl_config is not None
    path = p.trl_config.values[0]
    in_file = p.trl_config_settings or {}
    on_cli = {o.name for o in p.options} | {o.name[3:] for o in p.options if o.name.startswith("no_")}
    aliases = aliases or {}
    to_file: dict[str, Any] = {}
    to_cli: dict[str, Any] = {}
    for name, value in changes.items():
        names = (name, *aliases.get(name, ()))
        if path in files and not any(n in on_cli for n in names) and any(n in in_file for n in names):
            to_file.update({n: value for n in names if n in in_file})
        else:
            to_cli[name] = value
    if to_file:
        files[path] = rewrite_args_file(path, files[path], to_file)
        load_args_file(path, files[path])
    edit = Edit(list(p.argv))
    edit_options(edit, p.options, to_cli, aliases=aliases, no_forms=p.no_forms)
    return edit.result()


def _edit_launcher(edit: Edit, s: Settings, nproc: int, *, cpu: bool, env: dict[str, str], standalone: bool) -> None:
    p = s.parsed
    if nproc == s.nproc:
        return
    if p.launcher == "trl":
        _edit_trl_processes(edit, p, nproc, cpu=cpu, env=env)
        return
    if p.launcher == "python":
        extra = ["-m", "torch.distributed.run"] + (["--standalone"] if standalone and s.nnodes == 1 else [])
        edit.insert.setdefault(p.script_index, []).extend([*extra, "--nproc_per_node", str(nproc)])
        return
    name = "nproc_per_node" if p.launcher == "torchrun" else "num_processes"
    opt = p.launcher_option(name)
    # a launcher's own ``-m`` switch sits right before the module name: insert before the switch
    switch = next((o for o in p.launcher_options if o.name in ("m", "module")), None)
    at = switch.start if switch is not None else p.script_index
    if opt is not None:
        tokens = [f"{opt.spelling}={nproc}"] if opt.inline else [opt.spelling, str(nproc)]
        edit.replace[opt.start] = (opt.end, tokens)
    else:
        edit.insert.setdefault(at, []).extend([f"--{name}", str(nproc)])
    if p.launcher == "accelerate" and cpu and nproc > 1:
        # accelerate starts several CPU processes only through its torchrun-based multi-GPU launcher
        if not any(p.launcher_switch(x) for x in ("multi_gpu", "use_deepspeed", "use_fsdp", "use_megatron_lm")):
            edit.insert.setdefault(at, []).insert(0, "--multi_gpu")
        cpu_switch = next((o for o in p.launcher_options if o.name == "cpu"), None)
        if cpu_switch is not None:
            edit.replace[cpu_switch.start] = (cpu_switch.end, [])
        env.setdefault("ACCELERATE_USE_CPU", "true")


def _edit_trl_processes(edit: Edit, p: ParsedLaunch, nproc: int, *, cpu: bool, env: dict[str, str]) -> None:
    """``trl COMMAND``'s process count: its ``--num_processes`` flag, which TRL hands to ``accelerate launch``
    (edited in place, else appended: a command-line option comes after the config file's in what accelerate parses,
    so it wins). On CPU, several processes need accelerate's multi-process launcher, as for ``accelerate launch``."""
    opt = p.launcher_option("num_processes")
    if opt is not None:
        edit.replace[opt.start] = (opt.end, [f"{opt.spelling}={nproc}"] if opt.inline else [opt.spelling, str(nproc)])
    else:
        edit.append.extend(["--num_processes", str(nproc)])
    if cpu and nproc > 1:
        distributed = ("multi_gpu", "use_deepspeed", "use_fsdp", "use_megatron_lm")
        if not any(p.launcher_switch(x) or (p.trl_config_launcher or {}).get(x) for x in distributed):
            edit.append.append("--multi_gpu")
        cpu_switch = next((o for o in p.launcher_options if o.name == "cpu"), None)
        if cpu_switch is not None:
            edit.replace[cpu_switch.start] = (cpu_switch.end, [])
        env.setdefault("ACCELERATE_USE_CPU", "true")


def _repoint_file(path: str, text: str, copies: Mapping[str, str]) -> str:
    from attune.frameworks.hf.launch import load_args_file

    data = load_args_file(path, text)
    changes = {k: copies[v] for k, v in data.items() if isinstance(v, str) and v in copies and v != path}
    return rewrite_args_file(path, text, changes) if changes else text


FRAMEWORK = frameworks.register(HFFramework())

__all__ = ["ACCEPTED", "FRAMEWORK", "RULES", "TOKEN_FLAGS", "TRIAL_FLAGS", "TRL_TOKEN_KEY", "HFFramework", "count_key",
           "derived_accumulation", "render_launch", "trial_token_flags"]


def _block_size(argv: Sequence[str]) -> int | None:
    """The sample length a script's ``--block_size N`` states, where the command line gives one: run_clm.py (and the
    scripts made from it) cut the concatenated text into chunks of exactly that many tokens, so a step's tokens are
    its samples × N. None where the command line says nothing (the trials then count samples, and say so)."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--block_size=") else \
            argv[i + 1] if arg == "--block_size" and i + 1 < len(argv) else None
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return None
