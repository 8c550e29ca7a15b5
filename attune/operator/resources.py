"""The custom resources' schemas: ``TuningRun`` and ``TuningTrial`` (group ``attune.dev``, ``v1alpha1``).

These pydantic models are the single source of the CRDs (:mod:`attune.operator.crdgen` renders them into
``crds/``, with CEL rules from :data:`EDIT_POLICY`) and of the operator's parsing. Fields are camelCase on the wire,
snake_case in Python.

**The spec is frozen once the run exists**, except what :data:`EDIT_POLICY` names: ``spec.suspend`` may change, and
``spec.budget.acceleratorHours``, ``maxTrials`` and ``maxFailedTrials`` may increase. Three places enforce it, from
this one table: the CRD's CEL rules (``x-kubernetes-validations`` with ``oldSelf``; the opaque ``trialTemplate`` and
``recipe.inline`` are compared whole: CEL can select no field inside them), the validating webhook
(:func:`spec_edit_problems`, which sees everything), and the operator itself, which runs on the spec it accepted
(``status.acceptedSpec``) and reports an edit that got past both (CRDs served from before a rule, a webhook down) as
``SpecAccepted=False`` (:func:`merge_allowed_edits`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from attune.operator.outcomes import RunOutcome
from attune.recipe.model import Accelerator

GROUP = "attune.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
RUN_PLURAL = "tuningruns"
TRIAL_PLURAL = "tuningtrials"
LABEL_RUN = f"{GROUP}/run"
LABEL_TRIAL = f"{GROUP}/trial"
LABEL_INDEX = f"{GROUP}/index"
#: the longest a run may make the operator wait on one Prometheus query and on one proposal (its steps share threads
#: with the other runs of its namespace)
MAX_METRICS_TIMEOUT_S = 30
MAX_AGENT_TIMEOUT_S = 120
#: how long a trial's pods may wait to run when budget.pendingDeadlineSeconds is unset and Kueue does not queue it
DEFAULT_PENDING_DEADLINE_S = 3600
#: a Prometheus label name (its data model): the only text a run's settings put into a PromQL selector unquoted, so
#: nothing else (a quote, a comma, another matcher) can reach the query from a tenant's run
PROMETHEUS_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
#: the longest label value the API accepts (k8s.io/apimachinery/pkg/util/validation: LabelValueMaxLength)
LABEL_VALUE_MAX = 63
FINALIZER = f"{GROUP}/finalizer"


def label_value(name: str) -> str:
    """``name`` as a label value the API accepts: itself up to 63 characters, else its first 50 (trimmed to end in an
    alphanumeric) and 12 hex digits of its SHA-256, so two long names never share a value. A run or trial name may
    have 253 characters; a label value longer than 63 makes the API refuse the object (and a selector with it)."""
    if len(name) <= LABEL_VALUE_MAX:
        return name
    import hashlib

    return name[:50].rstrip("-._") + "-" + hashlib.sha256(name.encode()).hexdigest()[:12]

LABEL_QUEUE = "kueue.x-k8s.io/queue-name"
#: how a spec field (wire path) may change once the run exists; every field not named here is frozen
EDIT_POLICY: dict[str, Literal["free", "increase"]] = {
    "suspend": "free",
    "budget.acceleratorHours": "increase",
    "budget.maxTrials": "increase",  # absent: no limit (the largest)
    "budget.maxFailedTrials": "increase",
    "ttlSecondsAfterFinished": "free",  # when a finished run is deleted concerns no trial
}
#: most refusals a run's status keeps (each TuningTrial keeps its own record; refused proposals have no trial)
REFUSED_KEPT = 25
#: most loss (and gradient-norm) values a trial's record keeps; a longer curve is dropped (no loss check on it)
CURVE_CAP = 4096

RunPhase = Literal["Pending", "Baseline", "Tuning", "Suspended", "Succeeded", "Failed"]
TrialPhase = Literal["Pending", "Queued", "Running", "Succeeded", "Failed"]
TrialKindName = Literal["baseline", "candidate", "confirm", "reference", "calibration", "certify"]


class Wire(BaseModel):
    """Base of every resource model: camelCase aliases, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, Any]:
        """The JSON-ready camelCase mapping, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


NAME = 253  # longest Kubernetes object name (DNS subdomain)
TEXT = 1024
URL = 2048


class ConfigMapRef(Wire):
    """A recipe stored in a ConfigMap of the run's namespace."""

    name: str = Field(min_length=1, max_length=NAME, description="ConfigMap name")
    key: str = Field(default="recipe.yaml", max_length=NAME, description="key holding the recipe YAML")


