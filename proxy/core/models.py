"""Model names as Ollama spells them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def model_name(entry: Mapping[str, Any]) -> str:
    """The model of an /api/tags or /api/ps entry (`model`, or `name` on older servers)."""
    return str(entry.get("model") or entry.get("name"))


def normalise_model(name: str) -> str:
    """Ollama's `name[:tag]`, the tag defaulting to `latest`, as /api/ps reports it."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"
