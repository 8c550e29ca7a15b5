"""TRL launches on the hf framework: ``trl sft`` read the way TRL reads it (flags, ``--config`` YAML, accelerate
options), rendered back exactly, TRL's defaults and contract checked against the installed dataclasses, and the gate
refusing TRL's own settings."""

from __future__ import annotations

import dataclasses
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from attune.errors import RecipeError
from attune.frameworks.hf import catalogue as cat
from attune.frameworks.hf import render_launch, settings
from attune.frameworks.hf import trl as hftrl
from attune.frameworks.hf.launch import parse
from attune.gate import evaluate
from attune.gate.verdict import ReasonCode
from attune.recipe.io import parse_recipe
from attune.testing.procs import processes_in
from attune.trial import TrialOutcome
from tests.frameworks.hf.helpers import backend, cmd, hf, recipe, request, with_argv
from tests.frameworks.hf.trl_helpers import build_tiny_sft, offline_env

SFT = cmd("trl sft --model_name_or_path model --dataset_name data --max_length 64 --per_device_train_batch_size 1 "
          "--gradient_accumulation_steps 8 --learning_rate 1e-4 --max_steps 1000 --use_cpu True --seed 3")
CONFIG = """\
# the team's SFT settings
model_name_or_path: model   # a local directory
dataset_name: data
max_length: 64
packing: false
per_device_train_batch_size: 2
gradient_accumulation_steps: 4
num_processes: 1            # not TRL's: accelerate's
env:
  TOKENIZERS_PARALLELISM: "false"
"""