class KeyRef(Wire):
    """One key of a Secret or ConfigMap in the run's namespace."""

    name: str = Field(min_length=1, max_length=NAME, description="object name")
    key: str = Field(min_length=1, max_length=NAME, description="key within its data")


class BasicAuthRef(Wire):
    """HTTP basic-auth credentials held in a Secret of the run's namespace."""

    name: str = Field(min_length=1, max_length=NAME, description="Secret name")
    username_key: str = Field(default="username", max_length=NAME)
    password_key: str = Field(default="password", max_length=NAME)


class PrometheusAccess(Wire):
    """How the operator authenticates to Prometheus (or Thanos, Cortex, Mimir) and trusts its certificate."""

    bearer_token_secret_ref: KeyRef | None = Field(
        default=None, description="Secret key holding a bearer token (sent as Authorization: Bearer)")
    basic_auth_secret_ref: BasicAuthRef | None = Field(default=None, description="Secret holding basic-auth "
                                                                                "credentials")
    ca_config_map_ref: KeyRef | None = Field(
        default=None, description="ConfigMap key holding the PEM CA bundle that signs Prometheus's certificate")
    ca_secret_ref: KeyRef | None = Field(default=None, description="the CA bundle from a Secret key instead")
    tenant: str | None = Field(default=None, max_length=TEXT, pattern=r"^[A-Za-z0-9_.|-]+$",
                               description="deprecated: the platform sets the X-Scope-OrgID of each namespace (the "
                                           "operator's --prometheus-org); admitted only when it names that one")

    def has_credentials(self) -> bool:
        """Whether a token or basic-auth credentials would be sent (only over https: see attune.operator.urls)."""
        return self.bearer_token_secret_ref is not None or self.basic_auth_secret_ref is not None


def template_frameworks() -> list[str]:
    """Frameworks a recipe can be imported for from a trial template: they run the user's own launch
    (``launch_based``, or ``native_launch``: a recipe that carries the launch it was imported from, as Megatron's)
    and render Kubernetes trials (``k8s``); not one whose recipes declare their own knobs (``command``: a container
    carries no declaration, so its recipe comes inline). Read from the framework registry."""
    from attune import frameworks

    return [n for n in frameworks.names()
            if (frameworks.get(n).launch_based or frameworks.get(n).native_launch) and frameworks.get(n).k8s
            and not frameworks.get(n).declared_knobs]


def _enum(values: list[str]) -> dict[str, Any]:
    return {"enum": values} if values else {}


class TemplateRecipe(Wire):
    """The baseline recipe imported from the trial template: its training container's command and args."""

    framework: str = Field(max_length=64, description="framework of the container's launch (one that runs the user's own command "
                                       "and has a Kubernetes renderer)",
                           json_schema_extra=_enum(template_frameworks()))
    name: str | None = Field(default=None, max_length=NAME, description="the recipe's name (default: the TuningRun's name)")
    devices_per_node: int | None = Field(
        default=None, ge=1, description="accelerators each trial pod trains on (default: the template's "
                                        "nprocPerNode when it is a number, else the accelerators rank 0's pod "
                                        "requests, else 1); a trial is charged for what its pods request")
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
    """Limits of the run (acceleratorHours, maxTrials and maxFailedTrials may increase once it runs)."""

    accelerator_hours: float = Field(gt=0, description="accelerator-hours the run may spend, failed trials included")
    max_trials: int | None = Field(default=None, ge=1, description="stop after this many launched trials")
    max_failed_trials: int = Field(default=3, ge=1, description="stop after this many failed trials (interrupted "
                                                                "trials, e.g. a job deleted by someone else, do not count)")
    trial_deadline_seconds: int = Field(
        default=1800, ge=10, description="limit of one trial's running time, counted (and charged) from when its pods "
                                         "run; time waiting for accelerators is not counted")
    pending_deadline_seconds: int | None = Field(
        default=None, ge=10, description="how long a trial may wait for its pods to run (Kueue admission, "
                                         "scheduling, image pulls), uncharged; then the run stops (a trial "
                                         "waiting is never a failure: it is recorded interrupted, uncharged). "
                                         "Unset: 3600 s for a job the scheduler places, none for a job Kueue "
                                         "admits (a queued workload waits its turn)")

    def pending_deadline(self, kueue: bool) -> int | None:
        """The pending deadline in force for a trial whose job Kueue admits (``kueue``) or not."""
        if self.pending_deadline_seconds is not None:
            return self.pending_deadline_seconds
        return None if kueue else DEFAULT_PENDING_DEADLINE_S


