"""What a TuningRun's conditions say, as named data: how a run ended, and why a run at work waits.

**How it ended** (:class:`RunOutcome`): ``status.outcome``, the reason of ``Ready`` (and of ``Stalled`` when the run
failed) and of ``Tuned``. ``Succeeded`` alone said nothing of whether a gain was shown.

**Why it waits** (:data:`HOLDS`): kstatus readers (Flux; the chart's ``AttuneRunStalled`` alert) read ``Stalled=True``
as failed, so a hold that clears by itself (Prometheus unreachable, an API discovery 503, a job creation the API
refused for now) keeps ``Stalled=False`` and shows on ``Reconciling=True`` with its reason; only a hold that needs
someone to change something (a missing Secret, a Kueue queue that does not exist) is ``Stalled=True``.

The README's table of reasons is checked against these (``tests/k8s/test_outcomes.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class RunOutcome(str, Enum):
    """How a finished run ended (``status.outcome``; the reason on ``Ready``, ``Tuned`` and, when it failed,
    ``Stalled``)."""

    GAIN_CERTIFIED = "GainCertified"
    GAIN_NOT_CERTIFIED = "GainNotCertified"
    NO_GAIN_SHOWN = "NoGainShown"
    STOPPED_WAITING = "StoppedWaiting"
    NO_SAMPLES = "NoSamples"
    NO_BASELINE = "NoBaseline"
    FAILED = "Failed"

    @property
    def doc(self) -> str:
        return _OUTCOME_DOCS[self]


_OUTCOME_DOCS = {
    RunOutcome.GAIN_CERTIFIED: "Succeeded: the tuned recipe's speedup is certified (its 95 % interval lies above 1)",
    RunOutcome.GAIN_NOT_CERTIFIED: "Succeeded: a faster recipe was found, but no interleaved baseline/best pair "
                                   "ran to certify it (maxTrials or the budget left no room): its speedup is the "
                                   "search's own estimate",
    RunOutcome.NO_GAIN_SHOWN: "Succeeded: no change was shown faster (the tuned recipe is the baseline's, or the "
                              "certification's interval reaches 1)",
    RunOutcome.STOPPED_WAITING: "a trial's pods did not run within pendingDeadlineSeconds: the run stopped with what "
                                "it had (Succeeded with a baseline, else Failed)",
    RunOutcome.NO_SAMPLES: "trials in a row ran but Prometheus held too few of their steps: the run stopped with what "
                           "it had (Succeeded with a baseline, else Failed)",
    RunOutcome.NO_BASELINE: "Failed: the baseline never ran to a measurement",
    RunOutcome.FAILED: "Failed for the reason on Stalled (a configuration error, a refused job kind, ...)",
}


@dataclass(frozen=True)
class Hold:
    """Why a run at work cannot progress right now."""

    reason: str  #: the condition reason (on Reconciling, or on Stalled)
    clears: bool  #: True: it clears without anyone's change (Reconciling=True); False: someone must act (Stalled)
    doc: str  #: what it means and what clears it


HOLDS: dict[str, Hold] = {h.reason: h for h in (
    Hold("DiscoveryUnavailable", True, "API discovery of the job kind did not answer (an aggregated API's 503): "
                                       "asked again at each step"),
    Hold("PrometheusUnreachable", True, "the trial's steps could not be read from Prometheus: read again at each "
                                        "step, nothing recorded or charged on a guess"),
    Hold("JobRefused", True, "the API refused the trial's job for now (not a configuration error: a webhook timeout, "
                             "a conflict): tried again, and the trial fails after three refusals"),
    Hold("TrialCreateRefused", True, "the API refused to create the next TuningTrial: tried again, and the run fails "
                                     "after three refusals"),
    Hold("QuotaExceeded", True, "a ResourceQuota refused the next TuningTrial or job: waited out (not charged) until "
                                "the quota frees up, or pendingDeadlineSeconds"),
    Hold("HoursQuotaSpent", True, "the namespace spent the platform's accelerator-hours quota for the period "
                                  "(--hours-quota, operator.hoursQuotas): no new trial until the period ends"),
    Hold("PodLogAPIError", True, "the API failed to list the trial's pods or read its log: read again at each step"),
    Hold("SecretNotFound", False, "a Secret spec.metrics.prometheus names is missing: create it"),
    Hold("PodLogForbidden", False, "the operator may not list the trial's pods or read their log: grant it (the "
                                   "chart's rules do)"),
    Hold("PodLogUnauthorized", False, "the API did not accept the operator's credentials for the trial's pods"),
    Hold("PodLogBadRequest", False, "the API refused the pod log request (the container name?): fix the template"),
    Hold("KueueInadmissible", False, "Kueue cannot admit the trial's job: its LocalQueue or ClusterQueue does not "
                                     "exist or is stopped (Kueue's own message): create or start it, or fix the "
                                     "queue name"),
)}


def hold(reason: str) -> Hold:
    """The hold named ``reason`` (a KeyError names a reason missing from :data:`HOLDS`: add it there, and to the
    README's table)."""
    return HOLDS[reason]
