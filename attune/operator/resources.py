"""The custom resources' schemas: ``TuningRun`` and ``TuningTrial`` (group ``attune.dev``, ``v1alpha1``).

These pydantic models are the single source of the CRDs (:mod:`attune.operator.crdgen` renders them into
``crds/``) and of the operator's parsing. Fields are camelCase on the wire, snake_case in Python.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from attune.recipe.model import Accelerator

GROUP = "attune.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
RUN_PLURAL = "tuningruns"
TRIAL_PLURAL = "tuningtrials"
LABEL_RUN = f"{GROUP}/run"
LABEL_TRIAL = f"{GROUP}/trial"
LABEL_INDEX = f"{GROUP}/index"
FINALIZER = f"{GROUP}/finalizer"

#: spec fields a running TuningRun may change; every other edit is refused
MUTABLE_WHILE_RUNNING = ("budget", "agent", "suspend")
#: phases in which the spec is frozen (everything except the mutable fields above)
ACTIVE_PHASES = ("Pending", "Baseline", "Tuning", "Suspended")

RunPhase = Literal["Pending", "Baseline", "Tuning", "Suspended", "Succeeded", "Failed"]
TrialPhase = Literal["Pending", "Running", "Succeeded", "Failed"]
TrialKindName = Literal["baseline", "candidate", "confirm", "reference", "calibration"]


class Wire(BaseModel):
    """Base of every resource model: camelCase aliases, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, Any]:
        """The JSON-ready camelCase mapping, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class ConfigMapRef(Wire):
    """A recipe stored in a ConfigMap of the run's namespace."""

    name: str = Field(min_length=1, description="ConfigMap name")
    key: str = Field(default="recipe.yaml", description="key holding the recipe YAML")


def template_frameworks() -> list[str]:
    """Frameworks a recipe can be imported for from a trial template: they run the user's own launch
    (``launch_based``) and render Kubernetes trials (``k8s``). Read from the framework registry."""
    from attune import frameworks

    return [n for n in frameworks.names() if frameworks.get(n).launch_based and frameworks.get(n).k8s]


def _enum(values: list[str]) -> dict[str, Any]:
    return {"enum": values} if values else {}


class TemplateRecipe(Wire):
    """The baseline recipe imported from the trial template: its training container's command and args."""

    framework: str = Field(description="framework of the container's launch (one that runs the user's own command "
                                       "and has a Kubernetes renderer)",
                           json_schema_extra=_enum(template_frameworks()))
    name: str | None = Field(default=None, description="the recipe's name (default: the TuningRun's name)")
    devices_per_node: int | None = Field(
        default=None, ge=1, description="accelerators each trial pod trains on (default: the template's "
                                        "nprocPerNode when it is a number, else 1)")
    tokens_per_sample: int | None = Field(
        default=None, ge=1, description="tokens in one training sample, where the framework's log counts none")
    accelerator: Accelerator | None = Field(default=None, description="accelerator kind of the trial pods "
                                                                      "(default cpu)")


class RecipeSource(Wire):
    """Where the baseline recipe comes from (exactly one): inline, a ConfigMap key, or the trial template."""

    inline: dict[str, Any] | None = Field(default=None, description="the recipe mapping itself")
    config_map_ref: ConfigMapRef | None = Field(default=None, description="a ConfigMap holding the recipe YAML")
    from_template: TemplateRecipe | None = Field(
        default=None, description="import the recipe from the trial template's training container (its command "
                                  "and args are the user's launch)")


class Objective(Wire):
    """What is maximised and the smallest gain that counts."""

    metric: Literal["tokens_per_second_per_device"] = Field(
        default="tokens_per_second_per_device", description="throughput figure to maximise")
    min_gain: float = Field(default=0.02, ge=0, description="smallest relative gain ever accepted")


class BudgetSpec(Wire):
    """Limits of the run (may change while it runs)."""

    accelerator_hours: float = Field(gt=0, description="accelerator-hours the run may spend, failed trials included")
    max_trials: int | None = Field(default=None, ge=1, description="stop after this many launched trials")
    max_failed_trials: int = Field(default=3, ge=1, description="stop after this many failed trials")
    trial_deadline_seconds: int = Field(default=1800, ge=10, description="wall-clock limit of one trial, pending included")


class MetricsSpec(Wire):
    """How a trial is measured: Prometheus (the trainer's and DCGM's metrics), or the master pod's log."""

    prometheus_url: str | None = Field(
        default=None, description="base URL of the Prometheus HTTP API, e.g. http://prometheus:9090; required for "
                                  "frameworks whose trials serve metrics (torch), unused where trials are measured "
                                  "from their pod logs")
    pod_label: str = Field(default="pod", description="label naming the pod (exported_pod without honorLabels)")
    namespace_label: str = Field(default="namespace", description="label naming the namespace")
    metrics_port: int = Field(default=9464, ge=1, le=65535, description="rank R of a trial serves /metrics on port+R")
    warmup_steps: int = Field(default=2, ge=0, description="optimizer steps dropped before the measurement window")
    measure_steps: int = Field(default=6, ge=2, description="optimizer steps in the measurement window")
    warmup_seconds: int = Field(default=0, ge=0, description="seconds after job start ignored for GPU utilisation")
    baseline_repeats: int = Field(default=2, ge=1, description="baseline runs that learn the noise floor")
    confirm: bool = Field(default=True, description="re-run a winning candidate once before keeping it")
    paired: bool = Field(default=True, description="decide a promising candidate on an A-B-A paired measurement: a "
                                                   "run of the best between the candidate's two runs")
    timeout_seconds: float = Field(default=10, gt=0, description="timeout of one Prometheus query")
    linger_seconds: float = Field(
        default=30, ge=0, le=600,
        description="after its last step a trial waits at most this long for Prometheus to scrape its final "
                    "metrics (default: two 15 s scrape intervals); the loss check needs every step's loss")


