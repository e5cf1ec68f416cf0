"""Composition root: the only place that picks concrete adapters and wires them together."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from proxy import __version__
from proxy.api.routes import SidecarApi
from proxy.observability.metrics import Metrics
from proxy.service.routing import DirectRouter, ModelCatalog, ProviderPool
from proxy.settings import Settings


def build_app(settings: Settings) -> FastAPI:
    pool = ProviderPool(settings)
    catalog = ModelCatalog(pool, ttl_s=settings.probe_interval_seconds)
    metrics = Metrics()
    router = DirectRouter(pool, catalog, settings.model_model, settings.triage_model)

    async def ready() -> bool:
        if pool.static is not None:
            return True
        await catalog.refresh()
        return catalog.any_reachable()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await pool.close()

    app = FastAPI(title="kubemoot-proxy", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    SidecarApi(router=router, pool=pool, catalog=catalog, metrics=metrics,
               max_request_bytes=settings.max_request_bytes,
               chunk_timeout_s=settings.chunk_timeout_seconds,
               default_can_wait=settings.role != "coordinator",
               readiness=ready).mount(app)
    app.state.settings = settings
    app.state.metrics = metrics
    return app
