"""Run outputs: ``result.json``, ``best-recipe.yaml``, ``report.md`` and a throughput plot."""

from attune.report.result import build_result, write_outputs

__all__ = ["build_result", "write_outputs"]
