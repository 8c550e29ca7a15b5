"""axolotl training launches (``framework: axolotl``), on the framework seam.

The recipe carries the user's launch and the text of its YAML config (:mod:`attune.frameworks.hfyaml` has what this
shares with LLaMA-Factory). Accepted forms, as axolotl 0.19.0 reads them (``axolotl/cli/main.py``,
``axolotl/cli/utils/train.py``, ``axolotl/cli/train.py``, ``axolotl/cli/config.py``)::

    axolotl train cfg.yml [--key=value | --key value | --flag | --no-flag ...] [--launcher accelerate|torchrun|python]
                          [-- LAUNCHER ARGS]
    accelerate launch [options] -m axolotl.cli.train cfg.yml [--key=value ...]
    torchrun [options] -m axolotl.cli.train cfg.yml [--key=value ...]
    python -m axolotl.cli.train cfg.yml [--key=value ...]

- ``axolotl train`` is a click command: each config key is an option spelled with dashes (``--micro-batch-size``),
  booleans as ``--flag/--no-flag``; unknown options and everything after ``--`` go to the launcher
  (``accelerate launch`` by default: ``-- --num_processes 2``), which runs ``-m axolotl.cli.train cfg --key=value``;
  the module form reads the same overrides through ``fire`` (dashes or underscores);
- ``load_cfg`` sets each override over the YAML (``yaml.safe_load``), cast to the type of the value the YAML has
  (``_coerce_value``), and ignores an override of a key the YAML lacks when the YAML says ``strict: true``;
- the global batch is ``micro_batch_size`` × ``gradient_accumulation_steps`` × processes; a config may give
  ``batch_size`` (per process) instead of the accumulation, which is then ``batch_size // micro_batch_size``
  (``normalize_config``; the schema refuses both). The batch knobs keep whichever form the config uses;
- accelerate's default process count (no ``--num_processes``, no accelerate config file) is one per visible GPU;
  on CPU one. A default accelerate config file (``accelerate config``) is not read: give the count explicitly.

Knobs: ``micro_batch_size`` (the accumulation derived), the process count, ``gradient_checkpointing``,
``dataloader_num_workers`` and ``torch_compile``. The attention implementation stays frozen: with ``sample_packing``
it decides how packed sequences are kept apart. Contract: ``sequence_len``, ``sample_packing``, ``learning_rate``,
the model, adapter, datasets, template, schedule, optimizer, precision and seed, with axolotl's defaults (its
pydantic schema, ``axolotl/utils/schemas/``) where absent; every other key is frozen verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, ClassVar

from attune import frameworks
from attune.errors import RecipeError
from attune.frameworks.base import Signature
from attune.frameworks.cmdline import ACCELERATE_SWITCHES, REMOVE, TORCHRUN_SWITCHES, Edit, split_launch
from attune.frameworks.common import (
    GLOBAL_BATCH_HINT,
    compile_rules,
    loader_worker_rules,
    micro_batch_rules,
    process_rules,
    processes_fit_problem,
    recompute_rules,
)
from attune.frameworks.hfyaml import (
    ConfigLaunch,
    Override,
    Settings,
    YamlTrainerFramework,
    head_process_count,
    head_process_edit,
)
from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics
from attune.trial import FailureKind

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

NAME = "axolotl"
VERSIONS = ">=0.12,<0.20"
MICRO = "micro_batch_size"
NPROC = "nproc_per_node"
CHECKPOINTING = "gradient_checkpointing"
WORKERS = "dataloader_num_workers"
COMPILE = "torch_compile"
MODULE = "axolotl.cli.train"
#: ``axolotl train``'s own options (not config keys): they choose the launcher
CLI_OPTIONS = ("launcher", "cloud", "sweep")

ACCEPTED = (
    "axolotl train CONFIG.yml [--key=value ...] [--launcher accelerate|torchrun|python] [-- LAUNCHER ARGS]",
    "accelerate launch [options] -m axolotl.cli.train CONFIG.yml [--key=value ...]",
    "torchrun [options] -m axolotl.cli.train CONFIG.yml [--key=value ...]",
    "python -m axolotl.cli.train CONFIG.yml [--key=value ...]",
)

#: contract keys with axolotl 0.19.0's schema defaults (``utils/schemas/{config,training,peft,model}.py``)
CONTRACT: dict[str, Any] = {
    # model and adapter
    "base_model": None, "base_model_config": None, "revision_of_model": None, "adapter": None, "lora_model_dir": None,
    "lora_r": None, "lora_alpha": None, "lora_dropout": 0.0, "lora_target_modules": None, "lora_target_linear": None,
    "lora_modules_to_save": None, "peft_use_dora": None, "peft_use_rslora": None, "load_in_8bit": False,
    "load_in_4bit": False, "rl": None, "reward_model": None, "trl": None,
    # data
    "datasets": None, "test_datasets": None, "chat_template": None, "chat_template_jinja": None,
    "sequence_len": 512, "sample_packing": False, "pad_to_sequence_len": None, "train_on_inputs": False,
    "val_set_size": 0.0, "shuffle_merged_datasets": True, "curriculum_sampling": None, "special_tokens": None,
    "tokens": None, "group_by_length": None, "excess_length_strategy": None, "min_sample_len": None,
    # optimisation
    "learning_rate": None, "lr_scheduler": "cosine", "lr_scheduler_kwargs": None, "cosine_min_lr_ratio": None,
    "warmup_steps": None, "warmup_ratio": None, "num_epochs": 1.0, "max_steps": None, "optimizer": "adamw_torch_fused",
    "optim_args": None, "weight_decay": 0.0, "max_grad_norm": None, "adam_beta1": None, "adam_beta2": None,
    "adam_epsilon": None, "loraplus_lr_ratio": None, "embedding_lr": None, "neftune_noise_alpha": None,
    # precision and randomness
    "bf16": "auto", "fp16": None, "bfloat16": None, "float16": None, "tf32": "auto", "fp8": None, "seed": None,
}
#: the trial's logging instrumentation (no saves, a log line per step with token counts)
TRIAL_KEYS: dict[str, Any] = {"logging_steps": 1, "save_strategy": "no", "include_tokens_per_second": True}
#: keys that make axolotl save or report during a run: a trial drops them (``setup_wandb_env_vars`` and its mlflow /
#: comet siblings turn a tracker on whenever its project key is set) and turns the ``use_*`` switches off
_SIDE_EFFECT_KEYS = ("save_steps", "saves_per_epoch", "save_first_step", "hub_model_id", "wandb_project",
                     "mlflow_tracking_uri", "mlflow_experiment_name", "comet_project_name", "comet_api_key")
_TRACKER_SWITCHES = ("use_wandb", "use_mlflow", "use_tensorboard", "use_comet", "use_trackio")

D, P = Semantics.NUMERICS_DRIFT, Semantics.PRESERVING
KNOBS = [
    Knob(name=MICRO, type="int", values=(1, 2, 4, 8, 16, 32, 64), default=1, semantics=D, group="batch_split",
         description="micro_batch_size: samples (packed sequences with sample_packing) per forward/backward on each "
                     "process. gradient_accumulation_steps (or batch_size, where the config uses it) is derived so "
                     "the global batch stays. Larger means bigger GEMMs, more activation memory."),
    Knob(name=NPROC, type="int", values=(1, 2, 4, 8), default=1, semantics=D, group="batch_split",
         description="data-parallel processes per node: accelerate --num_processes (axolotl train passes launcher "
                     "arguments after --), torchrun --nproc_per_node. Each process takes a slice of the global batch."),
    Knob(name=CHECKPOINTING, type="choice", values=(False, True, "offload", "offload_disk"), default=False,
         semantics=P, description="gradient_checkpointing: recompute activations in backward (true), also offloading "
                                  "them to host memory or disk (offload, offload_disk). Saves memory, costs compute; "
                                  "same math."),
    Knob(name=WORKERS, type="int", values=(0, 1, 2, 4), default=0, semantics=D,
         description="dataloader_num_workers: background data-loader processes per training process (HF default "
                     "0). Owes the loss check, as for HF."),
    Knob(name=COMPILE, type="choice", values=(False, True, "auto"), default=False, semantics=D,
         description="torch_compile: compile the model with torch.compile (auto: when torch supports it). Fuses "
                     "kernels; the first step pays the compilation."),
]


def _settings(r: Recipe) -> Settings | None:
    return FRAMEWORK.settings_or_none(r)


def _batch_divisible(r: Recipe) -> str | None:
    return FRAMEWORK.batch_divisible_problem(r)


def _procs_fit(r: Recipe) -> str | None:
    n = int(r.knob(NPROC))
    problem = processes_fit_problem(r, NPROC)
    if problem:
        return problem
    s = _settings(r)
    if s is not None and n != s.nproc and s.launch.launcher == "python":
        return (f"{NPROC}: the launch runs axolotl in one python process (--launcher python or python -m "
                f"{MODULE}); launch it with accelerate or torchrun to tune the process count")
    return None


CONSTRAINTS = [
    Constraint("global_batch_divisible", (MICRO, NPROC), _batch_divisible,
               "global batch = micro batch × accumulation × processes, accumulation derived"),
    Constraint("processes_fit_devices", (NPROC,), _procs_fit, "one process per device slot, a multi-process launcher"),
]

RULES = {
    **micro_batch_rules(MICRO),
    **process_rules(NPROC),
    **recompute_rules(CHECKPOINTING),
    **loader_worker_rules(WORKERS),
    **compile_rules(COMPILE),
}

#: axolotl's own failure message (``LossWatchDogCallback``, ``utils/callbacks/__init__.py``)
SIGNATURES = (Signature(r"Loss is too high, stopping training", FailureKind.DIVERGED,
                        "axolotl's loss watchdog stopped training (loss_watchdog_threshold)"),)


def coerce(value: str, existing: Any) -> Any:
    """An override's text as axolotl 0.19's ``_coerce_value`` (``cli/config.py``) makes it: cast to the type of the
    YAML's value where it has one, else YAML-style inference (true/yes, false/no, null/none/~, int, float)."""
    if existing is not None:
        if isinstance(existing, bool):
            return value.lower() in ("true", "1", "yes")
        for kind in (int, float):
            if isinstance(existing, kind):
                try:
                    return kind(value)
                except ValueError:
                    return value
        return value
    lower = value.lower()
    if lower in ("true", "yes"):
        return True
    if lower in ("false", "no"):
        return False
    if lower in ("null", "none", "~"):
        return None
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