class DcgmLabels(Wire):
    """The labels naming a GPU's pod and namespace on NVIDIA's DCGM exporter series. The exporter writes the pod using
    the GPU as ``pod``/``namespace``; scraped by its chart's ServiceMonitor (``honorLabels: false``, the default),
    Prometheus keeps its own target labels (the exporter's pod) under those names and renames the exporter's to
    ``exported_pod``/``exported_namespace``: this default. With ``honorLabels: true``: ``pod``/``namespace``."""

    pod_label: str = Field(default="exported_pod", max_length=TEXT, pattern=PROMETHEUS_LABEL_NAME,
                           description="label naming the GPU's pod on DCGM series (pod with honorLabels: true)")
    namespace_label: str = Field(default="exported_namespace", max_length=TEXT, pattern=PROMETHEUS_LABEL_NAME,
                                 description="label naming the GPU pod's namespace on DCGM series")


class MetricsSpec(Wire):
    """How a trial is measured: Prometheus (the trainer's and DCGM's metrics), or the master pod's log."""

    prometheus_url: str | None = Field(
        default=None, max_length=URL,
        description="base URL of the Prometheus HTTP API, e.g. http://prometheus-operated.monitoring.svc:9090; "
                    "required for frameworks whose trials serve metrics (torch), unused where trials are measured from "
                    "their pod logs. Only hosts the operator allows are fetched (cluster-local by default)")
    prometheus: PrometheusAccess | None = Field(default=None, description="authentication, CA and tenant of "
                                                                          "prometheusUrl")
    pod_label: str = Field(default="pod", max_length=TEXT, pattern=PROMETHEUS_LABEL_NAME,
                           description="label naming the pod on the trainer's series (the chart's PodMonitor: pod); "
                                       "a Prometheus label name")
    namespace_label: str = Field(default="namespace", max_length=TEXT, pattern=PROMETHEUS_LABEL_NAME,
                                 description="label naming the namespace on the trainer's series")
    dcgm: DcgmLabels = Field(default_factory=DcgmLabels, description="the labels of the DCGM exporter's series, "
                                                                     "which its own scrape decides")
    metrics_port: int = Field(default=9464, ge=1, le=65535, description="rank R of a trial serves /metrics on port+R")
    warmup_steps: int = Field(default=2, ge=0, le=CURVE_CAP, description="optimizer steps dropped before the measurement window")
    measure_steps: int = Field(default=6, ge=2, le=CURVE_CAP, description="optimizer steps in the measurement window")
    adaptive_window: bool = Field(default=True, description=(
        "for a trial measured from its pod log: read its warm-up from its step times and end its measurement once "
        "the window's median is known well enough against the run-to-run noise (at most warmupSteps + measureSteps "
        "steps); false: drop warmupSteps, measure measureSteps. Trials measured through Prometheus use the fixed "
        "window"))
    min_measured_fraction: float = Field(
        default=0.8, gt=0, le=1, description="a trial counts as measured only when at least this fraction of its "
                                             "measureSteps were measured (Prometheus can miss scrapes)")
    warmup_seconds: int = Field(default=0, ge=0, description="seconds after job start ignored for GPU utilisation")
    baseline_repeats: int = Field(default=2, ge=1, description="baseline runs that learn the noise floor")
    confirm: bool = Field(default=True, description="re-run a winning candidate once before keeping it")
    paired: bool = Field(default=True, description="decide a promising candidate on an A-B-A paired measurement: a "
                                                   "run of the best between the candidate's two runs")
    certify_share: float = Field(default=0.15, ge=0, le=0.9, description=(
        "share of the budget kept back to certify the final speedup: interleaved runs of the baseline and the final "
        "best once the search is over, reported with a 95 % interval; 0 turns it off"))
    timeout_seconds: float = Field(default=10, gt=0, le=MAX_METRICS_TIMEOUT_S,
                                   description="timeout of one Prometheus query")
    linger_seconds: float = Field(
        default=30, ge=0, le=600,
        description="after its last step a trial waits at most this long for Prometheus to scrape its final "
                    "metrics (default: two 15 s scrape intervals); the loss check needs every step's loss")


