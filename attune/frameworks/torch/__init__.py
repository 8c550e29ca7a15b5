"""attune's reference trainer (``framework: torch``): the zero-dependency demo, on the framework seam.

Trials run ``torchrun ... -m attune.trainer.train --spec SPEC.json``; the trainer writes per-rank JSONL step
records (:mod:`attune.trainer.config`), which :meth:`TorchFramework.collect` reads, and runs exactly the steps
it is asked for. On Kubernetes the training container's command becomes that launch, with the spec in the
environment.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attune import frameworks
from attune.frameworks.base import Framework, Launch, LogParser, Observation, Rule, Tier, TrialLaunch, moved, only_moves
from attune.frameworks.common import GLOBAL_BATCH_HINT, micro_batch_layouts, micro_batch_rules
from attune.frameworks.torch import catalogue as _catalogue
from attune.trial import FailureKind

if TYPE_CHECKING:
    from attune.recipe.catalogue import Catalogue
    from attune.recipe.model import Recipe
    from attune.trial import Measurement, TrialRequest

_MEM = "memory_capacity"
SPEC_ENV = "ATTUNE_TRIAL_SPEC"
SPEC_PATH = "${TMPDIR:-/tmp}/attune-trial-spec.json"  # the container's /tmp (TMPDIR where a runtime sets one)
OUT_DIR = "attune-trial-out"
#: the Kubernetes training container's command: write the spec from the environment, then run the trainer
K8S_LAUNCH = ("printf '%s' \"$" + SPEC_ENV + "\" > \"" + SPEC_PATH +
              "\" && exec python -m torch.distributed.run -m attune.trainer.train --spec \"" + SPEC_PATH
              + "\"")

RULES = {
    **micro_batch_rules(),
    ("activation_checkpointing", "down"): Rule(Tier.FIT, 0.15, {"compute_bound": 0.2}, (_MEM,), memory=+1),
    ("activation_checkpointing", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    ("nproc_per_node", "up"): Rule(Tier.SCALE, 0.3, {"compute_bound": 0.35, "host_overhead": 0.3}),
    ("nproc_per_node", "down"): Rule(Tier.SCALE, 0.0, {"communication": 0.05}),
    ("dp_strategy", "up"): Rule(Tier.FIT, 0.0, {_MEM: 0.3}, memory=-1),
    ("dp_strategy", "down"): Rule(Tier.SCALE, 0.04, {"communication": 0.1}, memory=+1),
    ("ddp_bucket_cap_mb", "up"): Rule(Tier.OVERLAP, 0.01, {"communication": 0.05}),
    ("ddp_bucket_cap_mb", "down"): Rule(Tier.OVERLAP, 0.01, {"communication": 0.05}),
    ("compile_mode", "up"): Rule(Tier.MICRO, 0.05, {"compute_bound": 0.08, "host_overhead": 0.1}, cost=3.0,
                                 memory=+1),
    ("compile_mode", "down"): Rule(Tier.MICRO, 0.0),
    ("intra_op_threads", "up"): Rule(Tier.MICRO, 0.04, {"compute_bound": 0.08}),
    ("intra_op_threads", "down"): Rule(Tier.MICRO, 0.01),
    ("optimizer_impl", "up"): Rule(Tier.MICRO, 0.03, {"host_overhead": 0.1}),
    ("optimizer_impl", "down"): Rule(Tier.MICRO, 0.0),
    ("dataloader_workers", "up"): Rule(Tier.OVERLAP, 0.005, {"data_loading": 0.2}),
    ("dataloader_workers", "down"): Rule(Tier.OVERLAP, 0.0),
    ("matmul_precision", "up"): Rule(Tier.MICRO, 0.1, {"compute_bound": 0.2}),
    ("env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "up"): Rule(Tier.MICRO, 0.05, {"compute_bound": 0.1}),
}


def knob_env(recipe: Recipe) -> dict[str, str]:
    """Environment variables a recipe's ``env.*`` knobs set in every training process."""
    env: dict[str, str] = {}
    for name, value in recipe.effective_knobs.items():
        if name.startswith("env.") and value not in (None, ""):
            env[name.removeprefix("env.")] = str(value)
    return env


