"""A script's settings and hazards read from its source, in each form a script declares them, never by running it;
and the facts a declaration states for the loss check."""

from __future__ import annotations

import textwrap

import pytest

from attune.errors import RecipeError
from attune.frameworks.command.declaration import HazardKind, parse
from attune.frameworks.command.source import config_assignments, hazards, read_script
from tests.frameworks.command.helpers import command, declaration, recipe


def _script(tmp_path, text: str):
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(text))
    return read_script(path)


def test_click_options_are_read_with_their_defaults_and_switches(tmp_path):
    src = _script(tmp_path, """
        import click

        @click.command()
        @click.option("--batch-size", default=16, type=int)
        @click.option("--lr", default=3e-4)
        @click.option("--compile/--no-compile", default=False)
        @click.option("--bf16", is_flag=True)
        def main(batch_size, lr, compile, bf16):
            pass
    """)
    s = src.settings
    assert s["batch_size"].flag == "--batch-size" and s["batch_size"].default == 16
    assert s["lr"].default == 3e-4 and s["compile"].flag == "--compile" and s["bf16"].switch


def test_hf_argument_parser_dataclasses_in_the_script_are_read_field_by_field(tmp_path):
    src = _script(tmp_path, """
        from dataclasses import dataclass, field
        from transformers import HfArgumentParser

        @dataclass
        class Args:
            seq_len: int = field(default=1024, metadata={"help": "tokens"})
            micro_batch_size: int = 4
            dataset: str = "c4"

        Args2 = None
        args, = HfArgumentParser((Args,)).parse_args_into_dataclasses()
    """)
    assert {k: v.default for k, v in src.settings.items()} == {"seq_len": 1024, "micro_batch_size": 4,
                                                              "dataset": "c4"}


def test_a_jsonargparse_cli_functions_parameters_are_its_flags(tmp_path):
    src = _script(tmp_path, """
        from jsonargparse import CLI

        def train(data_dir: str, lr: float = 1e-3, block_size: int = 256, steps: int = 100, name=None):
            pass

        if __name__ == "__main__":
            CLI(train)
    """)
    assert src.settings["block_size"].default == 256 and src.settings["lr"].flag == "--lr"
    assert not src.settings["data_dir"].known and src.settings["name"].known


def test_a_script_that_does_not_parse_is_named_not_run(tmp_path):
    src = _script(tmp_path, "def broken(:\n")
    assert not src.settings and "not Python attune can parse (line 1)" in src.notes[0]


def test_a_config_file_is_read_in_order_and_a_computed_declared_setting_is_refused_with_its_line():
    got = config_assignments("config/x.py", "batch_size = 4\nwandb_run_name = 'gpt2-' + str(4)\n", 3,
                             {"batch_size"})
    assert got["batch_size"].value == 4 and got["batch_size"].where == "config/x.py line 1"
    assert "computed" in got["wandb_run_name"].value  # not declared: kept as text, never evaluated
    with pytest.raises(RecipeError, match=r"config/x.py line 2: batch_size is assigned here under a condition"):
        config_assignments("config/x.py", "import os\nif os.environ.get('BIG'):\n    batch_size = 8\n", 3,
                           {"batch_size"})


def test_hazards_are_not_claimed_where_the_source_shows_none(tmp_path):
    src = _script(tmp_path, """
        import torch
        g = torch.Generator().manual_seed(0)
        gradient_accumulation_steps = 4

        def get_batch():
            return torch.randint(100, (4,), generator=g)

        def evaluate():
            return get_batch()

        total = 0.0
        for _ in range(gradient_accumulation_steps):
            loss = get_batch().float().mean() / gradient_accumulation_steps
            total += loss.item()
        print(f"step 1 | loss {total:.4f}")
    """)
    assert hazards(src, {"dropout": 0.0}) == []
    assert [h.kind for h in hazards(src, {"attn_dropout": 0.1})] == [HazardKind.DROPOUT]


def test_the_declaration_states_its_hazards_and_the_framework_exposes_them():
    d = parse(declaration(loss_is_step_mean=False, eval_shares_generator=True, dropout=False))
    assert [h.kind for h in d.hazards()] == [HazardKind.LOSS_NOT_STEP_MEAN, HazardKind.EVAL_SHARES_GENERATOR]
    assert parse(declaration()).hazards() == []  # the example states none
    r = recipe(decl=declaration(dropout=True))
    assert [h.kind for h in command().declared_hazards(r)] == [HazardKind.DROPOUT]
    with pytest.raises(RecipeError, match="loss_is_step_mean"):
        parse(declaration(loss_is_step_mean="sometimes"))


def test_the_scripts_own_token_count_in_its_step_lines_is_checked_against_attunes():
    from attune.frameworks.command.logs import StepLineParser

    r = recipe()  # global batch 32 × 64 tokens
    parser = StepLineParser(r"step (?P<step>\d+) tokens (?P<tokens>\d+) loss (?P<loss>\S+)", tokens_per_step=2048)
    parser.feed("step 1 tokens 1024 loss 4.1\n", 0.0)
    problems = command().report_problems(r, parser.reported)
    assert problems and "1,024 tokens in its step line" in problems[0] and "2,048" in problems[0], problems
    assert command().report_problems(r, {"tokens_per_iteration": 2048}) == []


def test_a_dataclass_from_the_scripts_own_module_is_never_imported(tmp_path, monkeypatch):
    (tmp_path / "myargs.py").write_text("from pathlib import Path\nPath(__file__).with_name('EXECUTED').touch()\n"
                                        "from dataclasses import dataclass\n@dataclass\nclass Args:\n    lr: float = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m attune` run in the script's directory has it
    src = _script(tmp_path, """
        from transformers import HfArgumentParser
        from myargs import Args
        parser = HfArgumentParser((Args,))
    """)
    assert not (tmp_path / "EXECUTED").exists() and "lr" not in src.settings
    assert "no installed library" in src.notes[0]
