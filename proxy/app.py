"""Composition root: the only place that picks concrete adapters and wires them together."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI

from proxy import __version__
from proxy.adapters.dcgm import DcgmExporter
from proxy.adapters.memory_kv import MemoryStore
from proxy.adapters.nats_bus import NatsBus
from proxy.adapters.nats_kv import NatsOptions, NatsStore
from proxy.adapters.ollama import OllamaClient
from proxy.api.cors import OllamaCors
from proxy.api.errors import install_error_shapes
from proxy.api.hosts import AllowedHosts, loopback_listener
from proxy.api.kubemoot import KubemootApi
from proxy.api.routes import SidecarApi
from proxy.api.status import StatusApi
from proxy.core.fleet import FleetFigures, fleet_figures
from proxy.core.models import CallModels, normalise_model
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import Candidate
from proxy.observability.fleet import FleetCollector
from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.observability.recent import RecentCalls
from proxy.ports import (
    SIDECAR_BUCKETS,
    SYSTEM_CLOCK,
    Clock,
    GpuMemoryGauge,
    StateStore,
    StoreUnavailable,
    Timeouts,
)
from proxy.service.bindings import Bindings
from proxy.service.calls import CallService
from proxy.service.claims import Claims
from proxy.service.demand import DemandBoard
from proxy.service.evictions import Evictions
from proxy.service.experience import Experience
from proxy.service.fleet_calls import CallExchange
from proxy.service.plans import PlanBook, PlanLimits
from proxy.service.prober import PROBE_TIMEOUT_S, Prober
from proxy.service.routing import ProviderPool
from proxy.service.scheduler import PlacementSettings, Scheduler
from proxy.service.snapshot import StateView
from proxy.service.tickets import TicketBook
from proxy.settings import Settings

log = get_logger("kubemoot.app")
# How long a starting sidecar waits for the shared state's replay to read what it says of
# the models before its first probe asks the cards (a replay takes milliseconds).
START_REPLAY_WAIT_S = 2.0


def nats_options(settings: Settings) -> NatsOptions:
    assert settings.nats_url is not None
    return NatsOptions(settings.nats_url, settings.nats_creds, settings.nats_user,
                       settings.nats_password, settings.nats_token, settings.nats_tls_ca,
                       settings.nats_tls_cert, settings.nats_tls_key)


def build_store(settings: Settings, clock: Clock = SYSTEM_CLOCK) -> StateStore:
    if settings.nats_url:
        return NatsStore(nats_options(settings), SIDECAR_BUCKETS,
                         replicas=settings.nats_replicas)
    return MemoryStore(SIDECAR_BUCKETS, clock=clock)


def placement_settings(settings: Settings) -> PlacementSettings:
    mulling = tuple(Candidate(normalise_model(c.model), c.score, c.vram_mib)
                    for c in settings.model_candidates_mulling)
    if not mulling and settings.model_model:
        mulling = (Candidate(normalise_model(settings.model_model)),)
    preferred = normalise_model(settings.model_model) if settings.model_model else None
    return PlacementSettings(CallModels(mulling, settings.triage_model, preferred),
                             settings.tolerance,
                             settings.wait_limit_seconds, tuple(settings.providers))


@dataclass
class Services:
    """The placement service, wired: what the API calls, and what starts and stops with it."""

    settings: Settings
    store: StateStore
    pool: ProviderPool
    metrics: Metrics
    prober: Prober
    tickets: TicketBook
    local_tickets: TicketBook  # tickets while the shared store is unreachable
    view: StateView
    demand: DemandBoard
    claims: Claims
    evictions: Evictions
    experience: Experience
    scheduler: Scheduler
    plans: PlanBook
    calls: CallService
    figures: Callable[[], FleetFigures]  # the fleet now, as the metrics and status page show it
    _probing: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def shared(self) -> bool:
        return self.settings.nats_url is not None

    def to_probe(self) -> list[str]:
        """Embedded: always probe. Shared: only providers nobody published fresh state for."""
        settings = self.settings
        now = self.scheduler.clock.now()
        names = self.view.stale_providers(now) if self.shared else \
            [c.name for c in settings.providers]
        for config in settings.providers:
            state = self.view.provider_state(config.name, now)
            age = now - state.last_probed_at if state else settings.state_stale_seconds
            self.metrics.state_age_seconds.labels(config.name).set(age)
        return names

    async def start(self) -> None:
        try:
            await self.store.start()
        except StoreUnavailable as exc:
            log.warning("shared state unavailable; only loaded copies serve calls, no load or "
                        "unload until NATS answers", error=str(exc))
        if self.settings.providers:
            await self._learn_published_models()
            await self.prober.round()
        self._probing = asyncio.create_task(
            self.prober.run(self.settings.probe_interval_seconds, self.to_probe))
        self.plans.start()
        self.claims.start()

    async def _learn_published_models(self) -> None:
        """In shared mode, what the published states say of each provider's models (their
        /api/show figures), so that the first probe asks /api/show only of models nobody
        described: a pod that starts (or rolls) beside many others probes each card's
        /api/ps, /api/tags and /api/version (what is loaded now), not every model again."""
        if not self.shared or not await self.store.replayed(START_REPLAY_WAIT_S):
            return
        now = self.scheduler.clock.now()
        for config in self.settings.providers:
            state = self.view.provider_state(config.name, now)
            if state is not None:
                self.prober.described(config.name, state.models)

    async def close(self) -> None:
        probing, self._probing = self._probing, None
        if probing is not None:
            probing.cancel()
        await self.plans.close()
        await self.claims.close()
        await self.evictions.close()
        if probing is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await probing
        await self.demand.close()
        await self.tickets.close()  # releases not yet written go out now
        await self.local_tickets.close()
        await self.store.close()
        await self.pool.close()


def build_services(settings: Settings, store: StateStore, pool: ProviderPool, *,
                   gpu_memory: GpuMemoryGauge, clock: Clock = SYSTEM_CLOCK) -> Services:
    """Every service of the sidecar over the given store and model servers, on one clock."""
    metrics = Metrics()
    local_store = MemoryStore(clock=clock)  # tickets while the shared store is unreachable
    local_store.changes = store.changes  # its claims and releases wake waiting calls too
    policy = DEFAULT_POLICY
    prober = Prober(settings.providers, pool.clients, store, gpu_memory=gpu_memory,
                    clock=clock)
    tickets = TicketBook(store, policy, settings.ticket_ttl_seconds, clock=clock)
    view = StateView(store, settings.providers, prober.latest, settings.state_stale_seconds,
                     tickets)
    local_tickets = TicketBook(local_store, policy, settings.ticket_ttl_seconds, clock=clock)
    holder, crew = f"{settings.namespace}/{settings.agent_name}", settings.crew or ""
    demand = DemandBoard(store, holder, clock, crew=crew)
    claims = Claims(tickets=tickets, local_tickets=local_tickets, view=view,
                    providers=tuple(settings.providers), prober=prober, metrics=metrics,
                    holder=holder, clock=clock, crew=crew)
    evictions = Evictions(clients=pool.clients, claims=claims, view=view,
                          providers=tuple(settings.providers), metrics=metrics, clock=clock)
    experience = Experience(pool.clients)
    scheduler = Scheduler(settings=placement_settings(settings), pool=pool,
                          changes=store.changes, view=view, demand=demand, claims=claims,
                          evictions=evictions, experience=experience, metrics=metrics,
                          policy=policy, clock=clock)
    scheduler.bindings = Bindings(store, settings.namespace, settings.agent_name,
                                  scheduler.settings.models, settings.tolerance,
                                  shared=settings.nats_url is not None, clock=clock)
    plans = PlanBook(scheduler, PlanLimits(settings.max_plans, settings.plan_memory_share),
                     clock=clock)
    calls = CallService(scheduler=scheduler, plans=plans, claims=claims, evictions=evictions,
                        experience=experience, demand=demand, prober=prober, metrics=metrics,
                        recent=RecentCalls())
    metrics.nats_connected.set_function(lambda: 1.0 if store.connected else 0.0)  # at scrape

    def figures() -> FleetFigures:
        return fleet_figures(scheduler.snapshot(clock.now()), policy)

    metrics.registry.register(FleetCollector(figures))
    return Services(settings, store, pool, metrics, prober, tickets, local_tickets, view,
                    demand, claims, evictions, experience, scheduler, plans, calls, figures)


def newest_version(prober: Prober) -> str | None:
    """The Ollama version the most recent probe that got one heard."""
    heard = [s for s in prober.latest.values() if s.version]
    return max(heard, key=lambda s: s.last_probed_at).version if heard else None


def build_app(settings: Settings, store: StateStore | None = None,
              clock: Clock = SYSTEM_CLOCK) -> FastAPI:
    timeouts = Timeouts(settings.connect_timeout_seconds, settings.first_byte_timeout_seconds,
                        settings.chunk_timeout_seconds, settings.answer_timeout_seconds)
    pool = ProviderPool(settings.providers, settings.model_endpoint, settings.triage_endpoint,
                        lambda endpoint: OllamaClient(endpoint, timeouts))
    services = build_services(settings, store or build_store(settings, clock), pool,
                              gpu_memory=DcgmExporter(PROBE_TIMEOUT_S), clock=clock)
    scheduler, metrics, shared = services.scheduler, services.metrics, services.shared
    sidecar = f"{settings.namespace}/{settings.agent_name}"
    exchange = None  # NATS mode: the status page shows every sidecar's calls
    if isinstance(services.store, NatsStore):
        bus = NatsBus()
        services.store.on_connect.append(bus.attach)
        exchange = CallExchange(bus, services.calls.recent, sidecar, clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await services.start()
        if exchange is not None:
            await exchange.start()
        try:
            yield
        finally:
            if exchange is not None:
                await exchange.close()
            await services.close()

    app = FastAPI(title="kubemoot-proxy", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    if loopback_listener(settings.listen_host_port[0]):  # inside CORS, as in Ollama
        app.add_middleware(AllowedHosts)
    app.add_middleware(OllamaCors, extra_origins=settings.origins)
    api = SidecarApi(calls=services.calls, pool=pool,
                     holders=scheduler.providers_with, unreachable=scheduler.unreachable,
                     unload=scheduler.unload_everywhere, metrics=metrics,
                     max_request_bytes=settings.max_request_bytes,
                     chunk_timeout_s=settings.chunk_timeout_seconds,
                     default_can_wait=settings.role != "coordinator",
                     readiness=scheduler.ready,
                     prompt_tokens=services.experience.learning.prompt_tokens,
                     probed_version=lambda: newest_version(services.prober),
                     probed_versions=lambda: [scheduler.provider_view(name).version
                                              for name in scheduler.providers],
                     shared_state=lambda: "embedded" if not shared else
                     "connected" if services.store.connected else "unavailable")
    api.mount(app)
    app.state.api = api
    KubemootApi(scheduler, services.plans, services.view, services.demand,
                settings.max_request_bytes, settings.role != "coordinator").mount(app)
    status = StatusApi(services.figures, services.store.changes, services.calls.recent,
                       sidecar, lambda: "shared" if shared else "embedded", exchange)
    status.mount(app)
    app.state.status = status
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.scheduler = scheduler
    return app


def build_ops_app(main: FastAPI) -> FastAPI:
    """The operations listener: probes, scrapes and the status page, never the inference
    API, so the sidecar's API can stay on loopback while kubelet and Prometheus reach the
    pod IP."""
    api: SidecarApi = main.state.api
    ops = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    ops.router.add_route("/healthz", api.healthz, methods=["GET"])
    ops.router.add_route("/readyz", api.readyz, methods=["GET"])
    ops.router.add_route("/metrics", api.prometheus, methods=["GET"])
    main.state.status.mount(ops)  # the status page, read-only like the scrape
    install_error_shapes(ops)
    return ops