def _has_cuda() -> bool:
    return Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists()


def read_records(trial_dir: Path, rank: int = 0) -> list[dict[str, Any]]:
    """Parsed JSONL records of one rank (a torn last line is skipped)."""
    path = trial_dir / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


#: a data phase below this share of the step leaves nothing for more data-loader workers to win
DATA_NEGLIGIBLE = 0.005

class TorchFramework(Framework):
    name = "torch"
    title = "attune reference trainer (PyTorch DDP/FSDP)"
    versions = ">=2.4"
    distribution = "torch"
    backends = ("local",)
    rules = RULES
    phase_keys = {"forward": "compute", "backward": "compute", "optimizer": "host", "data": "data", "comm": "comm"}
    field_hints = {"training.global_batch_size": GLOBAL_BATCH_HINT.format(knob="micro_batch_size")}
    k8s = True
    metrics_source = "prometheus"  # the trainer serves per-step metrics (attune.operator.metrics)
    #: trainer exit codes (``attune.trainer.config``) → failure kind
    exit_codes = {3: FailureKind.OOM, 4: FailureKind.DIVERGED}

    def catalogue(self) -> Catalogue:
        return _catalogue.build()

    def preflight(self, recipe: Recipe, backend: str) -> list[str]:
        problems = super().preflight(recipe, backend)
        if problems:
            return problems
        t = recipe.training
        assert t is not None
        if recipe.resources.accelerator == "cpu" and t.precision not in ("fp32", "bf16"):
            problems.append(f"training.precision: the reference trainer runs fp32 or bf16 on CPU, not {t.precision}; "
                            "use a GPU recipe (resources.accelerator) for fp16/fp8")
        if recipe.resources.accelerator != "cpu" and not _has_cuda():
            problems.append(f"resources.accelerator: {recipe.resources.accelerator} trials need an NVIDIA GPU, and "
                            "this machine has none (no /dev/nvidiactl); tune here with accelerator cpu, or on the "
                            "cluster with the operator")
        if t.data.source == "tokens" and t.data.path and not Path(t.data.path).is_file():
            problems.append(f"training.data.path: {t.data.path} does not exist (relative paths are read from the "
                            "directory attune runs in)")
        return problems

    def compute_precision(self, recipe: Recipe) -> str:
        return recipe.training.precision if recipe.training is not None else "fp32"

    def random_stream_hazards(self, recipe: Recipe) -> list[str]:
        t = recipe.training
        if t is None or not t.dropout:
            return []
        return [f"training.dropout is {t.dropout:g}: the trainer draws its dropout masks per micro-batch, so another "
                "micro-batch split or process count draws another random stream"]

    def cannot_matter(self, best: Recipe, candidate: Recipe, measured: Measurement | None) -> str | None:
        change = moved(best, candidate)
        world = int(candidate.knob("nproc_per_node")) * candidate.resources.nodes
        if only_moves(change, ("ddp_bucket_cap_mb",)) and (world == 1 or candidate.knob("dp_strategy") != "ddp"):
            return ("ddp_bucket_cap_mb: " + ("the job runs one process" if world == 1 else
                                             f"dp_strategy is {candidate.knob('dp_strategy')}, not ddp")
                    + ", so there are no DDP gradient buckets")
        if only_moves(change, ("dataloader_workers",)) and measured is not None and measured.step_time_median_s > 0:
            share = measured.phases.get("data", 0.0) / measured.step_time_median_s
            if "data" in measured.phases and share < DATA_NEGLIGIBLE:
                return (f"dataloader_workers: loading a batch takes {share:.2%} of a step here; more workers cannot "
                        "make the step faster")
        return None

    def equivalent_layouts(self, recipe: Recipe, avoid: Sequence[str] = ()) -> list[dict[str, Any]]:
        return micro_batch_layouts(recipe, avoid=avoid)

    # -- launches --------------------------------------------------------------------------------------
    def argv(self, recipe: Recipe, spec_path: str, python: str = sys.executable) -> tuple[str, ...]:
        """torchrun argument list. Only integers from validated knobs enter it."""
        nproc = int(recipe.knob("nproc_per_node"))
        return (python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                "-m", "attune.trainer.train", "--spec", spec_path)

    def env(self, recipe: Recipe) -> dict[str, str]:
        env = knob_env(recipe)
        if not env.get("OMP_NUM_THREADS"):
            nproc = int(recipe.knob("nproc_per_node"))
            threads = int(recipe.knob("intra_op_threads")) or max(1, (os.cpu_count() or 1) // nproc)
            env["OMP_NUM_THREADS"] = str(threads)
        return env

    def render(self, recipe: Recipe, *, max_steps: int | None = None, out_dir: str = "attune-out",
               metrics_port: int | None = None) -> Launch:
        from attune.trainer.config import TrialSpec

        assert recipe.training is not None  # the torch framework requires it (Recipe validation)
        spec = TrialSpec(recipe=recipe, max_steps=max_steps or recipe.training.steps, out_dir=out_dir,
                         metrics_port=metrics_port)
        return Launch(argv=self.argv(recipe, "spec.json"), env=self.env(recipe),
                      files={"spec.json": spec.model_dump_json(indent=2)})

    def trial_launch(self, recipe: Recipe, request: TrialRequest, trial_dir: Path, *, python: str = sys.executable,
                     metrics_port: int | None = None) -> TrialLaunch:
        from attune.trainer.config import TrialSpec

        for old in trial_dir.glob("rank*.jsonl"):
            old.unlink()
        spec = TrialSpec(recipe=recipe, max_steps=request.steps, out_dir=str(trial_dir), metrics_port=metrics_port)
        spec_path = trial_dir / "spec.json"
        launch = Launch(argv=self.argv(recipe, str(spec_path), python), env={**self.env(recipe), "PYTHONUNBUFFERED": "1"},
                        files={str(spec_path): spec.model_dump_json(indent=2)}, cwd=str(trial_dir))
        return TrialLaunch(launch, stop_after_steps=None)  # the trainer runs exactly request.steps

    def collect(self, parser: LogParser, trial_dir: Path) -> Observation:
        records = read_records(trial_dir)
        errors = [{"kind": r.get("kind", "crash"), "message": str(r.get("message", ""))}
                  for r in records if r.get("event") == "error"]
        return Observation(steps=[r for r in records if r.get("event") == "step"],
                           errors=errors + [e for e in parser.errors if e["kind"] not in {x["kind"] for x in errors}],
                           done=any(r.get("event") == "done" for r in records),
                           first_error=next((e["message"] for e in errors), parser.first_error_line))

    # -- Kubernetes ------------------------------------------------------------------------------------
    def patch_job(self, recipe: Recipe, job: dict[str, Any], container: dict[str, Any], *, steps: int,
                  metrics_port: int, linger_s: float) -> None:
        from attune.trainer.config import TrialSpec

        tspec = TrialSpec(recipe=recipe, max_steps=steps, out_dir=OUT_DIR, metrics_port=metrics_port,
                          metrics_linger_s=linger_s)
        job.setdefault("spec", {})["nprocPerNode"] = str(int(recipe.knob("nproc_per_node")))
        container["command"] = ["/bin/sh", "-c", K8S_LAUNCH]
        container.pop("args", None)
        env = knob_env(recipe)
        if "OMP_NUM_THREADS" not in env and int(recipe.knob("intra_op_threads")):
            env["OMP_NUM_THREADS"] = str(int(recipe.knob("intra_op_threads")))
        _set_env(container, {**env, SPEC_ENV: tspec.model_dump_json(), "PYTHONUNBUFFERED": "1"})
        ports = [p for p in container.get("ports") or [] if p.get("name") != "attune-metrics"]
        ports.append({"name": "attune-metrics", "containerPort": metrics_port, "protocol": "TCP"})
        container["ports"] = ports


def _set_env(container: dict[str, Any], values: dict[str, str]) -> None:
    env = [e for e in container.get("env") or [] if e.get("name") not in values]
    env += [{"name": k, "value": v} for k, v in sorted(values.items())]
    container["env"] = env


FRAMEWORK = frameworks.register(TorchFramework())
