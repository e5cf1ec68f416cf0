"""Small builders for core snapshots, so each table row reads like the scenario it is."""

from __future__ import annotations

from typing import Any

from proxy.core.types import (
    CallSpec,
    Candidate,
    Circuit,
    ModelDemand,
    ProviderHealth,
    ProviderView,
    Resident,
    Snapshot,
    Ticket,
)

NOW = 1_000.0
GIB32, GIB24, GIB16 = 32605, 24563, 16376
SIZES = {"qwen3:32b": 27000, "qwen3:14b": 12224, "qwen3:8b": 6000, "phi3:mini": 3600,
         "llama3.2:3b": 3100}


def gpu(name: str, total: int | None = GIB24, residents: tuple[str, ...] = (), *,
        ctx: int = 0, parallel: int = 1, ready: bool = True, weight: float = 100.0,
        resident_ctx: int = 0, max_loaded: int = 0, **extra: Any) -> ProviderView:
    """A card on which every model of SIZES was seen at that size (no architecture known, so
    the figure holds at any context)."""
    extra.setdefault("observed", {m: {0: mib} for m, mib in SIZES.items()})
    return ProviderView(
        name=name, total_vram_mib=total, ready=ready,
        residents=tuple(Resident(m, SIZES[m], resident_ctx) for m in residents),
        context_length=ctx, max_parallel=parallel, max_loaded=max_loaded, weight=weight,
        **extra,
    )


_ids = iter(range(1, 10**9))


def ticket(provider: str, model: str, *, elapsed: float = 0.0, cold: bool = False,
           evicts: dict[str, int] | None = None, ttl: float = 60.0) -> Ticket:
    started = NOW - elapsed
    return Ticket(f"t{next(_ids)}", provider, model, SIZES[model] if cold else 512, started,
                  started + ttl, cold=cold, evicts=evicts or {})


def snapshot(*providers: ProviderView, tickets: tuple[Ticket, ...] = (),
             demand: dict[str, ModelDemand] | None = None,
             latency: dict[str, float] | None = None,
             circuits: dict[str, Circuit] | None = None, **extra: Any) -> Snapshot:
    health = {}
    for p in providers:
        health[p.name] = ProviderHealth(
            circuit=(circuits or {}).get(p.name, Circuit.CLOSED),
            latency_ema_s=(latency or {}).get(p.name))
    return Snapshot(now=NOW, providers=providers, tickets=tickets, demand=demand or {},
                    health=health, **extra)


def call(*models: str | tuple[str, float], tokens: int = 100, tolerance: float = 10,
         phase: str = "mulling", **extra: Any) -> CallSpec:
    candidates = tuple(Candidate(m) if isinstance(m, str) else Candidate(m[0], m[1])
                       for m in models)
    return CallSpec(candidates, prompt_tokens=tokens, tolerance=tolerance,
                    phase=phase, **extra)  # type: ignore[arg-type]
