"""Diagnosis on recorded measurements: every bottleneck class, missing signals, OOM."""

from __future__ import annotations

import pytest

from attune.agent.diagnose import diagnose
from attune.testing.factories import tiny_recipe
from attune.trial import TrialOutcome, TrialRecord
from tests.agent.helpers import measurement, megatron_recipe

# trainer phase timers as recorded by the reference trainer (seconds per step)
CASES = [
    ("communication", "dp", measurement(1.0, {"forward": 0.2, "backward": 0.35, "comm": 0.4, "optimizer": 0.03,
                                              "data": 0.01})),
    ("data_loading", None, measurement(1.0, {"forward": 0.3, "backward": 0.4, "data": 0.25, "optimizer": 0.03})),
    ("host_overhead", None, measurement(1.0, {"forward": 0.2, "backward": 0.3, "optimizer": 0.45, "data": 0.01})),
    ("compute_bound", None, measurement(1.79, {"forward": 0.5, "backward": 1.3, "comm": 0.0, "optimizer": 0.02,
                                               "data": 0.004})),
    # simulator breakdowns
    ("communication", "tp", measurement(1.0, {"compute": 0.5, "tp_comm": 0.35, "dp_exposed": 0.05, "host": 0.02})),
    ("communication", "ep", measurement(1.0, signals={"compute": 0.45, "ep_comm": 0.4, "host": 0.02})),
    ("pipeline_bubble", None, measurement(1.0, {"compute": 0.6, "pp_bubble": 0.3, "tp_comm": 0.05})),
]


@pytest.mark.parametrize(("expected", "sub", "m"), CASES)
def test_each_bottleneck_class(expected, sub, m):
    d = diagnose(m, tiny_recipe())
    assert d.bottleneck == expected
    if sub:
        assert d.sub_kind == sub
    assert 0.3 <= d.confidence <= 1.0
    assert d.evidence


def test_oom_is_memory_with_high_confidence():
    rec = TrialRecord(id=3, kind="candidate", outcome=TrialOutcome.OOM)
    d = diagnose(rec, tiny_recipe())
    assert (d.bottleneck, d.confidence >= 0.9) == ("memory_capacity", True)
    assert diagnose(None, None, "oom").bottleneck == "memory_capacity"


def test_memory_near_capacity_from_dcgm_framebuffer():
    d = diagnose(measurement(1.0, {"compute": 0.9}, {"fb_used": 78000, "fb_total": 81559}), megatron_recipe())
    assert d.bottleneck == "memory_capacity"


def test_dcgm_signals_alone():
    host = diagnose(measurement(1.0, signals={"sm_active": 0.2, "tensor_active": 0.1}))
    assert host.bottleneck == "host_overhead"
    comm = diagnose(measurement(1.0, signals={"sm_active": 0.3, "nvlink_bytes": 5e10}))
    assert comm.bottleneck == "communication"
    busy = diagnose(measurement(1.0, signals={"sm_active": 0.9, "tensor_active": 0.7}))
    assert busy.bottleneck == "compute_bound"


def test_missing_signals_lower_confidence_never_crash():
    full = diagnose(measurement(1.0, {"forward": 0.4, "backward": 0.55, "optimizer": 0.03, "data": 0.01}))
    bare = diagnose(measurement(1.0))
    nothing = diagnose(None)
    odd = diagnose(measurement(0.0, {"forward": 0.0}, {"sm_active": 0.0}))
    assert bare.confidence < full.confidence
    assert nothing.confidence < 0.2 and bare.confidence < 0.2
    assert odd.bottleneck in ("host_overhead", "compute_bound")
    assert diagnose(measurement(1.0), None, "not-an-outcome").bottleneck == "compute_bound"
