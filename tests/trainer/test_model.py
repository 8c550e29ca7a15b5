"""The GPT model: shapes, GQA, tied head and layout-independent initialisation."""

from __future__ import annotations

import pytest
import torch

from attune.recipe.model import ModelSpec
from attune.trainer.model import build_model

SPEC = ModelSpec(layers=2, hidden_size=64, heads=4, kv_groups=2, ffn_hidden_size=128, vocab_size=256)


def test_initial_weights_depend_only_on_seed() -> None:
    a = build_model(SPEC, 32, seed=0, checkpointing="none").state_dict()
    b = build_model(SPEC, 32, seed=0, dropout=0.1, checkpointing="full").state_dict()
    c = build_model(SPEC, 32, seed=1).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tok.weight"], c["tok.weight"])


def test_gqa_projection_and_tied_head() -> None:
    model = build_model(SPEC, 32, seed=0)
    assert model.blocks[0].attn.qkv.weight.shape == ((4 + 2 * 2) * 16, 64)
    tied = build_model(SPEC.model_copy(update={"tied_embeddings": True}), 32, seed=0)
    assert tied.head.weight is tied.tok.weight
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in tied.parameters()) == 256 * 64


@pytest.mark.parametrize("checkpointing", ["selective", "full"])
def test_checkpointing_gives_identical_loss_and_gradients(checkpointing: str) -> None:
    idx = torch.randint(0, 256, (2, 17))
    ref, ckpt = build_model(SPEC, 32, seed=0), build_model(SPEC, 32, seed=0, checkpointing=checkpointing)
    for m in (ref, ckpt):
        m(idx[:, :-1], idx[:, 1:]).backward()
    assert torch.equal(ref(idx[:, :-1], idx[:, 1:]), ckpt(idx[:, :-1], idx[:, 1:]))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ref.parameters(), ckpt.parameters(), strict=True))


def test_moe_is_refused_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match="MoE"):
        build_model(SPEC.model_copy(update={"moe_experts": 4, "moe_top_k": 2}), 32, seed=0)
