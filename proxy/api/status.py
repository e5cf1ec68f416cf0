"""The status page and its live feed: `GET /kubemoot/ui` (one self-contained HTML page) and
`GET /kubemoot/v1/events` (server-sent events, one whole view each time the fleet's state or
its calls move). Nothing is computed, and in NATS mode nothing asked of other sidecars,
unless a page is connected."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from functools import cache
from importlib.resources import files
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from proxy.core.fleet import FleetFigures, GpuFigures
from proxy.observability.recent import RECENT, CallRecord, RecentCalls, RefusalRecord
from proxy.ports import ChangeCounter
from proxy.service.fleet_calls import CallExchange, FleetCalls

EVENTS_PATH = "/kubemoot/v1/events"
MIN_INTERVAL_S = 0.25  # at most four views a second, however fast the state moves
HEARTBEAT_S = 15.0  # a comment line, so proxies and the browser keep an idle stream open


@cache
def page() -> bytes:
    return files("proxy.api").joinpath("ui.html").read_bytes()


def gpu_json(gpu: GpuFigures) -> dict[str, Any]:
    free = None if gpu.usable_mib is None else \
        max(0, gpu.usable_mib - gpu.resident_mib - gpu.claimed_mib)
    return {"name": gpu.provider, "ready": gpu.ready, "totalMiB": gpu.total_mib,
            "usableMiB": gpu.usable_mib, "reserveMiB": gpu.reserve_mib,
            "residentMiB": gpu.resident_mib, "claimedMiB": gpu.claimed_mib,
            "scratchMiB": gpu.scratch_mib, "freeMiB": free,
            "copies": [{"model": c.model, "state": c.state, "mib": c.mib} for c in gpu.copies],
            "calls": gpu.calls, "parallel": gpu.parallel, "circuit": gpu.circuit.value,
            "stateAge_s": round(gpu.state_age_s, 1)}


def call_json(sidecar: str, c: CallRecord) -> dict[str, Any]:
    return {"at": c.at, "sidecar": sidecar, "model": c.model, "provider": c.provider,
            "placement": c.placement, "evicted": list(c.evicted), "waitedMs": c.waited_ms,
            "seconds": c.seconds, "ok": c.ok, "error": c.error}


def refusal_json(sidecar: str, r: RefusalRecord) -> dict[str, Any]:
    return {"at": r.at, "sidecar": sidecar, "model": r.model, "reason": r.reason,
            "message": r.message}


def view_json(fleet: FleetFigures, recent: RecentCalls, sidecar: str, state: str,
              others: FleetCalls | None = None) -> dict[str, Any]:
    """Everything the page shows, newest calls first: this sidecar's and, in NATS mode,
    those the others sent (the newest RECENT of each kind across all)."""
    calls = [(sidecar, c) for c in recent.calls]
    refusals = [(sidecar, r) for r in recent.refusals]
    sidecars = {sidecar}
    if others is not None:
        calls += others.calls.values()
        refusals += others.refusals.values()
        sidecars.update(name for name, _ in others.heard.values())
    calls.sort(key=lambda pair: pair[1].at, reverse=True)
    refusals.sort(key=lambda pair: pair[1].at, reverse=True)
    return {
        "sidecar": sidecar, "state": state, "at": time.time(),
        "sidecars": sorted(sidecars),
        "gpus": [gpu_json(g) for g in fleet.gpus],
        "models": [{"model": m.model, "waiters": m.waiters, "intents": m.intents,
                    "recentUse": round(m.recent_use, 2)} for m in fleet.demand],
        "calls": [call_json(*pair) for pair in calls[:RECENT]],
        "refusals": [refusal_json(*pair) for pair in refusals[:RECENT]],
    }


class StatusApi:
    def __init__(self, figures: Callable[[], FleetFigures], changes: ChangeCounter,
                 recent: RecentCalls, sidecar: str, state: Callable[[], str],
                 exchange: CallExchange | None = None) -> None:
        self.figures = figures
        self.exchange = exchange  # NATS mode: the other sidecars' calls, while watched
        self.changes = changes
        self.recent = recent
        self.sidecar = sidecar
        self.state = state
        self.watchers = 0  # event streams open now

    def mount(self, app: FastAPI) -> None:
        app.router.add_route("/kubemoot/ui", self.ui, methods=["GET"])
        app.router.add_route(EVENTS_PATH, self.events, methods=["GET"])

    async def ui(self, request: Request) -> Response:
        return Response(page(), media_type="text/html; charset=utf-8",
                        headers={"cache-control": "no-cache"})

    async def events(self, request: Request) -> StreamingResponse:
        return StreamingResponse(self.stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache",
                                          "x-accel-buffering": "no"})

    def view(self, others: FleetCalls | None) -> bytes:
        data = view_json(self.figures(), self.recent, self.sidecar, self.state(), others)
        return b"event: view\ndata: " + orjson.dumps(data) + b"\n\n"

    async def stream(self) -> AsyncIterator[bytes]:
        """A view at once, then one whenever something moved (at most one per
        MIN_INTERVAL_S), and a heartbeat when nothing did. Ends when the client leaves:
        Starlette cancels the response, and with it this generator."""
        self.watchers += 1
        others = self.exchange.watch() if self.exchange is not None else None
        try:
            yield b"retry: 2000\n\n"
            while True:
                seen = (self.changes.value, self.recent.version,
                        others.version if others is not None else 0)
                yield self.view(others)
                await asyncio.sleep(MIN_INTERVAL_S)
                while not await self._moved(seen, others, HEARTBEAT_S):
                    yield b": heartbeat\n\n"
        finally:
            self.watchers -= 1
            if self.exchange is not None:
                self.exchange.unwatch()

    async def _moved(self, seen: tuple[int, int, int], others: FleetCalls | None,
                     timeout_s: float) -> bool:
        """Whether the state, this sidecar's calls or the others' moved past what was seen,
        within `timeout_s`."""
        state = asyncio.ensure_future(self.changes.wait_past(seen[0], timeout_s))
        calls = [asyncio.ensure_future(self.recent.wait_past(seen[1]))]
        if others is not None:
            calls.append(asyncio.ensure_future(others.wait_past(seen[2])))
        try:
            await asyncio.wait((state, *calls), return_when=asyncio.FIRST_COMPLETED)
            return any(c.done() for c in calls) or (state.done() and state.result())
        finally:
            state.cancel()
            for waiting in calls:
                waiting.cancel()