class AgentSpec(Wire):
    """The proposal agent: a sidecar over HTTP, with a local fallback policy (may change while running)."""

    endpoint: str | None = Field(default="http://127.0.0.1:8081", description="agent sidecar base URL; none: local")
    policy: Literal["playbook", "llm", "hybrid", "coordinate", "random"] = Field(
        default="playbook", description="policy the sidecar is asked to use")
    fallback_policy: Literal["playbook", "coordinate", "random"] = Field(
        default="playbook", description="local policy used while the sidecar is unreachable")
    timeout_seconds: float = Field(default=30, gt=0, description="timeout of one proposal request")
    seed: int = Field(default=0, description="seed of randomised policies")


class TuningRunSpec(Wire):
    """What to tune, how to run a trial, and within which limits."""

    recipe: RecipeSource = Field(description="the user's baseline recipe")
    trial_template: dict[str, Any] = Field(
        description="a kubeflow.org/v1 PyTorchJob; image, resources, volumes and node selectors are kept as given")
    container_name: str = Field(default="pytorch", description="the training container of the template")
    search_space: list[str] = Field(
        default_factory=list, description="knobs the tuner may change, in priority order; empty: the recipe's")
    objective: Objective = Field(default_factory=Objective)
    budget: BudgetSpec
    metrics: MetricsSpec
    agent: AgentSpec = Field(default_factory=AgentSpec)
    suspend: bool = Field(default=False, description="launch no new trial while true")


class Condition(Wire):
    """A status condition (the metav1.Condition shape)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str = ""


class TrialRefSummary(Wire):
    """A trial and its measured throughput."""

    trial: str = ""
    throughput: float | None = Field(default=None, description="tokens/s per device")
    speedup: float | None = Field(default=None, description="throughput / baseline throughput")
    knobs: dict[str, Any] | None = Field(default=None, description="knobs that differ from the baseline")


class BudgetStatus(Wire):
    """Accelerator-hours charged so far."""

    hours_used: float = 0.0
    hours_limit: float = 0.0


class TrialCounts(Wire):
    """How many trials ended which way (refusals launched nothing)."""

    total: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    refused: int = 0


class TuningRunStatus(Wire):
    """Where the run stands; the operator's whole state (restart-safe)."""

    phase: RunPhase = "Pending"
    message: str = ""
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    baseline: TrialRefSummary | None = None
    best: TrialRefSummary | None = None
    budget: BudgetStatus | None = None
    trials: TrialCounts | None = None
    current_trial: str | None = Field(default=None, description="the trial running now")
    tuned_recipe: dict[str, Any] | None = Field(default=None, description="the best recipe found (when finished)")
    records: list[dict[str, Any]] = Field(
        default_factory=list, description="the engine's trial records, in order (the run's journal)")
    baseline_recipe: dict[str, Any] | None = Field(
        default=None, description="the baseline recipe as resolved when the run started (ConfigMap edits do not move it)")
    spec_hash: str | None = Field(default=None, description="digest of the spec fields frozen while running")
    start_time: str | None = None
    completion_time: str | None = None


class Proposal(Wire):
    """Where a trial's change came from and why."""

    source: str = Field(default="", description="baseline, gate, agent policy name, or a fallback")
    rationale: str = Field(default="", description="why the proposer expects it to help")


class TuningTrialSpec(Wire):
    """One attempted configuration of a run."""

    run_ref: str = Field(min_length=1, description="name of the owning TuningRun")
    index: int = Field(ge=1, description="trial number within the run (the engine's record id)")
    kind: TrialKindName = Field(description="baseline, candidate, confirm, reference (the best, re-run between a "
                                            "candidate's two runs) or calibration")
    change: dict[str, Any] = Field(default_factory=dict, description="knob → value changed from the parent")
    knobs: dict[str, Any] = Field(default_factory=dict, description="full effective knob assignment")
    proposal: Proposal = Field(default_factory=Proposal)


class JobRef(Wire):
    """The job that runs a trial."""

    api_version: str = "kubeflow.org/v1"
    kind: str = "PyTorchJob"
    name: str = ""


class TuningTrialStatus(Wire):
    """What happened to one trial."""

    phase: TrialPhase = "Pending"
    job_ref: JobRef | None = None
    start_time: str | None = None
    completion_time: str | None = None
    outcome: str | None = Field(default=None, description="succeeded, oom, crashed, timed_out, diverged, interrupted")
    measurements: dict[str, Any] | None = Field(default=None, description="steady-state figures (the engine's Measurement)")
    verdict: dict[str, Any] | None = Field(default=None, description="the gate's verdict")
    loss_check: dict[str, Any] | None = Field(default=None, description="loss-equivalence result, if one ran")
    decision: str = ""
    message: str = ""
    hours_charged: float = 0.0
    conditions: list[Condition] = Field(default_factory=list)
