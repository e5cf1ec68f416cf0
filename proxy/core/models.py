"""Model names as Ollama spells them, and which models an agent's calls may run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

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


def not_found(name: str, embedding: bool = False) -> str:
    """Ollama's 404 for a model it does not have, in the words of the handler: generate's and
    chat's own (server/routes.go:289, 2485), the embedding handlers' a scheduling error with
    the name Go-quoted (handleScheduleError, :3107-3116, from :848-851 and :1066-1070;
    v0.12.6 :2259-2268, from scheduleRunner's GetModel, :121-124, at :654 and :779)."""
    if embedding:
        return f"model {orjson.dumps(name).decode()} not found, try pulling it first"
    return f"model '{name}' not found"
