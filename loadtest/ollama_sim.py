"""A faithful Ollama simulator: one simulated GPU per HTTP server on loopback.

It speaks Ollama's wire formats (OLLAMA-API.md) and models what matters to a scheduler:
VRAM, load time proportional to size, OLLAMA_NUM_PARALLEL slots with queueing beyond them,
the per-slot context with Ollama's *silent* front truncation, keep-alive expiry, and
num_ctx reloads. Loading a model that does not fit is an out-of-memory event, never
silently accepted. `/_sim/*` reports counters and injects faults.

    python -m loadtest.ollama_sim --fleet demo           # three GPUs on 127.0.0.1:11501..11503
    python -m loadtest.ollama_sim --port 11501 --vram 24564 --parallel 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from loadtest import sim_dialects
from loadtest.serving import ThreadedServer
from loadtest.sim_model import (
    CATALOG,
    MIB,
    PromptTokens,
    SimConfig,
    SimModel,
    demo_fleet,
    fit_to_context,
    parse_keep_alive,
    tokens_for_text,
)

log = logging.getLogger("ollama_sim")  # loads, unloads and evictions, when asked for
WORDS = ("the", "answer", "is", "forty", "two", "and", "that", "settles", "it", "for", "now")


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status,
                    media_type="application/json; charset=utf-8")


async def _client_gone(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(message: str, status: int) -> Response:
    return _json({"error": message}, status)


class SimError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Runner:
    """A loaded (or loading) model, like Ollama's runnerRef."""

    model: SimModel
    ctx: int
    footprint_mib: int
    slots: asyncio.Semaphore
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    refcount: int = 0
    keep_alive_s: float = 300.0
    expires_at: float = math.inf  # time.time() seconds
    unload_requested: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Fault:
    mode: str = "none"  # none | error | midstream | stall | slow_first_byte
    count: int = 0  # how many more requests it hits; -1 forever
    status: int = 500
    after_chunks: int = 2
    delay_s: float = 0.0


@dataclass
class Stats:
    requests: int = 0
    loads: int = 0
    unloads: int = 0
    reloads: int = 0
    self_evictions: int = 0
    oom_events: int = 0
    truncations: int = 0
    peak_vram_mib: int = 0
    max_prompt_tokens: int = 0
    inference_requests: int = 0
    abandoned: int = 0  # complete answers whose client left first (generation stopped)
    requests_by_model: dict[str, int] = field(default_factory=dict)


