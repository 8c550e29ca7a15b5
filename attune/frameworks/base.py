"""The framework seam: everything attune knows about one training framework, behind one small interface.

A :class:`Framework` provides, for its recipes:

- ``catalogue()``: the knobs a tuner may change (domain, constraints, semantics class, description) and the
  framework versions each entry covers;
- ``contract(recipe)``: the native settings that decide what the model learns, plus the settings attune does
  not model (carried verbatim and *frozen*), as ``field path → ContractField``; the gate refuses any change;
- ``import_launch(argv, ...)``: the user's own launch (a command line, plus a config file where the framework
  has one) → a recipe mapping;
- ``render(recipe)``: recipe → the exact launch (argument list, environment, files); never a shell string;
- ``trial_launch(recipe, request)``: the launch of one trial: ``render`` plus measurement instrumentation that
  does not change what is learned (where logs go, how often a step is logged), and when to stop it;
- ``parser()``: a :class:`LogParser` turning the framework's own output stream into per-step records and
  failure signatures (OOM, NCCL/gloo errors, NaN);
- ``patch_container(...)``: the Kubernetes trial: the user's container with the change applied (``None`` when
  the framework has no Kubernetes renderer);
- ``rules``: playbook priors for its knobs, ``phase_keys``: diagnosis hints, and ``equivalent_layout(recipe)``:
  the re-layout the loss-equivalence check measures rounding drift with.

Frameworks register in :mod:`attune.frameworks`; nothing outside ``attune/frameworks/`` names their knobs.
"""

from __future__ import annotations

import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from attune.errors import RecipeError
from attune.trial import FailureKind

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe
    from attune.sim.model import SimResult
    from attune.trial import Measurement, TrialRequest


# -------------------------------------------------------------------------------------------- launches

@dataclass(frozen=True)
class Launch:
    """An exact launch: argument list, environment additions, files to write first, working directory.

    ``files`` maps a path *as the argument list names it* (relative paths are relative to ``cwd``) to its text.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "env": dict(self.env), "files": dict(self.files), "cwd": self.cwd}


@dataclass(frozen=True)
class TrialLaunch:
    """One trial's launch: what to run, and after how many parsed steps to end it (``None``: it ends itself)."""

    launch: Launch
    stop_after_steps: int | None = None
    instrumentation: tuple[str, ...] = ()  # human-readable list of what the trial adds for measurement


@dataclass(frozen=True)
class SetupStep:
    """One-time set-up a framework's trials share (a JIT op build, a compile cache), run once before the first trial
    so that no trial is billed for it: what it is, the command, and its environment."""

    what: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


# -------------------------------------------------------------------------------------------- contract

@dataclass(frozen=True)
class ContractField:
    """One contract quantity of a recipe: its value, why it is locked, and how to fix a change to it.

    ``kind``: ``contract`` (decides what is learned), ``frozen`` (a native setting attune does not model,
    carried verbatim) or ``derived`` (computed from knobs and settings, e.g. the global batch). ``explain``: where
    the framework words a refusal itself (in the script's own names), the whole message from the baseline's value
    and the candidate's; else the gate's general wording with ``fix`` appended.
    """

    value: Any
    kind: str = "contract"
    depends_on: tuple[str, ...] = ()
    fix: str = ""
    explain: Callable[[Any, Any], str] | None = field(default=None, compare=False)


# -------------------------------------------------------------------------------------------- logs

@dataclass(frozen=True)
class Signature:
    """A failure signature in a framework's output: a regular expression and the failure it means."""

    pattern: str
    kind: FailureKind
    message: str

    def match(self, line: str) -> bool:
        return re.search(self.pattern, line) is not None


