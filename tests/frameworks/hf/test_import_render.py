"""Import → render: an unchanged recipe renders the user's command exactly; a knob changes only its tokens."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from attune.errors import RecipeError
from attune.recipe.io import parse_recipe
from tests.frameworks.hf.helpers import POOR, cmd, hf, imported, recipe

FORMS = [
    POOR,
    "python -u train.py --per_device_train_batch_size=2 --gradient_accumulation_steps=4 --bf16 --use_cpu",
    "python3 -m mypkg.train --per-device-train-batch-size 4 --gradient-accumulation-steps 2 --seed 3",
    ("torchrun --standalone --nproc_per_node 2 train.py --per_device_train_batch_size 2 "
     "--gradient_accumulation_steps 4 --ddp_backend gloo --use_cpu True --report_to none"),
    "torchrun --standalone --nproc-per-node=2 train.py --per_device_train_batch_size 4 --no_dataloader_pin_memory",
    "torchrun --nnodes 1 --nproc_per_node=4 -m mypkg.train --per_device_train_batch_size 1 --gradient_accumulation_steps 8",
    ("python -m torch.distributed.run --standalone --nproc_per_node 2 train.py --per_device_train_batch_size 8 "
     "--label_names labels extra --gradient_checkpointing"),
    "accelerate launch --num_processes 2 --multi_gpu train.py --per_device_train_batch_size 2 --optim adamw_torch",
    "accelerate launch --mixed_precision no train.py --per_device_train_batch_size 16 --ddp_bucket_cap_mb 50",
]


@pytest.mark.parametrize("argv", FORMS, ids=lambda a: " ".join(a[:3]) if isinstance(a, list) else a[:40])
def test_unchanged_recipe_renders_the_command_exactly(argv):
    argv = argv.split() if isinstance(argv, str) else argv
    r = recipe(argv)
    assert list(r.launch.argv) == argv
    launch = hf().render(r)
    assert list(launch.argv) == argv
    assert all(isinstance(t, str) for t in launch.argv)


def test_import_mapping_carries_the_launch_and_every_knob(tmp_path):
    d = imported(POOR, tmp_path, tokens_per_sample=128, devices_per_node=None)
    assert d["framework"] == "hf" and d["launch"]["argv"] == POOR and d["launch"]["cwd"] == str(tmp_path)
    assert d["launch"]["tokens_per_sample"] == 128 and d["launch"]["framework_version"] == "5.24.0"
    assert d["resources"]["accelerator"] == "cpu" and d["resources"]["nodes"] == 1
    assert d["resources"]["devices_per_node"] == 1  # what the one-process launch uses, not the machine's cores
    assert set(d["knobs"]) == set(hf().catalogue().knobs)
    assert d["knobs"]["per_device_train_batch_size"] == 1 and d["knobs"]["gradient_checkpointing"] is True
    assert d["knobs"]["nproc_per_node"] == 1 and d["knobs"]["optim"] == "adamw_torch_fused"
    parse_recipe(d)


@pytest.mark.parametrize("launch,devices", [
    (POOR, 1),
    ("torchrun --standalone --nproc_per_node 2 train.py --per_device_train_batch_size 2", 2),
    ("accelerate launch --num_processes 4 train.py --per_device_train_batch_size 2", 4),
])
def test_a_trial_is_charged_for_the_devices_its_launch_uses(tmp_path, launch, devices):
    """Issue 19: a one-process job was charged (and its throughput normalised) over every core of the machine."""
    r = recipe(launch, tmp_path, devices_per_node=None)
    assert r.resources.devices == devices
    assert recipe(launch, tmp_path, devices_per_node=8).resources.devices == 8  # a declared allocation holds


def test_import_keeps_only_safe_environment(tmp_path):
    d = imported(POOR, tmp_path, env={"ACCELERATE_MIXED_PRECISION": "no", "HF_TOKEN": "secret", "PATH": "/bin",
                                      "ACCELERATE_API_KEY": "x", "OMP_NUM_THREADS": "2"})
    assert d["launch"]["env"] == {"ACCELERATE_MIXED_PRECISION": "no"}
    assert d["knobs"]["env.OMP_NUM_THREADS"] == "2"


@pytest.mark.parametrize("argv,problem", [
    ("deepspeed train.py --per_device_train_batch_size 1", "unknown launcher"),
    ("bash run.sh", "unknown launcher"),
    ("torchrun --standalone --nproc_per_node 2", "no training script"),
    ("python -c print(1)", "not supported"),
    ("python train.py --per_device_train_batch_size 3", "outside the hf catalogue's domain"),
    ("torchrun --nproc_per_node auto train.py", "number of processes"),
])
def test_import_refuses_what_it_cannot_represent(argv, problem):
    with pytest.raises(RecipeError) as err:
        imported(argv)
    assert problem in str(err.value)
    if "launcher" in problem or "script" in problem:
        assert "torchrun" in str(err.value) and "accelerate launch" in str(err.value)  # the accepted forms


def test_one_knob_change_differs_in_exactly_that_flag():
    r = recipe(POOR)
    argv = list(hf().render(r.with_knobs(dataloader_num_workers=2)).argv)
    diff = [(a, b) for a, b in zip(POOR, argv) if a != b]
    assert len(argv) == len(POOR) and diff == [("0", "2")]
    assert argv[argv.index("--dataloader_num_workers") + 1] == "2"


def test_micro_batch_change_rederives_accumulation_in_place():
    r = recipe(POOR)
    argv = list(hf().render(r.with_knobs(per_device_train_batch_size=4)).argv)
    assert len(argv) == len(POOR)
    changed = {POOR[i - 1]: (POOR[i], argv[i]) for i in range(len(POOR)) if POOR[i] != argv[i]}
    assert changed == {"--per_device_train_batch_size": ("1", "4"), "--gradient_accumulation_steps": ("16", "4")}


def test_inline_spelling_is_kept_and_missing_flags_are_appended():
    argv = cmd("python -u train.py --per_device_train_batch_size=2 --gradient_accumulation_steps=4 --bf16 --use_cpu")
    r = recipe(argv)
    out = list(hf().render(r.with_knobs(per_device_train_batch_size=8)).argv)
    assert out == [*argv[:3], "--per_device_train_batch_size=8", "--gradient_accumulation_steps=1", *argv[5:]]
    out = list(hf().render(r.with_knobs(dataloader_num_workers=1)).argv)
    assert out == [*argv, "--dataloader_num_workers", "1"]


def test_dashed_launch_gets_dashed_flags():
    argv = cmd("python train.py --per-device-train-batch-size 4 --gradient-accumulation-steps 2")
    out = list(hf().render(recipe(argv).with_knobs(dataloader_num_workers=2)).argv)
    assert out[-2:] == ["--dataloader-num-workers", "2"]


def test_bare_and_negated_booleans():
    argv = cmd("python train.py --per_device_train_batch_size 4 --torch_compile --no_dataloader_pin_memory")
    r = recipe(argv)
    assert r.knob("torch_compile") is True and r.knob("dataloader_pin_memory") is False
    out = list(hf().render(r.with_knobs(torch_compile=False)).argv)
    assert out == [*argv[:4], "--torch_compile", "False", "--no_dataloader_pin_memory"]
    out = list(hf().render(r.with_knobs(dataloader_pin_memory=True)).argv)
    assert out == [*argv[:5], "--dataloader_pin_memory", "True"]


def test_default_valued_knob_removes_its_flag():
    argv = cmd("accelerate launch train.py --per_device_train_batch_size 16 --ddp_bucket_cap_mb 50")
    out = list(hf().render(recipe(argv).with_knobs(ddp_bucket_cap_mb=None)).argv)
    assert out == argv[:5]


@pytest.mark.parametrize("version,flag", [("5.24.0", "--activation_checkpointing"),
                                          ("5.23.0", "--activation_checkpointing"),
                                          ("5.22.2", "--gradient_checkpointing"),
                                          ("4.57.6", "--gradient_checkpointing"),
                                          (None, "--gradient_checkpointing")])
def test_checkpointing_flag_name_follows_the_version_where_the_launch_has_none(version, flag):
    argv = cmd("python train.py --per_device_train_batch_size 2")
    data = imported(argv)
    data["launch"]["framework_version"] = version  # None: not known (transformers was not installed at import)
    r = parse_recipe(data)
    assert list(hf().render(r.with_knobs(gradient_checkpointing=True)).argv) == [*argv, flag, "True"]


def test_checkpointing_flag_the_launch_uses_is_edited():
    r = recipe(POOR)  # --gradient_checkpointing True, transformers 5.24
    out = list(hf().render(r.with_knobs(gradient_checkpointing=False)).argv)
    assert out[out.index("--gradient_checkpointing") + 1] == "False" and "--activation_checkpointing" not in out
    argv = cmd("python train.py --per_device_train_batch_size 2 --activation_checkpointing")
    out = list(hf().render(recipe(argv).with_knobs(gradient_checkpointing=False)).argv)
    assert out == [*argv, "False"]


def test_processes_edit_the_launcher():
    r = recipe(POOR)
    out = list(hf().render(r.with_knobs(nproc_per_node=2)).argv)
    assert out[:6] == ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    assert out[6:] == [t if t != "16" else "8" for t in POOR[1:]]
    argv = cmd("torchrun --standalone --nproc-per-node=2 train.py --per_device_train_batch_size 4")
    out = list(hf().render(recipe(argv).with_knobs(nproc_per_node=1)).argv)
    assert out == ["torchrun", "--standalone", "--nproc-per-node=1", "train.py", "--per_device_train_batch_size", "4",
                   "--gradient_accumulation_steps", "2"]
    argv = cmd("torchrun -m mypkg.train --per_device_train_batch_size 4 --gradient_accumulation_steps 2")
    out = list(hf().render(recipe(argv).with_knobs(nproc_per_node=2)).argv)
    assert out == ["torchrun", "--nproc_per_node", "2", "-m", "mypkg.train", "--per_device_train_batch_size", "4",
                   "--gradient_accumulation_steps", "1"]


def test_accelerate_on_cpu_uses_its_multi_process_launcher():
    argv = cmd("accelerate launch --cpu train.py --per_device_train_batch_size 2 --gradient_accumulation_steps 4")
    launch = hf().render(recipe(argv).with_knobs(nproc_per_node=2))
    assert list(launch.argv) == ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "train.py",
                                 "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2"]
    assert launch.env["ACCELERATE_USE_CPU"] == "true" and launch.env["OMP_NUM_THREADS"] == "4"


def test_multi_process_cpu_launch_without_use_cpu_gets_accelerate_cpu_mode():
    """Without use_cpu, accelerate on a machine with no GPU runs each torchrun worker as its own 1-process run."""
    argv = cmd("torchrun --nproc_per_node 2 train.py --per_device_train_batch_size 2")
    assert hf().render(recipe(argv)).env["ACCELERATE_USE_CPU"] == "true"
    assert "ACCELERATE_USE_CPU" not in hf().render(recipe(POOR).with_knobs(nproc_per_node=2)).env  # has --use_cpu
    assert "ACCELERATE_USE_CPU" not in hf().render(recipe("python train.py")).env


def test_indivisible_layout_is_refused_with_legal_values():
    r = recipe("python train.py --per_device_train_batch_size 2 --gradient_accumulation_steps 3 --use_cpu True")
    with pytest.raises(ValueError) as err:
        r.with_knobs(per_device_train_batch_size=4)
    assert "legal per_device_train_batch_size here: [1, 2]" in str(err.value)


def test_optimizer_moves_only_between_adamw_implementations():
    r = recipe("python train.py --optim adafactor")
    assert r.knob("optim") == "adafactor"
    with pytest.raises(ValueError, match="optimizer_family_fixed|changes the optimizer"):
        r.with_knobs(optim="adamw_torch")
    r = recipe("python train.py --optim adamw_torch")
    assert list(hf().render(r.with_knobs(optim="adamw_torch_fused")).argv)[-1] == "adamw_torch_fused"


def test_default_optimizer_is_not_rendered():
    r = recipe("python train.py --per_device_train_batch_size 4")
    assert r.knob("optim") == "adamw_torch_fused"
    assert list(hf().render(r).argv) == ["python", "train.py", "--per_device_train_batch_size", "4"]
    assert list(hf().render(r.with_knobs(optim="adamw_torch")).argv)[-2:] == ["--optim", "adamw_torch"]


# -- args files --------------------------------------------------------------------------------------------

ARGS_YAML = """\
# my run
per_device_train_batch_size: 1   # fits anywhere
gradient_accumulation_steps: 16
learning_rate: 5.0e-4
max_steps: 10000
use_cpu: true
"""


def test_args_file_launch_carries_the_file_and_edits_it_in_place(tmp_path):
    (tmp_path / "args.yaml").write_text(ARGS_YAML)
    r = recipe(["python", "train.py", "args.yaml"], tmp_path)
    assert r.launch.files == {"args.yaml": ARGS_YAML}
    launch = hf().render(r)
    assert list(launch.argv) == ["python", "train.py", "args.yaml"] and launch.files["args.yaml"] == ARGS_YAML
    launch = hf().render(r.with_knobs(per_device_train_batch_size=4))
    text = launch.files["args.yaml"]
    assert list(launch.argv) == ["python", "train.py", "args.yaml"]
    assert text.startswith("# my run\n") and "# fits anywhere" in text
    assert yaml.safe_load(text) == {**yaml.safe_load(ARGS_YAML), "per_device_train_batch_size": 4,
                                    "gradient_accumulation_steps": 4}
    text = hf().render(r.with_knobs(dataloader_num_workers=2)).files["args.yaml"]
    assert text.startswith(ARGS_YAML) and yaml.safe_load(text)["dataloader_num_workers"] == 2


def test_json_args_file(tmp_path):
    args = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8, "seed": 1, "use_cpu": True}
    (tmp_path / "cfg.json").write_text(json.dumps(args, indent=4))
    r = recipe(["torchrun", "--nproc_per_node", "1", "train.py", "cfg.json"], tmp_path)
    launch = hf().render(r.with_knobs(nproc_per_node=2))
    assert list(launch.argv) == ["torchrun", "--nproc_per_node", "2", "train.py", "cfg.json"]
    assert json.loads(launch.files["cfg.json"]) == {**args, "gradient_accumulation_steps": 4}


def test_missing_args_file_is_a_recipe_problem(tmp_path):
    with pytest.raises(RecipeError, match="cannot read the args file"):
        imported(["python", "train.py", "nope.json"], tmp_path)
    (tmp_path / "a.json").write_text("{}")
    data = imported(["python", "train.py", "a.json"], tmp_path)
    data["launch"]["files"] = {}
    with pytest.raises(RecipeError, match="does not carry that file"):
        parse_recipe(data)


def test_config_files_are_carried(tmp_path):
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    r = recipe("torchrun --nproc_per_node 2 train.py --deepspeed ds.json", tmp_path)
    assert r.launch.files == {"ds.json": '{"zero_optimization": {"stage": 2}}'}


# -- native settings ---------------------------------------------------------------------------------------

def test_set_native_edits_the_launch_not_the_knobs(tmp_path):
    data = imported(POOR)
    assert hf().set_native(data, "learning_rate", 1e-3)
    assert data["launch"]["argv"][data["launch"]["argv"].index("--learning_rate") + 1] == "0.001"
    assert hf().set_native(data, "warmup_steps", 10) and data["launch"]["argv"][-2:] == ["--warmup_steps", "10"]
    assert not hf().set_native(data, "per_device_train_batch_size", 4)  # a knob
    assert not hf().set_native(data, "no_such_setting", 4)
    (tmp_path / "a.yaml").write_text(ARGS_YAML)
    data = imported(["python", "train.py", "a.yaml"], tmp_path)
    assert hf().set_native(data, "seed", 7)
    assert yaml.safe_load(data["launch"]["files"]["a.yaml"])["seed"] == 7


def test_importing_the_package_imports_neither_torch_nor_transformers():
    code = ("import json, sys\nfrom attune import frameworks\nfw = frameworks.get('hf')\nfw.catalogue()\n"
            "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'accelerate') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == []


def test_set_native_accumulation_is_then_refused_by_the_gate():
    from attune.gate import evaluate

    base = recipe(POOR)
    data = base.model_dump(mode="python")
    assert hf().set_native(data, "gradient_accumulation_steps", 8)
    v = evaluate(base, data)
    assert not v.admitted and "hf.global_batch_size" in {r.field for r in v.reasons}


def test_a_recipe_whose_launch_does_not_parse_is_invalid():
    data = imported(POOR)
    data["launch"]["argv"] = ["deepspeed", "train.py"]
    with pytest.raises(RecipeError, match="unknown launcher"):
        parse_recipe(data)


def test_accelerate_config_file_is_carried(tmp_path):
    (tmp_path / "acc.yaml").write_text("num_processes: 2\nmixed_precision: 'no'\n")
    r = recipe("accelerate launch --config_file acc.yaml train.py --per_device_train_batch_size 2", tmp_path)
    assert r.launch.files == {"acc.yaml": "num_processes: 2\nmixed_precision: 'no'\n"}
    assert "launch.config_files" in hf().contract(r)
    assert r.knob("nproc_per_node") == 2  # from the config file
    out = list(hf().render(r.with_knobs(nproc_per_node=1)).argv)
    assert out[:5] == ["accelerate", "launch", "--config_file", "acc.yaml", "--num_processes"] and out[5] == "1"
