"""The playbook's score adjustments as named rules with named constants (issue 41, item 2): each does what its name
says, in the order SCORE_RULES lists them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from attune.agent.diagnose import Diagnosis
from attune.frameworks.base import Rule
from attune.policies import playbook as pb
from attune.trial import TrialKind, TrialOutcome


def _move(rule: Rule, diag: Diagnosis, **over: Any) -> pb.Move:
    ctx = SimpleNamespace(records=[], noise_floor=0.02, catalogue={}, measurement=None)
    base: dict[str, Any] = dict(policy=None, ctx=ctx, diag=diag, knob="k", value=2, direction="up", rule=rule,
                                shares={}, lessons=[])
    return pb.Move(**{**base, **over})  # type: ignore[arg-type]


def test_the_rules_are_named_and_ordered_the_bottleneck_first_and_the_lessons_last():
    names = [name for name, _ in pb.SCORE_RULES]
    assert len(names) == len(set(names)) == 10
    assert names[0] == "addresses the bottleneck" and names[-1] == "measured on alike jobs"


def test_a_move_against_the_bottleneck_keeps_its_named_share():
    rule = Rule(tier=pb.SCALE, gain=0.10, hurts=("communication",))
    s = pb.Score(gain=0.10)
    pb._works_against_the_bottleneck(_move(rule, Diagnosis("communication", 0.9)), s)
    assert s.gain == pytest.approx(0.10 * pb.AGAINST_BOTTLENECK) and "works against communication" in s.notes
    # adding memory to a recipe out of memory is not scaled: it is marked, to be kept only with a completion
    mem = Rule(tier=pb.SCALE, gain=0.10, hurts=("memory_capacity",), memory=1)
    s = pb.Score(gain=0.10)
    pb._works_against_the_bottleneck(_move(mem, Diagnosis("memory_capacity", 0.9)), s)
    assert s.adds_memory and s.gain == 0.10


def test_a_value_that_failed_earlier_in_this_run_keeps_its_named_share():
    failed = SimpleNamespace(kind=TrialKind.CANDIDATE, change={"k": 2}, outcome=TrialOutcome.OOM, gain=None)
    flat = SimpleNamespace(kind=TrialKind.CANDIDATE, change={"k": 2}, outcome=TrialOutcome.SUCCEEDED, gain=0.001)
    for record, share in ((failed, pb.FAILED_EARLIER), (flat, pb.NO_GAIN_EARLIER)):
        m = _move(Rule(tier=pb.SCALE, gain=0.10), Diagnosis("compute_bound", 0.5))
        m.ctx.records.append(record)
        s = pb.Score(gain=0.10)
        pb._tried_earlier_in_this_run(m, s)
        assert s.gain == pytest.approx(0.10 * share), record


def test_an_overlap_gains_at_most_the_phase_it_hides():
    rule = Rule(tier=pb.OVERLAP, gain=0.10, helps={"communication:dp": 0.10})
    s = pb.Score(gain=0.10)
    m = _move(rule, Diagnosis("communication", 0.9), shares={"communication:dp": 0.02})
    pb._overlap_cap(m, s)
    assert s.gain == pytest.approx(max(0.02 * pb.OVERLAP_MARGIN, pb.OVERLAP_FLOOR))


def test_a_failure_in_scope_prunes_the_move():
    action = SimpleNamespace(knob="k", direction="up", value=2)
    lesson = SimpleNamespace(action=action, is_infeasible=True, id="L1", failures=("oom",))
    s = pb.Score(gain=0.10)
    pb._failed_in_scope(_move(Rule(tier=pb.SCALE), Diagnosis("compute_bound", 0.5),
                              lessons=[(lesson, pb.INFEASIBLE_PRUNE_MATCH)]), s)
    assert s.pruned and "pruned by lesson L1" in s.notes[-1]
    s = pb.Score(gain=0.10)
    pb._failed_in_scope(_move(Rule(tier=pb.SCALE), Diagnosis("compute_bound", 0.5),
                              lessons=[(lesson, pb.INFEASIBLE_PRUNE_MATCH / 2)]), s)
    assert not s.pruned and s.gain == pytest.approx(0.10 * pb.FAILED_NEARBY)
