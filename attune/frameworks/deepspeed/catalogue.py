"""Knob catalogue of DeepSpeed launches (``framework: deepspeed``): keys of the DeepSpeed JSON config, the
launcher's process count and the OpenMP threads, with the contract keys.

Knob names are DeepSpeed's own config keys (dotted paths into the JSON). Key names, defaults and value ranges
are checked against the installed deepspeed 0.19.8 (``DeepSpeedZeroConfig`` and ``deepspeed.runtime.config``):
``reduce_bucket_size`` and ``allgather_bucket_size`` default to 5e8 elements, ``stage3_prefetch_bucket_size`` (field
``prefetch_bucket_size``) to 5e7, ``stage3_param_persistence_threshold`` (field ``param_persistence_threshold``) to
1e5, ``contiguous_gradients`` to true, and ``overlap_comm`` to null: DeepSpeed then turns it on for stage 3 only.

Every other setting DeepSpeed 0.19.8 reads is listed by ``attune knobs --framework deepspeed --discover``; those
with a finite domain are *exploratory* knobs here (numerics class ``exploratory``), frozen unless the recipe's
``tuning.explore`` names them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attune.frameworks.common import processes_fit_problem
from attune.frameworks.discover import EXPLORATORY
from attune.recipe.catalogue import Catalogue, Constraint, Knob, KnobValue, Semantics

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

D = Semantics.NUMERICS_DRIFT
P = Semantics.PRESERVING
VERSIONS = ">=0.19.8,<0.20"

MICRO = "train_micro_batch_size_per_gpu"
ACCUMULATION = "gradient_accumulation_steps"
TRAIN_BATCH = "train_batch_size"
NPROC = "nproc_per_node"
STAGE = "zero_optimization.stage"
OVERLAP = "zero_optimization.overlap_comm"
CONTIGUOUS = "zero_optimization.contiguous_gradients"
REDUCE_BUCKET = "zero_optimization.reduce_bucket_size"
ALLGATHER_BUCKET = "zero_optimization.allgather_bucket_size"
PREFETCH = "zero_optimization.stage3_prefetch_bucket_size"
PERSISTENCE = "zero_optimization.stage3_param_persistence_threshold"
OMP_ENV = "env.OMP_NUM_THREADS"

#: knob → other spellings DeepSpeed accepts for the same key (pydantic field name next to its alias)
ALIASES: dict[str, tuple[str, ...]] = {
    PREFETCH: ("zero_optimization.prefetch_bucket_size",),
    PERSISTENCE: ("zero_optimization.param_persistence_threshold",),
}
#: knobs that are config keys (nproc and env knobs are the launcher's / the environment's)
CONFIG_KNOBS = (MICRO, STAGE, OVERLAP, CONTIGUOUS, REDUCE_BUCKET, ALLGATHER_BUCKET, PREFETCH, PERSISTENCE)
#: DeepSpeed's default of each config knob (where the key is absent)
DEFAULTS: dict[str, Any] = {STAGE: 0, OVERLAP: None, CONTIGUOUS: True, REDUCE_BUCKET: 500_000_000,
                            ALLGATHER_BUCKET: 500_000_000, PREFETCH: 50_000_000, PERSISTENCE: 100_000}
#: config keys a knob controls (not frozen: the knob's value is the setting; accumulation is derived)
KNOB_KEYS = frozenset({*CONFIG_KNOBS, ACCUMULATION, *(a for names in ALIASES.values() for a in names)})
#: ZeRO-3-only knobs (moving them at stage 0-2 changes nothing)
STAGE3_ONLY = (PREFETCH, PERSISTENCE)
#: keys whose "auto" HF fills from the model's hidden size (attune cannot resolve those without the model)
HIDDEN_SIZE_AUTO = (REDUCE_BUCKET, PREFETCH, PERSISTENCE)

#: contract: top-level keys (and whole sections) that decide what is learned
CONTRACT_KEYS = (TRAIN_BATCH, "optimizer", "scheduler", "gradient_clipping", "fp16", "bf16", "bfloat16",
                 "torch_autocast", "data_types")
#: DeepSpeed 0.19.8's default of contract keys where the config leaves them out
CONTRACT_DEFAULTS: dict[str, Any] = {"gradient_clipping": 1.0, "optimizer": None, "scheduler": None,
                                     "fp16.enabled": False, "bf16.enabled": False, "torch_autocast.enabled": False}
#: script flags that are seeds (contract where the launch passes them)
SEED_FLAG = ("seed", "data_seed", "random_seed", "rng_seed", "init_seed")

_BUCKETS = (10_000, 100_000, 1_000_000, 5_000_000, 10_000_000, 20_000_000, 50_000_000, 100_000_000, 200_000_000,
            500_000_000, 1_000_000_000)
_PREFETCH = (0, 10_000, 100_000, 1_000_000, 5_000_000, 10_000_000, 20_000_000, 50_000_000, 100_000_000,
             200_000_000, 500_000_000)
_PERSIST = (0, 1_000, 10_000, 100_000, 1_000_000, 10_000_000, 100_000_000)

KNOBS = [
    Knob(name=MICRO, type="int", values=(1, 2, 4, 8, 16, 32, 64), default=1, semantics=D, group="batch_split",
         description="train_micro_batch_size_per_gpu: samples per forward/backward on each process; "
                     "gradient_accumulation_steps is derived so train_batch_size (micro × accumulation × processes) "
                     "stays fixed. Larger means bigger GEMMs and fewer steps of overhead, more activation memory. "
                     "Under the HF Trainer it is --per_device_train_batch_size."),
    Knob(name=NPROC, type="int", values=(1, 2, 4, 8), default=1, semantics=D, group="batch_split",
         description="data-parallel processes per node: deepspeed --num_gpus, torchrun --nproc_per_node, "
                     "accelerate launch --num_processes. Each takes a slice of the batch (gloo on CPU)."),
    Knob(name=STAGE, type="int", values=(0, 1, 2, 3), default=0, semantics=D,
         description="ZeRO stage: 0 off, 1 partitions optimizer state, 2 also gradients, 3 also parameters. "
                     "Higher stages save memory and add communication (stage 3 gathers parameters every "
                     "forward and backward); the reduction order changes with the stage."),
    Knob(name=OVERLAP, type="choice", values=(None, False, True), default=None, semantics=D,
         description="zero_optimization.overlap_comm: overlap the gradient reduction with the backward pass "
                     "(null: DeepSpeed's default, on for stage 3 only). Uses more memory for double buffers."),
    Knob(name=CONTIGUOUS, type="bool", values=(False, True), default=True, semantics=P,
         description="zero_optimization.contiguous_gradients: copy gradients into one contiguous buffer as "
                     "they are produced (less fragmentation, fewer copies at reduction)."),
    Knob(name=REDUCE_BUCKET, type="int", values=_BUCKETS, default=500_000_000, semantics=D,
         description="zero_optimization.reduce_bucket_size: gradient elements reduced per collective. Tiny "
                     "buckets mean many small messages (latency-bound); huge ones more memory."),
    Knob(name=ALLGATHER_BUCKET, type="int", values=_BUCKETS, default=500_000_000, semantics=P,
         description="zero_optimization.allgather_bucket_size: parameter elements all-gathered per collective "
                     "after the optimizer step (stages 1-2); exact copies, so only speed and memory change."),
    Knob(name=PREFETCH, type="int", values=_PREFETCH, default=50_000_000, semantics=P,
         description="zero_optimization.stage3_prefetch_bucket_size: ZeRO-3 parameter elements fetched ahead "
                     "of use. Small values serialise the all-gathers with compute."),
    Knob(name=PERSISTENCE, type="int", values=_PERSIST, default=100_000, semantics=D,
         description="zero_optimization.stage3_param_persistence_threshold: ZeRO-3 keeps parameters smaller "
                     "than this unpartitioned (no gather per use, more memory). 0 gathers every parameter."),
    Knob(name=OMP_ENV, type="choice", values=("", "1", "2", "4", "8", "16"), default="", semantics=D,
         description="OpenMP threads per process ('' lets attune use the CPU slots divided by the processes)."),
]


# ------------------------------------------------------------------------------------------- constraints

# constraints that compare a knob with the launch's own value look only at knobs the recipe sets (the gate also
# validates a candidate with its knobs stripped, where every knob reads as the catalogue default)

def _settings(r: Recipe) -> Any:
    from attune.frameworks.deepspeed import settings

    try:
        return settings.read(r)
    except Exception:  # noqa: BLE001 - reported by Framework.check; constraints stay quiet
        return None


def _batch_divisible(r: Recipe) -> str | None:
    s = _settings(r)
    if s is None:
        return None
    mb, world = int(r.knob(MICRO)), int(r.knob(NPROC)) * s.nnodes
    if s.train_batch % (mb * world) == 0:
        return None
    legal = [m for m in r.catalogue[MICRO].values if isinstance(m, int) and s.train_batch % (m * world) == 0]
    procs = [n for n in r.catalogue[NPROC].values if isinstance(n, int) and s.train_batch % (mb * n * s.nnodes) == 0]
    return (f"train_batch_size ({s.train_batch} = {s.micro} micro × {s.accumulation} accumulation × {s.world} "
            f"processes) must be divisible by {MICRO} ({mb}) × processes ({world}) so {ACCUMULATION} can keep it; "
            f"legal {MICRO} here: {legal}, legal {NPROC} here: {procs}")


def _procs_fit(r: Recipe) -> str | None:
    return processes_fit_problem(r, NPROC)


def _procs_editable(r: Recipe) -> str | None:
    s = _settings(r)
    if s is None or NPROC not in r.knobs or int(r.knob(NPROC)) == s.nproc or s.nproc_editable:
        return None
    return (f"the launch picks its processes with {s.nproc_fixed_by}, which attune does not rewrite; "
            f"{NPROC} must stay {s.nproc}")


def _stage3_only(r: Recipe) -> str | None:
    s = _settings(r)
    if s is None or int(r.knob(STAGE)) == 3:
        return None
    moved = [k for k in STAGE3_ONLY if k in r.knobs and r.knob(k) != s.knob_values[k]]
    if not moved:
        return None
    return (f"{', '.join(moved)} only act at ZeRO stage 3 ({STAGE} is {r.knob(STAGE)}): moving "
            f"{'it' if len(moved) == 1 else 'them'} changes nothing; restore {', '.join(moved)}")


def _auto_pinned(r: Recipe) -> str | None:
    s = _settings(r)
    if s is None:
        return None
    moved = [k for k in s.auto_knobs if k in r.knobs and r.knob(k) != s.knob_values[k]]
    if not moved:
        return None
    return (f"{', '.join(moved)} {'is' if len(moved) == 1 else 'are'} \"auto\" in the launch's DeepSpeed config "
            "(the HF Trainer fills it from the model's hidden size, which attune does not know); replace \"auto\" "
            "by a number in your config to let attune tune it")


def _threads_fit(r: Recipe) -> str | None:
    t, n = r.knob(OMP_ENV), int(r.knob(NPROC))
    if r.resources.accelerator == "cpu" and t and int(t) * n > 2 * r.resources.devices_per_node:
        return (f"{OMP_ENV} ({t}) × {NPROC} ({n}) oversubscribes the {r.resources.devices_per_node} CPU slots more "
                "than twice; lower it")
    return None


CONSTRAINTS = [
    Constraint("train_batch_divisible", (MICRO, NPROC), _batch_divisible,
               "train_batch_size = micro × accumulation × processes, accumulation derived"),
    Constraint("processes_fit_devices", (NPROC,), _procs_fit, "one process per device slot"),
    Constraint("process_count_editable", (NPROC,), _procs_editable,
               "the launcher's process count is set by an option attune rewrites"),
    Constraint("stage3_knobs_need_stage3", STAGE3_ONLY, _stage3_only, "ZeRO-3 knobs move only at stage 3"),
    Constraint("hf_auto_keys_stay_auto", HIDDEN_SIZE_AUTO, _auto_pinned,
               "keys the HF Trainer fills from the model's hidden size stay \"auto\""),
    Constraint("threads_fit_cores", (OMP_ENV, NPROC), _threads_fit, "threads × processes within twice the CPU slots"),
]


# ------------------------------------------------------------------------------------------- exploratory knobs

class _Effective(dict[str, Any]):
    """Effective knobs: an exploratory knob the recipe does not set reads as ``None`` (the launch's own value)."""

    def __init__(self, data: dict[str, KnobValue], explorable: dict[str, Knob]) -> None:
        super().__init__(data)
        self._explorable = explorable

    def __missing__(self, key: str) -> KnobValue:
        if key in self._explorable:
            return self._explorable[key].default
        raise KeyError(key)

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))


