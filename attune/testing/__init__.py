"""Test helpers shipped with attune: a fake backend and recipe factories."""
