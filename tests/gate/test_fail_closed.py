"""The gate fails closed: an adapter that cannot read a candidate's launch answers its contract with nothing (every
adapter returns ``{}`` where its launch does not parse), and a comparison that skipped the paths only one side has
would then admit any edit of the launch. A candidate that states none of what the baseline's launch freezes is
refused, saying why."""

from __future__ import annotations

import pytest

from attune.gate import evaluate
from attune.gate.verdict import ReasonCode
from tests.frameworks.hf.helpers import POOR, recipe, with_argv


@pytest.fixture
def unreadable(monkeypatch):
    """The hf adapter, reading only the baseline's launch: the candidate's (any other argv) does not parse."""
    from attune import frameworks

    impl = type(frameworks.get("hf"))
    contract = impl.contract

    def reads_only_the_baseline(self, r):
        return contract(self, r) if list(r.launch.argv) == POOR else {}

    monkeypatch.setattr(impl, "contract", reads_only_the_baseline)


def test_a_candidate_whose_launch_its_adapter_cannot_read_is_refused(unreadable):
    base = recipe(POOR)
    edited = [*POOR[:-2], "--learning_rate", "1e-3", "--use_cpu", "True"]  # a contract setting changed: unseen
    v = evaluate(base, with_argv(base, edited))
    assert not v.admitted
    reason = next(r for r in v.reasons if "cannot be read" in r.message)
    assert reason.code == ReasonCode.CONTRACT and reason.field.startswith("launch.")
    assert "The gate cannot vouch for a launch it cannot read" in reason.message
    assert evaluate(base, with_argv(base, POOR)).admitted  # the launch it reads is still compared as before


def test_a_candidate_that_drops_one_frozen_flag_is_refused_for_that_flag_alone():
    base = recipe(POOR)
    v = evaluate(base, with_argv(base, [t for t in POOR if t not in ("--use_cpu", "True")]))
    assert not v.admitted and not any("cannot be read" in r.message for r in v.reasons)
    assert any(r.field in ("launch.options", "launch.args.use_cpu") for r in v.reasons), v.reasons
