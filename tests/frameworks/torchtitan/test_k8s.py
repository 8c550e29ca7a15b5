"""torchtitan cannot train here: trials are Kubernetes jobs, rendered from the user's container."""

from __future__ import annotations

import copy
from typing import Any

from attune import api
from tests.frameworks.torchtitan.helpers import recipe, registry_argv, titan, toml_argv


def test_trial_container_changes_the_command_line_only():
    r = recipe()
    argv = toml_argv()
    container = {"name": "trainer", "image": "ghcr.io/pytorch/torchtitan:0.2.2", "command": argv[:1], "args": argv[1:]}
    job: dict[str, Any] = {"kind": "PyTorchJob", "spec": {}}
    c = copy.deepcopy(container)
    titan().patch_job(r.with_knobs(compile=True), job, c, steps=8, metrics_port=9464, linger_s=30)
    args = c["args"]
    assert "--compile.enable" in args  # the TOML is inside the image: the change goes on the command line
    assert args[args.index("--metrics.log_freq") + 1] == "1" and "--metrics.disable_color_printing" in args
    assert "--checkpoint.no-enable" in args and "--validation.no-enable" in args
    assert args[:len(container["args"])] == container["args"] and job["spec"]["nprocPerNode"] == "8"
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in c["env"]


def test_registry_form_container_import_needs_no_files():
    argv = registry_argv()
    data = titan().import_container({"command": argv[:1], "args": argv[1:]}, options={"framework_version": "0.2.2"})
    assert data["launch"]["files"] == {} and data["knobs"]["tensor_parallel_degree"] == 2


def test_local_trials_are_refused_before_spending_budget():
    r = recipe()
    problems = api.preflight(r.model_copy(update={"resources": r.resources.model_copy(update={"accelerator": "cpu"})}),
                             "local")
    assert problems and "CUDA GPUs" in problems[0]
    assert "sim" not in titan().backends
