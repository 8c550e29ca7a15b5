"""`attune knobs --framework command --suggest -- CMD`: a starting declaration read from a command, its argparse
--help and its source, every guess marked, that imports the command once saved."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from attune.frameworks.command.declaration import parse
from tests.frameworks.command.helpers import EXAMPLE, POOR, cli_env, imported

HF_EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hf-trainer"


def suggest(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", "knobs", "--framework", "command", "--suggest", "--",
                           *argv], capture_output=True, text=True, cwd=cwd, env=cli_env(), timeout=300)


def test_a_nanogpt_command_gets_its_preset_batch_and_contract_and_imports():
    res = suggest([*POOR, "--learning_rate=6e-4", "--eval_interval=2000"], EXAMPLE)
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "printed no argparse help" in text  # nanoGPT's configurator has no --help: the command line is read
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