class OllamaSim:
    """State and behaviour of one simulated `ollama serve` (one GPU)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.runners: dict[str, Runner] = {}
        self.stats = Stats()
        self.fault = Fault()
        self._lock = asyncio.Lock()

    # -- time ------------------------------------------------------------------------------
    async def _sleep(self, seconds: float) -> None:
        scaled = seconds * self.config.time_scale
        if scaled > 0:
            await asyncio.sleep(scaled)

    # -- memory ----------------------------------------------------------------------------
    def used_vram_mib(self) -> int:
        return sum(r.footprint_mib for r in self.runners.values())

    def _expire_idle(self) -> None:
        now = time.time()
        for name, runner in list(self.runners.items()):
            if runner.refcount == 0 and runner.loaded.is_set() and runner.expires_at <= now:
                self._drop(name, "keep-alive expiry")

    def _drop(self, name: str, why: str = "unload") -> None:
        if self.runners.pop(name, None) is not None:
            self.stats.unloads += 1
            log.info("%s %s: %s (%d MiB in use)", self.config.name, why, name,
                     self.used_vram_mib())

    def _make_room(self, need_mib: int) -> None:
        total = self.config.total_vram_mib
        if need_mib > total:
            self.stats.oom_events += 1
            raise SimError(
                f"model requires more system memory ({need_mib} MiB) than is available "
                f"({total} MiB)", 500)
        self._keep_count()
        if self.used_vram_mib() + need_mib <= total:
            return
        if self.config.evict_idle_on_pressure:
            # Ollama's findRunnerToUnload: idle runners by keep-alive duration, then name.
            idle = sorted(
                (r for r in self.runners.values() if r.refcount == 0 and r.loaded.is_set()),
                key=lambda r: (r.keep_alive_s, r.model.name),
            )
            for runner in idle:
                if self.used_vram_mib() + need_mib <= total:
                    break
                self._drop(runner.model.name, f"self-eviction for {need_mib} MiB")
                self.stats.self_evictions += 1
        if self.used_vram_mib() + need_mib > total:
            self.stats.oom_events += 1
            raise SimError(
                f"model requires more system memory ({need_mib} MiB) than is available "
                f"({total - self.used_vram_mib()} MiB)", 500)

    def _keep_count(self) -> None:
        """Ollama's count limit: at OLLAMA_MAX_LOADED_MODELS it unloads one runner before
        loading another, the idle one it sorts first, else a busy one as soon as its calls
        end (the load does not wait here; Ollama's would)."""
        limit = self.config.max_loaded_models
        staying = [r for r in self.runners.values() if not r.unload_requested]
        if limit <= 0 or len(staying) < limit:
            return
        idle = sorted((r for r in staying if r.refcount == 0 and r.loaded.is_set()),
                      key=lambda r: (r.keep_alive_s, r.model.name))
        if idle:
            self._drop(idle[0].model.name, f"self-eviction: {limit} models loaded")
        else:
            victim = min(staying, key=lambda r: (r.keep_alive_s, r.model.name))
            victim.unload_requested = True  # unloaded by _release when its last call ends
            log.info("%s self-eviction of busy %s: %d models loaded", self.config.name,
                     victim.model.name, limit)
        self.stats.self_evictions += 1

    def _context_for(self, model: SimModel, options: dict[str, Any]) -> int:
        requested = options.get("num_ctx")
        ctx = int(requested) if isinstance(requested, int | float) and requested > 0 else 0
        ctx = ctx or self.config.default_context()
        return max(4, min(ctx, model.trained_ctx))

    async def acquire(self, model: SimModel, options: dict[str, Any], keep_alive_s: float
                      ) -> tuple[Runner, float]:
        """The loaded runner for `model` (loading it if needed) and the load seconds spent."""
        started = time.perf_counter()
        ctx = self._context_for(model, options)
        while True:
            async with self._lock:
                self._expire_idle()
                runner = self.runners.get(model.name)
                stale: Runner | None = None
                if runner is not None and runner.ctx != ctx:
                    # num_ctx differs from the loaded runner: Ollama unloads and reloads.
                    if not runner.unload_requested:
                        self.stats.reloads += 1
                    if runner.refcount == 0 and runner.loaded.is_set():
                        self._drop(model.name, "num_ctx reload")
                        runner = None
                    else:
                        runner.unload_requested = True
                        stale = runner
                if stale is None:
                    loader = runner is None
                    if runner is None:
                        runner = self._start_load(model, ctx, keep_alive_s)
                    runner.refcount += 1
                    runner.idle.clear()
                    break
            # A reload waits for the old runner's in-flight requests to finish.
            await stale.idle.wait()
        if loader:
            try:
                await self._sleep(runner.footprint_mib / self.config.load_mib_per_s)
            except BaseException:
                self._release(runner)
                self.runners.pop(model.name, None)
                raise
            runner.loaded.set()
        else:
            await runner.loaded.wait()
        runner.keep_alive_s = keep_alive_s  # last writer wins, as in Ollama
        return runner, time.perf_counter() - started

    def _start_load(self, model: SimModel, ctx: int, keep_alive_s: float) -> Runner:
        footprint = model.footprint_mib(ctx, self.config.num_parallel)
        self._make_room(footprint)
        runner = Runner(model=model, ctx=ctx, footprint_mib=footprint,
                        slots=asyncio.Semaphore(self.config.num_parallel),
                        keep_alive_s=keep_alive_s)
        self.runners[model.name] = runner
        self.stats.loads += 1
        log.info("%s load: %s (%d MiB in use)", self.config.name, model.name,
                 self.used_vram_mib())
        self.stats.peak_vram_mib = max(self.stats.peak_vram_mib, self.used_vram_mib())
        return runner

    def _release(self, runner: Runner) -> None:
        runner.refcount -= 1
        if runner.refcount == 0:
            runner.idle.set()
            if runner.unload_requested or runner.keep_alive_s <= 0:
                if self.runners.get(runner.model.name) is runner:
                    self._drop(runner.model.name)
            else:
                runner.expires_at = time.time() + runner.keep_alive_s * self.config.time_scale

    def request_unload(self, model: SimModel) -> None:
        runner = self.runners.get(model.name)
        if runner is None:
            return
        if runner.refcount == 0 and runner.loaded.is_set():
            self._drop(model.name)
        else:
            runner.unload_requested = True

    # -- prompts ---------------------------------------------------------------------------
    def chat_prompt(self, body: dict[str, Any]) -> PromptTokens:
        cpt = self.config.chars_per_token
        prompt = PromptTokens()
        for msg in body.get("messages") or []:
            text = str(msg.get("content") or "")
            calls = msg.get("tool_calls")
            if calls:
                text += orjson.dumps(calls).decode()
            images = msg.get("images") or []
            prompt.messages.append(tokens_for_text(text, cpt) + 4
                                   + self.config.image_tokens * len(images))
            prompt.system_flags.append(msg.get("role") == "system")
        tools = body.get("tools")
        if tools:
            prompt.fixed += tokens_for_text(orjson.dumps(tools).decode(), cpt)
        return prompt

    def generate_prompt(self, body: dict[str, Any]) -> PromptTokens:
        cpt = self.config.chars_per_token
        prompt = PromptTokens()
        context = body.get("context")
        if isinstance(context, list) and context:  # an earlier answer's tokens, put first
            prompt.messages.append(len(context))
            prompt.system_flags.append(False)
        for key in ("system", "prompt"):
            text = body.get(key)
            if text:
                prompt.messages.append(tokens_for_text(str(text), cpt) + 4)
                prompt.system_flags.append(key == "system")
        return prompt

    # -- fault injection -------------------------------------------------------------------
    def take_fault(self) -> Fault | None:
        fault = self.fault
        if fault.mode == "none" or fault.count == 0:
            return None
        if fault.count > 0:
            fault.count -= 1
        return Fault(fault.mode, 1, fault.status, fault.after_chunks, fault.delay_s)

    # -- ps / tags / show ------------------------------------------------------------------
    def ps(self) -> dict[str, Any]:
        self._expire_idle()
        models = []
        now = time.time()
        for runner in self.runners.values():  # loading ones too, as Ollama lists them
            if runner.refcount > 0 or runner.expires_at == math.inf:
                remaining = runner.keep_alive_s * self.config.time_scale
            else:
                remaining = runner.expires_at - now
            remaining = min(remaining, 292 * 365 * 86400.0)
            expires = datetime.now(UTC) + timedelta(seconds=remaining)
            size = runner.footprint_mib * MIB
            models.append({
                **self._describe(runner.model),
                "expires_at": expires.isoformat().replace("+00:00", "Z"),
                "size": size,
                "size_vram": size,
                "context_length": runner.ctx,
            })
        models.sort(key=lambda m: m["expires_at"], reverse=True)
        return {"models": models}

    def _describe(self, model: SimModel) -> dict[str, Any]:
        return {
            "name": model.name,
            "model": model.name,
            "digest": hashlib.sha256(model.name.encode()).hexdigest(),
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": model.family,
                "families": [model.family],
                "parameter_size": model.parameter_size,
                "quantization_level": model.quantization,
            },
        }

    def tags(self) -> dict[str, Any]:
        return {"models": [
            {**self._describe(m), "modified_at": "2026-01-01T00:00:00Z", "size": m.disk_mib * MIB}
            for m in self.config.models
        ]}

    def show(self, model: SimModel) -> dict[str, Any]:
        arch = model.family
        return {
            "modelfile": f"FROM {model.name}\n",
            "parameters": "stop \"<|im_end|>\"",
            "template": "{{ .Prompt }}",
            "details": self._describe(model)["details"],
            "model_info": {
                "general.architecture": arch,
                "general.parameter_count": int(float(model.parameter_size.rstrip("B")) * 1e9),
                f"{arch}.context_length": model.trained_ctx,
                f"{arch}.block_count": 40,
            },
            "capabilities": ["completion", "tools"],
            "modified_at": "2026-01-01T00:00:00Z",
        }


