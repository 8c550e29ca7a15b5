"""The simulator times imported native recipes (model and training derived from the launch) like its own, and pads
the vocabulary by the recipe's ``make_vocab_size_divisible_by`` knob."""

from __future__ import annotations

import pytest

from attune.frameworks.megatron import catalogue as mc
from attune.sim import simulate
from tests.frameworks.megatron.helpers import bridge_yaml, mlm, nemo


def test_published_layouts_land_near_their_published_throughput():
    # Megatron-LM README FP8 table: Llama-3 70B, 64 H100, TP4 PP8 VP5 GBS128 → 1621 tokens/s/GPU
    assert simulate(mlm("llama3_70b_h100_fp8.sh")).tokens_per_s_per_device == pytest.approx(1621, rel=0.1)
    # dgxc-benchmarking v25.04 BF16: Llama-3.1 8B, 8 H100, TP1 PP1 CP2 GBS128 → 10682 tokens/s/GPU (knobs-and-sim §3.2)
    assert simulate(bridge_yaml()).tokens_per_s_per_device == pytest.approx(10682, rel=0.1)
    assert simulate(nemo()).outcome == "succeeded"


def test_padded_vocabulary_comes_from_the_divisor_knob():
    r = mlm()  # vocab 128256, TP 1
    assert mc.padded_vocab_size(r) == 128256
    wide = r.with_knobs(make_vocab_size_divisible_by=1024)
    assert mc.padded_vocab_size(wide) == 129024
    assert simulate(wide).model_flops_per_token > simulate(r).model_flops_per_token
