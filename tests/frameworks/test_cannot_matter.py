"""No kept change without a mechanism (issue 19): each framework says when a move cannot change a recipe's
throughput; such a move is never run, and a kept change that is one is flagged in every report."""

from __future__ import annotations

from attune.engine.loop import TuneConfig, Tuner
from attune.engine.policy import Policy, PolicyContext, Stop
from attune.policies import make_policy
from attune.recipe.change import Change, signature
from attune.report.result import build_result
from attune.testing.factories import tiny_recipe
from attune.testing.fakes import FakeBackend
from attune.trial import Measurement, TrialOutcome, TrialRecord
from tests.frameworks.hf.helpers import POOR
from tests.frameworks.hf.helpers import recipe as hf_recipe


def measured(**kw) -> Measurement:
    base = dict(tokens_per_s_per_device=100.0, tokens_per_s=100.0, step_time_median_s=1.0, step_time_cv=0.01,
                steps_measured=4)
    base.update(kw)
    return Measurement(**base)


def test_hf_ddp_settings_cannot_matter_on_one_process_or_when_every_gradient_fits_one_bucket(tmp_path):
    one = hf_recipe(POOR, tmp_path, devices_per_node=2)  # POOR runs one process
    fw = one.framework_impl
    why = fw.cannot_matter(one, one.with_knobs(ddp_bucket_cap_mb=50), None)
    assert why and "one process" in why
    two = one.with_knobs(nproc_per_node=2)
    assert fw.cannot_matter(two, two.with_knobs(ddp_bucket_cap_mb=50), None) is None  # DDP buckets exist: may matter
    small = measured(reported={"trainable_parameters": 984_192})  # 3.8 MB of fp32 gradients: one bucket either way
    assert "fit in one bucket" in fw.cannot_matter(two, two.with_knobs(ddp_bucket_cap_mb=50), small)
    big = measured(reported={"trainable_parameters": 124_000_000})
    assert fw.cannot_matter(two, two.with_knobs(ddp_bucket_cap_mb=50), big) is None
    # a change that also moves something that can matter is not moot
    assert fw.cannot_matter(one, one.with_knobs(nproc_per_node=2, ddp_bucket_cap_mb=50), None) is None


def test_reference_trainer_data_workers_cannot_matter_when_loading_takes_no_time():
    r = tiny_recipe(nproc_per_node=2)
    fw = r.framework_impl
    idle = measured(phases={"data": 0.001, "forward": 0.5, "backward": 0.499})
    busy = measured(phases={"data": 0.3, "forward": 0.4, "backward": 0.3})
    assert "0.10% of a step" in fw.cannot_matter(r, r.with_knobs(dataloader_workers=2), idle)
    assert fw.cannot_matter(r, r.with_knobs(dataloader_workers=2), busy) is None
    assert fw.cannot_matter(r, r.with_knobs(dataloader_workers=2), None) is None  # no evidence: it may matter
    solo = tiny_recipe(nproc_per_node=1)
    assert "one process" in fw.cannot_matter(solo, solo.with_knobs(ddp_bucket_cap_mb=50), None)


def test_deepspeed_and_megatron_communication_settings_cannot_matter_without_peers(tmp_path):
    from tests.frameworks.deepspeed.helpers import POOR as DS_POOR
    from tests.frameworks.deepspeed.helpers import POOR_CONFIG, write
    from tests.frameworks.deepspeed.helpers import recipe as ds_recipe

    ds = ds_recipe(DS_POOR, write(tmp_path, "ds_config.json", POOR_CONFIG))  # one process, ZeRO stage 3
    fw = ds.framework_impl
    assert "nothing to reduce" in fw.cannot_matter(ds, ds.with_knobs(**{"zero_optimization.reduce_bucket_size":
                                                                        500_000_000}), None)
    two = ds.with_knobs(nproc_per_node=2)
    assert fw.cannot_matter(two, two.with_knobs(**{"zero_optimization.reduce_bucket_size": 500_000_000}), None) is None

    from attune.bench.suite import load_suite

    mg = load_suite("suite")[0].recipe  # llama3.2-1b on 8 H100: TP 2, data-parallel 4
    flipped = mg.with_knobs(overlap_grad_reduce=not mg.knob("overlap_grad_reduce"))
    assert mg.framework_impl.cannot_matter(mg, flipped, None) is None
    dp1 = mg.with_knobs(tensor_model_parallel_size=8)  # TP 8 on 8 GPUs: one replica, nothing to reduce across
    flipped = dp1.with_knobs(overlap_grad_reduce=not dp1.knob("overlap_grad_reduce"))
    assert "data-parallel size 1" in dp1.framework_impl.cannot_matter(dp1, flipped, None)


