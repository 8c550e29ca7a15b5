"""Real trials are Kubernetes jobs: the user's container with the change applied to its command line, plus logging
instrumentation that does not change what is learned."""

from __future__ import annotations

import copy
from typing import Any

from tests.frameworks.megatron.helpers import (
    NEMO_8B,
    bridge_argv,
    bridge_yaml,
    megatron,
    mlm,
    nemo,
)


def container_of(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": "trainer", "image": "nvcr.io/nvidia/nemo:25.07", "command": argv[:1], "args": argv[1:],
            "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}


def patch(recipe, container, steps=8):
    job: dict[str, Any] = {"kind": "PyTorchJob", "spec": {}}
    c = copy.deepcopy(container)
    megatron().patch_job(recipe, job, c, steps=steps, metrics_port=9464, linger_s=30)
    return job, c


def test_megatron_lm_trial_container():
    r = mlm()
    base = container_of(list(r.launch.argv), dict(r.launch.env))
    _, c = patch(r.with_knobs(micro_batch_size=2, **{"env.NCCL_NVLS_ENABLE": "0"}), base)
    args = c["args"]
    assert c["command"] == ["torchrun"] and c["image"] == base["image"]
    assert args[args.index("--micro-batch-size") + 1] == "2"
    assert args[args.index("--exit-interval") + 1] == "8" and "--save" not in args and "--save-interval" not in args
    assert args[args.index("--eval-iters") + 1] == "0" and "--log-throughput" in args
    assert args[args.index("--train-samples") + 1] == "1953125000"  # the schedule stays
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["PYTHONUNBUFFERED"] == "1" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_bridge_trial_puts_every_change_on_the_command_line():
    # the YAML lives in the image: a trial cannot edit it, so the change is a key=value override
    r = bridge_yaml()
    _, c = patch(r.with_knobs(micro_batch_size=2), container_of(bridge_argv("llama3_8b_pretrain_8gpu_h100_bf16.yaml")))
    assert "train.micro_batch_size=2" in c["args"] and "train.exit_interval=8" in c["args"]
    assert "logger.log_interval=1" in c["args"] and "train.eval_iters=0" in c["args"]


def test_nemo2_trial():
    r = nemo()
    _, c = patch(r.with_knobs(tensor_model_parallel_size=1), container_of(NEMO_8B))
    assert c["command"] == ["nemo"] and "trainer.strategy.tensor_model_parallel_size=1" in c["args"]
    assert "trainer.log_every_n_steps=1" in c["args"] and "trainer.max_steps=1168251" not in c["args"]


def test_container_import_reads_the_launch_without_files():
    r = megatron().import_container(container_of(NEMO_8B), options={"framework_version": "2.4.0"})
    assert r["launch"]["argv"] == NEMO_8B and r["framework"] == "megatron"
