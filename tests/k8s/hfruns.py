"""TuningRuns made from examples/tuningrun-hf.yaml (an ordinary HuggingFace PyTorchJob as the trial template), shared
by the real control plane's tests (end to end, lifecycle, API faults)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.k8s.harness import NS, ROOT, ClusterReads, wait_for


def master_container(job: dict[str, Any]) -> dict[str, Any]:
    """The first container of a PyTorchJob's Master replica."""
    container: dict[str, Any] = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    return container


def hf_example_run(name: str, **output: object) -> dict[str, Any]:
    """The example as it is, in namespace ``ml``, with no agent sidecar (the local playbook proposes); ``output``
    adds to its ``spec.output`` (e.g. ``deleteWithRun=True``)."""
    run: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "tuningrun-hf.yaml").read_text())
    run["metadata"] = {"name": name, "namespace": NS}
    run["spec"]["agent"]["endpoint"] = None
    if output:
        run["spec"]["output"] = {**(run["spec"].get("output") or {}), **output}
    return run


def hf_run(name: str, **output: object) -> dict[str, Any]:
    """The example with a small budget, made data-bound so that its decision no load can turn: each batch read waits
    40 ms (the example's simulated slow storage, a sleep), 16 micro-batches a step, short sequences. Per-device batch
    2 halves the reads: 0.64 s of waiting a step against 0.32 s, about 1.8x whatever the CPUs are doing, far beyond
    the paired decision's noise."""
    run = hf_example_run(name, **output)
    run["spec"]["budget"].update(acceleratorHours=0.1, maxTrials=5, trialDeadlineSeconds=240)
    run["spec"]["metrics"].update(warmupSteps=1, measureSteps=3, baselineRepeats=2)
    args = master_container(run["spec"]["trialTemplate"])["args"]
    for flag, value in (("--gradient_accumulation_steps", "16"), ("--seq_len", "16")):
        args[args.index(flag) + 1] = value
    args += ["--read_latency_ms", "40"]
    return run


def finished(reads: ClusterReads, name: str, timeout: float, interval: float) -> dict[str, Any]:
    """The run once it is Succeeded or Failed, its records printed (id, kind, change, outcome, decision, time)."""
    done: dict[str, Any] = wait_for(
        lambda: ((reads.run(name) or {}).get("status") or {}).get("phase") in ("Succeeded", "Failed")
        and reads.run(name), timeout, f"the {name} run to finish", interval=interval)
    for r in reads.records(name):
        m = r.get("measurement") or {}
        print(r["id"], r["kind"], r["change"], r["outcome"], r["message"][:100], "|", r["decision"], "|",
              round(r["wall_s"], 1), "s", m.get("steps_measured"), m.get("step_time_median_s"))
    return done
