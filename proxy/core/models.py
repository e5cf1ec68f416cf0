"""Model names as Ollama spells them, and which models an agent's calls may run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core.types import Candidate


def model_name(entry: Mapping[str, Any]) -> str:
    """The model of an /api/tags or /api/ps entry (`model`, or `name` on older servers)."""
    return str(entry.get("model") or entry.get("name"))


def normalise_model(name: str) -> str:
    """Ollama's `name[:tag]`, the tag defaulting to `latest`, as /api/ps reports it."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


@dataclass(frozen=True)
class CallModels:
    """Which models an agent's calls may run: its mulling candidates (best first, as the
    operator ranked them) and the model its triage calls are bound to."""

    mulling: tuple[Candidate, ...] = ()
    triage_model: str | None = None

    def for_call(self, phase: str, model: str | None) -> tuple[Candidate, ...] | None:
        """The candidates of one call, the model it names first; None when it names none
        and none is configured."""
        if phase == "triage":
            bound = model or self.triage_model
            return (Candidate(normalise_model(bound)),) if bound else None
        if model is None:
            return self.mulling or None
        wanted = normalise_model(model)
        mine = next((c for c in self.mulling if c.model == wanted), None)
        if mine is None:
            return (Candidate(wanted),)
        return (mine, *(c for c in self.mulling if c.model != wanted))


def full_model_name(name: str) -> str:
    """Ollama's full name of a model, as its capability errors spell it (types/model/name.go
    ParseName and Name.String: host `registry.ollama.ai`, namespace `library` and tag
    `latest` filled in): "qwen3:8b" is "registry.ollama.ai/library/qwen3:8b"."""
    parts = normalise_model(name).split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    if len(parts) == 2:
        parts = ["registry.ollama.ai", *parts]
    return "/".join(parts)
