"""Megatron-Core training (``framework: megatron``), on the framework seam: Megatron-LM, Megatron-Bridge and NeMo 2.

One framework, three native launch formats (:mod:`attune.frameworks.megatron.formats`), because all three drive
the same engine: the knob catalogue (Megatron-Core config fields), its constraints, the padded-vocabulary contract and
the simulator (:mod:`attune.sim`) are one; a format only knows its own spelling of each knob and how to derive the
model and training contract from the launch. A recipe carries **both** attune's ``model`` / ``training`` sections
(what the simulator times, derived from the launch at import) and, when imported, the user's launch verbatim
(``recipe.launch``): :meth:`MegatronFramework.render` applies the knobs to that launch, changing exactly each
changed knob's own setting; an unchanged recipe renders the launch exactly. Every other native setting is contract or
frozen (:meth:`MegatronFramework.contract`), so the gate refuses a change to it in the framework's own names too
(``attune gate check recipe.yaml --set lr=1e-3``).

Trials run on the simulator (``--backend sim``); real trials are Kubernetes jobs (:meth:`MegatronFramework.patch_job`:
the container's command and args with the change and logging instrumentation applied), measured from the pod log
(:class:`~attune.frameworks.megatron.logs.MegatronLogParser`).
"""

from __future__ import annotations

import functools
import shlex
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
    moved,
    only_moves,
    reported_mismatches,
)
from attune.frameworks.cmdline import container_launch, set_container_argv
from attune.frameworks.common import (
    GLOBAL_BATCH_HINT,
    micro_batch_layouts,
    micro_batch_rules,
    recordable_env,
    same_value,
)
from attune.frameworks.discover import installed_version
from attune.frameworks.megatron import argv as _argv
from attune.frameworks.megatron import catalogue as _catalogue
from attune.frameworks.megatron import formats as _formats
from attune.frameworks.megatron import script as _script
from attune.frameworks.megatron.logs import MegatronLogParser
from attune.sim.model import NOISE_SIGMA

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import NativeLaunch, Recipe
    from attune.sim.model import SimResult
    from attune.trial import Measurement

_MEM = "memory_capacity"

