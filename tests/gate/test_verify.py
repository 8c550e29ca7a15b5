"""The empirical loss-equivalence check on the reference trainer (real torchrun training).

Preserving changes at a fixed global batch pass; a changed learning rate, a changed global batch and
bf16 autocast on an fp32 contract fail. The failing ones bypass the static gate (``static=False``) to
prove the empirical check catches them on its own.
"""

from __future__ import annotations

import json

import pytest

from attune.backends.local import LocalBackend
from attune.gate.verify import verify
from attune.recipe import parse_recipe
from attune.testing.factories import tiny_recipe_dict

pytestmark = pytest.mark.slow

STEPS = 10


class CachingBackend(LocalBackend):
    """Trains each distinct recipe once per test session (the reference and drift runs are shared)."""

    cache: dict[str, object] = {}

    def loss_curve(self, recipe, request):
        key = recipe.model_dump_json() + str(request.steps)
        if key not in self.cache:
            self.cache[key] = self.run(recipe, request)
        return self.cache[key]


def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(a.get(k, {}), v) if isinstance(v, dict) else v
    return out


BASE = tiny_recipe_dict(micro_batch_size=2)

CASES = {
    "micro_batch_4": ({"knobs": {"micro_batch_size": 4}}, True),
    "threads_2": ({"knobs": {"intra_op_threads": 2}}, True),
    "checkpointing_full": ({"knobs": {"activation_checkpointing": "full"}}, True),
    "data_parallel_2": ({"knobs": {"nproc_per_node": 2}}, True),
    "learning_rate": ({"training": {"optimizer": {"lr": 1.1e-3}}}, False),
    "global_batch": ({"training": {"global_batch_size": 16}}, False),
    "bf16_autocast": ({"training": {"precision": "bf16"}}, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_empirical_check(tmp_path_factory, name):
    delta, expect = CASES[name]
    base = parse_recipe(BASE)
    cand = parse_recipe(merge(base.model_dump(mode="python"), delta))
    res = verify(base, cand, backend=CachingBackend(), steps=STEPS, run_dir=tmp_path_factory.mktemp(name),
                 static=expect is not False)
    eq = res.equivalence
    assert res.passed is expect, res.reason
    if res.first_step is not None:
        # refused before any band was drawn: its first logged loss, before any update, was not the baseline's
        print(f"\n{name}: refused at the first step: {res.first_step}")
        assert not expect and eq is None
        return
    assert eq is not None, res.reason
    print(f"\n{name}: passed={res.passed} max|Δloss|={eq.max_abs_diff:.3g} tolerance≤{res.tolerance_max:.3g}")
    if not expect:
        assert eq.first_failure is not None


def test_static_gate_runs_first_and_costs_nothing(tmp_path):
    base = parse_recipe(BASE)
    cand = merge(base.model_dump(mode="python"), {"training": {"global_batch_size": 16}})
    res = verify(base, cand, backend=CachingBackend(), steps=STEPS, run_dir=tmp_path)
    assert not res.passed and "static gate" in res.reason and res.charged_hours == 0


def test_cli_verify(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from attune.commands.gate import app

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(BASE))
    res = CliRunner().invoke(app, ["verify", str(tmp_path / "r.yaml"), "--set", "micro_batch_size=4",
                                   "--steps", "4", "--json", "--out", str(tmp_path / "runs")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["passed"] is True


def test_the_drift_reference_is_never_the_candidate_itself():
    """micro-batch 2 → 4 is the baseline's own neighbouring split: the drift run must be another one."""
    from attune.gate import equivalent_layout
    from attune.recipe.change import apply_change, signature

    base = parse_recipe(BASE)
    cand = base.with_knobs(micro_batch_size=4)
    plain = equivalent_layout(base)
    assert signature(apply_change(base, plain)) == signature(cand)  # what verify used before: the candidate
    other = equivalent_layout(base, avoid=(signature(cand), signature(base)))
    assert other is not None and signature(apply_change(base, other)) not in (signature(cand), signature(base))


@pytest.mark.parametrize("name, delta", [("global_batch", {"training": {"global_batch_size": 16}}),
                                         ("learning_rate", {"training": {"optimizer": {"lr": 2e-3}}})])
def test_verify_rejects_a_real_change_of_what_is_learned(tmp_path, name, delta):
    """``attune gate verify`` on real CPU trials: a global-batch change and a learning-rate change fail the check
    itself (the static gate bypassed), and the CLI refuses them before training."""
    import yaml
    from typer.testing import CliRunner

    from attune.commands.gate import app

    base = parse_recipe(BASE)
    cand = parse_recipe(merge(base.model_dump(mode="python"), delta))
    res = verify(base, cand, backend=CachingBackend(), steps=STEPS, run_dir=tmp_path / "runs", static=False)
    if name == "global_batch":
        # other samples in the first batch: refused before any band is drawn, by its first logged loss
        assert res.passed is False and res.equivalence is None and "first logged loss" in (res.first_step or ""), res
    else:  # the same first step (no update yet), then another trajectory: refused by the band
        assert res.passed is False and res.first_step is None and res.equivalence is not None \
            and res.equivalence.first_failure is not None, res
    assert res.drift_change and res.drift_change != cand.knob_changes(base.effective_knobs)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(BASE))
    key = "training.global_batch_size=16" if name == "global_batch" else "training.optimizer.lr=2e-3"
    out = CliRunner().invoke(app, ["verify", str(tmp_path / "r.yaml"), "--set", key, "--steps", "4", "--json",
                                   "--out", str(tmp_path / "cli")])
    assert out.exit_code == 1 and json.loads(out.output)["passed"] is False, out.output