class SimApp:
    """HTTP routes over an OllamaSim."""

    def __init__(self, sim: OllamaSim) -> None:
        self.sim = sim
        self.app = Starlette(routes=[
            Route("/", self.root, methods=["GET", "HEAD"]),
            Route("/api/version", self.version, methods=["GET", "HEAD"]),
            Route("/api/tags", self.tags, methods=["GET", "HEAD"]),
            Route("/api/ps", self.ps, methods=["GET"]),
            Route("/api/show", self.show, methods=["POST"]),
            Route("/api/chat", self.chat, methods=["POST"]),
            Route("/api/generate", self.generate, methods=["POST"]),
            *(Route(path, self.dialect, methods=["POST"]) for path in (
                sim_dialects.CHAT, sim_dialects.COMPLETIONS, sim_dialects.RESPONSES,
                sim_dialects.MESSAGES)),
            Route("/v1/embeddings", self.openai_embed, methods=["POST"]),
            Route("/api/embed", self.embed, methods=["POST"]),
            Route("/api/embeddings", self.embed, methods=["POST"]),
            Route("/_sim/stats", self.stats, methods=["GET"]),
            Route("/_sim/fault", self.set_fault, methods=["POST"]),
            Route("/_sim/reset", self.reset, methods=["POST"]),
        ])

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def version(self, request: Request) -> Response:
        return _json({"version": self.sim.config.version})

    async def tags(self, request: Request) -> Response:
        return _json(self.sim.tags())

    async def ps(self, request: Request) -> Response:
        return _json(self.sim.ps())

    async def show(self, request: Request) -> Response:
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        name = body.get("model") or body.get("name")
        if not name:
            return _error("model is required", 400)
        model = self.sim.config.model(str(name))
        if model is None:
            return _error(f"model '{name}' not found", 404)
        return _json(self.sim.show(model))

    async def stats(self, request: Request) -> Response:
        s = self.sim.stats
        return _json({
            **s.__dict__,
            "vram_mib": self.sim.used_vram_mib(),
            "loaded": sorted(self.sim.runners),
            "fault": self.sim.fault.__dict__,
        })

    async def set_fault(self, request: Request) -> Response:
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        self.sim.fault = Fault(**{k: v for k, v in body.items() if k in Fault.__dataclass_fields__})
        return _json({"fault": self.sim.fault.__dict__})

    async def reset(self, request: Request) -> Response:
        self.sim.runners.clear()
        self.sim.stats = Stats()
        self.sim.fault = Fault()
        return _json({"reset": True})

    async def _body(self, request: Request) -> dict[str, Any] | Response:
        raw = await request.body()
        if not raw:
            return _error("missing request body", 400)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _error("invalid character in request body", 400)
        if not isinstance(body, dict):
            return _error("cannot unmarshal request body into object", 400)
        return body

    async def chat(self, request: Request) -> Response:
        return await self._infer(request, chat=True)

    async def generate(self, request: Request) -> Response:
        return await self._infer(request, chat=False)

    async def embed(self, request: Request) -> Response:
        """/api/embed (`input`: text or texts) and the legacy /api/embeddings (`prompt`)."""
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        legacy = request.url.path.endswith("embeddings")
        answer = await self._embed(body, body.get("prompt") if legacy else body.get("input"))
        if isinstance(answer, Response) or not legacy:
            return answer if isinstance(answer, Response) else _json(answer)
        vectors = answer["embeddings"]
        return _json({"embedding": vectors[0] if vectors else []})

    async def _embed(self, body: dict[str, Any], texts: Any) -> dict[str, Any] | Response:
        name = str(body.get("model") or "")
        model = self.sim.config.model(name)
        if model is None:
            return _error(f"model '{name}' not found", 404)
        texts = [texts] if isinstance(texts, str) else list(texts or [])
        self.sim.stats.requests += 1
        self.sim.stats.inference_requests += 1
        started = time.perf_counter()
        runner, load_s = await self.sim.acquire(model, body.get("options") or {},
                                                self.sim.config.keep_alive_s)
        try:
            tokens = 0
            vectors = []
            for text in texts:
                count = tokens_for_text(str(text), self.sim.config.chars_per_token)
                if count > runner.ctx:
                    self.sim.stats.truncations += 1  # Ollama cuts embedding inputs silently too
                    count = runner.ctx
                tokens += count
                digest = hashlib.sha256(str(text).encode()).digest()
                vectors.append([round((b - 128) / 128, 4) for b in digest[:8]])
            await self.sim._sleep(tokens / self.sim.config.prompt_tokens_per_s)
        finally:
            self.sim._release(runner)
        return {"model": model.name, "embeddings": vectors,
                "total_duration": int((time.perf_counter() - started) * 1e9),
                "load_duration": max(1, int(load_s * 1e9)), "prompt_eval_count": tokens}

    async def dialect(self, request: Request) -> Response:
        """OpenAI's and Anthropic's generation paths, through the native chat and generate."""
        self.sim.stats.requests += 1
        path = request.url.path
        body = await self._body(request)
        if isinstance(body, Response):
            return sim_dialects.translated_error(path, body)
        chat = path in sim_dialects.CHAT_PATHS
        native = await self._run(sim_dialects.native_request(path, body), chat, request)
        return await sim_dialects.answer(path, native, body)

    async def openai_embed(self, request: Request) -> Response:
        body = await self._body(request)
        if isinstance(body, Response):
            return sim_dialects.translated_error(request.url.path, body)
        answer = await self._embed(body, body.get("input"))
        if isinstance(answer, Response):
            return sim_dialects.translated_error(request.url.path, answer)
        return _json(sim_dialects.embeddings(answer, str(body.get("model"))))

    async def _infer(self, request: Request, chat: bool) -> Response:
        self.sim.stats.requests += 1
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        return await self._run(body, chat, request)

    async def _run(self, body: dict[str, Any], chat: bool, request: Request) -> Response:
        sim = self.sim
        name = body.get("model")
        if not name or not isinstance(name, str):
            return _error("model is required", 400)
        model = sim.config.model(name)
        if model is None:
            return _error(f"model '{name}' not found", 404)
        options = body.get("options") or {}
        if not isinstance(options, dict):
            return _error("options must be an object", 400)
        try:
            keep_alive = parse_keep_alive(body.get("keep_alive"), sim.config.keep_alive_s)
        except ValueError as exc:
            return _error(str(exc), 400)
        stream = body.get("stream", True) is not False
        load_only = not body.get("messages") if chat else not body.get("prompt")
        fault = None if load_only else sim.take_fault()
        if fault and fault.mode == "error":
            return _error("simulated upstream failure", fault.status)
        if fault and fault.mode == "slow_first_byte":
            await asyncio.sleep(fault.delay_s)
        if load_only:
            return await self._load_only(model, options, keep_alive, chat)

        sim.stats.inference_requests += 1
        sim.stats.requests_by_model[model.name] = sim.stats.requests_by_model.get(model.name, 0) + 1
        prompt = sim.chat_prompt(body) if chat else sim.generate_prompt(body)
        try:
            runner, load_s = await sim.acquire(model, options, keep_alive)
        except SimError as exc:
            return _error(str(exc), exc.status)
        predict = options.get("num_predict")
        n_tokens = int(predict) if isinstance(predict, int) and predict > 0 else \
            sim.config.default_predict
        gen = self._generate(runner, prompt, n_tokens, load_s, chat, fault, request)
        if stream:
            return StreamingResponse(gen, media_type="application/x-ndjson")
        final: dict[str, Any] = {}
        text: list[str] = []

        async def generate() -> str | None:
            """Runs the answer to its end; the engine's error, if any."""
            nonlocal final
            try:
                async for line in gen:
                    chunk = orjson.loads(line)
                    if "error" in chunk:
                        return str(chunk["error"])
                    text.append(chunk["message"]["content"] if chat else chunk["response"])
                    final = chunk
            finally:
                await gen.aclose()
            return None

        # Ollama stops a call whose client went away (its request context is cancelled).
        work = asyncio.ensure_future(generate())
        gone = asyncio.ensure_future(_client_gone(request))
        await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
            sim.stats.abandoned += 1
            return Response(status_code=499)
        if (failure := work.result()) is not None:
            return _error(failure, 500)
        if chat:
            final["message"]["content"] = "".join(text)
        else:
            final["response"] = "".join(text)
        return _json(final)

    async def _load_only(self, model: SimModel, options: dict[str, Any], keep_alive: float,
                         chat: bool) -> Response:
        sim = self.sim
        if keep_alive == 0:
            sim.request_unload(model)
            reason = "unload"
        else:
            try:
                runner, _ = await sim.acquire(model, options, keep_alive)
            except SimError as exc:
                return _error(str(exc), exc.status)
            sim._release(runner)
            reason = "load"
        out: dict[str, Any] = {"model": model.name, "created_at": _now_rfc3339()}
        if chat:
            out["message"] = {"role": "assistant", "content": ""}
        else:
            out["response"] = ""
        out.update({"done_reason": reason, "done": True})
        return _json(out)

    async def _generate(self, runner: Runner, prompt: PromptTokens, n_tokens: int,
                        load_s: float, chat: bool, fault: Fault | None, request: Request
                        ) -> AsyncGenerator[bytes, None]:
        sim = self.sim
        started = time.perf_counter()
        acquired = False
        try:
            await runner.slots.acquire()
            acquired = True
            queued_s = time.perf_counter() - started
            prompt_tokens, truncated = fit_to_context(prompt, runner.ctx)
            if truncated:
                sim.stats.truncations += 1
            sim.stats.max_prompt_tokens = max(sim.stats.max_prompt_tokens, prompt.total)
            t0 = time.perf_counter()
            await sim._sleep(prompt_tokens / sim.config.prompt_tokens_per_s)
            prompt_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            per_token = sim.config.time_scale / sim.config.tokens_per_s
            for i in range(n_tokens):
                if fault and fault.mode == "midstream" and i == fault.after_chunks:
                    raise RuntimeError("simulated crash mid-stream")
                if fault and fault.mode == "stall" and i == fault.after_chunks:
                    await asyncio.sleep(fault.delay_s)  # a hung runner: silence, then on
                # Sleep to an absolute schedule: timers are coarse (1 ms under uvloop), and
                # sub-millisecond sleeps would otherwise make the stream run fast.
                ahead = t1 + (i + 1) * per_token - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
                word = WORDS[i % len(WORDS)] + ("" if i == n_tokens - 1 else " ")
                yield self._chunk(runner.model.name, word, chat)
            eval_s = time.perf_counter() - t1
            final: dict[str, Any] = {"model": runner.model.name, "created_at": _now_rfc3339()}
            if chat:
                final["message"] = {"role": "assistant", "content": ""}
            else:
                final["response"] = ""
            final.update({
                "done_reason": "stop",
                "done": True,
                "total_duration": int((time.perf_counter() - started + load_s) * 1e9),
                "load_duration": max(1, int((load_s + queued_s) * 1e9)),
                "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": int(prompt_s * 1e9),
                "eval_count": n_tokens,
                "eval_duration": int(eval_s * 1e9),
            })
            if not chat:
                final["context"] = [1, 2, 3]
            yield orjson.dumps(final) + b"\n"
        finally:
            if acquired:
                runner.slots.release()
            sim._release(runner)

    @staticmethod
    def _chunk(model: str, text: str, chat: bool) -> bytes:
        chunk: dict[str, Any] = {"model": model, "created_at": _now_rfc3339()}
        if chat:
            chunk["message"] = {"role": "assistant", "content": text}
        else:
            chunk["response"] = text
        chunk["done"] = False
        return orjson.dumps(chunk) + b"\n"


