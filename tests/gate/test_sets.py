"""``apply_sets``: PATH=VALUE edits of recipe mappings."""

from __future__ import annotations

import pytest

from attune.gate import SetError, apply_sets
from tests.gate.recipes import base


def test_paths_and_yaml_scalars() -> None:
    data = base("tiny")
    out = apply_sets(data, ["training.optimizer.lr=1e-3", "knobs.micro_batch_size=4", "compile_mode=default",
                            "training.schedule.warmup_steps=3", "training.optimizer.grad_clip=null",
                            "dataloader_workers=2", "model.tied_embeddings=true", "name=x"])
    assert out["training"]["optimizer"]["lr"] == 1e-3 and isinstance(out["training"]["optimizer"]["lr"], float)
    assert out["knobs"]["micro_batch_size"] == 4 and out["knobs"]["compile_mode"] == "default"
    assert out["training"]["optimizer"]["grad_clip"] is None
    assert out["model"]["tied_embeddings"] is True and out["name"] == "x"
    assert data["knobs"]["micro_batch_size"] == 1  # pure: the input is untouched


def test_dotted_knob_names_and_string_valued_knobs() -> None:
    out = apply_sets(base("tiny"), ["knobs.env.OMP_NUM_THREADS=2", "env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1"])
    assert out["knobs"]["env.OMP_NUM_THREADS"] == "2"
    assert out["knobs"]["env.TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"] == "1"
    assert apply_sets(base("tiny"), ["env.OMP_NUM_THREADS="])["knobs"]["env.OMP_NUM_THREADS"] == ""


def test_missing_sections_are_created_and_mapping_form_works() -> None:
    out = apply_sets({"framework": "torch"}, {"training.data.seed": 5, "micro_batch_size": 2})
    assert out == {"framework": "torch", "training": {"data": {"seed": 5}}, "knobs": {"micro_batch_size": 2}}


@pytest.mark.parametrize("bad", ["micro_batch_size", "=4", "training..lr=1", "knobs=3", "training.seq_length.x=1",
                                 "knobs.x=[unclosed"])
def test_malformed_sets_raise(bad: str) -> None:
    with pytest.raises(SetError):
        apply_sets(base("tiny"), [bad])


def test_a_single_string_is_not_a_list_of_sets() -> None:
    with pytest.raises(SetError, match="list"):
        apply_sets(base("tiny"), "micro_batch_size=2")  # type: ignore[arg-type]
