"""In-memory stand-ins for what the placement service talks to: a model server answering
through the ModelServer port, and a clock reading the event loop's (virtual) time.

The model server keeps the simulator's arithmetic (`loadtest.sim_model`: the catalog's
architectures, what a copy takes of the GPU, Ollama's default context), so a fleet here is
the fleet of the end-to-end tests, without HTTP, threads or real time.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from loadtest.sim_engine import MIB, PROMPT_TOO_LONG
from loadtest.sim_model import CATALOG, SimConfig, SimModel, load_seconds
from proxy.adapters.memory_kv import MemoryStore
from proxy.core.engine_errors import SERVER_BUSY
from proxy.ports import (
    SIDECAR_BUCKETS,
    ModelEntry,
    ShowAnswer,
    StoreUnavailable,
    Timeouts,
    UpstreamError,
)

EPOCH = 1_750_000_000.0  # the wall-clock time the virtual clock starts from


class LoopClock:
    """The running event loop's time: virtual under the `looptime` plugin, where sleeps and
    timeouts jump to their deadline as soon as nothing else can run."""

    def __init__(self, epoch: float = EPOCH) -> None:
        self.epoch = epoch

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def now(self) -> float:
        return self.epoch + self.monotonic()


@dataclass(frozen=True)
class Answer:
    """How the server answers one inference call (`open`)."""

    seconds: float = 0.5  # from the call's arrival (after any load) to its answer's end
    status: int = 200
    error: str | None = None  # an error answer's message
    refused: bool = False  # the connection fails: no answer at all
    breaks: bool = False  # the answer begins, then breaks off
    prompt_tokens: int | None = None  # what the engine counts (default: chars / 4)
    answer_tokens: int | None = None  # eval_count, generated over the answer's seconds

    @classmethod
    def failing(cls, status: int = 500, error: str = "simulated upstream failure") -> Answer:
        return cls(seconds=0.0, status=status, error=error)

    @classmethod
    def busy(cls) -> Answer:
        return cls.failing(503, SERVER_BUSY)

    @classmethod
    def too_long(cls) -> Answer:
        return cls(seconds=0.0, status=400, error=PROMPT_TOO_LONG)


@dataclass
class Copy:
    """A model loaded on the GPU."""

    model: SimModel
    num_ctx: int
    mib: int
    calls: int = 0  # answers in progress
    leaving: bool = False  # asked to unload while busy: goes when its last call ends
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: bool = False  # its load's request went before it was ready


@dataclass
class Stats:
    loads: int = 0
    unloads: int = 0
    aborted_loads: int = 0
    calls: list[str] = field(default_factory=list)  # the models of every call, in order
    peak_mib: int = 0  # the most the loaded copies held at once


class FakeModelServer:
    """One GPU's `ollama serve`: the models on disk (the simulator's catalog), the copies
    loaded, and the answers to give, scripted one call at a time (`script`)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.endpoint = f"http://{config.name}.fake:11434"
        self.timeouts = Timeouts()
        self.loaded: dict[str, Copy] = {}
        self.stats = Stats()
        self.reachable = True  # False: every question fails as a refused connection would
        # Ollama unloads one copy at a time and waits for the memory to come back before the
        # next (up to 5 s, server/sched.go:458-466): the gap between two unloads (test control)
        self.unload_gap_s = 0.0
        self._unloader_free_at = 0.0
        self._answers: deque[Answer] = deque()

    # -- test controls ---------------------------------------------------------------------
    def script(self, *answers: Answer) -> None:
        """How the next calls are answered, in order (replacing what was scripted before and
        not used); after them, each call succeeds."""
        self._answers = deque(answers)

    def preload(self, *models: str) -> None:
        """Copies loaded before the sidecar starts (at the server's default context)."""
        for name in models:
            self._put(self._model(name), 0).loaded.set()

    @property
    def used_mib(self) -> int:
        return sum(c.mib for c in self.loaded.values())

    # -- the ModelServer port --------------------------------------------------------------
    async def version(self, timeout_s: float | None = None) -> str | None:
        self._check_reachable()
        return self.config.version

    async def ps(self, timeout_s: float | None = None) -> list[ModelEntry]:
        self._check_reachable()
        return [{**self._describe(c.model), "size": c.mib * MIB, "size_vram": c.mib * MIB,
                 "context_length": c.num_ctx}
                for c in self.loaded.values() if c.loaded.is_set()]

    async def fetch(self, path: str, timeout_s: float | None = None) -> ShowAnswer:
        self._check_reachable()
        return ShowAnswer(404, b"404 page not found")  # (no /api/status before 0.17)

    async def tags(self, timeout_s: float | None = None) -> list[ModelEntry]:
        self._check_reachable()
        return [{**self._describe(m), "size": m.disk_mib * MIB} for m in self.config.models]

    async def show(self, body: dict[str, Any], timeout_s: float | None = None) -> ShowAnswer:
        self._check_reachable()
        model = self.config.model(str(body.get("model")))
        if model is None:
            return ShowAnswer(404, b'{"error":"model not found"}')
        capabilities = ["embedding"] if model.embedding else ["completion", "tools"]
        return ShowAnswer(200, orjson.dumps({
            "details": self._describe(model)["details"], "model_info": model.model_info(),
            "tensors": model.tensors(), "capabilities": capabilities, "parameters": "",
            "modelfile": f"FROM {model.blob_path}\n"}))

    async def load(self, model: str, num_ctx: int = 0, timeout_s: float | None = None,
                   embedding: bool = False) -> None:
        self._check_reachable()
        await self._ready_copy(self._model(model), num_ctx)

    async def unload(self, model: str) -> None:
        """The copy of the model's weights file goes, whatever name loaded it (Ollama runs
        one copy of a file)."""
        self._check_reachable()
        blob = self._model(model).blob_path
        for copy in [c for c in self.loaded.values() if c.model.blob_path == blob]:
            copy.leaving = True
            self._drop_if_idle(copy)

    async def open(self, path: str, payload: bytes) -> FakeResponse:
        self._check_reachable()
        if path == "/api/show":  # the prober's verbose ask (a model with per-layer arrays)
            shown = self.config.model(str(orjson.loads(payload).get("model")))
            return FakeResponse(200, orjson.dumps({"model_info": shown.model_info(True)})) \
                if shown else FakeResponse(404, b'{"error":"model not found"}')
        answer = self._answers.popleft() if self._answers else Answer()
        if answer.refused:
            raise UpstreamError(f"{self.endpoint}: connection refused")
        body = orjson.loads(payload)
        model = self._model(str(body["model"]))
        self.stats.calls.append(model.name)
        if answer.status >= 400:
            await asyncio.sleep(answer.seconds)  # an engine can fail a call late (0: at once)
            return FakeResponse(answer.status, orjson.dumps({"error": answer.error}))
        options = body.get("options") or {}
        loads = model.name not in self.loaded
        started = asyncio.get_running_loop().time()
        copy = await self._ready_copy(model, int(options.get("num_ctx") or 0))
        load_seconds = asyncio.get_running_loop().time() - started if loads else 0.0
        copy.calls += 1
        prompt = answer.prompt_tokens or math.ceil(int(body.get("prompt_chars", 0)) / 4) + 1
        final = {"model": model.name, "done": True, "prompt_eval_count": prompt,
                 "load_duration": int(load_seconds * 1e9)}
        if answer.answer_tokens is not None:
            final |= {"eval_count": answer.answer_tokens,
                      "eval_duration": int(answer.seconds * 1e9)}
        return FakeResponse(200, orjson.dumps(final), answer.seconds, answer.breaks,
                            lambda: self._call_ended(copy))

    async def close(self) -> None:
        return None

    # -- the engine's inside ---------------------------------------------------------------
    def _check_reachable(self) -> None:
        if not self.reachable:
            raise UpstreamError(f"{self.endpoint}: connection refused")

    def _model(self, name: str) -> SimModel:
        model = self.config.model(name)
        if model is None:
            raise UpstreamError(f"model {name!r} not found")
        return model

    def _put(self, model: SimModel, num_ctx: int) -> Copy:
        c = self.config
        ctx = min(num_ctx or c.default_context(), model.trained_ctx)
        mib = model.footprint_mib(ctx, model.slots(c.num_parallel, c.version),
                                  c.cache_type_for(model),
                                  flash_attention=c.flash_attention_for(model))
        copy = self.loaded[model.name] = Copy(model, ctx, mib)
        self.stats.loads += 1
        self.stats.peak_mib = max(self.stats.peak_mib, self.used_mib)
        return copy

    async def _ready_copy(self, model: SimModel, num_ctx: int) -> Copy:
        """The loaded copy, loading it first (in the simulator's load time) if need be. A
        load whose request goes first is aborted (server/sched.go:733-739): the copy goes,
        and the calls that joined it load it again."""
        while True:
            copy = self.loaded.get(model.name)
            if copy is None:
                copy = self._put(model, num_ctx)
                c = self.config  # the weights file, as Ollama (and the simulator) reads it
                try:
                    await asyncio.sleep(load_seconds(c.startup_s, model.disk_mib,
                                                     c.load_mib_per_s))
                except asyncio.CancelledError:
                    self._abort(copy)
                    raise
                copy.loaded.set()
            await copy.loaded.wait()
            if not copy.aborted:
                return copy

    def _abort(self, copy: Copy) -> None:
        copy.aborted = True
        self.stats.aborted_loads += 1
        if self.loaded.get(copy.model.name) is copy:
            del self.loaded[copy.model.name]
        copy.loaded.set()  # (those that joined it load it again)

    def _call_ended(self, copy: Copy) -> None:
        copy.calls -= 1
        self._drop_if_idle(copy)

    def _drop_if_idle(self, copy: Copy) -> None:
        if copy.leaving and copy.calls == 0 and self.loaded.get(copy.model.name) is copy:
            if not self.unload_gap_s:
                self._drop(copy)
                return
            loop = asyncio.get_running_loop()
            at = max(loop.time(), self._unloader_free_at)
            self._unloader_free_at = at + self.unload_gap_s
            loop.call_at(at, self._drop, copy)

    def _drop(self, copy: Copy) -> None:
        if self.loaded.get(copy.model.name) is copy:
            del self.loaded[copy.model.name]
            self.stats.unloads += 1

    @staticmethod
    def _describe(model: SimModel) -> dict[str, Any]:
        return {"name": model.name, "model": model.name, "digest": f"sha256:{model.name}",
                "details": {"family": model.model_family,
                            "parameter_size": model.parameter_size,
                            "quantization_level": model.quantization}}


