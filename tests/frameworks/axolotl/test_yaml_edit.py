"""The YAML editing both YAML front ends share (attune.frameworks.hfyaml): one key's lines change, every other byte
stays, and what is written reads back as the value meant."""

from __future__ import annotations

import yaml

from attune.frameworks.hfyaml import REMOVE, format_scalar, omegaconf_loader, rewrite_yaml

TEXT = """# top comment
base_model: x   # the model
lora_target_modules:
  - q_proj
  - v_proj

micro_batch_size: 2  # per GPU
fp16:
special_tokens:
  pad_token: "<|end_of_text|>"
"""


def test_a_scalar_keeps_its_comment_and_everything_else_stays():
    out = rewrite_yaml("c.yml", TEXT, {"micro_batch_size": 4})
    assert out == TEXT.replace("micro_batch_size: 2  # per GPU", "micro_batch_size: 4  # per GPU")


def test_an_empty_value_a_block_value_and_a_new_key():
    out = rewrite_yaml("c.yml", TEXT, {"fp16": False, "lora_target_modules": "all", "torch_compile": True})
    assert yaml.safe_load(out) == {**yaml.safe_load(TEXT), "fp16": False, "lora_target_modules": "all",
                                   "torch_compile": True}
    assert "  - q_proj" not in out and out.startswith("# top comment\nbase_model: x   # the model\n")
    assert out.endswith('  pad_token: "<|end_of_text|>"\ntorch_compile: true\n')


def test_removal_and_no_change():
    assert rewrite_yaml("c.yml", TEXT, {"micro_batch_size": 2}) is TEXT
    out = rewrite_yaml("c.yml", TEXT, {"fp16": REMOVE})
    assert "fp16" not in yaml.safe_load(out) and "# top comment" in out


def test_scalars_read_back_as_written():
    lf = omegaconf_loader()
    for value in (1e-05, 2.0e-4, 0.1, 3, True, None, "no", "none", "fa2", "a: b", "1e-4"):
        for loader in (yaml.SafeLoader, lf):
            assert yaml.load(f"v: {format_scalar(value, loader)}", Loader=loader)["v"] == value  # noqa: S506
    assert format_scalar(1e-05) == "1.0e-05" and format_scalar("no") == '"no"'