class AgentSpec(Wire):
    """The proposal agent: a sidecar over HTTP, with a local fallback policy."""

    endpoint: str | None = Field(default="http://127.0.0.1:8081", max_length=URL,
                                 description="agent sidecar base URL (a host the operator allows: loopback or "
                                             "cluster-local by default); none: the local fallback policy")
    policy: Literal["playbook", "llm", "hybrid", "coordinate", "random"] = Field(
        default="playbook", description="policy the sidecar is asked to use")
    fallback_policy: Literal["playbook", "coordinate", "random"] = Field(
        default="playbook", description="local policy used while the sidecar is unreachable")
    timeout_seconds: float = Field(default=30, gt=0, le=MAX_AGENT_TIMEOUT_S,
                                   description="timeout of one proposal request")
    seed: int = Field(default=0, description="seed of randomised policies")


class TuningRunSpec(Wire):
    """What to tune, how to run a trial, and within which limits."""

    recipe: RecipeSource = Field(description="the user's baseline recipe")
    trial_template: dict[str, Any] = Field(
        description="a kubeflow.org/v1 PyTorchJob or a trainer.kubeflow.org/v1alpha1 TrainJob (its kind chooses the "
                    "trial backend); image, resources, volumes, node selectors and labels (e.g. "
                    "kueue.x-k8s.io/queue-name) are kept as given")
    container_name: str = Field(default="pytorch", max_length=NAME,
                                description="the training container of a PyTorchJob template (a TrainJob's is "
                                            "spec.trainer)")
    search_space: list[Annotated[str, Field(max_length=NAME)]] = Field(
        default_factory=list, max_length=256,
        description="knobs the tuner may change, in priority order; empty: the recipe's")
    objective: Objective = Field(default_factory=Objective)
    budget: BudgetSpec
    metrics: MetricsSpec
    agent: AgentSpec = Field(default_factory=AgentSpec)
    suspend: bool = Field(default=False, description="while true, launch no new trial and stop the one in flight "
                                                     "(its job deleted, its pods released, charged for the time they "
                                                     "ran; it runs again from its start on resume); it may change "
                                                     "freely once the run exists")
    output: OutputSpec = Field(default_factory=lambda: OutputSpec())
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="delete the run this many seconds after it finished (Succeeded or Failed; "
                                        "Kubeflow's runPolicy.ttlSecondsAfterFinished): its trials and jobs go with it, "
                                        "its outputs only with output.deleteWithRun; unset: kept")


class OutputSpec(Wire):
    """What the run leaves behind: the ConfigMap ``<run>-tuned`` (the tuned manifest, its patch, the recipe)."""

    delete_with_run: bool = Field(default=False, description="garbage-collect the outputs with the run (default: "
                                                             "they outlive it, for a team to commit)")


class Condition(Wire):
    """A status condition (the metav1.Condition shape: kstatus Ready/Reconciling/Stalled among them)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int | None = None


class TrialRefSummary(Wire):
    """A trial and its measured throughput."""

    trial: str = ""
    throughput: float | None = Field(default=None, description="tokens/s per device")
    speedup: float | None = Field(default=None, description="throughput / baseline throughput: the certified "
                                  "speedup where the interleaved baseline/best runs gave one, else the search's estimate")
    speedup_low: float | None = Field(default=None, description="low end of the certified speedup's 95 % interval")
    speedup_high: float | None = Field(default=None, description="high end of the certified speedup's 95 % interval")
    search_speedup: float | None = Field(default=None, description="the search's own estimate (best trial's "
                                         "throughput / baseline throughput), uncertified")
    certification: str | None = Field(default=None, description="the certified speedup and its verdict, or why "
                                      "there is none")
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


class Cursor(Wire):
    """Where the run's journal stands: each TuningTrial holds its own record; the run only counts."""

    next_trial: int = Field(default=1, description="index of the next trial (the engine's next record id)")
    recorded: int = Field(default=0, description="records so far, refusals included")
    refused: int = Field(default=0, description="proposals the gate refused (no trial was created for them)")
    hours_used: float = Field(default=0.0, description="accelerator-hours charged so far, lost records included: "
                              "never decreases (deleting TuningTrials does not give budget back)")
    trials_run: int = Field(default=0, description="trials that ran to an end so far, lost records included: never "
                            "decreases")
    lost_hours: float = Field(default=0.0, description="hours charged to trials whose TuningTrial (and record) is gone")
    lost_trials: int = Field(default=0, description="trials whose TuningTrial (and record) is gone")


