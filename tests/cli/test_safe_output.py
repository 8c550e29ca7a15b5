"""Pasting what attune prints runs nothing else: hostile environment names are refused when the recipe is read,
and every word of a rendered command (argv, values, working directory) is quoted, in the CLI, the report's
evidence and the operator's launch.sh. Each rendered line is run by a real shell in a scratch directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attune.cli import app
from attune.errors import RecipeError
from attune.recipe.io import parse_recipe

runner = CliRunner()

HOSTILE_NAMES = ["EVIL; touch pwned; X", "A=B", "$(touch pwned)", "1ST", "X Y", "`touch pwned`", "", "A\nB"]
HOSTILE_WORDS = ["; touch pwned", "$(touch pwned)", "`touch pwned`", "a' ; touch pwned ; '", "&& touch pwned",
                 "| tee pwned", "\"; touch pwned; \"", "$HOME/x", "> pwned"]


def hf_recipe(env: dict[str, str] | None = None, extra: list[str] | None = None, cwd: str = ".") -> dict:
    return {"name": "safe", "framework": "hf",
            "launch": {"argv": ["python", "train.py", "--output_dir", "out", *(extra or [])], "env": env or {},
                       "cwd": cwd},
            "resources": {"accelerator": "cpu", "devices_per_node": 1}}


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_an_environment_name_a_shell_would_run_is_refused_with_its_field(tmp_path: Path, name: str):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(hf_recipe({name: "1"})))
    res = runner.invoke(app, ["validate", str(path)])
    flat = " ".join(res.output.split())
    assert res.exit_code == 1 and "launch.env" in flat and "POSIX name" in flat, res.output
    assert "Traceback" not in res.output
    with pytest.raises(RecipeError):
        parse_recipe(hf_recipe({name: "1"}))


@pytest.mark.parametrize("where", ["env value", "argv", "cwd"])
def test_a_nul_byte_is_refused_when_read_not_when_launched(where: str):
    data = hf_recipe({"FOO": "a\0b"}) if where == "env value" else \
        hf_recipe(extra=["--x", "a\0b"]) if where == "argv" else hf_recipe(cwd="a\0b")
    with pytest.raises(RecipeError, match="NUL"):
        parse_recipe(data)


def _pasted(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a rendered line the way a user pastes it, with the command itself replaced by `true` (only what the
    shell does to the line matters)."""
    return subprocess.run(["sh", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)})


@pytest.mark.parametrize("word", HOSTILE_WORDS)
def test_a_rendered_command_pasted_into_a_shell_runs_nothing_else(tmp_path: Path, word: str):
    recipe = hf_recipe({"FOO": word, "OMP_NUM_THREADS": "1"}, extra=["--run_name", word, word])
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe))
    res = runner.invoke(app, ["render", str(path)])
    assert res.exit_code == 0, res.output
    line = res.output.strip().splitlines()[-1]
    assert " python train.py " in line, line
    line = line.replace(" python train.py ", " true train.py ", 1)  # harmless: only what the shell does is tested
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = _pasted(line, scratch)
    assert done.returncode == 0, (line, done.stderr)
    assert not list(scratch.iterdir()), f"pasting {line!r} created {list(scratch.iterdir())}"
    # what the shell hands the command is exactly the recipe's words
    echoed = _pasted(line.replace(" true ", " printf '%s\\n' ", 1), scratch)
    assert echoed.stdout.splitlines()[-3:] == ["--run_name", word, word], (line, echoed.stdout)


def test_the_operators_command_script_quotes_every_word(tmp_path: Path):
    from attune.engine.loop import RunState, TuneConfig
    from attune.operator.reconcile import tuned_configmap

    recipe = parse_recipe(hf_recipe({"FOO": "; touch pwned"}, extra=["--run_name", "$(touch pwned)"],
                                    cwd=str(tmp_path / "d; touch pwned")))
    state = RunState(baseline=recipe, config=TuneConfig.from_recipe(recipe, 1.0))
    container = {"name": "pytorch", "image": "img", "command": ["python"], "args": list(recipe.launch.argv[1:]),
                 "workingDir": recipe.launch.cwd, "env": [{"name": "FOO", "value": "; touch pwned"}]}
    run = {"apiVersion": "attune.dev/v1alpha1", "kind": "TuningRun",
           "metadata": {"name": "run", "namespace": "ns", "uid": "u"},
           "spec": {"recipe": {"inline": {"name": "x"}}, "budget": {"acceleratorHours": 1},
                    "metrics": {}, "trialTemplate": {"kind": "PyTorchJob", "spec": {"pytorchReplicaSpecs": {
                        "Master": {"template": {"spec": {"containers": [container]}}}}}}}}
    script = tuned_configmap(run, recipe, state)["data"]["command.sh"]
    (tmp_path / "d; touch pwned").mkdir()
    (tmp_path / "scratch").mkdir()
    script = script.replace("\npython ", "\ntrue ")
    done = _pasted(script, tmp_path / "scratch")
    assert done.returncode == 0, (script, done.stderr)
    assert not list((tmp_path / "scratch").iterdir()) and not (tmp_path / "d; touch pwned" / "pwned").exists()


def test_the_reports_command_evidence_quotes_every_word():
    from attune.report.evidence import launch_text

    recipe = parse_recipe(hf_recipe({"FOO": "; touch pwned"}, extra=["--run_name", "$(touch pwned)"],
                                    cwd="d\ntouch pwned"))
    text = launch_text(recipe.framework_impl.render(recipe))
    assert "FOO='; touch pwned'" in text and "'$(touch pwned)'" in text, text
    assert "\ntouch pwned" not in text  # the working directory's newline cannot start a line of its own
