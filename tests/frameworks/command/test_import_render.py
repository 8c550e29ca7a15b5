"""`command` recipes: the declaration read, the command imported, and rendered back with exactly the changed flags."""

from __future__ import annotations

import pytest

from attune.errors import RecipeError
from attune.frameworks.command import parse_argv
from attune.recipe.io import parse_recipe
from tests.frameworks.command.helpers import EXAMPLE, POOR, command, declaration, example_declaration, imported, recipe


def test_import_reads_every_declared_knob_as_the_command_has_it():
    data = imported(POOR)
    assert data["framework"] == "command" and data["knobs"] == {"batch_size": 1, "compile": False, "threads": "1"}
    assert data["launch"]["argv"] == POOR and data["launch"]["env"] == {"OMP_NUM_THREADS": "1"}
    assert data["launch"]["declaration"]["steps"] == {"preset": "nanogpt"}
    r = parse_recipe(data)
    assert set(r.catalogue.knobs) == {"batch_size", "compile", "threads"}
    assert r.tokens_per_step == 32 * 64  # global batch 1 × 32 samples of 64 tokens


def test_an_unchanged_recipe_renders_the_users_command_exactly():
    launch = command().render(recipe())
    assert list(launch.argv) == POOR and dict(launch.env) == {"OMP_NUM_THREADS": "1"}
    assert launch.cwd == str(EXAMPLE)


def test_a_batch_move_edits_its_flag_and_derives_the_accumulation_in_the_commands_own_style():
    launch = command().render(recipe().with_knobs(batch_size=4))
    assert list(launch.argv) == ["python", "train.py", "--batch_size=4", "--gradient_accumulation_steps=8",
                                 "--compile=False", "--max_iters=5000"]


def test_a_spaced_command_stays_spaced_and_an_absent_flag_is_appended_in_its_style():
    spaced = ["python", "train.py", "--gradient_accumulation_steps", "16", "--max_iters", "5000"]
    r = recipe(spaced)
    assert r.knob("batch_size") == 1 and r.knob("compile") is False  # the declared defaults
    argv = list(command().render(r.with_knobs(batch_size=2)).argv)
    assert argv == [*spaced[:2], "--gradient_accumulation_steps", "8", "--max_iters", "5000", "--batch_size", "2"]
    argv = list(command().render(r.with_knobs(compile=True)).argv)
    assert argv == [*spaced, "--compile", "True"]


def test_a_boolean_keeps_its_spelling_and_an_environment_knob_sets_its_variable():
    r = recipe(["python", "train.py", "--batch_size=1", "--gradient_accumulation_steps=16", "--compile=false"])
    assert list(command().render(r.with_knobs(compile=True)).argv)[-1] == "--compile=true"
    launch = command().render(r.with_knobs(threads="2"))
    assert launch.env["OMP_NUM_THREADS"] == "2" and list(launch.argv) == list(r.launch.argv)


def test_a_switch_is_added_and_removed():
    d = declaration(knobs={**example_declaration()["knobs"],
                           "checkpointing": {"flag": "--grad_ckpt", "switch": True, "values": [False, True],
                                             "semantics": "preserving", "role": "checkpointing"}})
    r = recipe([*POOR, "--grad_ckpt"], decl=d)
    assert r.knob("checkpointing") is True
    assert "--grad_ckpt" not in command().render(r.with_knobs(checkpointing=False)).argv
    r = recipe(POOR, decl=d)
    assert r.knob("checkpointing") is False
    assert list(command().render(r.with_knobs(checkpointing=True)).argv) == [*POOR, "--grad_ckpt"]


def test_the_process_count_edits_the_launcher():
    knobs = {**example_declaration()["knobs"], "processes": {"launcher": "processes", "values": [1, 2, 4],
                                                             "role": "processes"}}
    d = declaration(knobs=knobs)
    r = recipe(POOR, decl=d, devices_per_node=4)
    argv = list(command().render(r.with_knobs(processes=2)).argv)
    assert argv == ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *POOR[1:]]
    tr = ["torchrun", "--standalone", "--nproc_per_node=2", *POOR[1:]]
    r = recipe(tr, decl=d, devices_per_node=4)
    assert r.knob("processes") == 2
    assert list(command().render(r.with_knobs(processes=4, batch_size=1)).argv)[2] == "--nproc_per_node=4"
    # the script divides the accumulation among its processes: it must stay divisible by the count
    with pytest.raises(ValueError, match="divisible by the process count"):
        recipe(["python", "train.py", "--batch_size=1", "--gradient_accumulation_steps=2"], decl=d,
               devices_per_node=4).with_knobs(processes=4)