def swap(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    out[out.index(flag) + 1] = value
    return out


def config_recipe(tmp_path: Path, extra: tuple[str, ...] = ("--learning_rate", "1e-4", "--use_cpu", "True")) -> Any:
    (tmp_path / "sft.yaml").write_text(CONFIG)
    return recipe(["trl", "sft", "--config", "sft.yaml", *extra], tmp_path)


# -- launch reading and render -------------------------------------------------------------------------------

def test_trl_sft_flags_import_and_render_back_exactly(tmp_path):
    r = recipe(SFT, tmp_path)
    assert list(hf().render(r).argv) == SFT
    s = settings.read(r)
    assert s.trl == "sft" and s.parsed.launcher == "trl" and (s.per_device, s.accumulation, s.nproc) == (1, 8, 1)
    assert r.knobs["gradient_checkpointing"] is True  # TRL's _BaseConfig turns it on; the launch does not say
    # a batch change edits exactly the per-device batch and the accumulation, in place
    argv = list(hf().render(r.with_knobs(per_device_train_batch_size=4)).argv)
    assert argv == swap(swap(SFT, "--per_device_train_batch_size", "4"), "--gradient_accumulation_steps", "2")
    # checkpointing off is written explicitly (TRL's default is on), with the flag the transformers version prefers
    argv = list(hf().render(r.with_knobs(gradient_checkpointing=False)).argv)
    assert argv == [*SFT, "--activation_checkpointing", "False"]


def test_trl_config_file_is_read_as_trl_reads_it_and_edited_in_place(tmp_path):
    r = config_recipe(tmp_path)
    s = settings.read(r)
    assert (s.per_device, s.accumulation) == (2, 4)  # from the file
    assert s.native["learning_rate"] == "1e-4" and s.native["max_length"] == 64
    assert "num_processes" not in s.native and "env" not in s.native  # accelerate's key; TRL's environment
    launch = hf().render(r)
    assert list(launch.argv) == ["trl", "sft", "--config", "sft.yaml", "--learning_rate", "1e-4", "--use_cpu", "True"]
    assert launch.files == {"sft.yaml": CONFIG}
    # the batch lives in the file: the file is edited there, its comments and layout kept
    launch = hf().render(r.with_knobs(per_device_train_batch_size=8))
    assert list(launch.argv) == list(r.launch.argv)
    text = launch.files["sft.yaml"]
    assert text == CONFIG.replace("per_device_train_batch_size: 2", "per_device_train_batch_size: 8") \
        .replace("gradient_accumulation_steps: 4", "gradient_accumulation_steps: 1")
    # a flag on the command line overrides the file: the command line is where it is edited
    r = config_recipe(tmp_path, ("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                                 "--use_cpu", "True"))
    launch = hf().render(r.with_knobs(per_device_train_batch_size=1))
    assert list(launch.argv)[4:8] == ["--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8"]
    assert launch.files == {"sft.yaml": CONFIG}


def test_trl_process_count_is_the_accelerate_option_trl_hands_on(tmp_path):
    r = recipe([*SFT, "--num_processes", "1"], tmp_path, devices_per_node=2)
    s = settings.read(r)
    assert [o.name for o in s.parsed.launcher_options] == ["num_processes"] and "num_processes" not in s.native
    launch = hf().render(r.with_knobs(nproc_per_node=2, per_device_train_batch_size=1))
    argv = list(launch.argv)
    assert argv[argv.index("--num_processes") + 1] == "2" and argv[-1] == "--multi_gpu"
    assert argv[argv.index("--gradient_accumulation_steps") + 1] == "4"
    assert launch.env["ACCELERATE_USE_CPU"] == "true"
    # without the option it is appended (after the config file's keys, so it wins in accelerate's parser)
    r = config_recipe(tmp_path)
    assert settings.read(r).nproc == 1
    argv = list(hf().render(r.with_knobs(nproc_per_node=2, per_device_train_batch_size=2)).argv)
    assert argv[-3:] == ["--num_processes", "2", "--multi_gpu"]


def test_trl_scripts_under_other_launchers_are_trl_launches(tmp_path):
    for argv in (["accelerate", "launch", "--num_processes", "1", "trl/scripts/sft.py", "--packing", "True"],
                 ["python", "-m", "trl.scripts.sft", "--packing", "True"],
                 ["torchrun", "--nproc_per_node", "1", "-m", "trl.scripts.sft", "--packing", "True"]):
        s = settings.read(recipe(argv, tmp_path))
        assert s.trl == "sft" and s.contract_value("packing") is True
        assert s.contract_value("learning_rate") == pytest.approx(2e-5)
    assert settings.read(recipe(["python", "train.py", "--packing", "True"], tmp_path)).trl is None
    # the console script's module, run by python: read and rendered like `trl sft`
    argv = ["python", "-m", "trl.cli.main", "sft", "--packing", "True", "--per_device_train_batch_size", "2"]
    r = recipe(argv, tmp_path, devices_per_node=2)
    s = settings.read(r)
    assert (s.trl, s.parsed.launcher, s.knob_values["gradient_checkpointing"]) == ("sft", "trl", True)
    assert list(hf().render(r).argv) == argv
    assert list(hf().render(r.with_knobs(nproc_per_node=2, per_device_train_batch_size=1)).argv) == \
        [*swap(argv, "--per_device_train_batch_size", "1"), "--num_processes", "2", "--multi_gpu"]


def test_unreadable_trl_launches_are_refused_with_the_fix(tmp_path):
    with pytest.raises(RecipeError, match="does not train"):
        parse(["trl", "vllm-serve", "--model", "m"])
    with pytest.raises(RecipeError, match="name the TRL training command"):
        parse(["trl", "--config", "x.yaml"])
    with pytest.raises(RecipeError, match="only as `--config FILE.yaml`"):
        parse(["trl", "sft", "--config=x.yaml"])
    with pytest.raises(RecipeError, match="abbreviat"):
        recipe(["trl", "sft", "--per_device_train", "2"], tmp_path)
    r = config_recipe(tmp_path)
    data = r.model_dump(mode="python")
    data["launch"]["files"] = {}
    with pytest.raises(RecipeError, match="does not carry that file"):
        parse_recipe(data)


# -- TRL's own parser agrees -----------------------------------------------------------------------------------

def _trl_parse(argv: list[str], cwd: Path) -> tuple[Any, ...]:
    """``trl sft``'s own parse of ``argv[2:]`` as trl 1.16 ``TrainingCommand.run`` does it, in ``cwd``."""
    pytest.importorskip("trl")
    from trl.scripts.sft import make_parser

    old = Path.cwd()
    os.chdir(cwd)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tuple(make_parser(prog="trl sft").parse_args_and_config(
                argv[2:], return_remaining_strings=True, separate_remaining_strings=True))
    finally:
        os.chdir(old)


@pytest.mark.parametrize("extra", [(), ("--packing", "--completion_only_loss", "False", "--no_gradient_checkpointing",
                                        "--num_processes", "1", "--dataset_text_field", "content")])
def test_trls_own_parser_reads_what_attune_read(tmp_path, extra):
    (tmp_path / "sft.yaml").write_text(CONFIG)
    argv = ["trl", "sft", "--config", "sft.yaml", "--learning_rate", "1e-4", "--use_cpu", "True",
            "--output_dir", str(tmp_path / "out"), *extra]
    r = recipe(argv, tmp_path)
    s = settings.read(r)
    script_args, training_args, model_args, mixture, config_rest, cli_rest = _trl_parse(argv, tmp_path)
    # the accelerate arguments: the config's unknown keys and the command line's non-TRL flags
    assert config_rest == ["--num_processes", "1"]
    assert cli_rest == [t for o in s.parsed.launcher_options for t in argv[o.start:o.end]]
    parsed = {**vars(script_args), **vars(model_args), **vars(mixture),
              **{f.name: getattr(training_args, f.name) for f in dataclasses.fields(training_args)}}
    for name in s.contract_table:
        if name in parsed:
            mine, theirs = s.contract_value(name), parsed[name]
            if isinstance(theirs, float) or isinstance(mine, float):
                assert float(mine) == pytest.approx(float(theirs)), name
            else:
                assert mine == theirs or (mine is None and theirs in (None, [])), (name, mine, theirs)
    assert (training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps) == \
        (s.per_device, s.accumulation)
    assert training_args.gradient_checkpointing is r.knobs["gradient_checkpointing"]
    assert os.environ.get("TOKENIZERS_PARALLELISM") == "false"  # TRL exported the config's env (a side effect)


def test_trl_field_names_and_defaults_are_the_installed_dataclasses():
    pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl import DatasetMixtureConfig, DPOConfig, ModelConfig, ScriptArguments, SFTConfig
        from trl.scripts.sft import make_parser

        parser = make_parser(prog="trl sft")
        dests = {a.dest for a in parser._actions if a.dest != "help"}
        assert hftrl.fields("sft") == frozenset(dests)
        negated = {a.option_strings[0][len("--no_"):] for a in parser._actions
                   if a.option_strings and a.option_strings[0].startswith("--no_")}
        assert hftrl.no_forms("sft") == frozenset(negated)
        sft = SFTConfig(output_dir="/tmp/attune-trl-defaults", use_cpu=True)
        dpo = DPOConfig(output_dir="/tmp/attune-trl-defaults", use_cpu=True)
        defaults = {**vars(ScriptArguments()), **vars(ModelConfig()), **vars(DatasetMixtureConfig())}
    table = hftrl.contract("sft", cat.CONTRACT)
    s = settings.read(recipe(["trl", "sft", "--output_dir", "x"]))
    for name in table:
        if name == "warmup_ratio":
            continue  # hf's contract keeps it for transformers 4.x; gone from TrainingArguments since 5.18
        theirs = defaults[name] if name in defaults else getattr(sft, name)
        mine = s.contract_value(name)
        if isinstance(theirs, float) or isinstance(mine, float):
            assert float(mine) == pytest.approx(float(theirs)), name
        else:
            assert mine == theirs, (name, mine, theirs)
    assert sft.gradient_checkpointing is True and s.knob_values["gradient_checkpointing"] is True
    assert hftrl.LEARNING_RATE["dpo"] == dpo.learning_rate
    assert settings.read(recipe(["trl", "dpo", "--output_dir", "x"])).contract_value("learning_rate") == \
        pytest.approx(dpo.learning_rate)


# -- the gate -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--learning_rate", "2e-4"), ("--packing", "True"), ("--max_length", "128"),
                                        ("--completion_only_loss", "False"), ("--dataset_text_field", "content"),
                                        ("--model_name_or_path", "other"), ("--dataset_name", "other")])
def test_the_gate_refuses_trls_contract_in_its_own_names(tmp_path, flag, value):
    base = recipe(SFT, tmp_path)
    argv = swap(SFT, flag, value) if flag in SFT else [*SFT, flag, value]
    v = evaluate(base, with_argv(base, argv))
    assert not v.admitted
    field = f"launch.args.{flag[2:]}"
    reason = next(r for r in v.reasons if r.field == field)
    assert reason.code == ReasonCode.CONTRACT and "restore it" in reason.message


def test_trls_defaults_are_the_contract_where_a_launch_is_silent(tmp_path):
    argv = SFT[:SFT.index("--max_length")] + SFT[SFT.index("--max_length") + 2:]
    base = recipe(argv[:argv.index("--learning_rate")] + argv[argv.index("--learning_rate") + 2:], tmp_path)
    # SFTConfig's learning rate, written out: no change; HF's own default (5e-5) is one
    assert evaluate(base, with_argv(base, [*base.launch.argv, "--learning_rate", "2e-5"])).admitted
    assert not evaluate(base, with_argv(base, [*base.launch.argv, "--learning_rate", "5e-5"])).admitted
    assert evaluate(base, with_argv(base, [*base.launch.argv, "--max_length", "1024", "--packing", "False"])).admitted
    # bf16 is TRL's "not fp16": writing it true is no change, false is one
    assert evaluate(base, with_argv(base, [*base.launch.argv, "--bf16", "True"])).admitted
    assert not evaluate(base, with_argv(base, [*base.launch.argv, "--bf16", "False"])).admitted


def test_the_gate_refuses_a_contract_change_inside_the_config_file(tmp_path):
    base = config_recipe(tmp_path)
    data = base.model_dump(mode="python")
    data["launch"]["files"] = {"sft.yaml": CONFIG.replace("packing: false", "packing: true")}
    v = evaluate(base, data)
    assert not v.admitted and "launch.args.packing" in {r.field for r in v.reasons}
    # set_native (attune gate check --set) edits the file where only the file sets it
    data = base.model_dump(mode="python")
    assert hf().set_native(data, "max_length", 128)
    assert data["launch"]["argv"] == list(base.launch.argv) and "max_length: 128" in data["launch"]["files"]["sft.yaml"]
    assert "launch.args.max_length" in {r.field for r in evaluate(base, data).reasons}
    # knob moves stay admitted
    assert evaluate(base, base.with_knobs(per_device_train_batch_size=8)).admitted


# -- real trials -------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_sft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sft(tmp_path_factory.mktemp("tiny-sft"))


def _sft_recipe(tiny: Path, work: Path, **options: Any) -> Any:
    shutil.copytree(tiny, work)
    return recipe(["trl", "sft", "--model_name_or_path", "model", "--dataset_name", "data", "--max_length", "64",
                   "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "4", "--max_steps", "1000",
                   "--use_cpu", "True"], work, **options)


@pytest.mark.slow
def test_real_trl_sft_trial(tmp_path, monkeypatch, tiny_sft):
    for k, v in offline_env().items():
        monkeypatch.setenv(k, v)
    work = tmp_path / "work"
    r = _sft_recipe(tiny_sft, work, devices_per_node=1)
    r = r.with_knobs(per_device_train_batch_size=2, gradient_checkpointing=False, **{"env.OMP_NUM_THREADS": "1"})
    tl = hf().trial_launch(r, request(tmp_path), tmp_path / "trial")
    assert tl.launch.argv[:2] == ("trl", "sft") and "--activation_checkpointing" in tl.launch.argv
    res = backend().run(r, request(tmp_path, timeout_s=150))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    m = res.measurement
    assert m.steps_measured == 3 and len(m.losses) == 4 and all(0 < x < 10 for x in m.losses)
    # SFTTrainer is a Trainer: it states the layout attune rendered, checked against the recipe
    assert m.reported["per_device_train_batch_size"] == 2 and m.reported["gradient_accumulation_steps"] == 2
    assert m.reported["total_train_batch_size"] == 4 and hf().report_problems(r, m.reported) == []
    assert (tmp_path / "trial" / "hf-output").is_dir() and not (work / "trainer_output").exists()
    assert processes_in(tmp_path) == []


@pytest.mark.slow
def test_real_two_process_trl_trial(tmp_path, monkeypatch, tiny_sft):
    """Two CPU processes: `--num_processes 2 --multi_gpu` handed by `trl sft` to accelerate, which starts them."""
    for k, v in offline_env().items():
        monkeypatch.setenv(k, v)
    r = _sft_recipe(tiny_sft, tmp_path / "work", devices_per_node=2)
    r = r.with_knobs(nproc_per_node=2, per_device_train_batch_size=1, **{"env.OMP_NUM_THREADS": "1"})
    res = backend().run(r, request(tmp_path, timeout_s=150))
    assert res.outcome is TrialOutcome.SUCCEEDED, res.message
    assert res.measurement.reported["total_train_batch_size"] == 4
    assert res.measurement.reported["gradient_accumulation_steps"] == 2
    assert processes_in(tmp_path) == []


def test_render_launch_of_an_unchanged_trl_recipe_keeps_its_environment(tmp_path):
    r = recipe(SFT, tmp_path, env={"ACCELERATE_MIXED_PRECISION": "no"})
    launch = render_launch(r)
    assert list(launch.argv) == SFT and launch.env["ACCELERATE_MIXED_PRECISION"] == "no"
