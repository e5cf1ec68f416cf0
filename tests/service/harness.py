"""A sidecar's placement service over fake model servers, on the virtual clock, and a relay
small enough to read: it sends each attempt the service places and reports how it ended,
as proxy/api/relay.py does for a complete (not streamed) answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.adapters.memory_kv import MemoryStore
from proxy.api.errors import REFUSAL_STATUS
from proxy.app import Services, build_services
from proxy.core.engine_errors import SERVER_BUSY, prompt_too_long
from proxy.core.tokens import PromptSize
from proxy.core.types import Circuit, Ticket
from proxy.ports import SIDECAR_BUCKETS, UpstreamError
from proxy.service.routing import Attempt, CallOutcome, CallRequest, ProviderPool, Refusal
from proxy.settings import load_settings
from tests.service.fakes import Answer, FakeModelServer, LoopClock, gpu


@dataclass
class Answered:
    """How a call ended: answered (200), failed (502), or refused (the refusal's reason)."""

    status: int
    attempts: list[Attempt]
    refusal: Refusal | None = None
    error: str | None = None

    @property
    def last(self) -> Attempt:
        return self.attempts[-1]

    @property
    def provider(self) -> str:
        return self.last.provider

    @property
    def placement(self) -> str:
        return self.last.placement

    @property
    def reason(self) -> str | None:
        return self.refusal.reason if self.refusal else None


class NoGauge:
    async def total_mib(self, url: str, gpus: int = 1) -> int | None:
        return None


@dataclass
class Sidecar:
    services: Services
    servers: dict[str, FakeModelServer]
    clock: LoopClock
    background: set[asyncio.Task[Answered]] = field(default_factory=set)

    async def chat(self, model: str | None, *, prompt_chars: int = 100,
                   thread: str | None = None, can_wait: bool = True,
                   num_ctx: int | None = None, num_predict: int = 0,
                   client_gone: asyncio.Event | None = None, phase: str = "mulling",
                   stream: bool = False, keep_alive_0: bool = False,
                   keep_alive_s: float | None = None) -> Answered:
        """One /api/chat call, relayed to its end (`stream`: its answer's beginning told to
        the service, as the relay tells a stream's; `keep_alive_0`: sent asking Ollama to
        unload the model after it; `keep_alive_s`: the keep-alive it sets, in seconds)."""
        disconnected = client_gone.wait if client_gone is not None else None
        call = CallRequest("/api/chat", model, phase, thread=thread, can_wait=can_wait,
                           prompt=PromptSize(prompt_chars), num_ctx=num_ctx,
                           num_predict=num_predict, disconnected=disconnected,
                           unloads_after=keep_alive_0, keep_alive_s=keep_alive_s)
        calls = self.services.calls
        attempts = calls.attempts(call, time.perf_counter(), calls.cloud_attempt(call))
        placed = await attempts.first()
        tried: list[Attempt] = []
        while not isinstance(placed, Refusal):
            tried.append(placed)
            outcome, final = await send(placed, call, attempts.answering if stream else None)
            if final:
                await attempts.settle(outcome)
                return Answered(200 if outcome.healthy else 502, tried, error=outcome.error)
            another = await attempts.again(outcome)
            if another is None:
                return Answered(502, tried, error=outcome.error)
            placed = another
        return Answered(_status(placed), tried, placed, placed.message)

    def start_chat(self, model: str, **kwargs: Any) -> asyncio.Task[Answered]:
        """A call running in the background (await the task for its answer)."""
        task = asyncio.create_task(self.chat(model, **kwargs))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    async def plan(self, thread: str, model: str, prompt_chars: int | None = 100
                   ) -> dict[str, Any]:
        return await self.services.plans.create(thread, "mulling", model, prompt_chars)

    def tickets(self) -> list[Ticket]:
        """The live tickets, as the sidecar's state shows them."""
        now = self.clock.now()
        return [t for s in self.services.settings.providers
                for t in self.services.view.ticket_set(s.name, now).tickets.values()]

    def circuit(self, provider: str) -> Circuit:
        return self.services.experience.health(self.clock.now())[provider].circuit

    def decisions(self) -> float:
        """How many placement decisions were made so far."""
        registry = self.services.metrics.registry
        return registry.get_sample_value("kubemoot_decision_seconds_count") or 0.0

    def residents(self, provider: str) -> list[str]:
        """The models the sidecar counts loaded on `provider`."""
        return sorted(r.model for r in self.services.scheduler.provider_view(provider).residents)


async def send(attempt: Attempt, call: CallRequest,
               answering: Callable[[], None] | None = None) -> tuple[CallOutcome, bool]:
    """Send one attempt; how it ended, and whether that is the call's end (True) or a failure
    before its answer began that the service may place again (False)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    payload: dict[str, Any] = {"model": attempt.model, "prompt_chars": call.prompt.chars}
    if attempt.num_ctx:
        payload["options"] = {"num_ctx": attempt.num_ctx}
    try:
        upstream = await attempt.client.open(call.path, orjson.dumps(payload))
    except UpstreamError as exc:
        return CallOutcome(False, loop.time() - started, error=str(exc), began=False), False
    if answering is not None and upstream.status_code < 400:
        answering()
    try:
        data = await upstream.read()
    except UpstreamError as exc:  # the answer broke off
        return CallOutcome(False, loop.time() - started, error=str(exc)), True
    seconds = loop.time() - started
    answer = orjson.loads(data)
    if upstream.status_code >= 500:
        message = str(answer.get("error"))
        healthy = upstream.status_code == 503 and SERVER_BUSY in message
        return CallOutcome(healthy, seconds, error=message, began=False), False
    if upstream.status_code == 400:
        counted = prompt_too_long(str(answer.get("error")))
        if counted is not None:
            at_least = max(counted, attempt.context_length)
            return CallOutcome(True, seconds, at_least, error="prompt longer than the context",
                               prompt_too_long=True), False
    generating = answer.get("eval_duration")
    return CallOutcome(True, seconds, answer.get("prompt_eval_count"),
                       answer.get("load_duration", 0) / 1e9,
                       answer_tokens=answer.get("eval_count"),
                       answer_seconds=None if generating is None else generating / 1e9), True


def _status(refusal: Refusal) -> int:
    return REFUSAL_STATUS[refusal.reason]


class Fleet:
    """GPUs (fake model servers) and the sidecars placing calls on them."""

    def __init__(self) -> None:
        self.clock = LoopClock()
        self.servers: dict[str, FakeModelServer] = {}
        self.static: dict[str, FakeModelServer] = {}  # endpoints that are no provider
        self.sidecars: list[Sidecar] = []

    def gpu(self, name: str, **config: Any) -> FakeModelServer:
        server = self.servers[name] = gpu(name, **config)
        return server

    def static_endpoint(self, name: str, **config: Any) -> FakeModelServer:
        """A server calls that cannot wait go to (KUBEMOOT_MODEL_ENDPOINT)."""
        server = self.static[name] = gpu(name, **config)
        return server

    async def sidecar(self, store: MemoryStore | None = None, **settings: Any) -> Sidecar:
        """A sidecar over every GPU so far, with embedded state (`store`: one other sidecars
        share), started (probed once)."""
        loop = asyncio.get_running_loop()
        if not getattr(loop, "looptime_on", False):
            raise RuntimeError("service tests run on the virtual clock: the looptime plugin "
                               "must be installed (pip install -e '.[dev]')")
        by_endpoint = {s.endpoint: s for s in (*self.servers.values(), *self.static.values())}
        settings.setdefault("providers", [s.config.provider_entry(s.endpoint)
                                          for s in self.servers.values()])
        config = load_settings(**settings)
        pool = ProviderPool(config.providers, config.model_endpoint, config.triage_endpoint,
                            lambda endpoint: by_endpoint[endpoint])
        store = store or MemoryStore(SIDECAR_BUCKETS, clock=self.clock)  # as the app has it
        services = build_services(config, store, pool, gpu_memory=NoGauge(), clock=self.clock)
        await services.start()
        sidecar = Sidecar(services, self.servers, self.clock)
        self.sidecars.append(sidecar)
        return sidecar

    async def close(self) -> None:
        for sidecar in self.sidecars:
            for task in sidecar.background:
                task.cancel()
            await sidecar.services.close()


async def two_cards_one_busy(fleet: Fleet) -> tuple[Sidecar, asyncio.Task[Answered],
                                                     FakeModelServer, FakeModelServer]:
    """Two 24 GiB cards with qwen3:8b warm, one slot each, and a 20 s call on one of them:
    (the sidecar, that call, the card left free, the busy one)."""
    a = fleet.gpu("a", total_vram_mib=24564, context_length=4096)
    b = fleet.gpu("b", total_vram_mib=24564, context_length=4096)
    for card in (a, b):
        card.preload("qwen3:8b")
        card.script(Answer(seconds=20))
    sidecar = await fleet.sidecar()
    busy = sidecar.start_chat("qwen3:8b")
    await asyncio.sleep(1)
    free, other = (b, a) if a.stats.calls else (a, b)
    return sidecar, busy, free, other