def test_an_executable_of_its_own_is_read_too():
    d = declaration(knobs={"batch_size": example_declaration()["knobs"]["batch_size"]})
    r = recipe(["./train.sh", "--batch_size", "2", "--gradient_accumulation_steps", "8"], decl=d)
    assert r.knob("batch_size") == 2 and parse_argv(r.launch.argv).head is None
    assert list(command().render(r.with_knobs(batch_size=4)).argv)[1:] == ["--batch_size", "4",
                                                                          "--gradient_accumulation_steps", "4"]


def test_a_config_file_the_command_names_is_carried_and_frozen(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "small.py").write_text("n_layer = 2\n")
    r = recipe(["python", "train.py", "config/small.py", "--batch_size=2", "--gradient_accumulation_steps=8"],
               tmp_path)
    assert r.launch.files == {"config/small.py": "n_layer = 2\n"}
    assert command().contract(r)["launch.files"].value == {"config/small.py": "n_layer = 2\n"}


@pytest.mark.parametrize(("argv", "changes", "message"), [
    (["python", "train.py", "--gradient_accumulation_steps=16"], {"knobs": {"batch_size": {
        "flag": "--batch_size", "values": [1, 2]}}}, "knobs.batch_size: --batch_size is not on the command line"),
    (["python", "train.py", "--batch_size=3", "--gradient_accumulation_steps=16"], {},
     "knobs.batch_size: the launch has --batch_size = 3, outside the declared values"),
    (["python", "train.py", "--batch_size=1"], {"batch": {"global": "batch_size * grad_accum",
                                                          "accumulation": {"flag": "--grad_accum"}}},
     "batch.accumulation: --grad_accum is not on the command line"),
])
def test_a_command_that_does_not_match_its_declaration_is_named(argv, changes, message):
    d = declaration(**changes)
    with pytest.raises(RecipeError) as err:
        imported(argv, decl=d)
    assert message in str(err.value)


def test_import_without_a_declaration_says_how_to_get_one():
    with pytest.raises(RecipeError, match=r"--knobs knobs.yaml.*--suggest"):
        command().import_launch(POOR, cwd=EXAMPLE, env={}, options={})


def test_a_trial_adds_the_declared_trial_flags_and_ends_after_its_steps(tmp_path):
    from attune.backends.base import TrialRequest

    d = declaration(trial_flags={"--log_interval": "1", "--out_dir": "{trial_dir}/out"})
    r = recipe([*POOR, "--log_interval=10"], decl=d)
    req = TrialRequest(trial_id=3, trial_dir=tmp_path, warmup_steps=1, measure_steps=4, timeout_s=60)
    tl = command().trial_launch(r.with_knobs(batch_size=2), req, tmp_path)
    assert list(tl.launch.argv) == ["python", "train.py", "--batch_size=2", "--gradient_accumulation_steps=16",
                                    "--compile=False", "--max_iters=5000", "--log_interval=1",
                                    f"--out_dir={tmp_path}/out"]
    assert tl.stop_after_steps == 5 and tl.launch.env["PYTHONUNBUFFERED"] == "1"
    assert list(command().render(r).argv) == [*POOR, "--log_interval=10"]  # the user's command keeps its own


def test_a_kubernetes_trial_runs_the_rendered_command_in_the_users_container():
    r = recipe().with_knobs(batch_size=4, threads="1")
    container = {"name": "trainer", "image": "me/nanogpt:1", "command": ["python"],
                 "args": POOR[1:], "env": [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "FOO", "value": "x"}]}
    job: dict = {"kind": "PyTorchJob", "spec": {}}
    command().patch_job(r, job, container, steps=8, metrics_port=9464, linger_s=30)
    assert container["image"] == "me/nanogpt:1" and container["command"] == ["python"]
    assert container["args"] == ["train.py", "--batch_size=4", "--gradient_accumulation_steps=8", "--compile=False",
                                 "--max_iters=5000"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"OMP_NUM_THREADS": "1", "FOO": "x", "PYTHONUNBUFFERED": "1"}
    assert job["spec"] == {}  # no declared process count: the job's own stays
