"""Launch command lines shared by the frameworks: launcher scanning, token edits, and launch scripts read the way a
launcher receives them (``attune import --script``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attune.errors import RecipeError
from attune.frameworks.cmdline import (
    TORCHRUN_SWITCHES,
    Edit,
    as_written,
    node_count,
    read_launch_script,
    scan_flags,
    scan_launcher,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_launcher_options_switches_and_the_script_index():
    argv = ["torchrun", "--standalone", "--nproc-per-node=2", "--nnodes", "1", "-m", "pkg.train", "--lr", "1"]
    opts, i, module = scan_launcher(argv, 1, TORCHRUN_SWITCHES)
    assert [(o.name, o.values) for o in opts] == [("standalone", ()), ("nproc_per_node", ("2",)),
                                                   ("nnodes", ("1",)), ("m", ())]
    assert module and argv[i] == "pkg.train"
    # names as written (Megatron keeps dashes), the same positions
    assert [o.name for o in scan_launcher(argv, 1, TORCHRUN_SWITCHES, name=as_written)[0]][1] == "nproc-per-node"
    with pytest.raises(RecipeError, match="--nnodes has no value"):
        scan_launcher(["torchrun", "--nnodes"], 1, TORCHRUN_SWITCHES)
    assert node_count(opts[2]) == 1 and node_count(None) is None
    elastic = scan_launcher(["torchrun", "--nnodes", "1:4", "t.py"], 1, TORCHRUN_SWITCHES)[0][0]
    with pytest.raises(RecipeError, match="fixed-size"):
        node_count(elastic)


def test_flags_own_their_tokens_and_edits_keep_every_other_token_in_place():
    argv = ["train.py", "pos", "--a", "1", "2", "--b=x", "--flag", "--", "--not-a-flag"]
    opts, pos = scan_flags(argv, 1)
    assert [(o.name, o.values, o.inline) for o in opts] == [("a", ("1", "2"), False), ("b", ("x",), True),
                                                             ("flag", (), False)]
    assert pos == [(1, "pos"), (7, "--"), (8, "--not-a-flag")]
    e = Edit(list(argv))
    e.replace[opts[1].start] = (opts[1].end, ["--b=y"])
    e.insert[1] = ["--first"]
    e.append.append("--last")
    assert e.result() == ["train.py", "--first", "pos", "--a", "1", "2", "--b=y", "--flag", "--", "--not-a-flag",
                          "--last"]


def test_a_launch_script_is_read_as_the_launcher_receives_it(tmp_path):
    script = tmp_path / "pretrain.sh"
    script.write_text("#!/bin/bash\nset -euo pipefail\n# a comment\nexport NPROC=4\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"
                      "export TAG='my run'\ncd \"$(dirname \"$0\")\"\n"
                      "exec torchrun --nproc_per_node ${NPROC} \\\n    train.py --name \"$TAG\" --lr 1e-4\n")
    argv, env = read_launch_script(script)
    assert argv == ["torchrun", "--nproc_per_node", "4", "train.py", "--name", "my run", "--lr", "1e-4"]
    assert env == {"NPROC": "4", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "TAG": "my run"}
    # no exec: the last command line that is not shell set-up
    script.write_text("export A=1\npython prep.py\npython train.py --x $A\n")
    assert read_launch_script(script)[0] == ["python", "train.py", "--x", "1"]


@pytest.mark.parametrize("text, message", [
    ("export A=1\n", "no launch command"),
    ("exec python train.py --x $UNSET\n", r"\$UNSET .* not exported"),
    ("exec python train.py --name 'open\n", "cannot split"),
])
def test_a_script_that_cannot_be_read_says_why(tmp_path, text, message):
    script = tmp_path / "run.sh"
    script.write_text(text)
    with pytest.raises(RecipeError, match=message):
        read_launch_script(script)
    with pytest.raises(RecipeError, match="cannot read"):
        read_launch_script(tmp_path / "missing.sh")


def _attune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attune", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_attune_import_script_makes_the_examples_recipes(tmp_path):
    res = _attune("import", "--framework", "megatron", "--script", "llama3_8b_h100_fp8.sh",
                  cwd=EXAMPLES / "megatron-lm")
    assert res.returncode == 0, res.stderr
    data = yaml.safe_load(res.stdout)
    assert data["framework"] == "megatron" and data["launch"]["argv"][0] == "torchrun"
    assert data["launch"]["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # the script's export, not this shell's
    res = _attune("import", "--framework", "torchtitan", "--script", str(EXAMPLES / "torchtitan" / "run_toml.sh"),
                  "-o", str(tmp_path / "t.yaml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load((tmp_path / "t.yaml").read_text())["framework"] == "torchtitan"
    # errors are messages, not tracebacks
    bad = _attune("import", "--framework", "megatron", "--script", "nope.sh", cwd=tmp_path)
    assert bad.returncode != 0 and "cannot read the launch script" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr
    both = _attune("import", "--framework", "hf", "--script", "x.sh", "--", "python", "t.py", cwd=tmp_path)
    assert both.returncode != 0 and "not both" in both.stderr + both.stdout


# -- launcher options read the way the launcher's own argparse parser reads them -------------------------------

def test_the_launcher_option_tables_are_the_installed_parsers():
    """The tables come from the installed torchrun and deepspeed runner sources; the pinned fallbacks (for machines
    without them) must be what those versions define."""
    from attune.frameworks.cmdline import PINNED_LAUNCHER_OPTIONS, launcher_options

    pytest.importorskip("torch")
    assert launcher_options("torchrun") == PINNED_LAUNCHER_OPTIONS["torchrun"][1]
    pytest.importorskip("deepspeed")
    assert launcher_options("deepspeed") == PINNED_LAUNCHER_OPTIONS["deepspeed"][1]
    assert launcher_options("accelerate") is None  # accelerate launch refuses abbreviations itself


#: abbreviated launcher options as people type them, with the option the launcher's parser reads them as
ABBREVIATED = [
    ("hf", "torchrun --nproc_per 2 train.py --output_dir out", "--nproc_per", "nproc_per_node"),
    ("hf", "torchrun --nproc-per=2 train.py --output_dir out", "--nproc-per", "nproc_per_node"),
    ("hf", "torchrun --standalone --nn 1 --nproc_per_node 2 train.py --output_dir out", "--nn", "nnodes"),
    ("hf", "python -m torch.distributed.run --stand --nproc_per_node 2 train.py --output_dir out", "--stand",
     "standalone"),
    ("deepspeed", "deepspeed --num_g 2 train.py --deepspeed_config ds.json", "--num_g", "num_gpus"),
    ("deepspeed", "deepspeed --num_n 1 --num_gpus 2 train.py --deepspeed_config ds.json", "--num_n", "num_nodes"),
    ("deepspeed", "torchrun --nproc_p 2 train.py --deepspeed_config ds.json", "--nproc_p", "nproc_per_node"),
    ("megatron", "torchrun --nproc-per 8 --nnodes 1 pretrain_gpt.py --micro-batch-size 1 --global-batch-size 128",
     "--nproc-per", "nproc_per_node"),
]


@pytest.mark.parametrize(("framework", "command", "flag", "full"), ABBREVIATED)
def test_an_abbreviated_launcher_option_is_refused_naming_it(tmp_path, framework, command, flag, full):
    from attune import frameworks

    (tmp_path / "ds.json").write_text('{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}')
    for script in ("train.py", "pretrain_gpt.py"):
        (tmp_path / script).write_text("# a training script\n")
    with pytest.raises(RecipeError) as err:
        frameworks.get(framework).import_launch(command.split(), cwd=tmp_path, env={}, options={})
    assert f"launcher option {flag} is an abbreviation" in str(err.value)
    assert f"--{full}" in str(err.value)


@pytest.mark.parametrize(("framework", "command", "flag", "full"), [a for a in ABBREVIATED if "torch" in a[1]])
def test_torchruns_own_parser_reads_those_abbreviations_as_the_message_says(framework, command, flag, full):
    """What the message claims, checked against the real parser: torchrun's argparse expands the abbreviation to
    the named option (so attune, reading the full names only, would have read the launch wrongly)."""
    run = pytest.importorskip("torch.distributed.run")
    argv = command.split()
    start = 3 if argv[0] == "python" else 1
    args = run.get_args_parser().parse_args(argv[start:])
    value = getattr(args, full)
    assert value not in (None, False, run.get_args_parser().get_default(full)) or flag == "--nn", (flag, value)
    if flag == "--nn":
        assert args.nnodes == "1"


def test_the_cli_refuses_an_abbreviated_launcher_option_without_a_traceback(tmp_path):
    (tmp_path / "train.py").write_text("# a training script\n")
    res = subprocess.run([sys.executable, "-m", "attune", "import", "--framework", "hf", "--", "torchrun",
                          "--nproc_per", "2", "train.py", "--output_dir", "out"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL)
    out = " ".join((res.stdout + res.stderr).split())
    assert res.returncode == 2 and "Traceback" not in out, out
    assert "--nproc_per is an abbreviation: torchrun reads it as --nproc_per_node" in out


def test_a_script_flag_where_a_launcher_belongs_points_to_import():
    """`attune tune --framework hf ... --script run.sh` puts --script where the launcher goes (seen by a user trying
    run_clm.py): the refusal says which command reads a launch script."""
    from typer.testing import CliRunner

    from attune.cli import app

    out = CliRunner().invoke(app, ["tune", "--framework", "hf", "--budget", "0.1", "--script", "run.sh"])
    assert out.exit_code != 0
    text = " ".join(out.output.split())
    assert "unknown launcher '--script'" in text and "attune import --framework NAME --script FILE" in text
