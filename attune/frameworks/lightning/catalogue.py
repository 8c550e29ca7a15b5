"""Knob catalogue of PyTorch Lightning ``LightningCLI`` launches (``framework: lightning``), with the contract
settings of the ``Trainer`` and their Lightning defaults.

Knob names are the settings' own dotted names as LightningCLI spells them (``--data.batch_size`` is the knob
``data.batch_size``), so a knob, a ``--set`` and the user's command line all say the same thing. Names and defaults
checked against the installed lightning 2.6.6 (``Trainer.__init__``'s signature and ``LightningCLI``'s parser):

- ``trainer.accumulate_grad_batches`` defaults to 1, ``trainer.num_nodes`` to 1, ``trainer.devices`` to ``"auto"``
  (one process on a CPU), ``trainer.precision`` to ``None`` (``"32-true"``), ``trainer.max_steps`` to -1;
- ``seed_everything`` is LightningCLI's own setting and defaults to ``true`` (a fresh random seed every run);
- legacy precision spellings (``32``, ``16``, ``"bf16"``, ``64``) mean ``32-true``, ``16-mixed``, ``bf16-mixed`` and
  ``64-true`` (``_convert_precision_to_unified_args``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attune.frameworks.common import processes_fit_problem
from attune.recipe.catalogue import Catalogue, Constraint, Knob, Semantics

if TYPE_CHECKING:
    from attune.recipe.model import Recipe

D = Semantics.NUMERICS_DRIFT
VERSIONS = ">=2.0,<3"

BATCH = "data.batch_size"
ACCUMULATION = "trainer.accumulate_grad_batches"
DEVICES = "trainer.devices"
NODES = "trainer.num_nodes"
WORKERS = "data.num_workers"
PRECISION = "trainer.precision"
STRATEGY = "trainer.strategy"
OMP_ENV = "env.OMP_NUM_THREADS"
#: the numerics class a recipe opts in to (``launch.numerics_opt_in: [precision]``) to let the tuner move precision
PRECISION_CLASS = "precision"

#: the knobs that set a LightningCLI setting of the same name (the env knob sets the environment)
FLAG_KNOBS = (BATCH, DEVICES, WORKERS, PRECISION)
#: settings a knob controls (never frozen: the knob's value is the setting; the accumulation is derived)
KNOB_SETTINGS = frozenset({*FLAG_KNOBS, ACCUMULATION})

PRECISIONS = ("64-true", "32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "transformer-engine",
              "transformer-engine-float16")
#: Lightning's legacy precision spellings → the unified ones
LEGACY_PRECISION = {"64": "64-true", "32": "32-true", "16": "16-mixed", "bf16": "bf16-mixed"}
#: strategies that run one process (the device count cannot grow under them)
SINGLE_PROCESS_STRATEGIES = ("single_device", "single_xla", "dp")

#: Trainer / LightningCLI settings that decide what is learned, with Lightning's defaults (value as the CLI reads it)
CONTRACT: dict[str, Any] = {
    "seed_everything": True,
    "trainer.max_steps": -1,
    "trainer.max_epochs": None,
    "trainer.min_steps": None,
    "trainer.min_epochs": None,
    "trainer.max_time": None,
    "trainer.limit_train_batches": None,
    "trainer.overfit_batches": 0.0,
    "trainer.gradient_clip_val": None,
    "trainer.gradient_clip_algorithm": None,
    "trainer.deterministic": None,
    "trainer.use_distributed_sampler": True,
    "trainer.num_nodes": 1,
    PRECISION: "32-true",
}
#: sections whose every setting decides what is learned (the model's hyper-parameters, the optimizer and schedule
#: LightningCLI adds, the data module's other arguments): contract, with no defaults attune could know
CONTRACT_SECTIONS = ("model", "optimizer", "lr_scheduler", "data")

KNOBS = [
    Knob(name=BATCH, type="int", values=(1, 2, 4, 8, 16, 32, 64), default=8, semantics=D, group="batch_split",
         description="--data.batch_size: samples per forward/backward in each process (the data module's "
                     "batch_size argument). --trainer.accumulate_grad_batches is derived so the global batch "
                     "(batch × accumulation × devices × nodes) stays fixed. Larger means bigger GEMMs and fewer "
                     "Python round trips per step, more activation memory."),
    Knob(name=DEVICES, type="int", values=(1, 2, 4, 8), default=1, semantics=D, group="batch_split",
         description="--trainer.devices: processes per node (on a CPU, data-parallel worker processes that "
                     "Lightning's ddp strategy starts itself, gloo all-reduce). Each takes a slice of the global "
                     "batch; the accumulation is re-derived. Lightning reads the training data of several "
                     "processes through a shuffling DistributedSampler and of one process through the loader's own "
                     "sampler, so only a launch that already runs several processes can change the count."),
    Knob(name=WORKERS, type="choice", values=(None, 0, 1, 2, 4), default=None, semantics=D,
         description="--data.num_workers: background data-loader processes per training process (null: the "
                     "launch does not set it). Only a launch that already passes --data.num_workers can move it "
                     "(attune cannot tell whether your data module takes the argument). Owes the loss check: a "
                     "dataset drawing from the global random generator draws other numbers in workers."),
    Knob(name=PRECISION, type="choice", values=PRECISIONS, default="32-true", semantics=Semantics.NUMERICS_CHANGING,
         numerics_class=PRECISION_CLASS,
         description="--trainer.precision: the arithmetic precision. Training contract: the gate refuses any "
                     "change unless the recipe owner lists 'precision' in launch.numerics_opt_in (then a change "
                     "owes the loss-equivalence check)."),
    Knob(name=OMP_ENV, type="choice", values=("", "1", "2", "4", "8", "16"), default="", semantics=D,
         description="OpenMP threads per process ('' lets attune use the CPU slots divided by the processes)."),
]


def normal_precision(value: Any) -> Any:
    """A precision setting in Lightning's unified spelling (``None`` → ``32-true``, ``bf16`` → ``bf16-mixed``)."""
    if value is None:
        return "32-true"
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    if isinstance(value, float) and value == int(value):
        text = str(int(value))
    return LEGACY_PRECISION.get(text, text)


