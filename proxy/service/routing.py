"""The seam where placement plugs in: a call comes in, a Route (or a Refusal) goes out.

The API layer knows only `Router`; the direct router below (a provider that has the model,
else the static endpoint) is what runs until the scheduler takes over the same seam.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from proxy.adapters.ollama import OllamaClient, Timeouts, UpstreamError
from proxy.settings import ProviderConfig, Settings

STATIC = "static"


@dataclass(frozen=True)
class CallRequest:
    """What the router needs to know about one inference call."""

    path: str
    model: str | None
    phase: str = "mulling"
    thread: str | None = None
    can_wait: bool = True
    prompt_chars: int = 0
    num_ctx: int | None = None


@dataclass(frozen=True)
class CallOutcome:
    ok: bool
    seconds: float
    prompt_eval_count: int | None = None
    load_seconds: float | None = None
    error: str | None = None


@dataclass
class Route:
    """Where a call goes, and what to do when it ends."""

    provider: str
    client: OllamaClient
    model: str
    placement: str
    evicted: tuple[str, ...] = ()
    waited_ms: int = 0
    on_done: Callable[[CallOutcome], Awaitable[None]] | None = None
    extra: dict[str, str] = field(default_factory=dict)

    async def finish(self, outcome: CallOutcome) -> None:
        if self.on_done is not None:
            callback, self.on_done = self.on_done, None  # at most once
            await callback(outcome)


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str
    message: str
    model: str | None = None
    retry_after_s: int | None = None


class Router(Protocol):
    async def route(self, call: CallRequest) -> Route | Refusal: ...


class ProviderPool:
    """One pooled client per configured provider, plus the static endpoints."""

    def __init__(self, settings: Settings) -> None:
        timeouts = Timeouts(settings.connect_timeout_seconds, settings.first_byte_timeout_seconds,
                            settings.chunk_timeout_seconds)
        self.configs: dict[str, ProviderConfig] = {p.name: p for p in settings.providers}
        self.clients: dict[str, OllamaClient] = {
            p.name: OllamaClient(p.endpoint, timeouts) for p in settings.providers
        }
        by_endpoint = {c.endpoint: c for c in self.clients.values()}

        def _static(endpoint: str | None) -> OllamaClient | None:
            if endpoint is None:
                return None
            return by_endpoint.get(endpoint) or OllamaClient(endpoint, timeouts)

        self.static = _static(settings.model_endpoint)
        self.static_triage = _static(settings.triage_endpoint) or self.static
        self.timeouts = timeouts

    def everything(self) -> list[tuple[str, OllamaClient]]:
        """Providers in configured order; the static endpoint when there are none."""
        if self.clients:
            return list(self.clients.items())
        return [(STATIC, self.static)] if self.static is not None else []

    async def close(self) -> None:
        seen: set[int] = set()
        for client in [*self.clients.values(), self.static, self.static_triage]:
            if client is not None and id(client) not in seen:
                seen.add(id(client))
                await client.close()


class ModelCatalog:
    """Which provider has which model on disk (`/api/tags`), refreshed at most every ttl_s."""

    def __init__(self, pool: ProviderPool, ttl_s: float = 5.0) -> None:
        self.pool = pool
        self.ttl_s = ttl_s
        self._models: dict[str, set[str]] = {}
        self._reachable: dict[str, bool] = {}
        self._fetched_at = -1e9
        self._lock = asyncio.Lock()

    async def refresh(self, force: bool = False) -> None:
        async with self._lock:
            if not force and time.monotonic() - self._fetched_at < self.ttl_s:
                return
            names = list(self.pool.clients)
            results = await asyncio.gather(
                *(self.pool.clients[n].get_json("/api/tags", 2.0) for n in names),
                return_exceptions=True)
            for name, result in zip(names, results, strict=True):
                self._reachable[name] = isinstance(result, dict)
                if isinstance(result, dict):
                    self._models[name] = {
                        str(m.get("model") or m.get("name")) for m in result.get("models") or []
                    }
            self._fetched_at = time.monotonic()

    async def providers_with(self, model: str) -> list[str]:
        await self.refresh()
        wanted = {model, f"{model}:latest"} if ":" not in model else {model}
        return [n for n in self.pool.clients
                if self._reachable.get(n) and self._models.get(n, set()) & wanted]

    def any_reachable(self) -> bool:
        return any(self._reachable.values())


class DirectRouter:
    """A configured provider that has the model, else the static endpoint."""

    def __init__(self, pool: ProviderPool, catalog: ModelCatalog, default_model: str | None,
                 triage_model: str | None) -> None:
        self.pool = pool
        self.catalog = catalog
        self.default_model = default_model
        self.triage_model = triage_model

    async def route(self, call: CallRequest) -> Route | Refusal:
        model = call.model or (self.triage_model if call.phase == "triage" else self.default_model)
        if not model:
            return Refusal(400, "bad-request", "field 'model': a model is required "
                           "(none in the request and KUBEMOOT_MODEL_MODEL is not set)")
        try:
            holders = await self.catalog.providers_with(model)
        except UpstreamError:
            holders = []
        if holders:
            return Route(holders[0], self.pool.clients[holders[0]], model, "cold")
        static = self.pool.static_triage if call.phase == "triage" else self.pool.static
        if static is not None:
            return Route(STATIC, static, model, STATIC)
        everything = self.pool.everything()
        if everything:
            # Let the provider answer (an unknown model gets Ollama's own 404).
            name, client = everything[0]
            assert client is not None
            return Route(name, client, model, "cold")
        return Refusal(503, "gpu-busy", "no provider is configured: set KUBEMOOT_PROVIDERS "
                       "or KUBEMOOT_MODEL_ENDPOINT", model, retry_after_s=5)