class SimServer(ThreadedServer):
    """A simulator on a real loopback socket (see ThreadedServer for stop/start)."""

    def __init__(self, config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.sim = OllamaSim(config)
        super().__init__(SimApp(self.sim).app, host, port, name=f"sim-{config.name}")

    def start(self) -> SimServer:
        super().start()
        return self


def start_fleet(configs: list[SimConfig], host: str = "127.0.0.1", base_port: int = 0
                ) -> list[SimServer]:
    servers = []
    for i, cfg in enumerate(configs):
        port = base_port + i if base_port else 0
        servers.append(SimServer(cfg, host=host, port=port).start())
    return servers


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.ollama_sim", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fleet", choices=["demo"], help="start a preset fleet of several GPUs")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11501, help="first port")
    p.add_argument("--name", default="sim")
    p.add_argument("--vram", type=int, default=24564, help="total VRAM in MiB")
    p.add_argument("--parallel", type=int, default=1, help="OLLAMA_NUM_PARALLEL")
    p.add_argument("--context", type=int, default=0, help="OLLAMA_CONTEXT_LENGTH (0 = auto)")
    p.add_argument("--max-loaded", type=int, default=3,
                   help="OLLAMA_MAX_LOADED_MODELS (0 = no limit)")
    p.add_argument("--tokens-per-s", type=float, default=50.0)
    p.add_argument("--time-scale", type=float, default=1.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s.%(msecs)03d %(message)s",
                        datefmt="%H:%M:%S")
    if args.fleet:
        configs = demo_fleet(args.time_scale)
    else:
        configs = [SimConfig(name=args.name, total_vram_mib=args.vram, models=CATALOG,
                             num_parallel=args.parallel, context_length=args.context,
                             max_loaded_models=args.max_loaded,
                             tokens_per_s=args.tokens_per_s, time_scale=args.time_scale)]
    servers = start_fleet(configs, args.host, args.port)
    for s in servers:
        print(f"{s.config.name}: {s.url}  ({s.config.total_vram_mib} MiB)", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    for s in servers:
        s.stop()


if __name__ == "__main__":
    main()