class Proposes(Policy):
    name = "scripted"

    def __init__(self, *changes: dict) -> None:
        self.changes = list(changes)

    def propose(self, ctx: PolicyContext):
        return Change(set=self.changes.pop(0), source=self.name) if self.changes else Stop("done")


def test_a_move_that_cannot_matter_is_never_run_and_costs_nothing(tmp_path):
    r = tiny_recipe(nproc_per_node=1, micro_batch_size=1)
    backend = FakeBackend()
    cfg = TuneConfig.from_recipe(r, 5.0, search_space=("ddp_bucket_cap_mb", "micro_batch_size"))
    state = Tuner(r, backend=backend, policy=Proposes({"ddp_bucket_cap_mb": 50}), config=cfg,
                  run_dir=tmp_path / "run").run()
    moot = [x for x in state.records if x.change == {"ddp_bucket_cap_mb": 50}]
    assert len(moot) == 1 and moot[0].outcome is TrialOutcome.REFUSED and moot[0].charged_hours == 0
    assert "cannot matter" in moot[0].decision and "one process" in moot[0].message
    assert all(x.knob("ddp_bucket_cap_mb") != 50 for x in backend.launches)
    # and the shipped playbook does not propose it at all
    cfg = TuneConfig.from_recipe(r, 5.0, search_space=("ddp_bucket_cap_mb",))
    state = Tuner(r, backend=FakeBackend(), policy=make_policy("playbook"), config=cfg, run_dir=tmp_path / "pb").run()
    assert not [x for x in state.records if x.kind == "candidate"], [(x.change, x.decision) for x in state.records]


def test_a_kept_change_without_a_mechanism_is_flagged_in_the_result_and_the_report(tmp_path):
    """A journal from before this check (or a framework that learned the reason later) kept ddp_bucket_cap_mb=50
    on a one-process job: the result and both reports say it had no mechanism."""
    from attune.engine.loop import RunState
    from attune.report import write_outputs

    r = tiny_recipe(nproc_per_node=1)
    kept = r.with_knobs(ddp_bucket_cap_mb=50)
    state = RunState(baseline=r, config=TuneConfig.from_recipe(r, 1.0))
    for i in (1, 2):
        state.records.append(TrialRecord(id=i, kind="baseline", outcome=TrialOutcome.SUCCEEDED, knobs=r.effective_knobs,
                                         signature=signature(r), measurement=measured(), charged_hours=0.01))
    state.records.append(TrialRecord(id=3, kind="confirm", outcome=TrialOutcome.SUCCEEDED, accepted=True,
                                     change={"ddp_bucket_cap_mb": 50}, knobs=kept.effective_knobs,
                                     signature=signature(kept), measurement=measured(tokens_per_s_per_device=150.0),
                                     charged_hours=0.01, decision="accepted: +50.0 %"))
    result = build_result(state)
    assert "one process" in result["kept_without_mechanism"]["ddp_bucket_cap_mb"]
    paths = write_outputs(state, tmp_path / "run")
    assert "kept without a mechanism" in paths["report"].read_text().lower()
    assert 'id="kept-without-mechanism"' in paths["html"].read_text()


def test_hf_loss_checks_know_the_print_resolution_of_the_trainers_log(tmp_path):
    """transformers 5 prints losses with four significant digits: a loss near 10 is shown to ±5e-3, so a loss check
    on those numbers cannot see a drift of 1e-4 and must say so (issue 19)."""
    r = hf_recipe(POOR, tmp_path)
    fw = r.framework_impl
    assert fw.loss_resolution(r, 10.3457) == 5e-3 and fw.loss_resolution(r, 2.1) == 5e-4
    old = hf_recipe(POOR, tmp_path, framework_version="4.46.0")
    assert fw.loss_resolution(old, 10.3457) == 5e-5  # 4.x rounds to four decimals
    assert tiny_recipe().framework_impl.loss_resolution(tiny_recipe(), 10.3457) is None  # full precision (JSON)
