"""torchtitan jobs (``framework: torchtitan``), on the framework seam.

The recipe carries the user's own launch verbatim (``recipe.launch``: the ``torchrun ... -m torchtitan.train`` command,
the TOML job file's text, the environment); knobs are the parallelism degrees, the local batch, activation
checkpointing, compile, async TP, FSDP resharding and the PP schedule (:mod:`.catalogue`, with each knob's spelling
in the 0.2.x TOML form and main's Python-config form). :meth:`TorchtitanFramework.render` changes only the changed
knobs' settings, on the command line where the launch sets them there, else in the TOML file, else as one appended
``--section.key value`` flag; an unchanged recipe renders the launch exactly. Every other setting is contract
(optimizer, LR schedule, model, data, sequence length, steps, seed, quantisation) or frozen, and the gate refuses any
change to it; the global batch (tokens per step) is a derived contract quantity.

torchtitan trains on CUDA GPUs only, so trials are Kubernetes jobs (:meth:`TorchtitanFramework.patch_job`) measured
from the pod log; the local backend refuses a machine without GPUs before any budget is spent.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attune import frameworks
from attune.errors import RecipeError
from attune.frameworks.base import (
    ContractField,
    Framework,
    Launch,
    LogParser,
    Rule,
    Tier,
)
from attune.frameworks.cmdline import container_launch, set_container_argv
from attune.frameworks.common import recordable_env, same_value
from attune.frameworks.discover import installed_version
from attune.frameworks.megatron import argv as av
from attune.frameworks.torchtitan import catalogue as cat
from attune.frameworks.torchtitan import launch as tl
from attune.frameworks.torchtitan.logs import TorchtitanLogParser

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe

_MEM = "memory_capacity"
RULES = {
    (cat.TP, "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    (cat.TP, "down"): Rule(Tier.SCALE, 0.05, {"communication": 0.15}, (_MEM,), memory=+1),
    (cat.PP, "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.25}, memory=-1),
    (cat.PP, "down"): Rule(Tier.SCALE, 0.04, {"pipeline_bubble": 0.2}, (_MEM,), memory=+1),
    (cat.CP, "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.25}, memory=-1),
    (cat.LOCAL_BATCH, "up"): Rule(Tier.SCALE, 0.08, {"host_overhead": 0.15, "compute_bound": 0.1}, (_MEM,),
                                  memory=+1),
    (cat.LOCAL_BATCH, "down"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    (cat.AC, "down"): Rule(Tier.FIT, 0.12, {"compute_bound": 0.2}, (_MEM,), memory=+1),
    (cat.AC, "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    (cat.COMPILE, "enable"): Rule(Tier.MICRO, 0.08, {"compute_bound": 0.1, "host_overhead": 0.1}, cost=2.0),
    (cat.ASYNC_TP, "enable"): Rule(Tier.OVERLAP, 0.04, {"communication": 0.1}),
    (cat.RESHARD, "up"): Rule(Tier.OVERLAP, 0.02, {"communication": 0.05}, (_MEM,), memory=+1),
    (cat.DP_REPLICATE, "up"): Rule(Tier.OVERLAP, 0.02, {"communication": 0.05}, (_MEM,), memory=+1),
}
#: environment variables a torchtitan launch sets that shape a run (never tokens or keys)
_ENV_PREFIXES = ("PYTORCH_", "NCCL_", "TORCH_NCCL_", "CUDA_", "LOG_RANK", "TORCHFT_")


class TorchtitanFramework(Framework):
    name = "torchtitan"
    title = "torchtitan (torchrun -m torchtitan.train: 0.2.x TOML job files, or main's --module/--config)"
    versions = cat.VERSIONS
    distribution = "torchtitan"
    launch_based = True
    backends = ("local",)
    rules = RULES
    k8s = True
    metrics_source = "logs"
    field_hints: ClassVar[dict[str, str]] = {
        "torchtitan.tokens_per_step": "torchtitan's default global batch (-1) is local batch × data-parallel degree, "
        "so a layout change that moves the DP degree changes it: set training.global_batch_size (0.2.x) or "
        "training.num_tokens_per_train_step (main) in the baseline to fix it and free the layout"}

    def catalogue(self) -> Catalogue:
        return cat.build()

    # -- import ------------------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The torchtitan launch → a recipe mapping (argv, TOML text, environment verbatim; knob values as the
        launch has them). ``options``: ``devices_per_node``, ``accelerator`` (default ``h100-sxm-80gb``),
        ``framework_version`` (default: the installed torchtitan's), ``name``, ``read_files``."""
        options = dict(options or {})
        argv = [str(a) for a in argv]
        if not tl.detect(argv):
            tl.parse(argv, {})  # raises with the accepted forms
        files: dict[str, str] = {}
        path = tl.config_file(argv)
        if path is not None:
            if not options.get("read_files", True):
                raise RecipeError(f"the launch reads its job from {path}, which attune cannot read here (inside the "
                                  "image); use --module/--config with --section.key flags, or import where the file is")
            full = Path(path) if Path(path).is_absolute() else Path(cwd) / path
            try:
                files[path] = full.read_text()
            except OSError as err:
                raise RecipeError(f"cannot read the job file {path} (in {cwd}): {err.strerror}") from None
        version = options.get("framework_version") or installed_version("torchtitan")
        av.check_version("torchtitan", version, cat.VERSIONS)
        job = tl.parse(argv, files, version=version)
        catalogue = cat.build()
        problems = [f"knobs.{k}: the launch has {v!r}, outside the torchtitan catalogue's domain "
                    f"({', '.join(map(repr, catalogue[k].values))}); change it in your launch before importing"
                    for k, v in job.knobs.items() if catalogue[k].check_value(v)]
        if problems:
            raise RecipeError(f"cannot import `{' '.join(argv)}`:", problems)
        kept_env = recordable_env({k: str(v) for k, v in dict(env or {}).items()}, _ENV_PREFIXES)
        devices = job.nproc or options.get("devices_per_node") or 8
        space = [k for k in catalogue.knobs if job.form in cat.SPELLINGS[k]]
        name = options.get("name") or f"torchtitan-{job.model_name}-{job.flavor}".lower()
        return {
            "name": name,
            "framework": "torchtitan",
            "launch": {"argv": argv, "env": kept_env, "cwd": str(cwd), "files": files, "framework_version": version,
                       "tokens_per_sample": job.seq_len},
            "resources": {"accelerator": options.get("accelerator") or "h100-sxm-80gb", "nodes": job.nodes,
                          "devices_per_node": int(devices)},
            "knobs": dict(job.knobs),
            "tuning": {"search_space": space},
        }

    def import_container(self, container: Mapping[str, Any], *, job_spec: Mapping[str, Any] | None = None,
                         options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        argv, env, cwd = container_launch(container, forms="the torchrun launch")
        return self.import_launch(argv, cwd=cwd, env=env, options={"read_files": False, **dict(options or {})})

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """``--set optimizer.lr=1e-3`` / ``--set lr=1e-3`` / ``--set training.seq_len=4096``: a torchtitan setting of
        the launch (TOML or command line), applied in place; knob-controlled settings are set as knobs."""
        launch = recipe_data.get("launch")
        if not isinstance(launch, dict):
            return False
        try:
            job = tl.read(launch)
        except RecipeError:
            return False
        key = tl.resolve(name, job)
        if key is None:
            return False
        by_key = {v: k for k, v in job.knob_keys().items()}
        if key in by_key:
            knob = by_key[key]
            recipe_data.setdefault("knobs", {})[knob] = value if not (knob == cat.LOCAL_BATCH and job.form == "registry") \
                else int(value) // job.seq_len
            return True
        argv, files = tl.edit(job, {key: value})
        launch["argv"], launch["files"] = argv, {**dict(launch.get("files") or {}), **files}
        return True

    # -- contract ----------------------------------------------------------------------------------------
    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        try:
            job = tl.read_recipe(recipe)
        except RecipeError:
            return {}
        knobs = recipe.effective_knobs
        out: dict[str, ContractField] = {}
        g = job.explicit_global_batch
        out["torchtitan.tokens_per_step"] = ContractField(
            tl.tokens_per_step(job, knobs, recipe.resources.devices), "derived",
            depends_on=tuple(f"knobs.{k}" for k in (cat.LOCAL_BATCH, cat.TP, cat.PP, cat.CP, cat.DP_SHARD,
                                                     cat.DP_REPLICATE)),
            fix=("the global batch is fixed at " + (f"{g} sequences" if g is not None else
                 "local batch × DP degree (-1)") + f" of {job.seq_len} tokens; with -1, keep local batch × DP degree "
                 "constant (or fix the global batch in the baseline)"))
        frozen_fix = "attune only changes the knob-controlled settings of a torchtitan launch"
        knob_keys = set(job.knob_keys().values())
        out["launch.form"] = ContractField(job.form, "frozen", fix=frozen_fix)
        out["launch.launcher"] = ContractField(job.launch.launcher_tokens(), "frozen", fix=frozen_fix)
        out["launch.script"] = ContractField(job.launch.script, "frozen", fix=frozen_fix)
        names = sorted(k for k in job.settings if k not in knob_keys)
        out["launch.options"] = ContractField(names, "frozen", fix="the launch's other settings (names) must stay as "
                                              "they are; " + frozen_fix)
        for key in sorted(set(names) | (tl.CONTRACT_KEYS - knob_keys)):
            kind = tl.kind_of(key)
            out[f"launch.args.{key}"] = ContractField(
                job.settings.get(key), kind,
                fix=f"{key} is the launch's own setting; attune never changes it" if kind == "contract" else frozen_fix)
        assert recipe.launch is not None
        out["launch.env"] = ContractField(dict(sorted(recipe.launch.env.items())), "frozen", fix=frozen_fix)
        out["launch.cwd"] = ContractField(recipe.launch.cwd, "frozen", fix=frozen_fix)
        return out

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        try:
            job = tl.read_recipe(recipe)
        except RecipeError:
            return None
        return tl.tokens_per_step(job, recipe.effective_knobs, recipe.resources.devices)

    def check(self, recipe: Recipe) -> list[str]:
        try:
            tl.read_recipe(recipe)
        except RecipeError as err:
            return [f"launch.argv: {err}"]
        return []

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        problems = super().preflight(recipe, backend)
        if problems:
            return problems
        if backend == "local" and (recipe.resources.accelerator == "cpu" or shutil.which("nvidia-smi") is None):
            problems.append("resources.accelerator: torchtitan trains on CUDA GPUs and this machine has none; run its "
                            "trials as a Kubernetes TuningRun (the operator renders them with patch_job)")
        return problems

    # -- render ------------------------------------------------------------------------------------------
    def render(self, recipe: Recipe) -> Launch:
        return self._render(recipe)

    def _render(self, recipe: Recipe, *, in_files: bool = True, extra: Mapping[str, Any] | None = None) -> Launch:
        job = tl.read_recipe(recipe)
        assert recipe.launch is not None
        keys = job.knob_keys()
        assignments: dict[str, Any] = {}
        for knob, value in recipe.effective_knobs.items():
            if same_value(value, job.knobs.get(knob)):
                continue
            if knob not in keys:
                raise RecipeError(f"knobs.{knob}: a torchtitan {job.form} launch has no setting for it")
            assignments[keys[knob]] = tl.native_value(job, knob, value)
        assignments.update(extra or {})
        argv, files = tl.edit(job, assignments, in_files=in_files)
        return Launch(argv=tuple(argv), env=dict(recipe.launch.env), files={**dict(recipe.launch.files), **files},
                      cwd=recipe.launch.cwd)

    @staticmethod
    def trial_settings(job: tl.Job) -> dict[str, Any]:
        """Measurement instrumentation (never what is learned): log every step, plain text, no checkpoints,
        profiling or validation; ``training.steps`` (the LR schedule) stays and attune ends the trial."""
        out: dict[str, Any] = {"metrics.log_freq": 1, "metrics.disable_color_printing": True}
        if job.form == "toml":
            out.update({"checkpoint.enable": False, "profiling.enable_profiling": False, "validation.enable": False})
        return out

    # -- logs --------------------------------------------------------------------------------------------
    def parser(self, recipe: Recipe) -> LogParser:
        tokens = self.tokens_per_step(recipe) or 0
        return TorchtitanLogParser(tokens_per_step=tokens, devices=recipe.resources.devices)

    # -- Kubernetes --------------------------------------------------------------------------------------
    def patch_job(self, recipe: Recipe, job: dict[str, Any], container: dict[str, Any], *, steps: int,
                  metrics_port: int, linger_s: float) -> None:
        """The user's container with the change on its command line (the job file is inside the image: every change
        goes on the command line, where torchtitan's CLI takes precedence over the TOML), plus logging
        instrumentation; the operator ends the trial after ``steps`` logged steps."""
        tj = tl.read_recipe(recipe)
        launch = self._render(recipe, in_files=False, extra=self.trial_settings(tj))
        argv = list(launch.argv)
        set_container_argv(container, argv)
        if job.get("kind") in (None, "PyTorchJob"):
            job.setdefault("spec", {})["nprocPerNode"] = str(recipe.resources.devices_per_node)
        env = [e for e in container.get("env") or [] if e.get("name") != "PYTHONUNBUFFERED"]
        env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
        container["env"] = env


FRAMEWORK = frameworks.register(TorchtitanFramework())

__all__ = ["FRAMEWORK", "RULES", "TorchtitanFramework"]