RULES = {
    **micro_batch_rules(),
    ("tensor_model_parallel_size", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    ("tensor_model_parallel_size", "down"): Rule(Tier.SCALE, 0.06, {"communication:tp": 0.2, "host_overhead": 0.1},
                                                 (_MEM,), memory=+1),
    ("pipeline_model_parallel_size", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.25}, memory=-1),
    ("pipeline_model_parallel_size", "down"): Rule(Tier.SCALE, 0.05, {"pipeline_bubble": 0.2, "communication:pp": 0.1},
                                                   (_MEM,), memory=+1),
    ("virtual_pipeline_model_parallel_size", "up"): Rule(Tier.OVERLAP, 0.02, {"pipeline_bubble": 0.15}),
    ("virtual_pipeline_model_parallel_size", "down"): Rule(Tier.OVERLAP, 0.0, {"communication:pp": 0.05}),
    ("context_parallel_size", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.25}, memory=-1),
    ("context_parallel_size", "down"): Rule(Tier.SCALE, 0.05, {"communication:cp": 0.15}, (_MEM,), memory=+1),
    ("expert_model_parallel_size", "up"): Rule(Tier.SCALE, 0.04, {_MEM: 0.2}, memory=-1),
    ("expert_model_parallel_size", "down"): Rule(Tier.SCALE, 0.02, {"communication:ep": 0.15}, (_MEM,), memory=+1),
    ("moe_token_dispatcher_type", "up"): Rule(Tier.OVERLAP, 0.03, {"communication:ep": 0.12}),
    ("recompute_granularity", "down"): Rule(Tier.FIT, 0.2, {"compute_bound": 0.25}, (_MEM,), memory=+1),
    ("recompute_granularity", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    ("use_distributed_optimizer", "enable"): Rule(Tier.FIT, 0.01, {_MEM: 0.3, "communication:dp": 0.04}, memory=-1),
    ("overlap_grad_reduce", "enable"): Rule(Tier.OVERLAP, 0.05, {"communication:dp": 0.15}),
    ("overlap_param_gather", "enable"): Rule(Tier.OVERLAP, 0.03, {"communication:dp": 0.1}),
    ("bucket_size", "up"): Rule(Tier.OVERLAP, 0.01, {"communication:dp": 0.03}),
    ("bucket_size", "down"): Rule(Tier.OVERLAP, 0.01, {"communication:dp": 0.03}),
    ("tp_comm_overlap", "enable"): Rule(Tier.OVERLAP, 0.04, {"communication:tp": 0.15}),
    ("sequence_parallel", "enable"): Rule(Tier.FIT, 0.02, {_MEM: 0.15, "communication:tp": 0.03}, memory=-1),
    ("grad_reduce_in_bf16", "enable"): Rule(Tier.OVERLAP, 0.03, {"communication:dp": 0.1}, memory=-1),
    ("fp8", "up"): Rule(Tier.MICRO, 0.25, {"compute_bound": 0.35}),
    ("enable_cuda_graph", "enable"): Rule(Tier.MICRO, 0.03, {"host_overhead": 0.15}, (_MEM,), cost=1.5, memory=+1),
    ("manual_gc", "enable"): Rule(Tier.MICRO, 0.01, {"host_overhead": 0.03}),
    ("env.NCCL_NVLS_ENABLE", "down"): Rule(Tier.FIT, 0.0, {_MEM: 0.05}, memory=-1),
    ("env.PYTORCH_CUDA_ALLOC_CONF", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.1}, memory=-1),
    ("env.TORCH_NCCL_AVOID_RECORD_STREAMS", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.03}, memory=-1),
    ("env.NVTE_FWD_LAYERNORM_SM_MARGIN", "up"): Rule(Tier.OVERLAP, 0.005, {"communication:dp": 0.03}),
    ("env.NVTE_BWD_LAYERNORM_SM_MARGIN", "up"): Rule(Tier.OVERLAP, 0.005, {"communication:dp": 0.03}),
    ("env.NCCL_P2P_NET_CHUNKSIZE", "up"): Rule(Tier.OVERLAP, 0.005, {"communication:pp": 0.05}),
}


#: environment variables a Megatron launch sets that shape a run and are safe to record (never tokens or keys)
_ENV_PREFIXES = ("NCCL_", "NVTE_", "TORCH_NCCL_", "CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF",
                 "CUDA_VISIBLE_DEVICES", "TORCH_NCCL")
_DEFAULT_ACCELERATOR = "h100-sxm-80gb"


@functools.lru_cache(maxsize=256)
def _read_cached(argv: tuple[str, ...], files: tuple[tuple[str, str], ...]) -> _formats.Native:
    fmt = _formats.detect(argv)
    return fmt.read(argv, dict(files))


def read_launch(launch: NativeLaunch | Mapping[str, Any]) -> _formats.Native:
    """The native launch of a recipe, read by its format (cached: treat the result as read-only)."""
    if isinstance(launch, Mapping):
        argv, files = launch.get("argv") or (), launch.get("files") or {}
    else:
        argv, files = launch.argv, launch.files
    return _read_cached(tuple(str(a) for a in argv), tuple(sorted((str(k), str(v)) for k, v in dict(files).items())))


@functools.cache
def _cat() -> Catalogue:
    return _catalogue.build()


def env_knobs() -> list[str]:
    return [k for k in _cat().knobs if k.startswith("env.")]


def _env_base(native: _formats.Native, env: Mapping[str, str], knob: str) -> Any:
    """The value an env knob has in a launch: its environment, else the framework's own default (a Bridge
    recipe's ``env_vars``), else the catalogue default."""
    var = knob.removeprefix("env.")
    defaults = native.extra.get("env", {}) if native.extra else {}
    if var in env:
        return str(env[var])
    if var in defaults:
        return str(defaults[var])
    return _cat()[knob].default