#: failure signatures every PyTorch-based framework shares (CUDA/CPU OOM, NCCL and gloo errors)
TORCH_SIGNATURES: tuple[Signature, ...] = (
    Signature(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError", FailureKind.OOM, "out of memory (CUDA)"),
    Signature(r"DefaultCPUAllocator: can't allocate memory|Cannot allocate memory|\bMemoryError\b|CPU out of memory",
              FailureKind.OOM, "out of memory (host)"),
    Signature(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|NCCL WARN .*timeout|"
              r"Watchdog caught collective operation timeout", FailureKind.COMM, "NCCL communication error"),
    Signature(r"Gloo connectFullMesh failed|gloo/transport.*(Connection|closed|reset)|"
              r"\[Gloo\].*(error|timed out)", FailureKind.COMM, "gloo communication error"),
)


class LogParser:
    """Incremental parser of one trial's output: ``feed(line, t)`` for each line as it arrives.

    ``steps`` holds per-step records in the engine's format (``step``, ``step_time_s``, ``tokens``, ``loss``,
    ``grad_norm``, ``peak_mem_mb``, ``phases``); ``errors`` holds ``{"kind", "message"}`` failures; ``done`` is
    set when the framework reported a finished run. Subclasses override :meth:`parse_line`.
    """

    signatures: Sequence[Signature] = TORCH_SIGNATURES

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.errors: list[dict[str, Any]] = []
        self.done = False
        self.first_error_line: str | None = None
        #: what the job's own start-up output says about its training contract (e.g. HF's "Total train batch
        #: size"), as ``name → value``; the engine checks it against the recipe and the baseline's
        self.reported: dict[str, Any] = {}
        self._error_kinds: set[str] = set()

    def feed(self, line: str, t: float) -> None:
        line = line.rstrip("\r\n")
        for sig in self.signatures:
            if sig.kind not in self._error_kinds and sig.match(line):
                self._error_kinds.add(sig.kind)
                self.errors.append({"kind": sig.kind, "message": f"{sig.message}: {line.strip()[:300]}"})
        if self.first_error_line is None and _looks_like_error(line):
            self.first_error_line = line.strip()[:300]
        self.parse_line(line, t)

    def parse_line(self, line: str, t: float) -> None:  # noqa: B027 - optional hook
        """Turn one line into step records or failures (default: failure signatures only)."""


_ERROR_LINE = re.compile(r"^\s*(\w+\.)*\w*(Error|Exception)\b[:(]|^\s*(RuntimeError|ValueError|TypeError|KeyError|"
                         r"AssertionError|ImportError|ModuleNotFoundError|FileNotFoundError)\b")


def _looks_like_error(line: str) -> bool:
    return bool(_ERROR_LINE.search(line))


@dataclass
class Observation:
    """What a finished (or ended) trial showed: step records, failures, whether the framework said it finished."""

    steps: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    done: bool
    first_error: str | None = None
    reported: dict[str, Any] = field(default_factory=dict)  # LogParser.reported


# -------------------------------------------------------------------------------------------- playbook

class Tier(IntEnum):
    """The playbook's order of knob families: fit before scale before overlap before micro-tuning."""

    LESSON = -1
    FIT = 0
    SCALE = 1
    OVERLAP = 2
    MICRO = 3


@dataclass(frozen=True)
class Rule:
    """Prior knowledge about moving one knob in one direction (the playbook's rule table rows)."""

    tier: int
    gain: float = 0.01
    helps: dict[str, float] = field(default_factory=dict)  # bottleneck[:sub] -> expected gain when diagnosed
    hurts: tuple[str, ...] = ()
    cost: float = 1.0
    memory: int = 0  # +1 uses more memory, -1 saves memory


Rules = dict[tuple[str, str], Rule]


# -------------------------------------------------------------------------------------------- the seam

def reported_mismatches(source: str, expected: Mapping[str, Any], reported: Mapping[str, Any], *,
                        spaced: bool = False) -> list[str]:
    """One line per name ``reported`` holds with another value than ``expected`` ("DeepSpeed reported
    train_batch_size = 32, the recipe reads 64"; ``spaced`` writes the name with spaces, as HF prints it)."""
    return [f"{source} reported {name.replace('_', ' ') if spaced else name} = {reported[name]}, the recipe reads "
            f"{value}" for name, value in expected.items() if name in reported and reported[name] != value]


class Framework(ABC):
    """One training framework behind the seam. Subclasses set the class variables and the methods they support."""

    name: ClassVar[str]
    title: ClassVar[str]
    #: framework versions the catalogue, importer and parser cover, as a PEP 440 specifier (e.g. ``>=5,<6``)
    versions: ClassVar[str] = ""
    #: the Python distribution that is this framework (its installed version is what a run's environment and a card
    #: record, and what re-running a card's claim needs); None when it is no Python package
    distribution: ClassVar[str | None] = None
    #: recipes carry the user's own launch (``recipe.launch``); model and training live inside it
    launch_based: ClassVar[bool] = False
    #: recipes carry attune's ``model`` / ``training`` sections *and* may carry the user's native launch they were
    #: derived from (``recipe.launch``, rendered back with the knobs applied), e.g. an imported Megatron-LM command
    native_launch: ClassVar[bool] = False
    #: trial backends that can run this framework's recipes (``local`` real processes, ``sim`` the model)
    backends: ClassVar[tuple[str, ...]] = ("local",)
    #: playbook priors for this framework's knobs
    rules: ClassVar[Rules] = {}
    #: diagnosis hints: this framework's phase keys → the generic phase they mean (forward, comm, data, ...)
    phase_keys: ClassVar[dict[str, str]] = {}
    #: hints the gate adds when a contract field is changed (field path → advice)
    field_hints: ClassVar[dict[str, str]] = {}
    #: exit statuses of a local trial that mean a known failure (a trainer of attune's own reports them so)
    exit_codes: ClassVar[dict[int, FailureKind]] = {}
    #: its recipes declare their own knobs in their launch (``command``: :meth:`launch_catalogue`); its own
    #: ``catalogue()`` then lists the roles a declared knob may have, not knobs
    declared_knobs: ClassVar[bool] = False
    #: the layout grid a grid-search baseline sweeps (axes, the interleaving knob, the model-parallel knobs, the
    #: micro-batch knob: :mod:`attune.policies.grid`); None when the framework declares none
    layout_grid: ClassVar[dict[str, Any] | None] = None

    # -- catalogue and contract ----------------------------------------------------------------------------
    @abstractmethod
    def catalogue(self) -> Catalogue:
        """The knob catalogue (built once by the registry)."""

    def launch_catalogue(self, launch: Any) -> Catalogue | None:
        """The catalogue of recipes with this ``launch`` (a :class:`~attune.recipe.model.NativeLaunch` or its
        mapping), for a framework whose recipes declare their own knobs (``command``); None: the framework's one
        catalogue."""
        return None

    def launch_problems(self, launch: Any) -> list[str]:
        """Why a ``launch`` has no catalogue of its own where the framework needs one (``command`` without its
        declaration), as ``field: message`` lines; checked before the recipe's knobs."""
        return []

    def contract(self, recipe: Recipe) -> dict[str, ContractField]:
        """Contract quantities beyond the recipe's ``model`` and ``training`` sections (native, frozen, derived)."""
        return {}

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        """Tokens per optimizer step, where the recipe says (used to turn step times into throughput)."""
        return recipe.training.tokens_per_step if recipe.training is not None else None

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Changes that would only re-split the work (same math, other rounding), nearest first, for the loss check's
        drift reference; none whose recipe has a signature in ``avoid`` (the candidate being judged is never its own
        reference). The gate takes the first it admits as pure reordering of sums."""
        return []

    def simulate(self, recipe: Recipe, *, seed: int | None = None, noise_sigma: float = 0.0) -> SimResult:
        """One steady-state training step of ``recipe`` by this framework's performance model (the ``sim`` backend's
        capability: a framework that lists ``sim`` in ``backends`` implements it). Raises ``ValueError`` here."""
        raise ValueError(f"the simulator has no performance model of framework: {self.name} recipes")

    def model_flops_per_token(self, recipe: Recipe) -> float | None:
        """Forward + backward model FLOPs per token by this framework's own count (a card's MFU); None: the card
        uses the generic 6·N_active + attention count."""
        return None

    def check(self, recipe: Recipe) -> list[str]:
        """Framework-specific problems of a whole recipe (``field: message`` lines); empty when fine."""
        return []

    def setup(self, recipe: Recipe, *, python: str = sys.executable) -> SetupStep | None:
        """The one-time set-up this recipe's local trials share, run before the first of them; None when none."""
        return None

    def loss_resolution(self, recipe: Recipe, loss: float, reported: Mapping[str, Any] | None = None) -> float | None:
        """Half the last unit of a ``loss`` as it reached attune from a trial that ``reported`` this
        (:attr:`Measurement.reported`): what a loss check cannot see below; None at full precision."""
        return None

    def compute_precision(self, recipe: Recipe) -> str:
        """The precision ``recipe``'s forward pass runs in (a key of :data:`attune.gate.equivalence.EPSILON`):
        what rounding can move its first-step loss by under another layout. fp32 unless the framework knows
        better."""
        return "fp32"

    def random_stream_hazards(self, recipe: Recipe) -> list[str]:
        """What this framework can see in ``recipe`` that makes a layout change draw other samples or another
        random stream (dropout laid out per micro-batch, an evaluation drawing from the training generator) or
        print another quantity (one micro-step's loss): advance warnings, one sentence each. The first-step
        comparison of the loss check decides; these name the likely cause when it refuses."""
        return []

    def cannot_matter(self, best: Recipe, candidate: Recipe, measured: Measurement | None) -> str | None:
        """Why the move from ``best`` to ``candidate`` cannot change this recipe's throughput (a DDP bucket on one
        process, a ZeRO bucket with nothing to reduce, data-loader workers when loading takes no time), from the
        recipes and what ``measured`` (the best's last measurement) reported; ``None`` when it may. The engine does
        not run such a move, and the report flags a kept change that turns out to be one."""
        return None

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        """Everything knowable without running that would make a trial of ``recipe`` on ``backend`` fail here
        (unsupported precision or accelerator, missing files or executables), as ``field: message`` lines."""
        if backend not in self.backends:
            return [f"framework: {self.name} recipes run on the {' or '.join(self.backends)} backend, not "
                    f"{backend}; use --backend {self.backends[0]}"]
        return []

    def set_native(self, recipe_data: dict[str, Any], name: str, value: Any) -> bool:
        """Apply a native setting in the framework's own name (``--set learning_rate=1e-3``) to a recipe mapping's
        launch, in place; False when ``name`` is no native setting of this framework (then it is read as a knob)."""
        return False

    # -- import / render -----------------------------------------------------------------------------------
    def import_launch(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None,
                      options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The user's launch → a recipe mapping (validated by the caller)."""
        raise RecipeError(f"the {self.name} framework cannot import a launch command; write its recipe YAML "
                          f"(see `attune knobs --framework {self.name}`)")

    def import_container(self, container: Mapping[str, Any], *, job_spec: Mapping[str, Any] | None = None,
                         options: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """A Kubernetes training container → a recipe mapping, where the framework reads containers its own way;
        None: the operator imports the container's command line with :meth:`import_launch`."""
        return None

    def render(self, recipe: Recipe) -> Launch:
        """The exact launch a user runs for ``recipe`` (what ``attune render`` prints)."""
        raise RecipeError(f"the {self.name} framework has no launch renderer")

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        """The launch of one local trial in ``trial_dir`` (defaults to :meth:`render`, ended after the request's
        steps). ``python`` is the interpreter attune runs under; ``metrics_port`` a Prometheus port, if asked."""
        return TrialLaunch(self.render(recipe), stop_after_steps=request.steps)

    # -- logs ----------------------------------------------------------------------------------------------
    def parser(self, recipe: Recipe) -> LogParser:
        """A fresh parser of this framework's output for one trial of ``recipe``."""
        return LogParser()

    def collect(self, parser: LogParser, trial_dir: Path) -> Observation:
        """What the trial showed (default: what the parser read from its output)."""
        return Observation(steps=list(parser.steps), errors=list(parser.errors), done=parser.done,
                           first_error=parser.first_error_line, reported=dict(parser.reported))

    #: names in :attr:`LogParser.reported` that are training contract: every trial must report the baseline's
    reported_contract: ClassVar[tuple[str, ...]] = ()

    def report_problems(self, recipe: Recipe, reported: Mapping[str, Any]) -> list[str]:
        """Where what a trial's own output reported (:attr:`LogParser.reported`) disagrees with what attune read
        from ``recipe`` (e.g. HF's logged batch per device against the recipe's knob): one line each."""
        return []

    # -- Kubernetes ----------------------------------------------------------------------------------------
    #: True when :meth:`patch_job` is implemented (admission refuses TuningRuns of frameworks without one)
    k8s: ClassVar[bool] = False
    #: where the operator reads a Kubernetes trial's step times and losses: ``"logs"`` (the master pod's log,
    #: timestamped by the kubelet, through :meth:`pod_parser`) or ``"prometheus"`` (metrics the trial serves)
    metrics_source: ClassVar[str] = "logs"

    def patch_job(self, recipe: Recipe, job: dict[str, Any], container: dict[str, Any], *, steps: int,
                  metrics_port: int, linger_s: float) -> None:
        """Apply ``recipe``'s knobs to a Kubernetes trial job and its training container, in place."""
        raise RecipeError(f"the {self.name} framework has no Kubernetes renderer: its recipes can be tuned with "
                          f"`attune tune` on {', '.join(self.backends)} backends only")

    def pod_parser(self, recipe: Recipe) -> LogParser:
        """Parser of a trial pod's log (step times from the pod's own output)."""
        return self.parser(recipe)


__all__ = [
    "TORCH_SIGNATURES",
    "ContractField",
    "Framework",
    "Launch",
    "LogParser",
    "Observation",
    "Rule",
    "Rules",
    "Signature",
    "Tier",
    "TrialLaunch",
    "reported_mismatches",
]


def moved(best: Recipe, candidate: Recipe) -> dict[str, tuple[Any, Any]]:
    """Knobs whose effective value differs between two recipes: name → (before, after)."""
    a, b = best.effective_knobs, candidate.effective_knobs
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def only_moves(change: Mapping[str, tuple[Any, Any]], knobs: Sequence[str]) -> bool:
    """True when every knob that moved is one of ``knobs`` (and one did)."""
    return bool(change) and set(change) <= set(knobs)


def gradient_mb(parameters: Any, bytes_per_gradient: int = 4) -> float | None:
    """Megabytes of gradients of ``parameters`` trainable parameters (fp32 by default), or None when unknown."""
    try:
        n = int(str(parameters).replace(",", ""))
    except (TypeError, ValueError):
        return None
    return n * bytes_per_gradient / 2**20 if n > 0 else None


def bucket_cannot_matter(change: Mapping[str, tuple[Any, Any]], knob: str, grads_mb: float | None, *,
                         default_mb: float = 25.0) -> str | None:
    """A DDP gradient bucket cap that holds all the gradients before and after the move (an unset cap is DDP's
    ``default_mb``): one bucket either way."""
    if grads_mb is None or set(change) != {knob}:
        return None
    before, after = change[knob]
    caps = [default_mb if c is None else float(c) for c in (before, after)]
    if min(caps) >= grads_mb:
        return (f"{knob} {before} → {after}: the model's gradients ({grads_mb:.1f} MB) fit in one bucket either "
                "way, so DDP reduces them in one bucket before and after")
    return None

