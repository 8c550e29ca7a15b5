"""Issue 39, item 8: the platform's accelerator-hours quota per namespace and period (attune/operator/quota.py): its
parsing, periods, the ledger's counting, the admission rule and the reconciler's hold (fakes; the real control plane
in test_real_quota.py)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from attune.operator import quota
from attune.operator.quota import HoursQuota, Left, Period
from tests.k8s.fakes import FakePorts, conds, drive, records, step, tuning_run

pytestmark = pytest.mark.k8s


def _t(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_quotas_parse_and_refuse_what_they_cannot_read():
    assert quota.parse(["ml=200/month", "*=2.5/week"]) == {"ml": HoursQuota(200, Period.MONTH),
                                                          "*": HoursQuota(2.5, Period.WEEK)}
    for bad in ("ml=200", "ml=200/year", "ML=1/day", "ml=-1/day", "=1/day", "ml"):
        with pytest.raises(ValueError, match="NAMESPACE=HOURS/PERIOD"):
            quota.parse([bad])
    with pytest.raises(ValueError, match="given twice"):
        quota.parse(["ml=1/day", "ml=2/day"])
    quotas = quota.parse(["ml=1/day", "*=3/month"])
    assert quota.quota_for(quotas, "ml") == HoursQuota(1, Period.DAY)
    assert quota.quota_for(quotas, "other") == HoursQuota(3, Period.MONTH)
    assert quota.quota_for(quota.parse(["ml=1/day"]), "other") is None


def test_periods_are_utc_calendar_days_iso_weeks_and_months():
    now = _t("2026-12-31T23:30:00")  # a Thursday
    assert Period.DAY.bounds(now) == ("2026-12-31", _t("2027-01-01T00:00:00"))
    assert Period.WEEK.bounds(now) == ("2026-W53", _t("2027-01-04T00:00:00"))  # ISO week 53 ends on Monday
    assert Period.MONTH.bounds(now) == ("2026-12", _t("2027-01-01T00:00:00"))
    assert Period.MONTH.bounds(_t("2026-02-10T00:00:00")) == ("2026-02", _t("2026-03-01T00:00:00"))


def test_the_ledger_counts_each_record_once_and_starts_again_each_period():
    now = _t("2026-12-07T10:00:00")
    e = quota.add({}, 0.5, "uid/1", Period.MONTH, now)
    assert e == {"period": "2026-12", "hours": 0.5, "counted": ["uid/1"]}
    assert quota.add(e, 0.5, "uid/1", Period.MONTH, now) is None  # a retried write counts nothing twice
    e = quota.add(e, 0.25, "uid/2", Period.MONTH, now)
    assert e is not None and e["hours"] == 0.75
    q = HoursQuota(1, Period.MONTH)
    assert quota.left(q, e, now).hours == pytest.approx(0.25)
    assert quota.left(q, e, _t("2027-01-01T00:00:01")).hours == 1  # a new month
    assert quota.add(e, 0.1, "uid/3", Period.MONTH, _t("2027-01-02T00:00:00"))["hours"] == 0.1
    assert quota.entry_of({"ml": "not json"}, "ml") == {} and quota.entry_of(None, "ml") == {}


def test_a_ledger_write_that_fails_is_owed_and_written_at_the_next_step():
    book = quota.Unledgered()
    written: list[tuple[str, float]] = []
    down = [True]

    def write(key, hours):
        if down[0]:
            raise ConnectionError("the API server is restarting")
        written.append((key, hours))

    err = book.settle("ml", [("uid/1", 0.5), ("uid/2", 0.0)], write)
    assert isinstance(err, ConnectionError) and written == []
    down[0] = False
    assert book.settle("ml", [("uid/3", 0.25)], write) is None
    assert written == [("uid/1", 0.5), ("uid/3", 0.25)]  # in order, nothing charged-free, nothing dropped
    assert book.settle("ml", [], write) is None and written == [("uid/1", 0.5), ("uid/3", 0.25)]


def test_admission_refuses_a_budget_beyond_what_is_left_and_names_the_setting():
    room = Left(HoursQuota(10, Period.MONTH), used=9.5, ends=_t("2027-01-01T00:00:00"))
    assert quota.admission_problem("ml", 0.5, None, room) is None
    said = quota.admission_problem("ml", 2, None, room)
    assert said is not None and "spec.budget.acceleratorHours = 2 exceeds" in said
    assert "namespace ml has 0.5 of its 10 accelerator-hours a month left" in said and "operator.hoursQuotas" in said
    assert quota.admission_problem("ml", 3, 2.8, room) is None  # raised by 0.2: fits
    assert "raised by 1" in (quota.admission_problem("ml", 3, 2, room) or "")
    assert quota.admission_problem("ml", 1, 5, room) is None  # lowered
    assert quota.admission_problem("ml", 100, None, None) is None  # no quota there


def test_a_namespace_that_spent_its_quota_launches_no_new_trial_until_the_period_ends():
    ports = FakePorts()
    run = tuning_run()
    step(run, ports)
    step(run, ports)  # the baseline's trial and job
    ports.finish()
    ports.quota_left = Left(HoursQuota(1, Period.MONTH), used=1.0, ends=ports.t + 86400)
    for _ in range(6):
        step(run, ports)
        ports.finish()
    c = conds(run)
    assert len(records(ports, run)) == 1 and len(ports.jobs_created) == 1  # the trial in flight finished; no more
    assert c["Reconciling"]["status"] == "True" and c["Reconciling"]["reason"] == "HoursQuotaSpent"
    assert c["Stalled"]["status"] == "False" and c["QuotaAvailable"]["status"] == "False"
    assert "namespace ml has 0 of its 1 accelerator-hours a month left" in c["QuotaAvailable"]["message"]
    ports.quota_left = Left(HoursQuota(1, Period.MONTH), used=0.0, ends=ports.t + 86400)  # a new period
    run = drive(run, ports)
    assert run["status"]["phase"] == "Succeeded" and conds(run)["QuotaAvailable"]["status"] == "True"


def test_the_cli_refuses_a_bad_quota_or_one_without_a_ledger_namespace():
    res = subprocess.run([sys.executable, "-m", "attune", "operator", "run", "--hours-quota", "ml=2/year"],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and "NAMESPACE=HOURS/PERIOD" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "-m", "attune", "operator", "run", "--hours-quota", "ml=2/month"],
                         capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert res.returncode == 2 and "--ledger-namespace" in res.stderr and "Traceback" not in res.stderr
