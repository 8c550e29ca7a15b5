"""Simulated trials: the cluster simulator (:mod:`attune.sim`, each framework's own performance model) behind the
trial-backend seam.

A simulated trial returns what a real one returns (step records summarised into a
:class:`~attune.trial.Measurement` with per-phase times, peak memory and DCGM-like signals) and is
charged as if it had run on the cluster, so tuners spend budget exactly as they would for real:

* wall time = job launch (scheduler, container start, NCCL init; 60-120 s, seeded) + model initialisation
  (and compilation, for a configuration whose catalogue says it compiles) + warm-up steps (the first step also pays one-off graph capture / allocator growth) + measured window;
* a trial that runs out of memory costs launch + initialisation + its first (failing) step;
* a trial whose wall time would pass ``request.timeout_s`` is killed there and charged the full deadline.

Noise is seeded from ``(seed, trial id)``: a run-to-run factor on the step time (``simulate(seed=...)``,
log-normal sigma ``NOISE_SIGMA``), small within-run jitter per step, and run-to-run variation of the peak
memory (allocator state), which makes configurations at the memory cliff fail some of the time, as on a
cluster. Nothing is run and nothing is written except ``trial_dir/sim.json`` when ``write_files`` is set.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from attune.backends.base import TrialBackend, TrialRequest, TrialResult
from attune.engine.budget import charge
from attune.engine.measure import summarise, window_end
from attune.errors import BackendError
from attune.recipe.model import Recipe
from attune.trial import TrialOutcome

LAUNCH_S = (60.0, 120.0)
"""Range of job-launch overhead on a cluster (scheduling, image pull from cache, rendezvous, NCCL init)."""
INIT_S_BASE = 20.0
"""Model construction, distributed-optimizer buffers and data-loader start before step 0."""
INIT_S_PER_BPARAM_PER_DEVICE = 2.0
"""Extra initialisation seconds per billion parameters held per device (weight init / checkpoint load)."""
COMPILE_S = 120.0
"""Compilation before the first step of a configuration whose catalogue says it compiles (``Knob.compiles``: CUDA
graph capture of every layer, torch.compile): every trial is a fresh process, and each pays it."""
FIRST_STEP_FACTOR = 3.0
"""The first step costs this many steady steps (CUDA-graph capture, NCCL communicator warm-up, allocator)."""
WARMUP_TAIL = (0.10, 0.07)
"""After the first step, the next steps are still this much slower than steady (caches, allocator and autotuned
kernels settling), then the run is steady. Source: a torchtitan log with torch.compile (pytorch/pytorch#158912,
2025-07-23): tps 269 at step 1, then 81,467, 83,762 and 90,209 at steps 2-4, i.e. steps 2 and 3 took 1.11x and
1.08x step 4's time."""
STEP_JITTER_SIGMA = 0.004
"""Within-run step-to-step noise (log-normal sigma). Source: torchtitan steady steps 14-21 at 7,272-7,334 tps
(pytorch/torchtitan#3393: a spread of 0.3 %); Megatron's 125.6-130.6 s iterations 182-186 (epfLLM/Megatron-LLM#11)
spread more, 1.4 %."""


def step_units(steps: int) -> float:
    """What ``steps`` steps of a trial take, in steady steps (its warm-up included)."""
    return sum(warmup_factor(i) for i in range(steps))


def warmup_factor(i: int) -> float:
    """How much slower than steady step ``i`` of a trial runs (the first step's one-off cost, then a decaying tail)."""
    if i == 0:
        return FIRST_STEP_FACTOR
    return 1.0 + (WARMUP_TAIL[i - 1] if i - 1 < len(WARMUP_TAIL) else 0.0)
MEMORY_SIGMA = 0.005
"""Run-to-run variation of peak memory (allocator fragmentation, NCCL buffers)."""
JITTER_BOUND = 1.02
"""Upper bound of the within-run jitter's effect on a trial's mean step (five STEP_JITTER_SIGMA up)."""


