"""The run driver: the level-triggered loop, its journal, budget and acceptance rules (no framework, no cluster)."""