class AxolotlFramework(YamlTrainerFramework):
    name = NAME
    title = "axolotl (axolotl train CONFIG.yml, or accelerate / torchrun / python -m axolotl.cli.train CONFIG.yml)"
    versions = VERSIONS
    distribution = "axolotl"
    rules = RULES
    tool = "axolotl"
    per_device_key = MICRO
    per_device_default = 1
    nproc_knob = NPROC
    key_knobs: ClassVar[dict[str, Any]] = {CHECKPOINTING: False, WORKERS: 0, COMPILE: False}
    contract_keys = CONTRACT
    trial_keys = TRIAL_KEYS
    accepted = ACCEPTED
    log_signatures = SIGNATURES
    field_hints: ClassVar[dict[str, str]] = {f"{NAME}.global_batch_size": GLOBAL_BATCH_HINT.format(knob=MICRO)}

    def build_catalogue(self) -> Catalogue:
        return Catalogue(framework=NAME, knobs={k.name: k for k in KNOBS}, constraints=list(CONSTRAINTS),
                         versions=VERSIONS)

    # -- the command line ------------------------------------------------------------------------------------
    def parse(self, argv: Sequence[str], data: Mapping[str, Any] | None = None) -> ConfigLaunch:
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise RecipeError("the launch command is empty; accepted forms:", list(ACCEPTED))
        data = data or {}
        if PurePosixPath(argv[0]).name == "axolotl":
            return self._parse_cli(argv, data)
        head = split_launch(argv, {"torchrun": TORCHRUN_SWITCHES, "accelerate": ACCELERATE_SWITCHES},
                            unknown="an axolotl launch runs `axolotl train` or -m axolotl.cli.train under python / "
                                    "torchrun / accelerate launch", accepted=ACCEPTED)
        if not head.module or head.script != MODULE:
            raise RecipeError(f"`{' '.join(argv)}` does not run -m {MODULE}; accepted forms:", list(ACCEPTED))
        config_at = head.args_start
        if len(argv) <= config_at or argv[config_at].startswith("-"):
            raise RecipeError(f"-m {MODULE} takes the config file first; accepted forms:", list(ACCEPTED))
        overrides, rest = self._options(argv, config_at + 1, data, dashed=False)
        if rest:
            raise RecipeError(f"-m {MODULE} reads --key=value overrides after the config; {argv[rest[0]]!r} is none")
        nproc, nnodes = head_process_count(head)
        skip = {i for o in head.options if o.name in ("nproc_per_node", "num_processes") for i in range(o.start, o.end)}
        tokens = tuple(t for i, t in enumerate(argv[:config_at]) if i not in skip)
        return ConfigLaunch(argv=argv, launcher=head.launcher, launcher_tokens=tokens, config_index=config_at,
                            overrides=tuple(overrides), nproc=nproc, nnodes=nnodes)

    def _parse_cli(self, argv: tuple[str, ...], data: Mapping[str, Any]) -> ConfigLaunch:
        """``axolotl train CONFIG [options] [-- launcher args]``: click's command line."""
        if len(argv) < 3 or argv[1] != "train":
            raise RecipeError(f"`{' '.join(argv)}` does not run `axolotl train`; accepted forms:", list(ACCEPTED))
        config_at = next((i for i in range(2, len(argv)) if not argv[i].startswith("-")
                          and argv[i].lower().endswith((".yml", ".yaml")) and not _value_of_option(argv, i)), None)
        if config_at is None:
            raise RecipeError("`axolotl train` names its YAML config (a .yml/.yaml file); none found; accepted "
                              "forms:", list(ACCEPTED))
        overrides: list[Override] = []
        launcher_tokens = list(argv[:2])
        launcher = "accelerate"
        launcher_args: list[tuple[int, str]] = []
        i = 2
        while i < len(argv):
            tok = argv[i]
            if i == config_at:
                i += 1
                continue
            if tok == "--":
                launcher_args.extend((j, argv[j]) for j in range(i, len(argv)))
                break
            name = tok[2:].partition("=")[0].replace("-", "_") if tok.startswith("--") else ""
            if name in CLI_OPTIONS:
                end = i + 1 if "=" in tok else i + 2
                value = tok.partition("=")[2] if "=" in tok else (argv[i + 1] if i + 1 < len(argv) else "")
                if name in ("cloud", "sweep"):
                    raise RecipeError(f"`axolotl train --{name}` runs elsewhere or several configs; attune tunes one "
                                      "local training run: drop the option")
                launcher = value
                launcher_tokens.extend(argv[i:end])
                i = end
                continue
            found, _ = self._options(argv, i, data, dashed=True, stop_at=config_at, one=True)
            if found:
                overrides.extend(found)
                i = found[-1].end
                continue
            launcher_args.append((i, tok))  # click hands extra arguments to the launcher
            i += 1
        if launcher not in ("accelerate", "torchrun", "python"):
            raise RecipeError(f"axolotl train --launcher {launcher}: axolotl knows accelerate, torchrun and python")
        nproc, nnodes = self._launcher_args_count(launcher, launcher_args)
        kept = [t for j, t in launcher_args if not self._is_count(launcher, launcher_args, j)]
        return ConfigLaunch(argv=argv, launcher="python" if launcher == "python" else f"axolotl-{launcher}",
                            launcher_tokens=(*launcher_tokens, *kept), config_index=config_at,
                            overrides=tuple(overrides), nproc=nproc, nnodes=nnodes)

    @staticmethod
    def _count_names(launcher: str) -> tuple[str, str]:
        return ("nproc_per_node", "nnodes") if launcher == "torchrun" else ("num_processes", "num_machines")

    def _is_count(self, launcher: str, args: list[tuple[int, str]], j: int) -> bool:
        name = self._count_names(launcher)[0]
        toks = dict(args)
        tok = toks[j]
        if tok.startswith("--") and tok[2:].partition("=")[0].replace("-", "_") == name:
            return True
        prev = toks.get(j - 1, "")
        return prev.startswith("--") and "=" not in prev and prev[2:].replace("-", "_") == name

    def _launcher_args_count(self, launcher: str, args: list[tuple[int, str]]) -> tuple[int | None, int]:
        names = self._count_names(launcher)
        found: dict[str, str] = {}
        toks = [t for _, t in args]
        for k, tok in enumerate(toks):
            if not tok.startswith("--"):
                continue
            key, eq, value = tok[2:].partition("=")
            key = key.replace("-", "_")
            if key in names:
                found[key] = value if eq else (toks[k + 1] if k + 1 < len(toks) else "")
        out: list[int | None] = []
        for key in names:
            text = found.get(key)
            if text is not None and (not text.isdigit() or int(text) < 1):
                raise RecipeError(f"--{key} {text}: attune needs a number of processes or nodes; write e.g. --{key} 2")
            out.append(int(text) if text is not None else None)
        nproc, nnodes = out[0], out[1] or 1
        if launcher == "accelerate" and nproc is not None:
            nproc = max(1, nproc // nnodes)  # accelerate's --num_processes counts every machine's processes
        return nproc, nnodes

    def _options(self, argv: Sequence[str], start: int, data: Mapping[str, Any], *, dashed: bool,
                 stop_at: int | None = None, one: bool = False) -> tuple[list[Override], list[int]]:
        """``--key=value`` / ``--key value`` / ``--flag`` / (click) ``--no-flag`` overrides from ``start``; returns
        them and the indexes of tokens that are none."""
        out: list[Override] = []
        rest: list[int] = []
        i = start
        while i < len(argv):
            tok = argv[i]
            if i == stop_at or tok == "--":
                break
            if not tok.startswith("--") or len(tok) == 2:
                rest.append(i)
                i += 1
                if one:
                    break
                continue
            spelling, eq, text = tok.partition("=")
            key = spelling[2:].replace("-", "_")
            if eq:
                end, raw, style = i + 1, text, "inline"
            elif i + 1 < len(argv) and i + 1 != stop_at and not argv[i + 1].startswith("--"):
                end, raw, style = i + 2, argv[i + 1], "separate"
            else:
                end, raw, style = i + 1, None, "switch"
            if raw is None and dashed and key.startswith("no_") and key[3:] in data:
                key, value = key[3:], False
            elif raw is None:
                value = True
            else:
                value = coerce(raw, data.get(key))
            out.append(Override(key=key, start=i, end=end, value=value, write=_writer(spelling, key, style)))
            i = end
            if one:
                break
        return out, rest

    def apply_overrides(self, data: Mapping[str, Any], launch: ConfigLaunch) -> dict[str, Any]:
        """``load_cfg``: an override sets its key unless the YAML says ``strict: true`` and lacks the key;
        ``parent__child`` sets a nested key."""
        out = dict(data)
        strict = data.get("strict") is True
        for o in launch.overrides:
            parent, nested, child = o.key.partition("__")
            if strict and parent not in data:
                continue
            if nested:
                sub = dict(out[parent]) if isinstance(out.get(parent), dict) else {}
                sub[child] = o.value
                out[parent] = sub
            else:
                out[o.key] = o.value
        return out

    def accumulation(self, effective: Mapping[str, Any], per_device: int) -> int:
        """``gradient_accumulation_steps``, or ``batch_size // micro_batch_size`` where the config gives the batch
        per process instead (``normalize_config``)."""
        if effective.get("gradient_accumulation_steps") is None and effective.get("batch_size") is not None:
            batch = self._int(effective, "batch_size", per_device)
            if batch % per_device:
                raise RecipeError(f"batch_size {batch} is not a multiple of {MICRO} {per_device}: axolotl would "
                                  "round the accumulation down; make it one")
            return max(1, batch // per_device)
        return self._int(effective, "gradient_accumulation_steps", 1)

    def batch_keys(self) -> tuple[str, ...]:
        return ("batch_size",)

    def batch_changes(self, s: Settings, per_device: int, nproc: int) -> dict[str, Any]:
        """The config's own form: ``gradient_accumulation_steps`` re-derived, or (a config with ``batch_size``) the
        batch per process, which stays unless the process count changes."""
        if s.effective.get("gradient_accumulation_steps") is None and s.effective.get("batch_size") is not None:
            per_process = s.global_batch // (nproc * s.nnodes)
            return {"batch_size": per_process} if per_process != s.per_device * s.accumulation else {}
        return super().batch_changes(s, per_device, nproc)

    def process_count(self, launch: ConfigLaunch, env: Mapping[str, str], *, accelerator: str,
                      devices_per_node: int | None) -> int:
        """The launcher's own count; accelerate's default is one process per visible GPU (one on CPU), torchrun's
        and python's one."""
        if launch.nproc is not None:
            return launch.nproc
        if launch.launcher in ("accelerate", "axolotl-accelerate") and accelerator != "cpu":
            return devices_per_node or 1
        return 1

    def process_edit(self, launch: ConfigLaunch, edit: Edit, env: dict[str, str], nproc: int, *, cpu: bool) -> None:
        if launch.launcher == "python":
            raise RecipeError(f"{NPROC}: the launch runs axolotl in one python process; launch it with accelerate "
                              "or torchrun to change the process count")
        if not launch.launcher.startswith("axolotl-"):
            head = split_launch(launch.argv, {"torchrun": TORCHRUN_SWITCHES, "accelerate": ACCELERATE_SWITCHES},
                                unknown="", accepted=ACCEPTED)
            head_process_edit(edit, head, nproc, cpu=cpu, env=env)
            return
        launcher = launch.launcher.removeprefix("axolotl-")
        name = self._count_names(launcher)[0]
        argv = launch.argv
        sep = argv.index("--") if "--" in argv else None
        done = False
        if sep is not None:
            for j in range(sep + 1, len(argv)):
                key, eq, _ = argv[j][2:].partition("=")
                if argv[j].startswith("--") and key.replace("-", "_") == name:
                    edit.replace[j] = (j + 1 if eq else j + 2, [f"{argv[j].partition('=')[0]}={nproc}"] if eq
                                       else [argv[j], str(nproc)])
                    done = True
        extra: list[str] = []
        if not done:
            extra += [f"--{name}", str(nproc)]
        if launcher == "accelerate" and cpu and nproc > 1 and not any(
                t in ("--multi_gpu", "--use_deepspeed", "--use_fsdp") for t in argv[(sep or len(argv)):]):
            extra.insert(0, "--multi_gpu")
        if extra:
            edit.append.extend((["--"] if sep is None else []) + extra)
        if cpu and nproc > 1:
            env.setdefault("ACCELERATE_USE_CPU", "true")

    def resolve(self, effective: dict[str, Any]) -> dict[str, Any]:
        """``sample_packing`` unset is off (the schema's ``None``, read as false by every use)."""
        if effective.get("sample_packing") is None:
            effective["sample_packing"] = False
        return effective

    def trial_instrumentation(self, s: Settings, trial_dir: Path) -> dict[str, Any]:
        keys = super().trial_instrumentation(s, trial_dir)
        for key in _SIDE_EFFECT_KEYS:
            if s.data.get(key) is not None:
                keys[key] = REMOVE
        for key in _TRACKER_SWITCHES:
            if s.effective.get(key) is True:
                keys[key] = False
        return keys

    def trial_env(self) -> dict[str, str]:
        return {"PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        """What would fail a local trial before it starts: the launcher not on PATH."""
        import shutil

        problems = super().preflight(recipe, backend)
        if problems or recipe.launch is None:
            return problems
        argv0 = recipe.launch.argv[0]
        if shutil.which(argv0) is None and not PurePosixPath(argv0).is_absolute():
            problems.append(f"launch.argv: {argv0} is not on PATH here; activate the environment that has axolotl "
                            "(pip install axolotl) before running attune")
        return problems


def _value_of_option(argv: Sequence[str], i: int) -> bool:
    """Whether ``argv[i]`` is the value of the option before it (``--launcher accelerate``, ``--sweep s.yml``)."""
    prev = argv[i - 1] if i > 0 else ""
    return prev.startswith("--") and "=" not in prev and prev[2:].replace("-", "_") in ("sweep", "cloud")


def _writer(spelling: str, key: str, style: str) -> Any:
    def write(value: Any) -> list[str]:
        if style == "inline":
            return [f"{spelling}={_text(value)}"]
        if style == "separate":
            return [spelling, _text(value)]
        if isinstance(value, bool):
            flag = "--" + (key.replace("_", "-") if "-" in spelling else key)
            return [flag] if value else [flag.replace("--", "--no-", 1)]
        return [f"{spelling}={_text(value)}"]
    return write


FRAMEWORK = AxolotlFramework()
frameworks.register(FRAMEWORK)

__all__ = ["ACCEPTED", "CONTRACT", "FRAMEWORK", "KNOBS", "SIGNATURES", "TRIAL_KEYS", "AxolotlFramework", "coerce"]