def _init_s(recipe: Recipe, params_per_device_b: float) -> float:
    """Seconds from the launch's end to the first step: model initialisation, and compilation where it compiles."""
    compiling = COMPILE_S if recipe.catalogue.compiling(recipe) else 0.0
    return INIT_S_BASE + INIT_S_PER_BPARAM_PER_DEVICE * params_per_device_b + compiling


class SimBackend(TrialBackend):
    """Runs each trial on the analytical cluster model (pure Python, no GPU, no torch)."""

    name = "sim"

    def __init__(self, *, seed: int = 0, noise: bool = True, write_files: bool = True,
                 noise_sigma: float | None = None) -> None:
        self.seed = seed
        self.noise = noise
        self.write_files = write_files
        #: run-to-run noise (log-normal sigma of the step time); None: the calibrated NOISE_SIGMA of a quiet cluster
        self.noise_sigma = noise_sigma

    def estimate_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        """A noiseless simulated trial's charge (the simulator is cheap and deterministic)."""
        quiet = SimBackend(seed=self.seed, noise=False, write_files=False)
        try:
            return quiet.run(recipe, request).charged_hours
        except BackendError:
            return None

    def typical_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        """What a successful trial of ``recipe`` typically costs: the noiseless step, the middle of the launch range
        (the benchmark's unit of budget, "a trial's worth")."""
        from attune.sim.model import simulate

        try:
            res = simulate(recipe)
        except ValueError:
            return None
        wall = (sum(LAUNCH_S) / 2 + _init_s(recipe, res.params_per_device_b)
                + (res.step_time_s or 0.0) * step_units(request.steps))
        return charge(recipe.resources.devices, min(wall, request.timeout_s))

    def worst_case_hours(self, recipe: Recipe, request: TrialRequest) -> float | None:
        """The most a trial of ``recipe`` can be charged: the slowest launch, noise three sigma up, the jitter's
        bound; a trial that fails is charged its launch and start-up."""
        from attune.sim.model import NOISE_SIGMA, simulate

        try:
            res = simulate(recipe)
        except ValueError:
            return None
        init = _init_s(recipe, res.params_per_device_b)
        if res.outcome != "succeeded" or res.step_time_s is None:
            wall = LAUNCH_S[1] + init + 10.0
        else:
            sigma = NOISE_SIGMA if self.noise_sigma is None else self.noise_sigma
            bound = math.exp(3 * sigma) * JITTER_BOUND if self.noise else 1.0
            wall = LAUNCH_S[1] + init + res.step_time_s * bound * step_units(request.steps)
        return charge(recipe.resources.devices, min(wall, request.timeout_s))

    def _rng(self, request: TrialRequest) -> random.Random:
        return random.Random(f"{self.seed}:{request.seed}:{request.trial_id}")

    def run(self, recipe: Recipe, request: TrialRequest) -> TrialResult:
        from attune.sim.model import NOISE_SIGMA, simulate

        fw = recipe.framework_impl
        if "sim" not in fw.backends:
            from attune import frameworks

            simulated = [n for n in frameworks.names() if "sim" in frameworks.get(n).backends]
            raise BackendError(f"the simulator models framework: {', '.join(simulated)} recipes; {recipe.name!r} is "
                               f"framework: {recipe.framework}. Use --backend {fw.backends[0]} for it")
        rng = self._rng(request)
        noise_seed = rng.randrange(2**31) if self.noise else None
        try:
            sim = simulate(recipe, seed=noise_seed,
                           noise_sigma=NOISE_SIGMA if self.noise_sigma is None else self.noise_sigma)
        except ValueError as err:
            raise BackendError(str(err)) from None
        devices = recipe.resources.devices
        launch = rng.uniform(*LAUNCH_S)
        init = _init_s(recipe, sim.params_per_device_b)
        cap_gb = sim.signals.get("fb_used_gb", sim.peak_memory_gb) if sim.outcome == "oom" else None
        peak_gb = sim.peak_memory_gb * (math.exp(rng.gauss(0.0, MEMORY_SIGMA)) if self.noise else 1.0)
        extra: dict[str, Any] = {"simulated": True, "launch_s": launch, "init_s": init,
                                 "predicted_peak_memory_gb": sim.peak_memory_gb}
        if sim.outcome == "oom" or sim.step_time_s is None:
            return self._oom(recipe, request, devices, launch + init + 10.0, sim.message or "out of memory",
                             extra, cap_gb)
        from attune.sim.hardware import get_hardware

        cap = get_hardware(recipe.resources.accelerator).hbm_capacity_bytes / 1e9
        if recipe.resources.device_memory_gb is not None:
            cap = min(cap, recipe.resources.device_memory_gb)
        if peak_gb > cap:
            return self._oom(recipe, request, devices, launch + init + FIRST_STEP_FACTOR * sim.step_time_s,
                             f"needs {peak_gb:.1f} GB in this run (allocator state), device has {cap:.1f} GB",
                             extra, cap)
        step = sim.step_time_s
        tokens = recipe.tokens_per_step or 0  # known for every simulated framework (a model with a training section)
        records: list[dict[str, Any]] = []
        elapsed = launch + init
        end = None
        for i in range(request.steps):  # step by step, as a job's log arrives: an adaptive window may end it sooner
            jitter = math.exp(rng.gauss(0.0, STEP_JITTER_SIGMA)) if self.noise else 1.0
            t = step * jitter * warmup_factor(i)
            elapsed += t
            if elapsed > request.timeout_s:
                return self._timeout(recipe, request, devices, i, extra)
            records.append({"step": i, "step_time_s": t, "tokens": tokens, "loss": 0.0,
                            "peak_mem_mb": peak_gb * 1e9 / 2**20,
                            "phases": {k: v * t / step for k, v in sim.breakdown.items()}})
            end = window_end(records, request, devices)
            if end is not None:
                break
        signals = {**sim.signals, "fb_used_gb": peak_gb, "mfu": sim.mfu}
        measurement = summarise(records, warmup_steps=end.warmup if end else request.warmup_steps, devices=devices,
                                signals=signals, ended=end.reason if end is not None and request.plan else None)
        extra.update(predicted_step_time_s=sim.step_time_s, memory_gb=sim.memory_gb)
        result = TrialResult(outcome=TrialOutcome.SUCCEEDED, measurement=measurement, wall_s=elapsed,
                             devices=devices, charged_hours=charge(devices, elapsed), extra=extra)
        self._write(request, result)
        return result

    def _oom(self, recipe: Recipe, request: TrialRequest, devices: int, wall: float, message: str,
             extra: dict[str, Any], cap_gb: float | None) -> TrialResult:
        wall = min(wall, request.timeout_s)
        result = TrialResult(outcome=TrialOutcome.OOM, measurement=None, wall_s=wall, devices=devices,
                             charged_hours=charge(devices, wall), message=f"CUDA out of memory: {message}",
                             extra={**extra, "device_memory_gb": cap_gb})
        self._write(request, result)
        return result

    def _timeout(self, recipe: Recipe, request: TrialRequest, devices: int, steps_done: int,
                 extra: dict[str, Any]) -> TrialResult:
        wall = request.timeout_s
        result = TrialResult(outcome=TrialOutcome.TIMED_OUT, measurement=None, wall_s=wall, devices=devices,
                             charged_hours=charge(devices, wall), extra=extra,
                             message=f"no result before the deadline (last step seen: {steps_done}/{request.steps})")
        self._write(request, result)
        return result

    def _write(self, request: TrialRequest, result: TrialResult) -> None:
        if not self.write_files:
            return
        request.trial_dir.mkdir(parents=True, exist_ok=True)
        doc = {"outcome": result.outcome.value, "wall_s": result.wall_s, "charged_hours": result.charged_hours,
               "message": result.message, "extra": result.extra,
               "measurement": result.measurement.model_dump(mode="json") if result.measurement else None}
        (request.trial_dir / "sim.json").write_text(json.dumps(doc, indent=2, default=str))