class Refusals(Wire):
    """What the API said to a creation it refused (kept until one succeeds): its last answer and since when."""

    refusals: int = Field(default=0, description="creations the API refused (4xx other than 409 and 429)")
    code: int | None = None
    reason: str = ""
    message: str = ""
    at: str | None = None
    since: str | None = Field(default=None, description="the first refusal")


class TrialCreate(Refusals):
    """The API's refusals of the next TuningTrial's creation (a webhook, a quota, a cluster policy)."""

    index: int = Field(default=0, description="the trial's index")


class TunedRecipeRef(Wire):
    """The ConfigMap holding the tuned recipe, ready to commit."""

    config_map: str = ""
    keys: list[str] = Field(default_factory=list)


class TuningRunStatus(Wire):
    """Where the run stands: summaries and a cursor, bounded in size whatever the number of trials (each
    TuningTrial keeps its own record); restart-safe."""

    phase: RunPhase = "Pending"
    message: str = ""
    outcome: RunOutcome | None = Field(default=None, description="how the run ended (also the reason of its Ready "
                                       "condition): " + "; ".join(f"{o.value}: {o.doc}" for o in RunOutcome))
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    baseline: TrialRefSummary | None = None
    best: TrialRefSummary | None = None
    budget: BudgetStatus | None = None
    trials: TrialCounts | None = None
    current_trial: str | None = Field(default=None, description="the trial running now")
    search_stopped: str | None = Field(default=None, description="why the search ended (the policy stopped), while "
                                       "the certification runs of the baseline and the best still run")
    tuned_recipe: dict[str, Any] | None = Field(default=None, description="the best recipe found (when finished)")
    tuned_recipe_ref: TunedRecipeRef | None = Field(
        default=None, description="the ConfigMap holding the tuned recipe (recipe.yaml, and the framework's own "
                                  "launch where it renders one)")
    cursor: Cursor | None = None
    trial_create: TrialCreate | None = Field(
        default=None, description="what the API said to the next TuningTrial's creation, kept until it succeeds")
    refused: list[dict[str, Any]] = Field(
        default_factory=list, description=f"the last {REFUSED_KEPT} refused proposals' records (refusals create no "
                                          "TuningTrial)")
    queued_seconds: float = Field(default=0.0, description="time trials waited for their pods to run (not charged)")
    baseline_recipe: dict[str, Any] | None = Field(
        default=None, description="the baseline recipe as resolved when the run started (ConfigMap edits do not move it)")
    accepted_spec: dict[str, Any] | None = Field(
        default=None, description="the spec the run started with; the operator runs on it, taking from later edits "
                                  "only what spec edits may change")
    start_time: str | None = None
    completion_time: str | None = None


class Proposal(Wire):
    """Where a trial's change came from and why."""

    source: str = Field(default="", description="baseline, gate, agent policy name, or a fallback")
    rationale: str = Field(default="", description="why the proposer expects it to help")


class TuningTrialSpec(Wire):
    """One attempted configuration of a run."""

    run_ref: str = Field(min_length=1, max_length=NAME, description="name of the owning TuningRun")
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


class JobCreate(Refusals):
    """What the API said to the trial's job creation (kept until it succeeds)."""

    conflicts: int = Field(default=0, description="names found taken by a job this trial does not own")


