"""The hf framework reads what in a launch draws random numbers per micro-batch (the model's dropout, NEFTune, TRL's
LoRA dropout), so a per-device batch change is known to train on another random stream before any trial runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from attune.frameworks.hf.randomness import dropouts, type_defaults
from tests.frameworks.hf.helpers import cmd, hf, recipe

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="a model type's defaults are read from the installed transformers")
RUN_CLM = cmd("python run_clm.py --dataset_name wikitext --per_device_train_batch_size 1 "
              "--gradient_accumulation_steps 8 --max_steps 100 --output_dir out")
STREAM = "draws masks per micro-batch: a per-device batch (or process count) change draws another random stream"
#: the dropout keys of a GPT-2 config.json as transformers 5.24's save_pretrained writes them (every value)
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "attn_pdrop": 0.1, "embd_pdrop": 0.1,
        "resid_pdrop": 0.1, "summary_first_dropout": 0.1}


def model_dir(root: Path, name: str, config: dict) -> str:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.json").write_text(json.dumps(config))
    return name


def hazards(argv: list[str], cwd: Path) -> list[str]:
    return hf().random_stream_hazards(recipe(argv, cwd))


def test_a_local_models_dropout_is_named_with_where_it_was_read(tmp_path):
    model = model_dir(tmp_path, "tiny-gpt2", GPT2)
    found = hazards([*RUN_CLM, "--model_name_or_path", model], tmp_path)
    assert found == [f"the model's dropout (attn_pdrop=0.1, embd_pdrop=0.1, resid_pdrop=0.1; from "
                     f"--model_name_or_path tiny-gpt2) {STREAM}"]  # not the double-heads summary's dropout
    off = {**GPT2, "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0}
    assert hazards([*RUN_CLM, "--model_name_or_path", model_dir(tmp_path, "off", off)], tmp_path) == []


def test_the_config_name_wins_over_the_model_and_may_name_the_file(tmp_path):
    model = model_dir(tmp_path, "weights", GPT2)
    cfg = model_dir(tmp_path, "cfg", {"model_type": "llama", "attention_dropout": 0.0})
    assert hazards([*RUN_CLM, "--model_name_or_path", model, "--config_name", cfg], tmp_path) == []
    found = hazards([*RUN_CLM, "--config_name", "weights/config.json"], tmp_path)
    assert len(found) == 1 and "from --config_name weights/config.json" in found[0]


@needs_transformers
def test_training_from_scratch_reads_the_types_defaults_and_the_overrides(tmp_path):
    assert dict(type_defaults("gpt2")) == {"attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1}
    found = hazards([*RUN_CLM, "--model_type", "gpt2", "--config_overrides", "n_embd=64,n_layer=2,resid_pdrop=0.2"],
                    tmp_path)
    assert found == [f"the model's dropout (attn_pdrop=0.1, embd_pdrop=0.1, resid_pdrop=0.2; from --model_type gpt2 "
                     f"(its defaults) and --config_overrides) {STREAM}"]
    quiet = "n_embd=64,resid_pdrop=0.0,embd_pdrop=0.0,attn_pdrop=0.0"
    assert hazards([*RUN_CLM, "--model_type", "gpt2", "--config_overrides", quiet], tmp_path) == []
    assert hazards([*RUN_CLM, "--model_type", "llama"], tmp_path) == []  # Llama's attention_dropout is 0.0


@needs_transformers
def test_a_key_a_hand_written_config_lacks_has_its_types_default(tmp_path):
    bert = model_dir(tmp_path, "bert", {"model_type": "bert", "hidden_size": 64})
    found = hazards([*RUN_CLM, "--model_name_or_path", bert], tmp_path)
    assert len(found) == 1 and "attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.1;" in found[0]


def test_a_hub_model_is_not_read_and_says_nothing(tmp_path):
    assert hazards([*RUN_CLM, "--model_name_or_path", "openai-community/gpt2"], tmp_path) == []
    assert hazards(RUN_CLM, tmp_path) == []


def test_an_args_file_launch_is_read_through_its_file(tmp_path):
    model_dir(tmp_path, "m", GPT2)
    (tmp_path / "args.json").write_text(json.dumps({"model_name_or_path": "m", "output_dir": "out",
                                                    "per_device_train_batch_size": 2}))
    found = hazards(["python", "run_clm.py", "args.json"], tmp_path)
    assert len(found) == 1 and "resid_pdrop=0.1" in found[0]


def test_neftune_and_trl_lora_dropout_are_random_streams_too(tmp_path):
    model = model_dir(tmp_path, "llama", {"model_type": "llama", "attention_dropout": 0.0})
    found = hazards([*RUN_CLM, "--model_name_or_path", model, "--neftune_noise_alpha", "5"], tmp_path)
    assert len(found) == 1 and found[0].startswith("NEFTune (neftune_noise_alpha=5) draws embedding noise")
    sft = ["trl", "sft", "--model_name_or_path", model, "--dataset_name", "data", "--use_peft"]
    found = hazards(sft, tmp_path)
    assert found == ["LoRA's dropout (lora_dropout=0.05) draws masks per micro-batch: a per-device batch (or process "
                     "count) change draws another random stream"]  # TRL's default lora_dropout
    assert hazards([*sft, "--lora_dropout", "0"], tmp_path) == []
    assert hazards(sft[:-1], tmp_path) == []  # no adapter, no LoRA dropout


def test_dropout_keys_of_the_common_config_families():
    config = {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "dropout": 0.2, "attention_dropout": 0,
              "hidden_dropout": 0.05, "dropout_rate": 0.1, "layerdrop": 0.1, "classifier_dropout": 0.3,
              "summary_first_dropout": 0.1, "hidden_size": 64, "text_config": {"attention_dropout": 0.1}}
    assert dropouts(config) == {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "dropout": 0.2,
                                "attention_dropout": 0.0, "hidden_dropout": 0.05, "dropout_rate": 0.1,
                                "layerdrop": 0.1, "text_config.attention_dropout": 0.1}
