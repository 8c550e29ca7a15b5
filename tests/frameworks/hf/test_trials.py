"""Trial launches (local and Kubernetes) of HF recipes, and real trials of the example through LocalBackend."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from attune.frameworks.hf.logs import parse_dict
from attune.recipe.io import load_recipe
from attune.testing.procs import processes_in
from attune.trial import TrialOutcome
from tests.frameworks.hf.helpers import EXAMPLE, POOR, backend, example_recipe, hf, recipe, request


def test_trial_launch_adds_logging_instrumentation_only(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # the python with tensorboardX
    r = recipe([*POOR, "--logging_steps", "50"], tmp_path)
    tl = hf().trial_launch(r, request(tmp_path), tmp_path / "trial")
    argv = list(tl.launch.argv)
    assert argv[:len(POOR)] == POOR and tl.stop_after_steps == 4
    assert argv[argv.index("--logging_steps") + 1] == "1" and argv.count("--logging_steps") == 1  # edited in place
    added = dict(zip(argv[len(POOR) + 2::2], argv[len(POOR) + 3::2]))
    assert added == {"--logging_strategy": "steps", "--logging_nan_inf_filter": "False",
                     "--disable_tqdm": "True", "--save_strategy": "no",
                     "--report_to": "tensorboard", "--log_level": "info",
                     "--output_dir": str(tmp_path / "trial" / "hf-output")}
    # full-precision losses: the Trainer's own TensorBoard integration writes them to the trial directory
    assert tl.launch.env["TENSORBOARD_LOGGING_DIR"] == str(tmp_path / "trial" / "hf-tensorboard")
    assert tl.launch.cwd == str(tmp_path) and tl.launch.env["PYTHONUNBUFFERED"] == "1"
    assert tl.launch.env["OMP_NUM_THREADS"] == "8"  # 8 CPU slots, 1 process
    assert any("logging_steps 1" in note for note in tl.instrumentation)


def test_without_a_tensorboard_writer_trials_report_to_no_tracker_and_say_so(tmp_path, monkeypatch):
    # a real interpreter that cannot import tensorboardX: this one without its site-packages
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    (bin_dir / "python").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    tl = hf().trial_launch(recipe(POOR, tmp_path), request(tmp_path), tmp_path / "trial")
    argv = list(tl.launch.argv)
    assert argv[argv.index("--report_to") + 1] == "none" and "TENSORBOARD_LOGGING_DIR" not in tl.launch.env
    assert any("install tensorboardX" in note for note in tl.instrumentation)


def test_trial_of_an_args_file_launch_uses_a_copy(tmp_path):
    (tmp_path / "args.json").write_text(json.dumps({"per_device_train_batch_size": 2, "use_cpu": True}))
    r = recipe(["python", "train.py", "args.json"], tmp_path)
    tl = hf().trial_launch(r.with_knobs(per_device_train_batch_size=1), request(tmp_path), tmp_path / "trial")
    copy = str(tmp_path / "trial" / "hf-args" / "args.json")
    assert list(tl.launch.argv) == ["python", "train.py", copy] and list(tl.launch.files) == [copy]
    args = json.loads(tl.launch.files[copy])
    assert args["per_device_train_batch_size"] == 1 and args["gradient_accumulation_steps"] == 2
    assert args["logging_steps"] == 1 and args["output_dir"] == str(tmp_path / "trial" / "hf-output")


def test_trial_turns_off_hub_pushes():
    tl = hf().trial_launch(recipe([*POOR, "--push_to_hub"]), request(Path("/tmp/x")), Path("/tmp/x"))
    argv = list(tl.launch.argv)
    assert argv[argv.index("--push_to_hub") + 1] == "False"


def test_kubernetes_patch_changes_args_keeps_image_and_command():
    container = {"name": "trainer", "image": "me/train:1", "command": ["torchrun"],
                 "args": ["--nproc_per_node", "1", "train.py", "--per_device_train_batch_size", "1",
                          "--gradient_accumulation_steps", "8", "--use_cpu", "True"],
                 "env": [{"name": "FOO", "value": "1"}]}
    job = {"kind": "PyTorchJob", "spec": {"nprocPerNode": "1"}}
    # two CPU slots declared (the default is what the launch starts: one process)
    data = hf().import_container(container, job_spec=job["spec"], options={"devices_per_node": 2})
    from attune.recipe.io import parse_recipe

    r = parse_recipe(data).with_knobs(nproc_per_node=2)
    hf().patch_job(r, job, container, steps=8, metrics_port=9464, linger_s=30)
    assert container["image"] == "me/train:1" and container["command"] == ["torchrun"]
    args = container["args"]
    assert args[:7] == ["--nproc_per_node", "2", "train.py", "--per_device_train_batch_size", "1",
                        "--gradient_accumulation_steps", "4"]
    assert "--logging_steps" in args and "--output_dir" not in args
    assert job["spec"]["nprocPerNode"] == "2"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["FOO"] == "1" and env["PYTHONUNBUFFERED"] == "1"


def test_import_container_needs_a_command():
    from attune.errors import RecipeError

    with pytest.raises(RecipeError, match="no command"):
        hf().import_container({"args": ["train.py"]})


def test_example_recipe_is_the_importers_output_of_run_sh():
    r = load_recipe(EXAMPLE / "recipe.yaml")
    text = (EXAMPLE / "run.sh").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ln.startswith("exec "))
    assert list(hf().render(r).argv) == line.split()[1:]
    assert yaml.safe_load((EXAMPLE / "recipe.yaml").read_text())["framework"] == "hf"


# -- real trials -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_real_trial_of_the_example(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # attune reads it as trials do
    r = example_recipe(tmp_path, gradient_checkpointing=False, per_device_train_batch_size=4)
    res = backend().run(r, request(tmp_path, timeout_s=90))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    m = res.measurement
    assert m.steps_measured == 3 and len(m.losses) == 4 and all(5 < x < 7 for x in m.losses)
    assert m.tokens_per_s == pytest.approx(16 * 128 / m.step_time_median_s)
    log = (tmp_path / "trial" / "log.txt").read_text()
    assert "num_input_tokens_seen" not in log  # a flag launch cannot ask for non-padding counts: the global batch
    # the Trainer's own statement of what it trains, read from its log and checked against the recipe
    assert m.reported == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4,
                          "total_train_batch_size": 16, "total_optimization_steps": 10000,
                          "trainable_parameters": m.reported["trainable_parameters"], "loss_precision": "float32",
                          "throughput_unit": "global batch x tokens_per_sample"}
    # the losses are the TensorBoard events' unrounded values, each of which prints as the log's four digits
    printed = [float(d["loss"]) for d in map(parse_dict, log.splitlines()) if d and "grad_norm" in d]
    assert len(printed) == 4 and all(f"{x:.4g}" == f"{p:.4g}" for x, p in zip(m.losses, printed))
    assert any(f"{x:.4g}" != repr(x) for x in m.losses)
    assert m.reported["trainable_parameters"] > 100_000 and hf().report_problems(r, m.reported) == []
    assert processes_in(tmp_path) == []
    assert not (tmp_path / "hf-trainer" / "trainer_output").exists()  # output went to the trial directory
    assert (tmp_path / "trial" / "hf-output").is_dir()


@pytest.mark.slow
def test_real_two_process_trial(tmp_path):
    r = example_recipe(tmp_path, nproc_per_node=2, gradient_checkpointing=False, per_device_train_batch_size=4)
    res = backend().run(r, request(tmp_path, timeout_s=90))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    log = (tmp_path / "trial" / "log.txt").read_text()
    assert "world size 2" in log and log.count("'loss'") == 4  # rank 0 prints; the job was ended by attune
    assert processes_in(tmp_path) == []


def test_kubernetes_python_launch_with_more_processes_becomes_torchrun():
    container = {"name": "pytorch", "image": "img", "command": ["python", "train.py"],
                 "args": ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4", "--use_cpu",
                          "True"]}
    from attune.recipe.io import parse_recipe

    r = parse_recipe(hf().import_container(container, options={"devices_per_node": 2})).with_knobs(nproc_per_node=2)
    job: dict = {"spec": {}}
    hf().patch_job(r, job, container, steps=4, metrics_port=9464, linger_s=0)
    assert container["command"] == ["python"]  # the image's interpreter; torchrun is its module
    assert container["args"][:5] == ["-m", "torch.distributed.run", "--nproc_per_node", "2", "train.py"]
    assert job["spec"]["nprocPerNode"] == "2"


def test_kubernetes_trials_need_flags_not_an_args_file(tmp_path):
    from attune.errors import RecipeError

    (tmp_path / "a.json").write_text("{}")
    r = recipe(["python", "train.py", "a.json"], tmp_path)
    with pytest.raises(RecipeError, match="inside the image"):
        hf().patch_job(r, {"spec": {}}, {"command": ["python"], "args": ["train.py", "a.json"]}, steps=4,
                       metrics_port=1, linger_s=0)


def test_pytorchjob_process_count_reaches_torchrun_through_its_environment():
    container = {"name": "pytorch", "image": "img", "command": ["torchrun"],
                 "args": ["train.py", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2"]}
    from attune.recipe.io import parse_recipe

    r = parse_recipe(hf().import_container(container, job_spec={"nprocPerNode": "2"},
                                           options={"devices_per_node": 4}))
    assert r.knob("nproc_per_node") == 2 and r.launch.env == {"PET_NPROC_PER_NODE": "2"}
    assert hf().contract(r)["hf.global_batch_size"].value == 8
    job: dict = {"kind": "PyTorchJob", "spec": {"nprocPerNode": "2"}}
    hf().patch_job(r.with_knobs(nproc_per_node=4), job, container, steps=4, metrics_port=1, linger_s=0)
    assert container["args"][:3] == ["--nproc_per_node", "4", "train.py"] and job["spec"]["nprocPerNode"] == "4"
    assert container["args"][container["args"].index("--gradient_accumulation_steps") + 1] == "1"


def test_preflight_finds_what_would_fail_a_trial(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # this venv's python first
    (tmp_path / "train.py").write_text("")
    assert hf().preflight(recipe(POOR, tmp_path), "local") == []
    problems = hf().preflight(recipe(["python", "missing.py"], tmp_path), "local")
    assert any("missing.py does not exist" in p for p in problems)
    problems = hf().preflight(recipe(["/nonexistent/bin/python3", "train.py"], tmp_path), "local")
    assert any("/nonexistent/bin/python3 does not exist" in p for p in problems)
    problems = hf().preflight(recipe("python train.py --bf16", tmp_path), "local")
    assert any("--use_cpu True" in p for p in problems)
    assert hf().preflight(recipe("python train.py --bf16 --use_cpu", tmp_path), "local") == []
    assert "backend" in hf().preflight(recipe(POOR, tmp_path), "sim")[0]


def test_preflight_finds_an_interpreter_without_transformers(tmp_path):
    (tmp_path / "train.py").write_text("")
    bare = tmp_path / "bin" / "python3"
    bare.parent.mkdir()
    bare.write_text("#!/bin/sh\nexit 3\n")  # an interpreter whose find_spec finds nothing
    bare.chmod(0o755)
    problems = hf().preflight(recipe([str(bare), "train.py"], tmp_path), "local")
    assert any("cannot import transformers" in p for p in problems)
