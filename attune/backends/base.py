"""The trial-backend seam: run one configuration and report what happened.

The seam itself (:class:`~attune.trial.TrialBackend`, :class:`~attune.trial.TrialRequest`,
:class:`~attune.trial.TrialResult`) lives in the trial vocabulary, below the engine that calls it; this package holds
the backends (``local`` processes, the ``sim`` simulator) and re-exports the seam for them.
"""

from __future__ import annotations

from attune.trial import TrialBackend, TrialRequest, TrialResult

__all__ = ["TrialBackend", "TrialRequest", "TrialResult"]
