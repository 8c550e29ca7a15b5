"""`attune knobs --framework command --suggest -- CMD`: a starting declaration read from a command and its script's
source (never by running the script), every guess marked, that imports the command once saved."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from attune.frameworks.command.declaration import parse
from tests.frameworks.command.helpers import EXAMPLE, FIXTURES, POOR, cli_env, imported

HF_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf-trainer"


def suggest(argv: list[str], cwd: Path, *, cpus: int | None = None) -> subprocess.CompletedProcess[str]:
    """The suggestion, run as a user runs it (on ``cpus`` of this machine's CPUs where given)."""
    def pin() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])

    return subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "command", "--suggest", "--",
                           *argv], capture_output=True, text=True, cwd=cwd, env=cli_env(), timeout=300,
                          preexec_fn=pin)


def fixture_copy(name: str, tmp_path: Path) -> Path:
    work = tmp_path / name
    shutil.copytree(FIXTURES / name, work)
    return work


def test_a_nanogpt_command_gets_its_preset_batch_and_contract_and_imports():
    res = suggest([*POOR, "--learning_rate=6e-4", "--eval_interval=2000"], EXAMPLE)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "settings are module-level globals" in text  # read from train.py's source, as its configurator does
    data = yaml.safe_load(text)
    assert data["steps"] == "nanogpt" and data["batch"]["accumulation"] == {"flag": "--gradient_accumulation_steps",
                                                                          "default": 32}
    assert set(data["knobs"]) == {"batch_size", "compile", "threads"} and "--learning_rate" in data["contract"]
    assert "# every other flag stays frozen as the command writes it: --eval_interval" in text
    assert text.count("# guess") >= 5
    parse(data)  # a valid declaration as it stands
    imported([*POOR, "--learning_rate=6e-4"], decl=data)  # and it reads the command it was made from


def test_an_argparse_script_the_suggestion_reads_through_its_help():
    # the HF example parses its flags with transformers' HfArgumentParser (argparse): its --help lists them all
    res = suggest(["python", "train.py", "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "16",
                   "--use_cpu", "True"], HF_EXAMPLE)
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load(res.stdout)
    assert data["steps"] == "hf" and data["batch"]["global"] == "per_device_train_batch_size * " \
        "gradient_accumulation_steps"
    knobs = data["knobs"]
    assert {"per_device_train_batch_size", "dataloader_num_workers", "torch_compile"} <= set(knobs)
    assert knobs["dataloader_num_workers"]["default"] == 0  # read from --help's "(default: 0)"
    assert {"--learning_rate", "--seed", "--max_steps", "--bf16"} <= set(data["contract"])
    parse(data)


def test_suggest_needs_a_command_and_the_command_framework(tmp_path):
    res = subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "command", "--suggest"],
                         capture_output=True, text=True, env=cli_env(), timeout=120)
    assert res.returncode != 0 and "give the command after `--`" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "hf", "--suggest", "--", "python",
                          "x.py"], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert res.returncode != 0 and "--framework command" in res.stderr


def test_knobs_lists_the_roles_and_a_declarations_knobs():
    res = subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "command"], capture_output=True,
                         text=True, env=cli_env(), timeout=120)
    assert res.returncode == 0 and res.stdout.splitlines()[0] == "role\twhat it is"
    assert {line.split("\t")[0] for line in res.stdout.splitlines()[1:]} == {
        "batch_per_process", "processes", "loader_workers", "compile", "checkpointing", "threads", "other"}
    res = subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "command", "--knobs", "knobs.yaml"],
                         capture_output=True, text=True, env=cli_env(), timeout=120, cwd=EXAMPLE)
    rows = [line.split("\t") for line in res.stdout.splitlines()[1:]]
    assert res.returncode == 0 and [r[0] for r in rows] == ["batch_size", "compile", "threads"]
    assert rows[0][1] == "1, 2, 4, 8, 16, 32" and rows[0][4].startswith("--batch_size: ")
    res = subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "command", "--knobs", "none.yaml"],
                         capture_output=True, text=True, env=cli_env(), timeout=120, cwd=EXAMPLE)
    assert res.returncode != 0 and "cannot read the knob declaration none.yaml" in res.stderr


def test_the_suggestion_reads_argparse_from_the_source_and_never_runs_the_script(tmp_path):
    work = fixture_copy("argparse_script", tmp_path)
    res = suggest(["python", "train.py", "--micro_batch_size", "8", "--grad_accum", "4"], work)
    assert res.returncode == 0, res.stderr
    assert not (work / "EXECUTED").exists(), "the script was run"
    data = yaml.safe_load(res.stdout)
    assert data["steps"] == "step_loss" and data["batch"]["global"] == "micro_batch_size * grad_accum"
    assert data["batch"]["accumulation"] == {"flag": "--grad_accum", "default": 4}
    knobs = data["knobs"]
    assert knobs["num_workers"]["role"] == "loader_workers" and knobs["num_workers"]["default"] == 2
    assert knobs["compile"]["switch"] is True
    # the contract: the learning-affecting settings the source declares, not only the two flags on the command line
    assert {"--lr", "--seed", "--max_steps", "--warmup_steps", "--seq_len", "--dataset"} <= set(data["contract"])
    assert data["tokens_per_sample"] == 512  # the --seq_len default, read from its add_argument call
    assert data["loss_is_step_mean"] is True and data["eval_shares_generator"] is False
    parse(data)
    imported(["python", "train.py", "--micro_batch_size", "8", "--grad_accum", "4"], work, decl=data)


def test_the_suggestion_marks_each_hazard_it_sees_in_a_nanogpt_script_with_why(tmp_path):
    work = fixture_copy("hazards", tmp_path)
    res = suggest(["python", "train.py", "--batch_size=12", "--compile=False"], work)
    assert res.returncode == 0, res.stderr
    assert not (work / "EXECUTED").exists(), "the script was run"
    text = res.stdout
    data = yaml.safe_load(text)
    assert data["tokens_per_sample"] == 256  # block_size = 256 in train.py
    assert data["batch"]["accumulation"]["default"] == 4
    assert {"--learning_rate", "--max_iters", "--warmup_iters", "--weight_decay", "--dropout", "--block_size",
            "--dataset", "--seed", "--lr_decay_iters", "--n_layer"} <= set(data["contract"])
    assert data["eval_shares_generator"] is True and data["loss_is_step_mean"] is False
    assert data["dropout"] is True
    hazards = [line for line in text.splitlines() if line.startswith("# hazard")]
    assert len(hazards) == 3, text
    assert any("estimate_loss" in h and "get_batch" in h and "torch.randint" in h for h in hazards), hazards
    assert any("loss.item() * gradient_accumulation_steps" in h for h in hazards), hazards
    assert any("dropout" in h and "0.2" in h for h in hazards), hazards
    assert parse(data).hazards()  # the declaration states them, for the loss check


def test_the_suggested_threads_fit_the_cpus_the_process_may_use(tmp_path):
    work = fixture_copy("argparse_script", tmp_path)
    res = suggest(["python", "train.py", "--micro_batch_size", "8", "--grad_accum", "4"], work, cpus=1)
    assert res.returncode == 0, res.stderr
    assert "threads" not in yaml.safe_load(res.stdout)["knobs"]  # one CPU: nothing to choose
    assert "1 CPU" in res.stdout
    if len(os.sched_getaffinity(0)) >= 2:
        res = suggest(["python", "train.py", "--micro_batch_size", "8", "--grad_accum", "4"], work, cpus=2)
        assert yaml.safe_load(res.stdout)["knobs"]["threads"]["values"] == ["1", "2"]
