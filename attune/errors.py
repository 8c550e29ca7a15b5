"""One error root for everything attune raises on purpose.

Trial failures are not errors: they are :class:`attune.trial.TrialOutcome` values.
"""

from __future__ import annotations


class AttuneError(Exception):
    """Root of every error attune raises deliberately; the CLI prints it without a traceback."""


class RecipeError(AttuneError):
    """A recipe (or a change to one) is malformed. ``problems`` holds one line per field."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        self.problems = list(problems or [])
        text = message
        if self.problems:
            text += "\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)


class GateRefusal(AttuneError):
    """The correctness gate refused a change."""


class BackendError(AttuneError):
    """A trial backend could not launch or observe a trial at all (not a trial failure)."""


class PolicyError(AttuneError):
    """A policy was misconfigured or produced something unusable."""


class JournalError(AttuneError):
    """A run directory's journal is missing, corrupt, or belongs to another recipe."""
