"""End-to-end runs of the reference trainer on a small GPT: determinism, layout equivalence, faults, metrics."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attune.recipe.model import Recipe
from attune.testing.procs import wait_for
from attune.trainer.config import EXIT_DIVERGED, EXIT_OOM, FAULT_ENV
from attune.trainer.sinks import STEP_SERIES_CAP, PrometheusSink
from attune.trainer.train import lr_at

Make = Callable[..., Recipe]


def _close(a: list[float], b: list[float], atol: float) -> bool:
    return len(a) == len(b) > 0 and float(np.max(np.abs(np.subtract(a, b)))) <= atol


def test_records_follow_the_contract(runner, recipe: Make) -> None:
    code, recs = runner.inproc(recipe(), steps=3)
    assert code == 0
    assert [r["event"] for r in recs] == ["start", "step", "step", "step", "done"]
    start, step = recs[0], recs[1]
    assert {"rank", "world", "threads", "params", "accum", "micro_batch_size", "device"} <= start.keys()
    assert start["accum"] == 4 and start["world"] == 1 and start["threads"] == 1
    assert step["tokens"] == 8 * 32 and step["step"] == 1 and step["peak_mem_mb"] > 0
    assert set(step["phases"]) == {"data", "forward", "backward", "comm", "optimizer"}
    assert sum(step["phases"].values()) <= step["step_time_s"] * 1.01
    assert step["lr"] == pytest.approx(5e-4) and step["grad_norm"] > 0


def test_rerun_is_bit_exact_and_loss_decreases(runner, recipe: Make) -> None:
    a = runner.losses(runner.inproc(recipe(), steps=6)[1])
    b = runner.losses(runner.inproc(recipe(), steps=6)[1])
    assert a == b
    assert a[-1] < a[0]


def test_micro_batch_split_agrees(runner, recipe: Make) -> None:
    one = runner.losses(runner.inproc(recipe({"micro_batch_size": 1}))[1])
    four = runner.losses(runner.inproc(recipe({"micro_batch_size": 4}))[1])
    assert _close(one, four, 1e-6)


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_is_bit_exact(runner, recipe: Make, mode: str) -> None:
    ref = runner.losses(runner.inproc(recipe())[1])
    assert runner.losses(runner.inproc(recipe({"activation_checkpointing": mode}))[1]) == ref


def test_dataloader_workers_and_optimizer_impls_agree(runner, recipe: Make) -> None:
    ref = runner.losses(runner.inproc(recipe())[1])
    assert runner.losses(runner.inproc(recipe({"dataloader_workers": 2}))[1]) == ref
    for impl in ("for_loop", "fused"):
        assert _close(runner.losses(runner.inproc(recipe({"optimizer_impl": impl}))[1]), ref, 1e-6)


def test_contract_changes_change_the_losses(runner, recipe: Make) -> None:
    ref = runner.losses(runner.inproc(recipe())[1])
    lr = runner.losses(runner.inproc(recipe(optimizer={"lr": 3e-3}))[1])
    bf16 = runner.losses(runner.inproc(recipe(precision="bf16"))[1])
    assert lr[0] == ref[0] and abs(lr[-1] - ref[-1]) > 1e-3
    assert ref != bf16 and _close(ref, bf16, 5e-2)


def test_lr_schedule_shapes(recipe: Make) -> None:
    t = recipe(schedule={"name": "cosine", "warmup_steps": 10, "min_lr_ratio": 0.1}).training
    assert lr_at(0, t) == pytest.approx(1e-4) and lr_at(9, t) == pytest.approx(1e-3)
    assert 1e-3 > lr_at(50, t) > lr_at(99, t) > 1e-4
    assert lr_at(10_000, t) == pytest.approx(1e-4)
    lin = recipe(schedule={"name": "linear", "warmup_steps": 0, "min_lr_ratio": 0.0}).training
    assert lr_at(50, lin) == pytest.approx(5e-4)


def test_oom_fault_exits_3_with_error_record(runner, recipe: Make) -> None:
    rc, out, _ = runner.proc(recipe(), steps=4, env={FAULT_ENV: "oom@2"})
    recs = runner.records(out)
    assert rc == EXIT_OOM
    assert [r["event"] for r in recs] == ["start", "step", "error"] and recs[-1]["kind"] == "oom"


@pytest.mark.parametrize(("fault", "kind", "code"), [("nan@2", "diverged", EXIT_DIVERGED), ("crash@3", "crash", 1)])
def test_nan_and_crash_faults(runner, recipe: Make, monkeypatch, fault: str, kind: str, code: int) -> None:
    monkeypatch.setenv(FAULT_ENV, fault)
    rc, recs = runner.inproc(recipe(), steps=4)
    assert rc == code and recs[-1]["event"] == "error" and recs[-1]["kind"] == kind


@pytest.mark.slow
def test_oom_under_torchrun_writes_error_records_on_every_rank(runner, recipe: Make) -> None:
    rc, out, _ = runner.proc(recipe({"nproc_per_node": 2}), steps=4, nproc=2, env={FAULT_ENV: "oom@2"})
    assert rc != 0  # torchrun reports 1 for any failed worker; the record tells why
    for rank in (0, 1):
        assert runner.records(out, rank)[-1]["kind"] == "oom"


def test_token_file_and_shuffled_order(runner, recipe: Make, tmp_path) -> None:
    path = tmp_path / "tokens.npy"
    rng = np.random.default_rng(0)
    np.save(path, ((rng.integers(0, 256) + 3 * np.arange(40 * 33)) % 256).astype(np.uint16))
    seq = runner.losses(runner.inproc(recipe(data={"source": "tokens", "path": str(path)}))[1])
    shuf = runner.losses(runner.inproc(recipe(data={"source": "tokens", "path": str(path), "order": "shuffled"}))[1])
    assert len(seq) == 4 and seq != shuf and seq[-1] < seq[0]


def test_memory_cap_raises_oom(runner, recipe: Make) -> None:
    rc, out, _ = runner.proc(recipe(resources={"device_memory_gb": 0.001}), steps=2)
    recs = runner.records(out)
    assert rc == EXIT_OOM and recs[-1]["kind"] == "oom" and "memory cap" in recs[-1]["message"]


def test_hang_fault_stops_making_progress(runner, recipe: Make) -> None:
    proc, out = runner.proc(recipe(), steps=4, env={FAULT_ENV: "hang@2"}, wait=False)
    try:
        stderr = Path(f"{out}.stderr")
        # the trainer says when it enters the hang, before step 2 and its record: from then on no step can follow
        wait_for(lambda: (stderr.exists() and "injecting fault hang at step 2" in stderr.read_text(errors="replace"))
                 or proc.poll() is not None, 60, "the trainer to enter the injected hang")
        assert proc.poll() is None
        assert [r["event"] for r in runner.records(out)] == ["start", "step"]
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_prometheus_sink_serves_rank_labelled_metrics() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = PrometheusSink(port, rank=1)
    try:
        for _ in range(2):
            sink.write({"event": "step", "step_time_s": 0.5, "tokens_per_s": 512.0, "loss": 2.5, "tokens": 256})
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        sink.close()
    assert 'attune_trainer_tokens_total{rank="1"} 512.0' in text
    assert 'attune_trainer_steps_total{rank="1"} 2.0' in text
    assert 'attune_trainer_loss{rank="1"} 2.5' in text
    assert 'attune_trainer_step_time_seconds{rank="1"} 0.5' in text
    assert 'attune_trainer_tokens_per_second{rank="1"} 512.0' in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def test_prometheus_sink_keeps_every_steps_loss_and_grad_norm() -> None:
    port = _free_port()
    sink = PrometheusSink(port, rank=0)
    try:
        for step in (1, 2, 3, STEP_SERIES_CAP + 1):
            sink.write({"event": "step", "step": step, "step_time_s": 0.5, "tokens_per_s": 512.0,
                        "loss": 10.0 - step, "grad_norm": step / 2, "tokens": 256})
        text = _scrape(port)
    finally:
        sink.close()
    for step in (1, 2, 3):  # set once, still exported after later steps
        assert f'attune_trainer_step_loss{{rank="0",step="{step}"}} {10.0 - step}' in text
        assert f'attune_trainer_step_grad_norm{{rank="0",step="{step}"}} {step / 2}' in text
    assert f'step="{STEP_SERIES_CAP + 1}"' not in text  # past the cap: no per-step series
    assert 'attune_trainer_loss{rank="0"} ' + str(10.0 - STEP_SERIES_CAP - 1) in text


def test_wait_for_scrape_needs_a_scrape_that_began_after_it() -> None:
    port = _free_port()
    sink = PrometheusSink(port, rank=0)
    try:
        _scrape(port)  # a scrape before the wait does not count
        t0 = time.monotonic()
        assert sink.wait_for_scrape(0.3) is False
        assert 0.3 <= time.monotonic() - t0 < 5
        timer = threading.Timer(0.2, _scrape, (port,))
        timer.start()
        t0 = time.monotonic()
        assert sink.wait_for_scrape(30) is True
        assert time.monotonic() - t0 < 10  # the scrape ended the wait, not the timeout
        timer.join()
        assert sink.scrapes == 2
    finally:
        sink.close()


def test_trainer_serving_metrics_waits_until_its_final_state_was_scraped(runner, recipe: Make,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from attune.trainer.train import run_trial

    port, steps = _free_port(), 5
    spec = runner.spec(recipe(), steps).model_copy(update={"metrics_port": port, "metrics_linger_s": 60.0})
    done_path = Path(spec.out_dir) / "rank0.jsonl"
    seen: dict[str, object] = {}
    lingering = threading.Event()
    waits = PrometheusSink.wait_for_scrape

    def wait_for_scrape(self: PrometheusSink, timeout_s: float) -> bool:
        lingering.set()
        return waits(self, timeout_s)

    monkeypatch.setattr(PrometheusSink, "wait_for_scrape", wait_for_scrape)

    finished = threading.Event()

    def scraper() -> None:  # scrapes after the trainer wrote its last record and began to wait for a scrape
        if not lingering.wait(60):  # a trainer that returns at once never waits: the scrape never comes
            return
        assert '"event": "done"' in done_path.read_text()
        for _ in range(10):  # again if the first began a moment before the trainer took its mark
            began = time.monotonic()  # the trainer counts a scrape once it has sent the body, which
            text = _scrape(port)      # can be a moment before this client has read all of it
            seen.setdefault("began", began)
            seen.setdefault("text", text)
            if finished.wait(5):
                return

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    assert run_trial(spec) == 0
    returned = time.monotonic()
    finished.set()
    thread.join(10)
    assert "text" in seen, "the scraper never got an answer"
    assert returned >= float(seen["began"]), "run_trial returned before its final scrape began"
    text = str(seen["text"])
    losses = [json.loads(line)["loss"] for line in done_path.read_text().splitlines()
              if json.loads(line)["event"] == "step"]
    for step, loss in enumerate(losses, 1):
        assert f'attune_trainer_step_loss{{rank="0",step="{step}"}} {loss!r}' in text
    assert len(losses) == steps


def test_cli_run_alone_writes_done(runner, recipe: Make) -> None:
    rc, out, err = runner.proc(recipe(), steps=2)
    assert rc == 0, err
    assert runner.records(out)[-1] == {"event": "done", "steps": 2, "wall_s": runner.records(out)[-1]["wall_s"]}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", pytest.param("fsdp_no_reshard", marks=pytest.mark.slow)])
def test_two_processes_agree_with_one(runner, recipe: Make, strategy: str) -> None:
    ref = runner.losses(runner.inproc(recipe({"micro_batch_size": 2}))[1])
    knobs = {"nproc_per_node": 2, "dp_strategy": strategy, "micro_batch_size": 1 if strategy == "ddp" else 2}
    rc, out, err = runner.proc(recipe(knobs), steps=4, nproc=2)
    assert rc == 0, err[-3000:]
    r0, r1 = runner.records(out, 0), runner.records(out, 1)
    assert runner.losses(r0) == runner.losses(r1)
    assert r0[0]["world"] == 2 and r0[0]["accum"] == (4 if strategy == "ddp" else 2)
    assert _close(runner.losses(r0), ref, 1e-5)
    assert r0[-1]["event"] == "done" and r1[-1]["event"] == "done"


@pytest.mark.slow
def test_torch_compile_runs_and_agrees(runner, recipe: Make) -> None:
    ref = runner.losses(runner.inproc(recipe())[1])
    rc, out, err = runner.proc(recipe({"compile_mode": "default"}), steps=4, timeout=300)
    assert rc == 0, err[-3000:]
    assert _close(runner.losses(runner.records(out)), ref, 1e-5)
