"""The recipe card: one verified recipe, its evidence and its provenance, as a reviewable YAML document.

The pydantic model below is the single definition; the JSON Schema in ``openrecipes/schema/`` is generated
from it (``attune card schema``) and a test keeps the two identical. Numbers are copied from the run's
``result.json``, kept beside the card and named by its SHA-256 (``source.result_sha256``), so anyone can check
a card against the run it came from.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = "attune.dev/recipe-card/v1"
SCHEMA_ID = "https://attune.dev/schemas/recipe-card-v1.schema.json"


class _Card(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class FrameworkInfo(_Card):
    name: str = Field(description="attune framework name (torch, megatron, hf, ...)")
    title: str = Field(description="what the framework is")
    version: str | None = Field(description="framework version the trials ran (null when simulated or unknown)")
    catalogue_versions: str = Field(description="framework versions attune's knob catalogue covers (PEP 440)")


class ModelInfo(_Card):
    name: str = Field(description="the recipe's name")
    family: str | None = Field(description="model family (gpt, llama3, mixtral, ...); null when the architecture "
                                           "lives in the user's own launch")
    parameters: int | None = Field(description="approximate parameter count (experts counted whole)")
    active_parameters: int | None = Field(description="parameters active per token (MoE: top-k experts)")
    size: str = Field(description="size bucket: <100M, 100M-1B, 1B-10B, 10B-100B, >100B or unknown")
    architecture: dict[str, Any] | None = Field(description="the recipe's model section")


class HardwareInfo(_Card):
    accelerator: str = Field(description="accelerator kind (cpu, a100-80gb, h100-sxm-80gb, h200, b200)")
    nodes: int = Field(ge=1)
    devices_per_node: int = Field(ge=1)
    devices: int = Field(ge=1, description="allocated devices (throughput is per allocated device)")
    label: str = Field(description="e.g. 8 × h100-sxm-80gb (1 node)")


class KnobChange(_Card):
    from_: Any = Field(alias="from", description="baseline value")
    to: Any = Field(description="tuned value")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=())


class Launch(_Card):
    form: Literal["launch", "knobs"] = Field(description="launch: the framework renders a command line/config; "
                                                         "knobs: it does not, the YAML knobs are the recipe")
    description: str
    tuned: str = Field(description="the tuned recipe in that form (command line and files, or YAML knobs)")
    diff: list[str] = Field(description="unified diff baseline → tuned, one line per entry")


class RecipeInfo(_Card):
    tuned: dict[str, Any] = Field(description="the tuned recipe, a complete attune recipe (valid YAML recipe)")
    baseline_knobs: dict[str, Any] = Field(description="the baseline's knobs; the baseline is the tuned recipe "
                                                       "with these knobs")
    changes: dict[str, KnobChange] = Field(description="knob → baseline and tuned value (effective values)")
    launch: Launch


class Throughput(_Card):
    unit: Literal["tokens/s per device", "samples/s per device"] = "tokens/s per device"
    baseline: float = Field(gt=0, description="mean of the baseline runs")
    tuned: float = Field(gt=0, description="mean of the tuned recipe's runs (candidate and confirmation)")
    speedup: float = Field(gt=0, description="tuned / baseline: the certified speedup where the run certified it")
    speedup_low: float | None = Field(default=None, description="lower end of the certified speedup's 95 % interval "
                                                               "(interleaved baseline/best runs); null: not certified")
    speedup_high: float | None = Field(default=None, description="upper end of that interval")
    certification: str | None = Field(default=None, description="the run's own line on its final speedup")
    gain_percent: float = Field(description="(speedup - 1) × 100")
    job_tokens_per_s: float | None = Field(description="tuned throughput of the whole job")
    noise_floor: float | None = Field(description="smallest relative gain the run could tell from noise")
    step_time_s: float | None = Field(description="median step time of the tuned recipe's last run")
    peak_memory_gb: float | None = Field(description="peak memory per device of that run")


class MFU(_Card):
    value: float | None = Field(description="model-FLOPs utilisation of the tuned recipe (0..1), null where the "
                                            "accelerator's peak is unknown")
    model_flops_per_token: float | None = Field(description="model FLOPs per token (forward + backward)")
    achieved_tflops_per_device: float | None
    peak_tflops_per_device: float | None = Field(description="dense BF16 peak the MFU is relative to")
    basis: str = Field(description="how the value was obtained")


class LossEvidence(_Card):
    required: bool = Field(description="a kept change reorders floating-point sums and owes the check")
    verdict: Literal["passed", "failed", "not required", "unchecked", "no change kept"]
    modelled: bool = Field(description="false when the backend models no loss (the simulator): the check is "
                                       "then vacuous")
    steps: int = Field(ge=0)
    tolerance_basis: str
    tolerance: list[float] = Field(description="per-step absolute tolerance band")
    baseline_loss: list[list[float]] = Field(description="loss per step of each baseline run")
    tuned_loss: list[list[float]] = Field(description="loss per step of each run of the tuned recipe")
    drift_runs: int = Field(ge=0, description="equivalent runs the tolerance was derived from")
    comparison: dict[str, Any] | None = Field(description="tuned vs baseline within the band")
    checks: list[dict[str, Any]] = Field(description="every loss-equivalence check of the run")
    numerics_opt_in: list[str] = Field(default_factory=list, description=(
        "the numerics classes the recipe's owner opted in to; random_stream: changes that draw another random "
        "stream or other samples were admitted, judged against runs that differ the same way, not rounding"))


class GateRecord(_Card):
    trial: int
    kind: str
    change: dict[str, Any]
    admitted: bool | None = Field(description="the gate's verdict (null when the trial has none)")
    semantics: str | None
    owed: list[str]
    reasons: list[str]
    outcome: str
    decision: str


class Evidence(_Card):
    loss_equivalence: LossEvidence
    gate: list[GateRecord] = Field(description="every gate verdict of the run, one per trial")


class Measurement(_Card):
    kind: Literal["measured", "simulated"] = Field(description="measured: trials ran on real hardware; "
                                                               "simulated: attune's analytical cluster model")
    backend: str
    policy: str | None
    started_at: str | None = Field(description="UTC ISO-8601")
    finished_at: str | None
    machine: dict[str, Any] = Field(description="the machine (or the simulator) the trials ran on")
    software: dict[str, Any] = Field(description="attune, Python and framework versions")
    runs: dict[str, int] = Field(description="successful runs behind each headline figure: baseline, tuned")
    window: dict[str, int] = Field(description="warm-up and measured steps per trial")


class Cost(_Card):
    accelerator_hours: float = Field(ge=0, description="accelerator-hours spent finding this recipe, failures "
                                                       "included")
    budget_hours: float = Field(gt=0)
    trials_launched: int = Field(ge=0)
    trials_failed: int = Field(ge=0)
    trials_refused: int = Field(ge=0)
    stop_reason: str | None


class Reproduce(_Card):
    command: str = Field(description="one shell command that re-runs the search that found this recipe")
    recipe_path: str | None = Field(description="the baseline recipe file the command names")
    notes: str = ""


class Source(_Card):
    run: str = Field(description="name of the run directory the card was made from")
    result: str = Field(description="the run's result.json, relative to the card")
    result_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    created_at: str
    created_by: str = Field(description="attune version that wrote the card")


class Card(_Card):
    """A recipe card (``attune card DIR``)."""

    schema_: Literal["attune.dev/recipe-card/v1"] = Field("attune.dev/recipe-card/v1", alias="schema")
    id: str = Field(pattern=r"^[A-Za-z0-9._-]+$", description="file name of the card, without .yaml")
    title: str
    summary: str = Field(description="one line: model, hardware, throughput, gain, backend")
    framework: FrameworkInfo
    model: ModelInfo
    hardware: HardwareInfo
    recipe: RecipeInfo
    throughput: Throughput
    mfu: MFU
    evidence: Evidence
    measurement: Measurement
    cost: Cost
    reproduce: Reproduce
    source: Source

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, protected_namespaces=())

    @property
    def simulated(self) -> bool:
        return self.measurement.kind == "simulated"

    def to_data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.model_dump(mode="json", by_alias=True)
        return data


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a card."""
    schema = Card.model_json_schema(by_alias=True, mode="validation")
    schema.pop("title", None)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "attune recipe card", **schema}
