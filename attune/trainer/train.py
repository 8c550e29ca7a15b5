"""The reference trainer's entry point and loop: ``python -m attune.trainer.train --spec SPEC.json``.

Runs alone (one process) or under ``torchrun --standalone --nproc_per_node=N``; gloo on CPU, NCCL on CUDA.
It trains the recipe's GPT for ``max_steps`` optimizer steps and writes ``OUT_DIR/rank{R}.jsonl``
(format and exit codes: :mod:`attune.trainer.config`). Step numbers in records and in
``ATTUNE_TRAINER_FAULT`` are 1-based. Under torchrun a failing worker's code (3, 4, 1) shows in torchrun's log
but torchrun itself exits 1, so a launcher should classify failures by the ``error`` record.
With ``training.dropout > 0`` the dropout masks depend on the rank, so losses are not layout-invariant.

Phases of a step record (seconds, summed over the step's micro-steps; on CUDA each boundary synchronises):

- ``data``: taking the next micro-batch from the data iterator and copying it to the device
- ``forward``: forward pass and loss (under autocast for bf16)
- ``backward``: backward pass; on the final micro-step of DDP/FSDP it also holds the gradient all-reduce /
  reduce-scatter that backward overlaps and waits for
- ``comm``: the explicit all-reduce of the step loss, i.e. mostly the wait for the slowest rank (0 alone)
- ``optimizer``: gradient-norm clipping, optimizer step and zeroing the gradients
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from attune.recipe.model import OptimizerSpec, Recipe, TrainingContract
from attune.trainer.config import EXIT_DIVERGED, EXIT_OOM, FAULT_ENV, TrialSpec, read_latency_s
from attune.trainer.data import micro_batches
from attune.trainer.model import Checkpointing, build_model
from attune.trainer.sinks import JsonlSink, PrometheusSink, Record, Sink

log = logging.getLogger(__name__)

_IMPORT_T = time.perf_counter()
EXIT_CRASH = 1


class Diverged(RuntimeError):
    """The global-batch loss became non-finite."""


@dataclass(frozen=True)
class Layout:
    """Where this process sits: rank, world size, local rank and torch device."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device


# --------------------------------------------------------------------------------------------- setup


def setup_distributed(device_name: str, need_group: bool) -> Layout:
    """Join the torchrun process group (if launched by torchrun, or a 1-process group if ``need_group``)."""
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    if device_name not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, not {device_name!r}")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device = torch.device(device_name, local_rank) if device_name == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    elif need_group:
        # torch.distributed imports HashStore from torch._C without re-exporting it (no `as`, no __all__ entry)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return Layout(rank, world, local_rank, local_world, device)