class TuningTrialStatus(Wire):
    """What happened to one trial."""

    phase: TrialPhase = "Pending"
    job_ref: JobRef | None = None
    job_create: JobCreate | None = None
    start_time: str | None = Field(default=None, description="when its job was created")
    running_since: str | None = Field(default=None, description="when its pods started running: charging starts here")
    running_observed: str | None = Field(default=None, description="when the operator first saw them run (its own "
                                         "clock: the running deadline counts from the later of the two)")
    queued_seconds: float | None = Field(default=None, description="time from job creation until its pods ran")
    running_pods: list[str] | None = Field(default=None, description="the UIDs of its pods when they were first seen "
                                           "running: pods of other UIDs in their place mean they were replaced "
                                           "(preempted and admitted again, or evicted and recreated)")
    completion_time: str | None = None
    outcome: str | None = Field(default=None, description="succeeded, oom, crashed, failed, finished_early, timed_out, diverged, interrupted")
    measurements: dict[str, Any] | None = Field(default=None, description="steady-state figures (the engine's Measurement)")
    verdict: dict[str, Any] | None = Field(default=None, description="the gate's verdict")
    loss_check: dict[str, Any] | None = Field(default=None, description="loss-equivalence result, if one ran")
    decision: str = ""
    message: str = ""
    hours_charged: float = 0.0
    record: dict[str, Any] | None = Field(default=None, description="the engine's record of this trial (the run's "
                                                                    "journal is the union of its trials' records)")
    loss_check_record: dict[str, Any] | None = Field(
        default=None, description="the record of the loss-equivalence check that judged this trial")
    decision_record: dict[str, Any] | None = Field(
        default=None, description="the record of the paired decision's look taken after this reference run")
    job_stopping: bool | None = Field(default=None, description="the trial is recorded; its job is being stopped")
    conditions: list[Condition] = Field(default_factory=list)


# -- spec edits ---------------------------------------------------------------------------------------------------

def _get(spec: dict[str, Any], path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _increase_ok(path: str, old: Any, new: Any) -> bool:
    if path == "budget.maxTrials":  # absent: no limit
        return new is None or (old is not None and new >= old)
    if old is None or new is None:
        return new == old or path == "budget.maxFailedTrials"
    return new >= old


def prune_nulls(value: Any) -> Any:
    """``value`` without null mapping entries (an absent field and a null one mean the same; merge patches drop them)."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    return value


def spec_edit_problems(old: dict[str, Any], new: dict[str, Any], accepted: dict[str, Any] | None = None) -> list[str]:
    """What an edit of a run's spec changes that :data:`EDIT_POLICY` does not allow (empty: allowed).

    With ``accepted`` (the spec the run started with, ``status.acceptedSpec``), a field that the edit sets back to its
    accepted value is allowed whatever ``old`` holds: an edit that slipped past the webhook (it was down, or its
    failure policy Ignore) can always be reverted, and the run's ``SpecAccepted=False`` then clears."""
    old, new = prune_nulls(old), prune_nulls(new)
    base = prune_nulls(accepted) if accepted is not None else None
    problems: list[str] = []
    budget_keys = {p.split(".", 1)[1] for p in EDIT_POLICY if p.startswith("budget.")}

    def reverted(path: str) -> bool:
        return base is not None and _get(base, path) == _get(new, path)

    for key in sorted(set(old) | set(new)):
        if key == "budget":
            ob, nb = old.get("budget") or {}, new.get("budget") or {}
            for sub in sorted(set(ob) | set(nb)):
                path = f"budget.{sub}"
                if reverted(path):
                    continue
                if sub in budget_keys:
                    if not _increase_ok(path, ob.get(sub), nb.get(sub)):
                        problems.append(f"spec.{path} may only increase ({ob.get(sub)} → {nb.get(sub)})")
                elif ob.get(sub) != nb.get(sub):
                    problems.append(f"spec.{path} is frozen")
        elif EDIT_POLICY.get(key) != "free" and old.get(key) != new.get(key) and not reverted(key):
            problems.append(f"spec.{key} is frozen")
    return problems


def merge_allowed_edits(accepted: dict[str, Any], live: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The spec to run on: ``accepted`` (what the run started with) plus the edits of ``live`` that
    :data:`EDIT_POLICY` allows; and what ``live`` changes that is ignored."""
    import copy

    out = copy.deepcopy(accepted)
    for path, how in EDIT_POLICY.items():
        old, new = _get(accepted, path), _get(live, path)
        if old == new or (how == "increase" and not _increase_ok(path, old, new)):
            continue
        node = out
        parts = path.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        if new is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = new
    return out, spec_edit_problems(accepted, live)


EDIT_RULE_MESSAGE = ("the spec is frozen once the run exists: only spec.suspend and spec.ttlSecondsAfterFinished may "
                     "change, and "
                     "spec.budget.acceleratorHours, maxTrials and maxFailedTrials may increase")
