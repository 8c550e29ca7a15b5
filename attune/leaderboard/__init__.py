"""The open-recipes leaderboard: a static site built from recipe cards (``attune leaderboard build``)."""

from attune.leaderboard.site import build_site

__all__ = ["build_site"]