class FakeResponse:
    """An answer whose head is in; its body arrives `seconds` later (or breaks off then)."""

    content_type = "application/json"

    def __init__(self, status_code: int, body: bytes, seconds: float = 0.0,
                 breaks: bool = False, on_end: Any = None) -> None:
        self.status_code = status_code
        self._body = body
        self._seconds = seconds
        self._breaks = breaks
        self._on_end = on_end

    async def read(self) -> bytes:
        try:
            await asyncio.sleep(self._seconds)
            if self._breaks:
                raise UpstreamError("connection reset mid-answer", before_first_byte=False)
            return self._body
        finally:
            await self.aclose()

    async def chunks(self) -> AsyncIterator[bytes]:
        yield await self.read()

    async def aclose(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()


def gpu(name: str, **config: Any) -> FakeModelServer:
    """A GPU as the end-to-end tests' `sim_factory` makes one: the whole catalog on disk."""
    config.setdefault("models", CATALOG)
    return FakeModelServer(SimConfig(name=name, **config))


class RoundTripStore(MemoryStore):
    """The embedded store with a round trip on every write, as NATS JetStream's have: the
    next decision runs before a claim's write returns."""

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        await asyncio.sleep(0.005)
        return await super().cas(bucket, key, value, last_revision)

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        await asyncio.sleep(0.005)
        return await super().put(bucket, key, value)


class SlowStore(MemoryStore):
    """The embedded store whose writes take `delay_s` each (0 until set): a NATS server on
    an overloaded machine, or one timing out."""

    delay_s = 0.0

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        await asyncio.sleep(self.delay_s)
        return await super().cas(bucket, key, value, last_revision)

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        await asyncio.sleep(self.delay_s)
        return await super().put(bucket, key, value)


class AwayStore(MemoryStore):
    """The embedded store, unreachable while `away` (until `back()`); while `failing`, still
    connected as far as the client knows, yet every write fails: the first moments of an
    outage, before the connection is seen lost."""

    def __init__(self, clock: LoopClock) -> None:
        super().__init__(SIDECAR_BUCKETS, clock=clock)
        self.away = False
        self.failing = False

    @property
    def connected(self) -> bool:
        return not self.away

    def back(self) -> None:
        self.away = False
        self.changes.bump()

    def _reachable(self) -> None:
        if self.away:
            raise StoreUnavailable("NATS is not connected")
        if self.failing:
            raise StoreUnavailable("nats: timeout")

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        self._reachable()
        return await super().put(bucket, key, value)

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        self._reachable()
        return await super().cas(bucket, key, value, last_revision)