@dataclass
class DeepSpeedCatalogue(Catalogue):
    """The curated knobs plus, looked up by name, one exploratory knob per unclassified setting with a finite domain.

    Exploratory knobs are not listed in ``knobs`` (so the default search space, ``attune knobs`` and every recipe's
    knob section stay the curated ones); the gate finds them by name when a recipe sets one."""

    explorable: dict[str, Knob] = field(default_factory=dict)

    def __contains__(self, name: str) -> bool:
        return name in self.knobs or name in self.explorable

    def __getitem__(self, name: str) -> Knob:
        return self.knobs[name] if name in self.knobs else self.explorable[name]

    def value_problems(self, knobs: dict[str, Any]) -> list[str]:
        problems: list[str] = []
        for name, value in knobs.items():
            if name not in self:
                problems.append(f"knobs.{name}: {self.unknown_knob_message(name)}")
                continue
            msg = self[name].check_value(value)
            if msg:
                problems.append(f"knobs.{name}: {msg}")
        return problems

    def effective(self, knobs: dict[str, Any]) -> dict[str, KnobValue]:
        full: dict[str, KnobValue] = {k.name: k.default for k in self.knobs.values()}
        full.update(knobs)
        return _Effective(full, self.explorable)


def exploratory_knobs() -> dict[str, Knob]:
    """One knob per unclassified setting of deepspeed 0.19.8 with a finite domain (from the recorded schema)."""
    from attune.frameworks.deepspeed import schema
    from attune.frameworks.discover import explore_domain

    out: dict[str, Knob] = {}
    for s in schema.settings():
        if s.name in KNOB_KEYS or s.name.split(".")[0] in CONTRACT_KEYS or s.name in (TRAIN_BATCH, ACCUMULATION):
            continue
        domain = explore_domain(s)
        if domain is None:
            continue
        out[s.name] = Knob(
            name=s.name, type="choice", values=(None, *domain), default=None, semantics=Semantics.NUMERICS_CHANGING,
            numerics_class=EXPLORATORY, group=f"exploratory:{s.name}", versions=VERSIONS,
            description=f"unclassified DeepSpeed setting ({s.source}; type {s.type}, default {s.default!r}); "
                        "null keeps the launch's own value. Frozen unless tuning.explore names it; then a change is "
                        "treated as numerics-changing and owes the loss-equivalence check.")
    return out


def build() -> DeepSpeedCatalogue:
    return DeepSpeedCatalogue(framework="deepspeed", knobs={k.name: k for k in KNOBS}, constraints=list(CONSTRAINTS),
                              versions=VERSIONS, explorable=exploratory_knobs())


__all__ = ["ACCUMULATION", "ALIASES", "CONFIG_KNOBS", "CONTRACT_KEYS", "DEFAULTS", "KNOBS", "MICRO", "NPROC",
           "STAGE", "TRAIN_BATCH", "DeepSpeedCatalogue", "build", "exploratory_knobs"]
