"""Property-based fuzzing of the CLI entry points as a user reaches them: recipe files of arbitrary bytes and
mutated HF launches for `validate` / `gate check`, `--set` values, run directories in odd states for `report`,
and card folders for `card check`. Every input ends in an exit code and a message: never a traceback, never a
Python exception escaping the command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attune.cli import _mount_optional, app
from attune.testing.factories import tiny_recipe_dict

runner = CliRunner()
_mount_optional()
FUZZ = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
#: what a command may end with: 0 fine, 1 refused / problems found, 2 bad usage or input, 3 nothing measured
CODES = {0, 1, 2, 3}


def invoke(*args: object):
    res = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code in CODES, (res.exit_code, res.output)
    return res


flag_words = st.sampled_from(["--per_device_train_batch_size", "--gradient_accumulation_steps", "--learning_rate",
                              "--per_device_train", "--gradient_acc", "--max_steps", "--bf16", "--no_dataloader_pin",
                              "--seed=1", "--output_dir", "--", "-m", "train.py", "args.json", "--lr", "--eval"])
value_words = st.one_of(st.sampled_from(["1", "0", "-1", "1e400", "nan", "inf", "True", "no", "", " ", "4.5",
                                         "010", "1_000", "\x00", "é", "$(x)", "a b"]), st.text(max_size=6))


@FUZZ
@given(raw=st.binary(max_size=400))
def test_validate_any_bytes(tmp_path_factory, raw: bytes):
    path = tmp_path_factory.mktemp("v") / "r.yaml"
    path.write_bytes(raw)
    invoke("validate", path)


@FUZZ
@given(words=st.lists(st.one_of(flag_words, value_words), max_size=10),
       env=st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2))
def test_validate_and_gate_check_any_hf_launch(tmp_path_factory, words: list[str], env: dict[str, str]):
    data = {"name": "f", "framework": "hf", "launch": {"argv": ["python", "train.py", *words], "env": env},
            "resources": {"devices_per_node": 1}}
    path = tmp_path_factory.mktemp("h") / "r.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    invoke("validate", path)
    invoke("gate", "check", path, "--set", "per_device_train_batch_size=2")


@FUZZ
@given(key=st.sampled_from(["micro_batch_size", "nproc_per_node", "training.optimizer.lr", "knobs", "name", "x.y.z",
                            "training", "activation_checkpointing", "env.OMP_NUM_THREADS", ""]),
       value=value_words)
def test_gate_check_any_set_value(tmp_path_factory, key: str, value: str):
    path = tmp_path_factory.mktemp("s") / "r.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe_dict()))
    invoke("gate", "check", path, "--set", f"{key}={value}")


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**6), junk=st.binary(max_size=60), drop=st.sampled_from(
    ["", "result.json", "journal.jsonl", "best-recipe.yaml", "environment.json"]))
def test_report_and_card_on_a_run_directory_in_any_state(tmp_path_factory, sim_run_dir: Path, cut: int, junk: bytes,
                                                         drop: str):
    run = tmp_path_factory.mktemp("r") / "run"
    shutil.copytree(sim_run_dir, run)
    journal = run / "journal.jsonl"
    text = journal.read_bytes()
    journal.write_bytes(text[:cut % (len(text) + 1)] + junk)
    if drop:
        (run / drop).unlink(missing_ok=True)
    invoke("report", run)
    invoke("card", run, "--out", run / "cards")


@FUZZ
@given(files=st.dictionaries(st.sampled_from(["a.yaml", "b.yaml", "sub/c.yaml", "d.yml"]),
                             st.one_of(st.binary(max_size=200),
                                       st.sampled_from([b"{}", b"[]", b"id: x\n", b"schema_version: 1\n"])),
                             max_size=3))
def test_card_check_on_any_folder(tmp_path_factory, files: dict[str, bytes]):
    folder = tmp_path_factory.mktemp("c") / "cards"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    invoke("card", "check", folder)


def test_the_fuzzed_run_directory_is_a_real_run(sim_run_dir: Path):
    result = json.loads((sim_run_dir / "result.json").read_text())
    assert result["trials_launched"] >= 2
