"""The placement core's vocabulary: frozen snapshots in, decisions out. Standard library only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal


@dataclass(frozen=True, slots=True)
class Resident:
    """A model loaded on a provider, as `/api/ps` reports it."""

    model: str
    footprint_mib: int
    context_length: int = 0  # 0: unknown (an old Ollama)
    last_used_at: float = 0.0
    expires_at: float = math.inf  # when Ollama's keep-alive unloads it if idle; inf: unknown
    leaving: bool = False  # asked to unload: never joined or loaded again until seen gone


@dataclass(frozen=True, slots=True)
class ProviderView:
    """One GPU (one Ollama) as the placement sees it."""

    name: str
    total_vram_mib: int | None  # None: never published, proves nothing
    ready: bool = True
    residents: tuple[Resident, ...] = ()
    context_length: int = 0  # configured per-slot context (OLLAMA_CONTEXT_LENGTH); 0 unknown
    max_parallel: int = 1
    # OLLAMA_MAX_LOADED_MODELS: beyond it Ollama unloads a model itself, even mid-work, to
    # load another. 0: no limit.
    max_loaded: int = 0
    weight: float = 100.0  # the policy's provider weight (phase-aware)
    disk_mib: Mapping[str, int] = field(default_factory=dict)  # on-disk sizes from /api/tags
    # Each on-disk model's trained context (/api/show): Ollama caps a slot's context at it.
    trained_context: Mapping[str, int] = field(default_factory=dict)
    probed_at: float = 0.0  # when the residents were last observed


@dataclass(frozen=True, slots=True)
class Ticket:
    """An active VRAM claim on a provider."""

    ticket_id: str
    provider: str
    model: str
    footprint_mib: int
    started_at: float
    expires_at: float
    cold: bool = False  # claimed to load the model (full occupancy), not to share a copy
    evicts: Mapping[str, int] = field(default_factory=dict)  # planned victims: model -> MiB
    holder: str = ""


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """What the demand board says about one model."""

    waiters: int = 0
    intents: int = 0
    recent_use: float = 0.0
    predicted: float = 0.0
    last_used_at: float = 0.0

    @property
    def expected_reloads(self) -> float:
        return self.waiters + self.intents + 0.5 * (self.recent_use + self.predicted)


class Circuit(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class ProviderHealth:
    circuit: Circuit = Circuit.CLOSED
    latency_ema_s: float | None = None  # per-endpoint EMA of call duration
    success_rate: float | None = None  # None until enough samples


@dataclass(frozen=True, slots=True)
class Candidate:
    model: str
    score: float = 0.0
    vram_mib: int | None = None  # declared occupancy


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One call to place."""

    candidates: tuple[Candidate, ...]  # preferred first
    prompt_tokens: int = 0
    min_context: int = 0  # the client's num_ctx, a requirement rather than a reload trigger
    tolerance: float = 10.0
    phase: Literal["mulling", "triage"] = "mulling"

    @property
    def preferred(self) -> Candidate:
        return self.candidates[0]

    @property
    def needed_context(self) -> int:
        return max(self.prompt_tokens, self.min_context)


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    providers: tuple[ProviderView, ...]
    tickets: tuple[Ticket, ...] = ()
    demand: Mapping[str, ModelDemand] = field(default_factory=dict)
    health: Mapping[str, ProviderHealth] = field(default_factory=dict)
    observed_footprints: Mapping[str, int] = field(default_factory=dict)  # first seen, any GPU
    load_mib_per_s: float | None = None  # learned from load_duration; None: the policy default


PlacementKind = Literal["warm", "loading", "cold", "queued", "evict"]
Outcome = Literal["placed", "wait", "model-too-large", "prompt-too-large", "model-not-found"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One provider's answer for one model: feasible or why not, and the cost terms."""

    provider: str
    model: str
    feasible: bool
    reason: str
    terms: Mapping[str, float] = field(default_factory=dict)

    @property
    def cost_s(self) -> float:
        return sum(self.terms.values())


@dataclass(frozen=True, slots=True)
class Placement:
    provider: str
    model: str
    kind: PlacementKind
    step: int  # which CallPlanner step won (1-5)
    footprint_mib: int  # what the ticket claims
    cost_s: float = 0.0
    evicts: Mapping[str, int] = field(default_factory=dict)
    context_length: int = 0  # the context the call will get (0 unknown)


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    placement: Placement | None
    reason: str
    verdicts: tuple[Verdict, ...] = ()
    queue_option_s: float | None = None
    unload_option_s: float | None = None
