"""Recipe cards: one reviewable file per verified recipe (``attune card``), checked against its run's result."""

from attune.cards.model import SCHEMA_VERSION, Card, json_schema

__all__ = ["SCHEMA_VERSION", "Card", "json_schema"]