def _read(r: Recipe) -> Any:
    from attune.frameworks.lightning import settings

    try:
        return settings.read(r)
    except Exception:  # noqa: BLE001 - reported by Framework.check; constraints stay quiet
        return None


def _batch_divisible(r: Recipe) -> str | None:
    s = _read(r)
    if s is None:
        return None
    bs, dev = int(r.knob(BATCH)), int(r.knob(DEVICES))
    world = dev * s.nodes
    if s.global_batch % (bs * world) == 0:
        return None
    legal = [m for m in r.catalogue[BATCH].values if isinstance(m, int) and s.global_batch % (m * world) == 0]
    devices = [n for n in r.catalogue[DEVICES].values if isinstance(n, int) and s.global_batch % (bs * n * s.nodes) == 0]
    return (f"the launch's global batch ({s.global_batch} = {s.batch} per process × {s.accumulation} accumulation × "
            f"{s.devices} devices × {s.nodes} nodes) must be divisible by {BATCH} ({bs}) × devices × nodes ({world}) "
            f"so {ACCUMULATION} can keep it; legal {BATCH} here: {legal}, legal {DEVICES} here: {devices}")


def _devices_fit(r: Recipe) -> str | None:
    n = int(r.knob(DEVICES))
    problem = processes_fit_problem(r, DEVICES)
    if problem:
        return problem
    s = _read(r)
    if s is not None and n > 1 and str(s.native.get(STRATEGY, "")) in SINGLE_PROCESS_STRATEGIES:
        return (f"the launch's --{STRATEGY} {s.native[STRATEGY]} runs one process: {DEVICES} must stay 1 "
                f"(its strategy is the launch's own setting)")
    return None


def _data_order_kept(r: Recipe) -> str | None:
    s = _read(r)
    if s is None:
        return None
    n, world = int(r.knob(DEVICES)), s.devices * s.nodes
    if n == s.devices:
        return None
    if str(s.value("trainer.use_distributed_sampler")).lower() == "false":
        return (f"the launch sets --trainer.use_distributed_sampler false: every process reads the data loader as "
                f"the script builds it, so {DEVICES} {s.devices} → {n} changes which samples a step trains on; keep "
                f"{DEVICES} at {s.devices}")
    if world == 1 or n * s.nodes == 1:
        return (f"{DEVICES} {s.devices} → {n}: Lightning feeds one process from your data loader's own sampler but "
                "several through a DistributedSampler that shuffles the training data (seeded by seed_everything), so "
                "the step's samples and their order change (what is learned); only a launch that already runs several "
                f"processes can re-split them; keep {DEVICES} at {s.devices}")
    return None


def _workers_settable(r: Recipe) -> str | None:
    s = _read(r)
    if s is None:
        return None
    if r.knob(WORKERS) is None:
        if WORKERS in s.native and WORKERS in r.knobs:  # null means "not set": the launch's flag cannot mean it
            return (f"the launch passes --{WORKERS} {s.native[WORKERS]}, so null (not set) is no value for it here; "
                    "keep a number of workers")
        return None
    if WORKERS in s.native:
        return None
    return (f"the launch does not pass --{WORKERS}, so attune cannot tell whether its data module takes it; add "
            f"--{WORKERS} N to your command (its current value) to let the tuner move it, or keep {WORKERS} null")


def _threads_fit(r: Recipe) -> str | None:
    t, n = r.knob(OMP_ENV), int(r.knob(DEVICES))
    if r.resources.accelerator == "cpu" and t and int(t) * n > 2 * r.resources.devices_per_node:
        return (f"{OMP_ENV} ({t}) × {DEVICES} ({n}) oversubscribes the {r.resources.devices_per_node} CPU slots "
                "more than twice; lower it")
    return None


CONSTRAINTS = [
    Constraint("global_batch_divisible", (BATCH, DEVICES), _batch_divisible,
               "global batch = batch × accumulation × devices × nodes, accumulation derived"),
    Constraint("devices_fit", (DEVICES,), _devices_fit, "one process per device slot, under a multi-process strategy"),
    Constraint("data_order_kept", (DEVICES,), _data_order_kept,
               "one process ↔ several changes Lightning's training sampler (and the data order)"),
    Constraint("workers_settable", (WORKERS,), _workers_settable, "num_workers moves only where the launch sets it"),
    Constraint("threads_fit_cores", (OMP_ENV, DEVICES), _threads_fit, "threads × processes within twice the CPU slots"),
]


def build() -> Catalogue:
    return Catalogue(framework="lightning", knobs={k.name: k for k in KNOBS}, constraints=list(CONSTRAINTS),
                     versions=VERSIONS)