def configure_threads(knobs: dict[str, Any], layout: Layout) -> int:
    """Set torch intra-op threads (knob ``intra_op_threads``; 0 means cores divided by local processes)."""
    threads = int(knobs["intra_op_threads"])
    if threads == 0:
        threads = max(1, len(os.sched_getaffinity(0)) // layout.local_world)
    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(str(knobs["matmul_precision"]))
    return threads


def wrap_model(model: nn.Module, knobs: dict[str, Any], layout: Layout) -> nn.Module:
    """Apply data parallelism (DDP, or FSDP2 ``fully_shard`` per block then the root) to a model on its device."""
    strategy = str(knobs["dp_strategy"])
    if strategy == "ddp":
        if layout.world == 1:
            return model
        return nn.parallel.DistributedDataParallel(
            model, device_ids=[layout.local_rank] if layout.device.type == "cuda" else None,
            bucket_cap_mb=int(knobs["ddp_bucket_cap_mb"]),
        )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(layout.device.type, (layout.world,))
    reshard = strategy == "fsdp"
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def build_optimizer(model: nn.Module, spec: OptimizerSpec, impl: str) -> torch.optim.Optimizer:
    """The contract's optimizer; weight decay on matrices only; ``impl`` picks for_loop / foreach / fused kernels."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": spec.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    flags: dict[str, Any] = {"foreach": impl == "foreach", "fused": True if impl == "fused" else None}
    if spec.name == "sgd":  # momentum = betas[0]
        return torch.optim.SGD(groups, lr=spec.lr, momentum=spec.betas[0], **flags)
    cls = torch.optim.AdamW if spec.name == "adamw" else torch.optim.Adam
    if spec.name == "adam":
        groups = [{**g, "weight_decay": 0.0} for g in groups]
    return cls(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, **flags)


def lr_at(step: int, training: TrainingContract) -> float:
    """Learning rate of 0-based optimizer ``step``: linear warm-up, then constant / cosine / linear decay."""
    peak, sch, total = training.optimizer.lr, training.schedule, training.steps
    if step < sch.warmup_steps:
        return peak * (step + 1) / sch.warmup_steps
    if sch.name == "constant":
        return peak
    progress = min(1.0, (step - sch.warmup_steps) / max(1, total - sch.warmup_steps))
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if sch.name == "cosine" else 1 - progress
    return peak * (sch.min_lr_ratio + (1 - sch.min_lr_ratio) * shape)


# ----------------------------------------------------------------------------------- memory and faults


def process_age_s() -> float:
    """Seconds since this process started (from /proc; else since this module was imported)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            return float(f.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORT_T


def _rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_mem_mb(device: torch.device) -> float:
    """Peak allocated device memory on CUDA, peak resident set of the process on CPU (MiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


class MemoryGuard:
    """Enforces ``resources.device_memory_gb``: a CUDA memory fraction, or on CPU a cap on peak-RSS growth.

    On CPU the growth is the process's peak resident set minus its resident set when the guard was made
    (after ``import torch``); exceeding the cap raises ``torch.OutOfMemoryError`` like a real device would.
    """

    def __init__(self, cap_gb: float | None, device: torch.device) -> None:
        self.cap = int(cap_gb * 2**30) if cap_gb else None
        self.device = device
        self.baseline = _rss_bytes() if device.type == "cpu" else 0
        if self.cap and device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.cap / total), device)

    def check(self) -> None:
        if self.cap is None or self.device.type != "cpu":
            return
        growth = int(peak_mem_mb(self.device) * 2**20) - self.baseline
        if growth > self.cap:
            raise torch.OutOfMemoryError(
                f"CPU memory cap exceeded: resident set grew by {growth / 2**30:.3f} GiB, "
                f"resources.device_memory_gb is {self.cap / 2**30:.3f}"
            )


class FinishedEarly(Exception):
    """The run ends cleanly before its step count, as a script with a short ``max_steps`` of its own would."""


@dataclass(frozen=True)
class Fault:
    """Test-only fault from ``ATTUNE_TRAINER_FAULT=KIND@STEP`` (oom, hang, crash, nan, finish)."""

    kind: str = ""
    step: int = -1

    @classmethod
    def from_env(cls) -> Fault:
        raw = os.environ.get(FAULT_ENV, "")
        if not raw:
            return cls()
        kind, _, step = raw.partition("@")
        if kind not in ("oom", "hang", "crash", "nan", "finish") or not step.isdigit():
            raise ValueError(f"{FAULT_ENV}={raw!r}: expected oom@K, hang@K, crash@K, nan@K or finish@K")
        return cls(kind, int(step))

    def before_step(self, step: int) -> None:
        if step != self.step:
            return
        log.warning("injecting fault %s at step %d", self.kind, step)
        if self.kind == "oom":
            raise torch.OutOfMemoryError(f"injected out-of-memory at step {step}")
        if self.kind == "crash":
            raise RuntimeError(f"injected crash at step {step}")
        if self.kind == "finish":
            raise FinishedEarly(step)
        while self.kind == "hang":
            time.sleep(3600)

    def poison(self, step: int) -> bool:
        return self.kind == "nan" and step == self.step


def is_oom(exc: BaseException) -> bool:
    """Whether an exception means out of memory (CUDA OOM, MemoryError, CPU allocator failure)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


# ---------------------------------------------------------------------------------------------- loop


class Trainer:
    """Builds everything a trial needs from a :class:`TrialSpec` and runs its steps."""

    def __init__(self, spec: TrialSpec, layout: Layout, sinks: list[Sink]) -> None:
        self.spec, self.layout, self.sinks = spec, layout, sinks
        recipe: Recipe = spec.recipe
        t, knobs = recipe.training, recipe.effective_knobs
        assert t is not None and recipe.model is not None  # the torch framework requires both (Recipe validation)
        if t.precision not in ("fp32", "bf16"):
            raise ValueError(f"training.precision {t.precision!r} is not supported by the reference trainer "
                             "(use fp32 or bf16)")
        self.mbs = int(cast(int, knobs["micro_batch_size"]))
        if t.global_batch_size % (self.mbs * layout.world):
            raise ValueError(f"training.global_batch_size ({t.global_batch_size}) is not divisible by "
                             f"micro_batch_size ({self.mbs}) × world size ({layout.world})")
        expected = int(cast(int, knobs["nproc_per_node"])) * recipe.resources.nodes
        if expected != layout.world:
            log.warning("knobs say %d processes but the world has %d", expected, layout.world)
        self.accum = t.global_batch_size // (self.mbs * layout.world)
        self.knobs, self.training = knobs, t
        self.threads = configure_threads(knobs, layout)
        self.memory = MemoryGuard(recipe.resources.device_memory_gb, layout.device)
        self.fault = Fault.from_env()

        model = build_model(recipe.model, t.seq_length, t.seed, t.dropout,
                            cast(Checkpointing, knobs["activation_checkpointing"]))
        self.params = sum(p.numel() for p in model.parameters())
        torch.manual_seed(t.seed + 1 + layout.rank)  # dropout masks; initial weights are already fixed
        self.model = wrap_model(model.to(layout.device), knobs, layout)
        mode = str(knobs["compile_mode"])
        self.forward: Callable[..., torch.Tensor] = (
            self.model if mode == "none" else torch.compile(self.model, mode=mode))
        self.optimizer = build_optimizer(self.model, t.optimizer, str(knobs["optimizer_impl"]))
        self.batches: Iterator[torch.Tensor] = micro_batches(
            recipe, spec.max_steps, layout.world, layout.rank, self.mbs, int(cast(int, knobs["dataloader_workers"])),
            read_latency_s(dict(os.environ)))

    def emit(self, record: Record) -> None:
        for sink in self.sinks:
            sink.write(record)

    def _now(self) -> float:
        if self.layout.device.type == "cuda":
            torch.cuda.synchronize(self.layout.device)
        return time.perf_counter()

    def _lap(self, phases: dict[str, float], name: str, since: float) -> float:
        """Add the time since ``since`` to phase ``name``; returns now."""
        now = self._now()
        phases[name] += now - since
        return now

    def _sync_gradients(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Skip gradient synchronisation on all but the last micro-step (DDP ``no_sync`` / FSDP flag)."""
        if isinstance(self.model, nn.parallel.DistributedDataParallel):
            return contextlib.nullcontext() if last else self.model.no_sync()
        if hasattr(self.model, "set_requires_gradient_sync"):
            # nn.Module.__getattr__ is typed Tensor | Module: FSDP2's method is only known at run time
            self.model.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()

    def run(self) -> None:
        lay = self.layout
        self.emit({"event": "start", "rank": lay.rank, "world": lay.world, "threads": self.threads,
                   "params": self.params, "accum": self.accum, "micro_batch_size": self.mbs,
                   "device": str(lay.device), "precision": self.training.precision,
                   "knobs": self.knobs, "startup_s": round(process_age_s(), 3)})
        for step in range(1, self.spec.max_steps + 1):
            self.emit(self.train_step(step))
        self.emit({"event": "done", "steps": self.spec.max_steps, "wall_s": round(process_age_s(), 3)})

    def train_step(self, step: int) -> Record:
        """One optimizer step over ``accum`` micro-batches; returns its step record."""
        self.fault.before_step(step)
        dev, phases = self.layout.device, dict.fromkeys(("data", "forward", "backward", "comm", "optimizer"), 0.0)
        lr = lr_at(step - 1, self.training)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        bf16 = self.training.precision == "bf16"
        loss_sum = torch.zeros((), device=dev)
        t_step = t = self._now()
        for micro in range(self.accum):
            batch = next(self.batches).to(dev, non_blocking=True)
            t = self._lap(phases, "data", t)
            with self._sync_gradients(micro == self.accum - 1):
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
                    loss = self.forward(batch[:, :-1], batch[:, 1:]) / self.accum
                if self.fault.poison(step):
                    loss = loss * float("nan")
                t = self._lap(phases, "forward", t)
                loss.backward()
            loss_sum += loss.detach()
            self.memory.check()  # bookkeeping goes with the backward, so the data phase times only the batch fetch
            t = self._lap(phases, "backward", t)
        if self.layout.world > 1:
            dist.all_reduce(loss_sum)
            loss_sum /= self.layout.world
        loss_value = loss_sum.item()
        t = self._lap(phases, "comm", t)
        if not math.isfinite(loss_value):
            raise Diverged(f"loss is {loss_value} at step {step}")
        clip = self.training.optimizer.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip is not None else math.inf)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t_end = self._lap(phases, "optimizer", t)
        step_time, tokens = t_end - t_step, self.training.tokens_per_step
        return {"event": "step", "step": step, "loss": loss_value, "grad_norm": float(norm), "lr": lr,
                "step_time_s": step_time, "tokens": tokens, "tokens_per_s": tokens / step_time,
                "phases": phases, "peak_mem_mb": round(peak_mem_mb(dev), 1)}


# ---------------------------------------------------------------------------------------------- main


def run_trial(spec: TrialSpec) -> int:
    """Run one trial in this process; returns the exit code (0, EXIT_OOM, EXIT_DIVERGED or EXIT_CRASH)."""
    knobs = spec.recipe.effective_knobs
    layout = setup_distributed(spec.device, need_group=str(knobs["dp_strategy"]) != "ddp")
    sinks: list[Sink] = [JsonlSink(spec.out_dir, layout.rank)]
    prom: PrometheusSink | None = None
    code = 0
    try:
        if spec.metrics_port is not None:
            prom = PrometheusSink(spec.metrics_port + layout.rank, layout.rank)
            sinks.append(prom)
        trainer = Trainer(spec, layout, sinks)
        trainer.run()
        if prom is not None:  # a reader of Prometheus needs the last steps too: let it scrape them once
            prom.wait_for_scrape(spec.metrics_linger_s)
    except FinishedEarly as exc:
        log.info("finishing early, before step %s", exc)
    except Exception as exc:  # every failure becomes an error record and an exit code
        kind, code = ("oom", EXIT_OOM) if is_oom(exc) else \
            ("diverged", EXIT_DIVERGED) if isinstance(exc, Diverged) else ("crash", EXIT_CRASH)
        log.exception("trial failed (%s)", kind)
        for sink in sinks:
            sink.write({"event": "error", "kind": kind, "message": f"{type(exc).__name__}: {exc}"})
    finally:
        for sink in sinks:
            sink.close()
    if dist.is_initialized() and code == 0:
        dist.barrier()  # avoid gloo's teardown race when a peer exits first
        dist.destroy_process_group()
    return code


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--spec SPEC.json``."""
    parser = argparse.ArgumentParser(prog="python -m attune.trainer.train", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="TrialSpec JSON file written by the trial backend")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"[rank{os.environ.get('RANK', '0')}] %(asctime)s %(name)s %(levelname)s %(message)s")
    with open(args.spec, encoding="utf-8") as f:
        spec = TrialSpec.model_validate_json(f.read())
    return run_trial(spec)


def _exit(code: int) -> None:
    """Leave without the interpreter's finalisation: the trial's records are closed and its process group destroyed,
    and tearing down what torch's C++ side still holds (gloo's worker threads) can abort a finished trial
    ("terminate called without an active exception", SIGABRT) and turn its exit code into a crash."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