class MegatronFramework(Framework):
    name = "megatron"
    title = "Megatron-Core: Megatron-LM flags, Megatron-Bridge recipes, NeMo 2 overrides (MCore knob names)"
    versions = _catalogue.VERSIONS
    distribution = "megatron-core"
    backends = ("sim",)
    native_launch = True
    k8s = True
    metrics_source = "logs"
    rules = RULES
    field_hints: ClassVar[dict[str, str]] = {
        "training.global_batch_size": GLOBAL_BATCH_HINT.format(knob="micro_batch_size")}

    #: the NeMo AutoConfigurator-style grid baseline's axes (attune.policies.grid)
    layout_grid: ClassVar[dict[str, Any]] = {
        "axes": ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "expert_model_parallel_size", "micro_batch_size"),
        "interleave": "virtual_pipeline_model_parallel_size",
        "model_parallel": ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"),
        "micro_batch": "micro_batch_size",
    }

    def catalogue(self) -> Catalogue:
        return _catalogue.build()

    def simulate(self, recipe: Recipe, *, seed: int | None = None, noise_sigma: float = NOISE_SIGMA) -> SimResult:
        """Megatron-Core's analytical step-time and memory model (:mod:`attune.sim.megatron`)."""
        from attune.sim.megatron import simulate

        return simulate(recipe, seed=seed, noise_sigma=noise_sigma)

    def model_flops_per_token(self, recipe: Recipe) -> float | None:
        """MCore's count (``num_floating_point_operations``), as the performance model computes it."""
        from attune.sim.megatron import model_flops_per_token

        return float(model_flops_per_token(recipe))

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        return micro_batch_layouts(recipe, avoid=avoid)

    # -- contract ----------------------------------------------------------------------------------------
    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """The padded vocabulary (a model quantity derived from TP and ``make_vocab_size_divisible_by``), and, for a
        recipe with a native launch, every native setting no knob controls: contract or frozen, by name."""
        native = None
        if recipe.launch is not None:
            try:
                native = read_launch(recipe.launch)
            except RecipeError:
                native = None  # check() reports why
        out = {"model.padded_vocab_size": self._padded_vocab(recipe, native)}
        if native is not None:
            out.update(self._native_contract(recipe, native))
        return out

    def _padded_vocab(self, recipe: Recipe, native: _formats.Native | None) -> ContractField:
        assert recipe.model is not None  # a megatron recipe has a model section (Recipe validation)
        vocab = recipe.model.vocab_size
        deps = ("knobs.tensor_model_parallel_size", f"knobs.{_catalogue.VOCAB_DIVISOR}", "model.vocab_size")
        if native is not None and not native.pads_vocab:
            return ContractField(value=vocab, kind="derived", depends_on=("model.vocab_size",),
                                 fix=f"{native.format.title} does not pad the vocabulary here, so it stays {vocab}")
        padded = _catalogue.padded_vocab_size(recipe)
        tps = [tp for tp in recipe.catalogue["tensor_model_parallel_size"].values if isinstance(tp, int)]
        same_tp = [tp for tp in tps if _catalogue.pad_vocab(vocab, int(recipe.knob(_catalogue.VOCAB_DIVISOR)), tp)
                   == padded]
        keeping = {tp: _catalogue.divisors_keeping(vocab, padded, tp) for tp in tps}
        with_divisor = ", ".join(f"TP={tp}: {_catalogue.VOCAB_DIVISOR} {'/'.join(map(str, ds))}"
                                 for tp, ds in keeping.items() if ds)
        fix = (f"The padded vocabulary must stay {padded} (model.vocab_size {vocab} padded to a multiple of "
               f"{_catalogue.VOCAB_DIVISOR} × tensor_model_parallel_size); with the current divisor "
               f"tensor_model_parallel_size values that keep it are {same_tp}; moving {_catalogue.VOCAB_DIVISOR} "
               f"together with TP keeps it at {with_divisor or 'no other TP'}")
        return ContractField(value=padded, kind="derived", depends_on=deps, fix=fix)

    def _native_contract(self, recipe: Recipe, native: _formats.Native) -> dict[str, ContractField]:
        fmt = native.format
        assert recipe.launch is not None
        frozen_fix = f"attune only changes the knob-controlled settings of a {fmt.title}"
        out: dict[str, ContractField] = {}
        out["launch.format"] = ContractField(fmt.name, "frozen", fix=frozen_fix)
        launch = _argv.split(native.argv, programs=("nemo",))
        out["launch.launcher"] = ContractField(launch.launcher_tokens(), "frozen", fix=frozen_fix)
        out["launch.script"] = ContractField(launch.script, "frozen", fix=frozen_fix)
        names = sorted(k for k in native.settings if k not in native.knob_settings)
        out["launch.options"] = ContractField(names, "frozen", fix="the launch's other settings (names) must stay "
                                              "as they are; " + frozen_fix)
        for name in sorted(set(names) | set(fmt.known_contract())):
            kind = fmt.kind_of(name)
            value = native.settings.get(name)
            if kind == "contract":
                fix = (f"{name} is the launch's own setting; attune never changes it" + (
                    "" if name in native.settings else " (the launch does not set it: the framework default applies)"))
            else:
                fix = frozen_fix
            out[f"launch.args.{name}"] = ContractField(value, kind, fix=fix)
        env_names = {k.removeprefix("env.") for k in env_knobs()}
        out["launch.env"] = ContractField({k: v for k, v in sorted(recipe.launch.env.items()) if k not in env_names},
                                          "frozen", fix=frozen_fix)
        out["launch.cwd"] = ContractField(recipe.launch.cwd, "frozen", fix=frozen_fix)
        return out

    def cannot_matter(self, best: Recipe, candidate: Recipe, measured: Measurement | None) -> str | None:
        change = moved(best, candidate)
        if only_moves(change, ("overlap_grad_reduce", "overlap_param_gather", "bucket_size")) \
                and _catalogue.data_parallel_size(candidate) == 1 and _catalogue.expert_data_parallel_size(candidate) == 1:
            return (f"{', '.join(change)}: data-parallel size 1 (dense and expert): there is no gradient reduction "
                    "or parameter gather across replicas to overlap or bucket")
        return None

    def check(self, recipe: Recipe) -> list[str]:
        if recipe.launch is None:
            return []
        try:
            read_launch(recipe.launch)
        except RecipeError as err:
            return [f"launch.argv: {err}"]
        return []

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        problems = super().preflight(recipe, backend)
        if recipe.launch is None or problems:
            return problems
        native = read_launch(recipe.launch)
        version = recipe.launch.framework_version
        if _argv.version_in(version, native.format.versions) is False:
            problems.append(f"launch.framework_version: {native.format.package} {version} is outside the versions "
                            f"attune covers for {native.format.title} ({native.format.versions})")
        assert recipe.model is not None  # a megatron recipe has a model section (Recipe validation)
        model = recipe.model.model_dump(mode="python")
        for key, value in native.model.items():
            if key in model and not same_value(model[key], value):
                problems.append(f"model.{key}: the recipe says {model[key]!r} but its launch says {value!r}; "
                                "re-import the launch (the launch is what runs)")
        assert recipe.training is not None
        t = recipe.training
        for key, ours in (("global_batch_size", t.global_batch_size), ("seq_length", t.seq_length),
                          ("steps", t.steps), ("seed", t.seed), ("precision", t.precision)):
            theirs = native.training.get(key)
            if theirs is not None and not same_value(ours, theirs):
                problems.append(f"training.{key}: the recipe says {ours!r} but its launch says {theirs!r}; "
                                "re-import the launch (the launch is what runs)")
        if not same_value(t.optimizer.lr, native.training["optimizer"]["lr"]):
            problems.append(f"training.optimizer.lr: the recipe says {t.optimizer.lr!r} but its launch says "
                            f"{native.training['optimizer']['lr']!r}; re-import the launch")
        return problems

    # -- import / render -----------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A Megatron-LM / Megatron-Bridge / NeMo 2 launch → a recipe mapping: the launch verbatim (argv, the
        environment it sets, the config file it names), plus the model, training contract, resources and knob
        values the simulator needs, derived from the launch's settings.

        ``options``: ``accelerator`` (default ``h100-sxm-80gb``), ``devices_per_node`` (where the launch does not say),
        ``framework_version`` (default: the installed package's, if any), ``name``, ``read_files`` (default true)."""
        options = dict(options or {})
        argv = [str(a) for a in argv]
        fmt = _formats.detect(argv)
        files: dict[str, str] = {}
        for path in fmt.files_to_read(argv):
            if not options.get("read_files", True):
                raise RecipeError(f"the launch reads its config from {path}, which attune cannot read here (inside "
                                  "the image); import it where the file is, or spell the settings as overrides")
            full = Path(path) if Path(path).is_absolute() else Path(cwd) / path
            try:
                files[path] = full.read_text()
            except OSError as err:
                raise RecipeError(f"cannot read the config file {path} (in {cwd}): {err.strerror}") from None
        version = options.get("framework_version") or installed_version(fmt.package)
        _argv.check_version(f"{fmt.title}: {fmt.package}", version, fmt.versions)
        native = fmt.read(argv, files)
        kept_env = recordable_env({k: str(v) for k, v in dict(env or {}).items()}, _ENV_PREFIXES)
        catalogue = _cat()
        knobs = dict(native.knobs)
        for k in env_knobs():
            knobs[k] = _env_base(native, kept_env, k)
        problems = [f"knobs.{k}: the launch has {v!r}, outside the megatron catalogue's domain "
                    f"({', '.join(map(repr, catalogue[k].values))}); change it in your launch to one of those values "
                    "before importing" for k, v in knobs.items() if catalogue[k].check_value(v)]
        if problems:
            raise RecipeError(f"cannot import `{' '.join(argv)}`:", problems)
        moe_only = ("expert_model_parallel_size", "expert_tensor_parallel_size", "moe_token_dispatcher_type")
        space = [k for k, kn in catalogue.knobs.items()
                 if (k in fmt.spellings or k.startswith("env.")) and len(kn.values) > 1
                 and kn.semantics.value != "numerics_changing" and k != _catalogue.VOCAB_DIVISOR
                 and (native.model.get("moe_experts") or k not in moe_only)]
        model = native.model
        devices = native.devices_per_node or options.get("devices_per_node") or 8
        name = options.get("name") or f"{fmt.name}-{model.get('family', 'gpt')}-{model['layers']}l-" \
                                      f"{native.nodes * int(devices)}gpu"
        return {
            "name": name,
            "framework": "megatron",
            "model": model,
            "training": native.training,
            "launch": {"argv": argv, "env": kept_env, "cwd": str(cwd), "files": dict(native.files),
                       "framework_version": version, "tokens_per_sample": native.training["seq_length"]},
            "resources": {"accelerator": options.get("accelerator") or _DEFAULT_ACCELERATOR, "nodes": native.nodes,
                          "devices_per_node": int(devices)},
            "knobs": knobs,
            "tuning": {"search_space": space},
        }

    def import_container(self, container: Mapping[str, Any], *, job_spec: Mapping[str, Any] | None = None,
                         options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A Kubernetes training container (``command`` + ``args``, ``workingDir``, ``env``) → a recipe mapping.

        The launch is the container's command line, or the launch line of the shell script it runs: inline
        (``sh -c "torchrun ..."``) or a file whose text the caller read (``options["files"]``: path → text, e.g. a
        script mounted from a ConfigMap; the recipe keeps that text in ``launch.files`` so each trial runs a changed
        copy of it). A script inside the image is refused, saying what to do instead."""
        options = {"read_files": False, **dict(options or {})}
        given = {str(k): str(v) for k, v in dict(options.pop("files", None) or {}).items()}
        argv, env, cwd = container_launch(container, forms="the launch (torchrun ... pretrain_gpt.py ..., or bash "
                                                           "/path/run.sh with the script mounted from a ConfigMap)")
        how = _script.classify(argv, str(cwd))
        if how.kind == "direct":
            return self.import_launch(argv, cwd=cwd, env=env, options=options)
        script = self._read_script(how, given, env)
        data = self.import_launch(script.argv, cwd=cwd, env={**env, **script.env}, options=options)
        if how.kind == "file":
            assert how.path is not None
            data["launch"]["files"] = {**data["launch"].get("files", {}), how.path: script.text}
        return data

    @staticmethod
    def _read_script(how: _script.ContainerLaunch, files: Mapping[str, str],
                     env: Mapping[str, str]) -> _script.Script:
        """The launch of the script a container runs (its text from ``files`` for a script file)."""
        if how.kind == "inline":
            assert how.text is not None
            where = f"the container's inline script (`{shlex.join(how.shell)} -c ...`)"
            return _script.read_script(how.text, args=how.script_args, zero=how.zero or how.shell[0], env=env,
                                       is_launch=_is_launch, where=where)
        assert how.path is not None
        text = files.get(how.path)
        if text is None:
            raise RecipeError(f"the container runs `{shlex.join(how.argv)}`: attune has not read the script "
                              f"{how.path} (a script inside the image cannot be read), so it can neither see the "
                              f"flags it launches with nor change them for a trial; {_script.SEE_FIX}, and import "
                              "the recipe from the template (spec.recipe.fromTemplate: {framework: megatron})")
        return _script.read_script(text, args=how.script_args, zero=how.path, env=env, is_launch=_is_launch,
                                   where=f"the script {how.path}")

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """``--set lr=1e-3`` / ``--set optimizer.lr=1e-3`` / ``--set tensor-model-parallel-size=2``: a native setting
        of the recipe's launch (or a knob in its native spelling), applied in place; the model and training
        sections are re-derived from the changed launch, so both they and the launch's own setting show the change."""
        launch = recipe_data.get("launch")
        if not isinstance(launch, dict):
            return False
        try:
            native = read_launch(launch)
        except RecipeError:
            return False
        knob = _knob_for_native(native.format, name)
        if knob is not None:
            recipe_data.setdefault("knobs", {})[knob[0]] = (not bool(value)) if knob[1] else value
            return True
        result = native.format.set_native(native, name, value)
        if result is None:
            return False
        argv, files = result
        launch["argv"], launch["files"] = list(argv), dict(files)
        try:
            changed = native.format.read(argv, files)
        except RecipeError:
            return True  # the launch no longer reads: the gate refuses it as invalid
        opt_in = (recipe_data.get("training") or {}).get("numerics_opt_in", [])
        recipe_data["model"] = dict(changed.model)
        recipe_data["training"] = {**changed.training, "numerics_opt_in": opt_in}
        return True

    def render(self, recipe: Recipe) -> Launch:
        """The recipe's native launch with its knobs applied (an unchanged recipe: the launch exactly)."""
        return self._render(recipe)

    def _render(self, recipe: Recipe, *, in_files: bool = True, extra: Mapping[str, Any] | None = None,
                steps: int | None = None, native: _formats.Native | None = None,
                env_base: Mapping[str, str] | None = None) -> Launch:
        """``native`` (default: the recipe's launch) with the recipe's knobs and ``extra`` settings applied; env knobs
        that differ from ``env_base`` (default: the launch's environment) are set in the launch's environment."""
        if recipe.launch is None:
            raise RecipeError(f"recipe {recipe.name!r} carries no native launch (it was written for the simulator); "
                              "import your Megatron-LM / Megatron-Bridge / NeMo 2 command with `attune import "
                              "--framework megatron -- COMMAND` to get one attune can render")
        if native is None:
            native = read_launch(recipe.launch)
        if env_base is None:
            env_base = recipe.launch.env
        fmt = native.format
        knobs = recipe.effective_knobs
        changes = {k: v for k, v in knobs.items() if not k.startswith("env.") and k in native.knobs
                   and not same_value(v, native.knobs[k])}
        missing = [k for k in changes if fmt.spelling_of(k) is None]
        if missing:
            raise RecipeError(f"{fmt.title} has no setting for knobs {', '.join(missing)}; they cannot be changed in "
                              "this launch")
        if steps is not None:
            extra = {**fmt.trial_settings(native, steps), **dict(extra or {})}
        argv, files = fmt.render(native, changes, in_files=in_files, extra=extra)
        env = dict(recipe.launch.env)
        for k in env_knobs():
            if not same_value(knobs[k], _env_base(native, env_base, k)):
                env[k.removeprefix("env.")] = str(knobs[k])
        return Launch(argv=tuple(argv), env=env, files=files, cwd=recipe.launch.cwd)

    # -- logs ----------------------------------------------------------------------------------------------
    #: what Megatron-LM's argument dump reports that must stay the baseline's run's
    reported_contract = ("global_batch_size", "seq_length", "lr", "min_lr", "seed", "fp16", "bf16", "clip_grad",
                         "weight_decay", "train_iters", "train_samples")
    #: reported parallel layout → the knob it must equal
    _REPORTED_KNOBS = ("micro_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                       "context_parallel_size")

    def report_problems(self, recipe: Recipe, reported: Mapping[str, Any]) -> list[str]:
        """Megatron-LM's own resolved arguments against the recipe: its global batch and sequence length, and the
        micro-batch and parallel sizes the trial's knobs set."""
        expected: dict[str, Any] = {}
        if recipe.training is not None:
            expected = {"global_batch_size": recipe.training.global_batch_size,
                        "seq_length": recipe.training.seq_length}
        knobs = recipe.effective_knobs
        expected.update({k: knobs[k] for k in self._REPORTED_KNOBS if k in knobs})
        return reported_mismatches("Megatron", expected, reported)

    def parser(self, recipe: Recipe) -> LogParser:
        assert recipe.training is not None
        return MegatronLogParser(global_batch=recipe.training.global_batch_size,
                                 seq_length=recipe.training.seq_length)

    # -- Kubernetes ----------------------------------------------------------------------------------------
    def patch_job(self, recipe: Recipe, job: dict[str, Any], container: dict[str, Any], *, steps: int,
                  metrics_port: int, linger_s: float) -> None:
        """The user's container, its own command kept, with the change applied where the container writes its
        launch: the flags of its command line, or, for a container that runs a shell script (``bash /scripts/run.sh``
        mounted from a ConfigMap, or ``sh -c "..."``), a copy of the script with exactly the changed flags edited in
        place, run inline (``bash -c TEXT /scripts/run.sh ARGS...``, so ``$0`` and ``$1 ...`` stay). Config files
        inside the image are not edited: every change goes on the command line. Logging instrumentation that does
        not change what is learned is added (log every step; no checkpoint writes or evaluation; Megatron-LM / Bridge
        exit after ``steps``). Trials are measured from the pod log."""
        self.apply_to_container(recipe, container, steps=steps)

    def apply_to_container(self, recipe: Recipe, container: dict[str, Any], *, steps: int | None = None) -> None:
        """``recipe``'s knobs applied to a training container in place (``steps``: a trial's instrumentation too;
        ``None``: the tuned launch as it is, e.g. the tuned job a run writes)."""
        if recipe.launch is None:
            self._render(recipe)  # raises: nothing to render
        assert recipe.launch is not None
        argv, env, _ = container_launch(container, forms="the launch (torchrun ... pretrain_gpt.py ..., or bash "
                                                         "/path/run.sh with the script mounted from a ConfigMap)")
        how = _script.classify(argv, str(container.get("workingDir") or "/"))
        script = None if how.kind == "direct" else self._read_script(how, recipe.launch.files, env)
        target = script.argv if script is not None else argv
        target_env = {**env, **(script.env if script is not None else {})}
        native = self._target_native(recipe, target)
        launch = self._render(recipe, in_files=False, steps=steps, native=native, env_base=target_env)
        knobs = recipe.effective_knobs
        changed = {k.removeprefix("env."): str(knobs[k]) for k in env_knobs()
                   if not same_value(knobs[k], _env_base(native, target_env, k))}
        if script is None:
            set_container_argv(container, list(launch.argv))
        else:
            in_script = {k: v for k, v in changed.items() if k in script.env_sites}
            changed = {k: v for k, v in changed.items() if k not in in_script}
            zero = how.path if how.kind == "file" else (how.zero or how.shell[0])
            assert zero is not None
            text = _script.edit_script(script, launch.argv, in_script, is_launch=_is_launch, args=how.script_args,
                                       zero=zero, where=f"the script {how.path}" if how.kind == "file" else
                                       "the container's inline script")
            if how.kind == "file":
                container["command"] = [*_script.interpreter(script.text, how.shell), "-c"]
                container["args"] = [text, zero, *how.script_args]
            else:
                for key in ("command", "args"):  # the text stays where the container writes it
                    tokens = [str(t) for t in container.get(key) or []]
                    if how.text in tokens:
                        tokens[tokens.index(str(how.text))] = text
                        container[key] = tokens
                        break
        values = dict(changed)
        if steps is not None:
            values["PYTHONUNBUFFERED"] = "1"
        if values:
            kept = [e for e in container.get("env") or [] if e.get("name") not in values]
            container["env"] = kept + [{"name": k, "value": v} for k, v in sorted(values.items())]

    @staticmethod
    def _target_native(recipe: Recipe, argv: Sequence[str]) -> _formats.Native:
        """The container's own launch, read; it must be the recipe's launch up to the knobs (the same format, model
        and training contract), else :class:`RecipeError` names what differs."""
        assert recipe.launch is not None
        base = read_launch(recipe.launch)
        if list(argv) == list(base.argv):
            return base
        native = read_launch({"argv": list(argv), "files": dict(recipe.launch.files)})
        diffs = [] if native.format is base.format else [f"format ({native.format.title}, the recipe's "
                                                         f"{base.format.title})"]
        for section, ours, theirs in (("model", base.model, native.model), ("training", base.training,
                                                                            native.training)):
            for key in sorted(set(ours) | set(theirs)):
                if not same_value(ours.get(key), theirs.get(key)):
                    diffs.append(f"{section}.{key} ({theirs.get(key)!r}, the recipe's {ours.get(key)!r})")
        if diffs:
            raise RecipeError("the trial template's launch is not the recipe's launch: it differs in "
                              f"{', '.join(diffs)}; import the recipe from the template (spec.recipe.fromTemplate: "
                              "{framework: megatron}) or make the two agree")
        return native


def _is_launch(argv: list[str]) -> bool:
    """Whether ``argv`` is a Megatron-family launch (a script's launch line)."""
    try:
        _formats.detect(argv)
    except RecipeError:
        return False
    return True


def _knob_for_native(fmt: _formats.Format, name: str) -> tuple[str, bool] | None:
    """The knob a native setting name spells (and whether its value is inverted), for ``--set NATIVE=VALUE``."""
    from attune.frameworks.megatron.formats import dotted, mlm

    if isinstance(fmt, dotted.DottedFormat):
        for k in fmt.KNOBS:
            if name in k.keys:
                return k.knob, k.invert
        return None
    flag = name.lstrip("-").replace("_", "-")
    for knob, f in mlm.SWITCHES.items():
        if f == flag:
            return knob, False
    for knob, (f, _) in mlm.VALUES.items():
        if f == flag:
            return knob, False
    return None


FRAMEWORK = frameworks.register(MegatronFramework())
