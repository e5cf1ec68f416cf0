"""A faithful Ollama simulator: one `ollama serve` per HTTP server on loopback, on one
simulated GPU or several (`--gpus`, each of `--vram` MiB: sim_gpus.py).

It speaks Ollama's wire formats and behaves as Ollama's source says it does
(sim_sched.py, sim_engine.py): memory from each model's architecture x context x slots,
context resolution and the reload rule, one load at a time and its queue limit, its own
evictions (the 80 % rule, the model count), partial offload to the CPU when a model does not
fit, and what it does to a prompt longer than the context (cut without a word, or 400), as
the version it reports (`--version`; 0.12 behaves as 0.12 did). `/_sim/*` reports counters
and injects faults.

    python -m loadtest.ollama_sim --fleet demo           # three GPUs on 127.0.0.1:11501..11503
    python -m loadtest.ollama_sim --port 11501 --vram 24564 --parallel 2
    python -m loadtest.ollama_sim --port 11501 --vram 24564 --gpus 2 --fit-target 1024
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import math
import socket
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import sim_audio, sim_bindings, sim_checks, sim_cloud, sim_dialects, sim_gojson, sim_output
from .serving import ThreadedServer, add_sharing_flags, sharing_from
from .sim_cache import Block, CacheSlot, PromptCache, depth_scale, prefill_seconds
from .sim_engine import (
    INPUT_TOO_LONG,
    PARSE_ERROR,
    call_num_keep,
    embedding_refusal,
    embedding_too_long,
    left_out_duration,
    parse_error_holds_slot,
    reported_prompt_eval_count,
    version_tuple,
)
from .sim_model import (
    ANY_SPELLING_SINCE,
    CATALOG,
    CURRENT_VERSION,
    INVALID_MODEL_NAME,
    SimConfig,
    SimModel,
    demo_fleet,
    fit_prompt,
    name_parts,
    sha256_hex,
    tokens_for_text,
    valid_name,
)
from .sim_output import Piece, Reply
from .sim_sched import Fault, OllamaSim, Runner, SimError, log

# What a call on a runner whose llama-server died gets (llm/llama_server.go:1192-1199: the
# killed process's exit status is unknown, its last error empty), and what the call it died
# under gets (:1759-1766)
RUNNER_GONE = "llama-server process no longer running: unknown "
RUNNER_DIED = "an error was encountered while running the model: unexpected EOF"


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status,
                    media_type="application/json; charset=utf-8")


async def _client_gone(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


METRICS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
           "eval_count", "eval_duration")
# api.GenerateResponse's fields in their order (api/types.go:891-930), as Go writes them:
# the metrics come after the context, the tool calls after the metrics
GENERATE_ORDER = ("model", "remote_model", "remote_host", "created_at", "response", "thinking",
                  "done", "done_reason", "context", "total_duration", "load_duration",
                  "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration",
                  "tool_calls", "logprobs")


def in_generate_order(answer: dict[str, Any]) -> dict[str, Any]:
    ranked = {key: i for i, key in enumerate(GENERATE_ORDER)}
    return dict(sorted(answer.items(), key=lambda item: ranked.get(item[0], len(ranked))))


def context_tokens(count: int) -> list[int]:
    """`count` token ids, as Tokenize gives them for a generate call's prompt and answer."""
    return [1 + (i * 7919) % 151_000 for i in range(count)]


def _error(message: str, status: int) -> Response:
    return _json({"error": message}, status)


def _vector(text: str, dimensions: int) -> list[float]:
    """A text's embedding: eight figures from its digest, normalized as Ollama normalizes
    every one, and cut to `dimensions` (when fewer) and normalized again (server/routes.go:
    984-993)."""
    vector = _normalized([(b - 128) / 128 for b in _digest(text)[:8]])
    if 0 < dimensions < len(vector):
        vector = _normalized(vector[:dimensions])
    return [round(x, 6) for x in vector]


def _normalized(vector: list[float]) -> list[float]:
    norm = 1.0 / max(math.sqrt(sum(x * x for x in vector)), 1e-12)
    return [x * norm for x in vector]


LISTED_BY_MODEL_SINCE = (0, 30, 7)


def _namespace(name: str) -> str:
    """types/model ParseName's namespace: [host/][namespace/]model, "library" when none."""
    parts = name.split("/")
    return parts[-2] if len(parts) > 1 else "library"


# The struct each route binds its body to, which a body of another JSON kind is refused
# as (server/routes.go, middleware/openai.go, middleware/anthropic.go `var req ...`)
GO_REQUEST_TYPES = {
    "/api/generate": "api.GenerateRequest", "/api/chat": "api.ChatRequest",
    "/api/show": "api.ShowRequest", "/api/embed": "api.EmbedRequest",
    "/api/embeddings": "api.EmbeddingRequest", "/api/delete": "api.DeleteRequest",
    "/v1/chat/completions": "openai.ChatCompletionRequest",
    "/v1/completions": "openai.CompletionRequest", "/v1/embeddings": "openai.EmbedRequest",
    "/v1/responses": "openai.ResponsesRequest", "/v1/messages": "anthropic.MessagesRequest"}
# Ollama's own handlers answer an empty body (io.EOF) "missing request body"; the OpenAI
# and Anthropic layers err.Error(), "EOF" (v0.12.6 server/routes.go:170-172, :611-613)
NATIVE_BODIES = frozenset(path for path in GO_REQUEST_TYPES if path.startswith("/api/"))


def _go_decode(raw: bytes, go_type: str) -> dict[str, Any] | str:
    """json.Decoder.Decode of `raw` into a struct `go_type`: its first value (what follows
    is never read; `null` leaves the struct empty), or Go's words for it."""
    try:
        value = orjson.loads(raw)  # the usual body, read whole (100 times faster)
    except orjson.JSONDecodeError:
        end = sim_gojson.first_value(raw)
        if isinstance(end, str):
            return end
        raw = raw[:end]
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:  # Go reads what orjson will not (bad UTF-8, lone halves)
            value = json.loads(raw.decode("utf-8", "replace"))
    if value is None:
        return {}
    if not isinstance(value, dict):
        return f"json: cannot unmarshal {sim_gojson.kind(raw)} into Go value of type {go_type}"
    return _nested_binds(_as_go_binds(raw, value), _NESTED_BY_TYPE.get(go_type, _NESTED))


# Nested objects Go decodes into structs (keys folded) by field; maps (options, arguments,
# OpenAI chat content parts, a schema's properties) keep their keys as sent. A tool's
# parameters are an api.ToolFunctionParameters (api/types.go ToolFunction).
_NESTED: dict[str, Any] = {"messages": {"tool_calls": {"function": {}}},
                           "tools": {"function": {"parameters": {}}},
                           # OpenAI's chat (and completions): openai.ResponseFormat, its
                           # JsonSchema, StreamOptions, Reasoning
                           "response_format": {"json_schema": {}}, "stream_options": {},
                           "reasoning": {}}
# openai/responses.go: input items, their content parts, function outputs and summaries are
# structs; a ResponsesTool too, whose parameters convertTool reads into
# api.ToolFunctionParameters (a namespace's tools alike); text, its format, reasoning
_RESPONSES_TOOLS: dict[str, Any] = {"parameters": {}}
_RESPONSES_TOOLS["tools"] = _RESPONSES_TOOLS
_NESTED_BY_TYPE: dict[str, dict[str, Any]] = {
    "anthropic.MessagesRequest": {"messages": {"content": {}}, "tools": {}},
    "openai.ResponsesRequest": {"input": {"content": {}, "output": {}, "summary": {}},
                                "tools": _RESPONSES_TOOLS, "text": {"format": {}},
                                "reasoning": {}}}


def _nested_binds(value: Any, shape: dict[str, Any], top: bool = True) -> Any:
    """`value` with its nested structs' keys as Go binds them (case-insensitively, in the
    order read, the last winning)."""
    if isinstance(value, list):
        return [_nested_binds(item, shape, False) for item in value]
    if not isinstance(value, dict):
        return value
    out = value if top else {"".join(c.lower() if c.isascii() else c for c in
                                     key.translate(_FOLDS)): item for key, item in value.items()}
    return {**out, **{key: _nested_binds(out[key], inner, False)
                      for key, inner in shape.items() if key in out}}


# encoding/json's case folding onto ASCII (fold.go): long s, Kelvin sign, dotless/dotted I
_FOLDS = str.maketrans({"\u017f": "s", "\u212a": "k", "\u0131": "i", "\u0130": "i"})


def _as_go_binds(raw: bytes, body: dict[str, Any]) -> dict[str, Any]:
    """The top-level keys as Go binds them to a request struct (all of whose JSON names are
    lower case): case-insensitively, the last of the keys naming a field winning."""
    def field(key: str) -> str:
        return "".join(c.lower() if c.isascii() else c for c in key.translate(_FOLDS))
    if all(key == field(key) for key in body):
        return body
    objects: list[list[tuple[str, Any]]] = []
    json.loads(raw, object_pairs_hook=objects.append)  # the top-level object's pairs last
    out: dict[str, Any] = {}
    for key, _ in objects[-1]:
        out[field(key)] = body[key]
    return out


async def _no_route(request: Request, exc: Exception) -> Response:
    return PlainTextResponse("404 page not found", 404)  # gin's NoRoute answer


class SimApp:
    """HTTP routes over an OllamaSim."""

    def __init__(self, sim: OllamaSim) -> None:
        self.sim = sim
        self.app = Starlette(routes=[
            Route("/", self.root, methods=["GET", "HEAD"]),
            Route("/api/version", self.version, methods=["GET", "HEAD"]),
            Route("/api/tags", self.tags, methods=["GET", "HEAD"]),
            Route("/api/ps", self.ps, methods=["GET"]),
            Route("/api/status", self.status, methods=["GET"]),
            Route("/api/me", self.whoami, methods=["POST"]),
            *(Route(path, self.web, methods=["POST"]) for path in sim_cloud.WEB_UNAVAILABLE),
            Route("/api/experimental/model-recommendations", self.recommendations,
                  methods=["GET"]),
            Route("/v1/models", self.openai_models, methods=["GET"]),
            # (gin's `:model` is one path segment: a name with a slash is its 404)
            Route("/v1/models/{model}", self.openai_model, methods=["GET"]),
            Route("/api/show", self.show, methods=["POST"]),
            Route("/api/delete", self.delete, methods=["DELETE"]),
            Route("/api/chat", self.chat, methods=["POST"]),
            Route("/api/generate", self.generate, methods=["POST"]),
            *(Route(path, self.dialect, methods=["POST"]) for path in (
                sim_dialects.CHAT, sim_dialects.COMPLETIONS, sim_dialects.RESPONSES,
                sim_dialects.MESSAGES)),
            Route("/v1/embeddings", self.openai_embed, methods=["POST"]),
            Route(sim_audio.PATH, self.transcribe, methods=["POST"]),
            Route("/api/embed", self.embed, methods=["POST"]),
            Route("/api/embeddings", self.embed, methods=["POST"]),
            Route("/_sim/stats", self.stats, methods=["GET"]),
            Route("/_sim/fault", self.set_fault, methods=["POST"]),
            Route("/_sim/reset", self.reset, methods=["POST"]),
        ], lifespan=self._lifespan, exception_handlers={404: _no_route})

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.sim.adopt_loop()  # every start, a restart included: see adopt_loop
        yield

    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    def _probed(self, path: str) -> None:
        by_path = self.sim.stats.probes_by_path
        by_path[path] = by_path.get(path, 0) + 1

    async def version(self, request: Request) -> Response:
        self._probed("/api/version")
        return _json({"version": self.sim.config.version})

    async def tags(self, request: Request) -> Response:
        self._probed("/api/tags")
        return _json(self.sim.tags())

    async def ps(self, request: Request) -> Response:
        self._probed("/api/ps")
        return _json(self.sim.ps())

    async def status(self, request: Request) -> Response:
        if self._before(sim_cloud.STATUS_SINCE):
            return PlainTextResponse("404 page not found", status_code=404)  # gin's own
        return _json(sim_cloud.status(self.sim.config.no_cloud))

    def _before(self, since: tuple[int, int, int]) -> bool:
        return version_tuple(self.sim.config.version) < since

    async def whoami(self, request: Request) -> Response:
        if self._before(sim_cloud.ACCOUNT_SINCE):
            return PlainTextResponse("404 page not found", status_code=404)
        return _json(sim_cloud.whoami(self.sim.config.name))

    async def web(self, request: Request) -> Response:
        config = self.sim.config
        if self._before(sim_cloud.WEB_SINCE):
            return PlainTextResponse("404 page not found", status_code=404)
        status, answer = sim_cloud.web(request.url.path, await request.body(),
                                       config.no_cloud, config.version)
        return _json(answer, status)

    async def recommendations(self, request: Request) -> Response:
        if self._before(sim_cloud.RECOMMENDATIONS_SINCE):
            return PlainTextResponse("404 page not found", status_code=404)
        return _json(sim_cloud.recommendations())

    async def openai_models(self, request: Request) -> Response:
        """ListMiddleware over ListHandler (openai/openai.go ToListCompletion): each tags
        entry's `model` as its id from 0.30.7 (commit e09b3f9fb), its `name` before."""
        by_model = not self._before(LISTED_BY_MODEL_SINCE)
        return _json({"object": "list", "data": [{
            "id": (entry.get("model") if by_model else None) or entry["name"],
            "object": "model",
            "created": int(datetime.fromisoformat(entry["modified_at"]).timestamp()),
            "owned_by": _namespace((entry.get("model") if by_model else None) or
                                   entry["name"])}
            for entry in self.sim.tags()["models"]]})

    async def openai_model(self, request: Request) -> Response:
        """RetrieveMiddleware over ShowHandler (v0.12.6 server/routes.go:1492,
        middleware/openai.go:286-305, openai/openai.go:406-413 ToModel): the model as the
        path names it, created when it was, owned by its namespace; show's refusal in
        OpenAI's shape. A cloud model's is sent on to the cloud (cloud_proxy.go
        cloudModelPathPassthroughMiddleware)."""
        config, name = self.sim.config, request.path_params["model"]
        routed = sim_cloud.route(name, config.version, ())
        if isinstance(routed, sim_cloud.ToCloud):
            if refused := sim_cloud.disabled(config.no_cloud, config.version,
                                             sim_cloud.DETAILS_UNAVAILABLE):
                return _error(refused.message, refused.status)
            return _json(sim_cloud.openai_model(routed.echo))
        shown = self._show(name)
        if shown.status_code != 200:
            return sim_dialects.translated_error(request.url.path, shown)
        modified = orjson.loads(bytes(shown.body))["modified_at"]
        return _json({"id": name, "object": "model",
                      "created": int(datetime.fromisoformat(modified).timestamp()),
                      "owned_by": _namespace(name)})

    async def show(self, request: Request) -> Response:
        self._probed("/api/show")
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        if wrong := sim_bindings.binding_error(sim_bindings.SHOW_FIELDS, body):
            return _error(wrong, 400)
        name = body.get("model") or body.get("name")
        if not name:
            return _error("model is required", 400)
        verbose = body.get("verbose") is True
        if verbose:
            asked = self.sim.stats.verbose_shows
            asked[str(name)] = asked.get(str(name), 0) + 1
        return self._show(str(name), verbose)

    def _show(self, name: str, verbose: bool = False) -> Response:
        config = self.sim.config
        routed = sim_cloud.route(name, config.version, config.cloud_stubs)
        if isinstance(routed, sim_cloud.Refused):
            return _error(routed.message, routed.status)
        if isinstance(routed, sim_cloud.ToCloud):
            refused = sim_cloud.disabled(config.no_cloud, config.version,
                                        sim_cloud.DETAILS_UNAVAILABLE)
            return _error(refused.message, refused.status) if refused else \
                _json(sim_cloud.show_answer(routed))
        model = self._model(routed)
        if isinstance(model, Response):
            return model
        return _json(self.sim.show(model, verbose))

    async def delete(self, request: Request) -> Response:
        """`ollama rm`: the model's manifest removed (DeleteHandler, server/routes.go:1066-1115
        at v0.24.0; a name it cannot read is a 400, one it does not hold a 404); a copy of it
        loaded runs on until its keep-alive ends, while every call for it gets 404 (GetModel
        finds no manifest)."""
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        name = str(body.get("model") or body.get("name") or "")
        ref = sim_checks.pull_ref(name, self.sim.config.version)
        if isinstance(ref, sim_cloud.Refused):
            return _error(ref.message, ref.status)
        model = self.sim.config.model(ref)
        if model is None:
            return _error(f"model '{name}' not found", 404)
        self.sim.config = replace(self.sim.config, models=tuple(
            m for m in self.sim.config.models if m is not model))
        return Response(status_code=200)

    def _model(self, name: str, embedding: bool = False, handler: str = "show"
               ) -> SimModel | Response:
        """The model a call names, as Ollama finds it (types/model/name.go ParseName, each
        part matched case-insensitively), or its refusal of a name it cannot parse
        (`_unparsable`, by `handler`) and 404 (the embedding handlers' in a scheduling
        error's words: handleScheduleError, routes.go:3116, from :848-851, :1066-1070)."""
        if not valid_name(name):
            return self._unparsable(name, handler)
        model = self.sim.config.model(name)
        if model is not None:
            return model
        if embedding:
            return _error(f"model {orjson.dumps(name).decode()} not found, try pulling it "
                          "first", 404)
        return _error(f"model '{name}' not found", 404)

    def _unparsable(self, name: str, handler: str) -> Response:
        """A name ParseName cannot read: writeModelRefParseError's 400 from 0.18; before, each
        handler's own words (v0.17.7 server/routes.go: generate :199-203 and embed :695-697 a
        404, chat :1998-2000 and the legacy embeddings :842-844 "model is required"; show's
        GetModelInfo the 400 of every version)."""
        if handler == "show" or \
                version_tuple(self.sim.config.version) >= sim_cloud.SOURCE_SUFFIXES_SINCE:
            return _error(INVALID_MODEL_NAME, 400)
        if handler in ("chat", "embeddings"):
            return _error("model is required", 400)
        return _error(f"model '{name}' not found", 404)

    async def stats(self, request: Request) -> Response:
        s = self.sim.stats
        return _json({
            **s.__dict__,
            "vram_mib": self.sim.used_vram_mib(),
            "decoding": self.sim.decoding,
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
        self.sim.reset()
        return _json({"reset": True})

    async def _body(self, request: Request) -> dict[str, Any] | Response:
        """The body as the route's handler binds it (gin's ShouldBindJSON: json.Decoder reads
        the first value into the request struct), or its 400 in Go's words."""
        path = request.url.path
        read = _go_decode(await request.body(), GO_REQUEST_TYPES.get(path, "api.Request"))
        if read == "EOF" and path in NATIVE_BODIES:
            return _error("missing request body", 400)  # each handler's io.EOF check
        return _error(read, 400) if isinstance(read, str) else read

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
        answer = await self._embed(request, body,
                                   body.get("prompt") if legacy else body.get("input"), legacy)
        if isinstance(answer, Response) or not legacy:
            return answer if isinstance(answer, Response) else _json(answer)
        vectors = answer["embeddings"]
        return _json({"embedding": vectors[0] if vectors else []})

    async def _embed(self, request: Request, body: dict[str, Any], texts: Any, legacy: bool
                     ) -> dict[str, Any] | Response:
        """server/routes.go:795-1040 EmbedHandler: `input` a text (none when empty) or a list
        of texts (400 "invalid input type" otherwise, before the model is looked up), the
        model loaded even for no input, each input on the runner's slots (its semaphore,
        llm/llama_server.go:2339; one slot for an embedding model, sched.go:497-501); the
        legacy handler (:1042-1100) with its `prompt`."""
        try:
            keep_alive = sim_checks.parse_keep_alive(body.get("keep_alive"))
        except ValueError as exc:
            return _error(str(exc), 400)
        fields = sim_bindings.EMBEDDING_FIELDS if legacy else sim_bindings.EMBED_REQUEST_FIELDS
        if wrong := sim_bindings.native_binding_error(fields, body, self.sim.config.version):
            return _error(wrong, 400)
        config = self.sim.config
        routed = sim_cloud.route(str(body.get("model") or ""), config.version, ())
        if isinstance(routed, sim_cloud.Refused):
            return _error(routed.message, routed.status)
        if isinstance(routed, sim_cloud.ToCloud):  # sent on before the input is read
            if refused := sim_cloud.disabled(config.no_cloud, config.version,
                                             sim_cloud.INFERENCE_UNAVAILABLE):
                return _error(refused.message, refused.status)
            self.sim.stats.cloud_requests += 1
            inputs = [texts] if isinstance(texts, str) else texts or []
            return {"model": routed.echo, "embeddings": [_vector(str(t), 0) for t in inputs]}
        if isinstance(texts, str):
            texts = [texts] if texts else []
        elif isinstance(texts, list):
            if not all(isinstance(text, str) for text in texts):
                return _error("invalid input type", 400)
        elif texts is not None:
            return _error("invalid input type", 400)
        name = str(body.get("model") or "")
        model = self._model(name, embedding=True, handler="embeddings" if legacy else "embed")
        if isinstance(model, Response):
            return model
        options = body.get("options") or {}
        if isinstance(options, dict) and (wrong := sim_checks.option_type_error(options)):
            return _error(wrong, 500)
        texts = list(texts or [])
        self.sim.stats.requests += 1
        self.sim.stats.inference_requests += 1
        started = time.perf_counter()
        acquired = await self._acquire(request, model, body, keep_alive)
        if isinstance(acquired, Response):
            return acquired
        runner, load_s = acquired
        try:
            counts = self._embedding_counts(runner, body, texts, legacy)
            if isinstance(counts, Response):
                return counts
            await asyncio.gather(*(self._embed_one(runner, count) for count in counts))
        finally:
            self.sim.release(runner)
        if not texts:
            return {"model": name, "embeddings": []}
        dimensions = body.get("dimensions") if not legacy else None  # EmbedRequest's only
        vectors = [_vector(text, dimensions if isinstance(dimensions, int) else 0)
                   for text in texts]
        return {"model": name, "embeddings": vectors,
                "total_duration": int((time.perf_counter() - started) * 1e9),
                "load_duration": max(1, int(load_s * 1e9)), "prompt_eval_count": sum(counts)}

    def _embedding_counts(self, runner: Runner, body: dict[str, Any], texts: list[str],
                          legacy: bool) -> list[int] | Response:
        """Each input's tokens as the runner embeds it, or Ollama's refusal. /api/embed keeps
        the head within num_ctx - 2 (BOS and EOS; routes.go:874-941) or refuses it with
        `truncate: false`; the legacy path never cuts. Then the runner: a model that cannot
        embed is refused (sim_engine.embedding_refusal; the legacy path's runner refuses it
        before it reads the input), and at 0.30+ an input over the batch llama-server takes
        it whole in is refused, which /api/embed cuts to num_batch and retries unless told
        `truncate: false` (llm/llama_server.go:2435-2446, routes.go:956-973)."""
        if not texts:
            return []
        c = self.sim.config
        refused = embedding_refusal(runner.model.arch, runner.model.embedding, c.version,
                                    c.new_engine, legacy)
        if refused is not None and legacy:
            return _error(refused[1], refused[0])
        window = runner.ctx
        if self.sim.newest and runner.model.embeds_whole:  # embeddingBatchSize, :561-569
            window = min(runner.options.num_batch, runner.ctx)
        cuts = body.get("truncate") is not False and not legacy
        counts = []
        for text in texts:
            count = tokens_for_text(text, c.chars_per_token)
            limit = window - 2 if legacy else runner.ctx - 2
            if count > limit:
                if not cuts:
                    self.sim.stats.too_long_refusals += 1
                    status, message = embedding_too_long(c.version, legacy)
                    return _error(message, status)
                self.sim.stats.truncations += 1  # Ollama cuts embedding inputs silently
                count = limit
            counts.append(count)
        if refused is not None:
            return _error(refused[1], refused[0])
        for i, count in enumerate(counts):
            if count > window - 2:  # llama-server's refusal, retried cut to the batch
                if not cuts:
                    self.sim.stats.too_long_refusals += 1
                    return _error(INPUT_TOO_LONG, 400)
                self.sim.stats.truncations += 1
                counts[i] = window - 2
        return counts

    async def _embed_one(self, runner: Runner, tokens: int) -> None:
        async with runner.slots:
            await self.sim._sleep(tokens / (self.sim.config.prompt_tokens_per_s * runner.speed))

    async def dialect(self, request: Request) -> Response:
        """OpenAI's and Anthropic's generation paths, through the native chat and generate."""
        self.sim.stats.requests += 1
        path = request.url.path
        version = self.sim.config.version
        if version_tuple(version) < sim_dialects.SERVED_SINCE.get(path, (0, 0, 0)):
            return PlainTextResponse("404 page not found", 404)  # gin's NoRoute answer
        body = await self._body(request)
        if isinstance(body, Response):
            return sim_dialects.translated_error(path, body)
        if wrong := sim_dialects.request_error(path, body, version):
            return sim_dialects.error(path, wrong, 400)
        chat = path in sim_dialects.CHAT_PATHS
        native = await self._run(sim_dialects.native_request(path, body, version), chat,
                                 request)
        routed = sim_cloud.route(str(body.get("model") or ""), self.sim.config.version,
                                 self.sim.config.cloud_stubs)
        if isinstance(routed, sim_cloud.ToCloud):  # the cloud's own answer names its model
            body = {**body, "model": routed.echo}
        return await sim_dialects.answer(path, native, body, version)

    async def transcribe(self, request: Request) -> Response:
        """/v1/audio/transcriptions where the version's router has it: the form's audio
        through the native chat."""
        version = self.sim.config.version
        if not sim_audio.served(version):
            return PlainTextResponse(sim_audio.GIN_NOT_FOUND, status_code=404)
        self.sim.stats.requests += 1
        asked = await sim_audio.chat_request(request, version)
        if isinstance(asked, str):
            return sim_dialects.error(request.url.path, asked, 400)
        native = await self._run(asked[0], True, request)
        if native.status_code >= 400:
            return sim_dialects.translated_error(request.url.path, native)
        return sim_audio.answer(native, asked[1])

    async def openai_embed(self, request: Request) -> Response:
        """EmbeddingsMiddleware (middleware/openai.go:395-445): `""` is one input, none or
        `[]` a 400 "invalid input"; only model, input and dimensions reach the handler."""
        body = await self._body(request)
        if isinstance(body, Response):
            return sim_dialects.translated_error(request.url.path, body)
        version = self.sim.config.version
        if wrong := sim_bindings.embed_binding_error(body, version) or (
                sim_bindings.encoding_format_error(body)
                if not self._before(sim_bindings.ENCODING_FORMAT_SINCE) else None):
            return sim_dialects.error(request.url.path, wrong, 400)
        texts = body.get("input")
        if texts is None or texts == []:
            return sim_dialects.error(request.url.path, "invalid input", 400)
        # (a version's layer passes on only the fields it has)
        since = sim_bindings.OPENAI_EMBED_FIELDS
        native = {key: body[key] for key in ("model", "dimensions") if key in body and
                  (key == "model" or not self._before(since[key][1]))}
        answer = await self._embed(request, native, [""] if texts == "" else texts,
                                   legacy=False)
        if isinstance(answer, Response):
            return sim_dialects.translated_error(request.url.path, answer)
        return _json(sim_dialects.embeddings(answer, str(body.get("model")), None if self._before(
            sim_bindings.ENCODING_FORMAT_SINCE) else body.get("encoding_format")))

    async def _infer(self, request: Request, chat: bool) -> Response:
        self.sim.stats.requests += 1
        body = await self._body(request)
        if isinstance(body, Response):
            return body
        body.pop(sim_dialects.RELAX_THINKING, None)  # the Anthropic layer's mark, never a client's
        return await self._run(body, chat, request)

    async def _run(self, body: dict[str, Any], chat: bool, request: Request) -> Response:
        sim = self.sim
        version = sim.config.version
        for key, value in body.items():  # the binding's own decoders, in the body's order
            if key == "keep_alive":  # api.Duration.UnmarshalJSON
                try:
                    sim_checks.parse_keep_alive(value)
                except ValueError as exc:
                    return _error(str(exc), 400)
            elif key == "think" and (wrong := sim_bindings.think_error(value, version)):
                return _error(wrong, 400)
        keep_alive = sim_checks.parse_keep_alive(body.get("keep_alive"))
        fields = sim_bindings.CHAT_REQUEST_FIELDS if chat else sim_bindings.GENERATE_FIELDS
        if wrong := sim_bindings.native_binding_error(fields, body, version):
            return _error(wrong, 400)
        if wrong := sim_bindings.native_image_error(body, chat):
            return _error(wrong, 400)
        if wrong := sim_bindings.top_logprobs_error(body, version):
            return _error(wrong, 400)
        name = body.get("model")
        if not name or not isinstance(name, str):
            # generate refuses no name as any it cannot find (v0.12.6 server/routes.go:178-183,
            # HEAD :261-264 writeModelRefParseError's fallback); chat, as required (:2459)
            return _error("model is required", 400) if chat else \
                _error("model '' not found", 404)
        routed = sim_cloud.route(name, version, sim.config.cloud_stubs)
        if isinstance(routed, sim_cloud.Refused):
            return _error(routed.message, routed.status)
        if isinstance(routed, sim_cloud.ToCloud):
            return await self._cloud(body, chat, request, routed.echo)
        model = self._model(routed, handler="chat" if chat else "generate")
        if isinstance(model, Response):
            return model
        if chat and version_tuple(version) < ANY_SPELLING_SINCE and \
                name_parts(name) != name_parts(model.name):
            # before 0.15.5 chat reads the manifest under the name as spelled (v0.12.6
            # server/routes.go:1826 GetModel(req.Model)): a file path, case-sensitive
            return _error(f"model '{name}' not found", 404)
        options = body.get("options") or {}
        if not isinstance(options, dict):
            return _error("options must be an object", 400)
        stream = body.get("stream", True) is not False
        load_only = not body.get("messages") if chat else not body.get("prompt")
        if load_only and keep_alive == 0:  # an unload skips every check below
            return await self._unload(model, name, chat)
        if not chat and (wrong := sim_bindings.raw_refusal(body)):
            return _error(wrong, 400)
        relax = bool(body.get(sim_dialects.RELAX_THINKING))
        if refusal := sim_checks.capability_refusal(model, body, chat, relax, version):
            return _error(refusal, 400)
        if (wrong := sim_checks.option_type_error(options)) is not None:
            return _error(wrong, 500)
        if relax and not model.thinks:
            body = {**body, "think": None}
        fault = None if load_only else sim.take_fault()
        if fault and fault.mode == "error":
            return _error("simulated upstream failure", fault.status)
        if fault and fault.mode == "oom":
            sim.stats.oom_events += 1
            if sim.newest:
                sim.expire_all()
            return _error("llama runner process has terminated: CUDA error: out of memory", 500)
        if fault and fault.mode == "slow_first_byte":
            await asyncio.sleep(fault.delay_s)
        if load_only:
            return await self._load_only(request, model, body, keep_alive, chat)

        sim.stats.inference_requests += 1
        sim.stats.requests_by_model[model.name] = sim.stats.requests_by_model.get(model.name, 0) + 1
        prompt = sim.chat_prompt(body) if chat else sim.generate_prompt(body)
        acquired = await self._acquire(request, model, body, keep_alive)
        if isinstance(acquired, Response):
            return acquired
        runner, load_s = acquired
        sim.stats.max_prompt_tokens = max(sim.stats.max_prompt_tokens, prompt.total)
        fitted = fit_prompt(prompt, runner.ctx, sim.config.version, chat=chat,
                            truncate=body.get("truncate") is not False,
                            shift=runner.options.shift, num_keep=call_num_keep(body),
                            drop_ctx=sim.prompt_ctx(model, body, runner))
        if fitted.error is not None:
            sim.release(runner)
            sim.stats.too_long_refusals += 1
            return _error(fitted.error[1], fitted.error[0])
        if wrong := sim_bindings.format_error(body.get("format")):
            sim.release(runner)  # the runner refuses it once the prompt is in: after the load
            return _error(wrong, 500)
        if fitted.cut:
            sim.stats.truncations += 1
            log.info("%s cut a prompt of %d tokens to %d (context %d)", sim.config.name,
                     prompt.total, fitted.tokens, runner.ctx)
        reply = sim_output.reply_for(body, chat, sim_output.answer_tokens(
            options, sim.config.answer_tokens), sim_output.answer_cap(options),
            sim_checks.thinks(body.get("think"), model))
        # Context shift: from 0.30 the copy's (llama-server's --context-shift, on for every
        # family but deepseek2: server/sched.go:129-147), before it each call's own `shift`
        # (v0.12.6 server/routes.go:495, 2078)
        shifts = runner.options.shift if sim.newest else body.get("shift") is not False
        if fitted.tokens + reply.tokens > runner.ctx and not shifts:
            # Without shift the answer stops at the end of the context, done_reason "length"
            # (v0.12.6 runner/ollamarunner/runner.go:526-537; llama-server's stop_type
            # "limit", llm/llama_server.go:1714-1716)
            reply = sim_output.stopped_at(reply, max(0, runner.ctx - fitted.tokens))
        elif not fitted.cut and fitted.tokens + reply.tokens > runner.ctx:
            # The answer reaches the end of the context, which the engine shifts: the start
            # of the prompt goes, mid-answer (--context-shift, llm/llama_server.go:420,
            # 789-795)
            sim.stats.truncations += 1
            log.info("%s shifted the context under an answer: %d + %d tokens (context %d)",
                     sim.config.name, fitted.tokens, reply.tokens, runner.ctx)
        # A prompt cut to fit starts differently from what any slot holds.
        blocks = () if fitted.cut else tuple(prompt.blocks)
        # /api/generate answers the tokens of its whole prompt (BOS, any earlier context, not
        # cut) and answer, none in raw mode (server/routes.go:712-719; v0.12.6 :537-544)
        context = None if chat or body.get("raw") else prompt.total + 1
        gen = self._generate(runner, fitted.tokens, blocks, reply, load_s, chat, fault, name,
                             context, sim_bindings.logprobs_asked(body, version))
        if stream:
            return await self._stream(gen, request)
        return await self._collect(gen, chat, request)

    async def _cloud(self, body: dict[str, Any], chat: bool, request: Request, echo: str
                     ) -> Response:
        """The cloud's answer, sent back as Ollama relays it: no runner, no slot, no GPU."""
        sim = self.sim
        if refused := sim_cloud.disabled(sim.config.no_cloud, sim.config.version,
                                         sim_cloud.INFERENCE_UNAVAILABLE):
            return _error(refused.message, refused.status)
        options = body.get("options") if isinstance(body.get("options"), dict) else {}
        sim.stats.cloud_requests += 1
        reply = sim_output.reply_for(body, chat, sim_output.answer_tokens(
            options, sim.config.answer_tokens), sim_output.answer_cap(options), False)
        prompt = sim.chat_prompt(body) if chat else sim.generate_prompt(body)
        gen = self._cloud_answer(reply, prompt.total, chat, echo)
        if body.get("stream", True) is not False:
            return await self._stream(gen, request)
        return await self._collect(gen, chat, request)

    async def _cloud_answer(self, reply: Reply, prompt_tokens: int, chat: bool, echo: str
                            ) -> AsyncGenerator[bytes, None]:
        started = time.perf_counter()
        for piece in reply.pieces:
            await asyncio.sleep(piece.tokens / self.sim.config.tokens_per_s
                                * self.sim.config.time_scale)
            yield self._chunk(echo, piece, chat)
        final = self._done(echo, chat, reply.done_reason)
        final.update({"total_duration": int((time.perf_counter() - started) * 1e9),
                      "prompt_eval_count": prompt_tokens, "eval_count": reply.tokens})
        yield orjson.dumps(final) + b"\n"

    async def _collect(self, gen: AsyncGenerator[bytes, None], chat: bool, request: Request
                       ) -> Response:
        """A non-streamed answer: the chunks run to the end and gathered into the last."""
        sim = self.sim
        final: dict[str, Any] = {}
        text: list[str] = []
        thinking: list[str] = []
        calls: list[Any] = []
        logprobs: list[Any] = []

        async def generate() -> str | None:
            """Runs the answer to its end; the engine's error, if any."""
            nonlocal final
            try:
                async for line in gen:
                    chunk = orjson.loads(line)
                    if "error" in chunk:
                        return str(chunk["error"])
                    said = chunk["message"] if chat else chunk
                    text.append(said["content"] if chat else said["response"])
                    thinking.append(said.get("thinking", ""))
                    calls.extend(said.get("tool_calls", ()))
                    logprobs.extend(chunk.get("logprobs", ()))
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
        # As Ollama's writeChatResponse: the pieces gathered into the last chunk.
        said = final["message"] if chat else final
        said["content" if chat else "response"] = "".join(text)
        if any(thinking):
            said["thinking"] = "".join(thinking)
        if calls:
            said["tool_calls"] = calls
        if logprobs:  # after done_reason, before the metrics (api/types.go ChatResponse)
            final = {**{k: v for k, v in final.items() if k not in METRICS},
                     "logprobs": logprobs, **{k: v for k, v in final.items() if k in METRICS}}
        return _json(final if chat else in_generate_order(final))

    async def _acquire(self, request: Request, model: SimModel, body: dict[str, Any],
                       keep_alive: float | None) -> tuple[Runner, float] | Response:
        """The runner (and its load_duration), or the answer when there is none: Ollama loads
        for the request that asked and aborts the load, or drops the request from its queue,
        once that client's connection closes (server/sched.go:627, 733-739;
        llm/llama_server.go:1299-1301)."""
        acquiring = asyncio.ensure_future(self.sim.acquire(model, body, keep_alive))
        gone = asyncio.ensure_future(_client_gone(request))
        await asyncio.wait({acquiring, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not acquiring.done():
            acquiring.cancel()
            with contextlib.suppress(asyncio.CancelledError, SimError):
                await acquiring
            self.sim.stats.aborted_loads += 1
            return Response(status_code=499)  # nobody reads it
        try:
            return acquiring.result()
        except SimError as exc:
            return _error(str(exc), exc.status)

    async def _stream(self, gen: AsyncGenerator[bytes, None], request: Request) -> Response:
        """The native stream, its head sent with the first chunk as gin's c.Stream does: an
        error before any chunk is a JSON 500, one after it an {"error"} line under 200
        (server/routes.go:2097-2127)."""
        first = asyncio.ensure_future(anext(gen))
        gone = asyncio.ensure_future(_client_gone(request))
        await asyncio.wait((first, gone), return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not first.done():
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await first
            await gen.aclose()
            self.sim.stats.abandoned += 1
            return Response(status_code=499)
        line = first.result()
        if line.startswith(b'{"error"'):
            await gen.aclose()
            return _error(str(orjson.loads(line)["error"]), 500)

        async def chunks() -> AsyncGenerator[bytes, None]:
            try:
                yield line
                async for rest in gen:
                    yield rest
            finally:
                await gen.aclose()

        return StreamingResponse(chunks(), media_type="application/x-ndjson")

    async def _unload(self, model: SimModel, asked: str, chat: bool) -> Response:
        await self.sim.request_unload(model)
        return _json(self._done(asked, chat, "unload"))

    @staticmethod
    def _done(asked: str, chat: bool, reason: str) -> dict[str, Any]:
        out: dict[str, Any] = {"model": asked, "created_at": _now_rfc3339()}
        if chat:
            out["message"] = {"role": "assistant", "content": ""}
        else:
            out["response"] = ""
        out.update({"done": True, "done_reason": reason})  # api.ChatResponse's field order
        return out

    async def _load_only(self, request: Request, model: SimModel, body: dict[str, Any],
                         keep_alive: float | None, chat: bool) -> Response:
        acquired = await self._acquire(request, model, body, keep_alive)
        if isinstance(acquired, Response):
            return acquired
        self.sim.release(acquired[0])
        return _json(self._done(str(body.get("model")), chat, "load"))

    async def _generate(self, runner: Runner, prompt_tokens: int, blocks: tuple[Block, ...],
                        reply: Reply, load_s: float, chat: bool, fault: Fault | None,
                        asked: str, context: int | None = None, logprobs: int | None = None
                        ) -> AsyncGenerator[bytes, None]:
        """The answer's chunks (the model as the call named it, as Ollama echoes req.Model),
        or an {"error"} line where llama-server died."""
        sim = self.sim
        started = time.perf_counter()
        acquired = False
        slot: CacheSlot | None = None
        try:
            await runner.slots.acquire()
            acquired = True
            if runner.crashed:  # Completion's status check (llm/llama_server.go:1546-1551)
                yield orjson.dumps({"error": RUNNER_GONE}) + b"\n"
                return
            cached = 0
            if runner.cache is not None:
                slot, cached = runner.cache.take(blocks, prompt_tokens)
            sim.stats.cached_tokens += cached
            sim.stats.evaluated_tokens += prompt_tokens - cached
            sim.stats.cache_hits += cached > 0
            t0 = time.perf_counter()
            # Prefill time follows the tokens evaluated and their depth (sim_cache.py): the
            # cached prefix costs nothing.
            await sim._sleep(prefill_seconds(cached, prompt_tokens, sim.config.prompt_tokens_per_s
                                             * runner.speed, depth_scale(runner.model)))
            prompt_s = time.perf_counter() - t0
            t1 = due = time.perf_counter()
            with sim.decoding_on(runner):
                for i, piece in enumerate(reply.pieces):
                    if fault and fault.mode == "midstream" and i == fault.after_chunks:
                        sim.crash(runner)
                        yield orjson.dumps({"error": RUNNER_DIED}) + b"\n"
                        return
                    if fault and fault.mode == "parser" and i == fault.after_chunks:
                        if parse_error_holds_slot(sim.config.version):
                            acquired = False  # the blocked callback keeps it
                            sim.stats.wedged_slots += 1
                        yield orjson.dumps({"error": PARSE_ERROR}) + b"\n"
                        return
                    if fault and fault.mode == "stall" and i == fault.after_chunks:
                        await asyncio.sleep(fault.delay_s)  # a hung runner: silence, then on
                    # Sleep to an absolute schedule: timers are coarse (1 ms under uvloop),
                    # and sub-millisecond sleeps would otherwise make the stream run fast. It
                    # advances at the pace the card allows now, which the calls decoding
                    # beside this one set.
                    due += piece.tokens * sim.token_period_s(runner) * sim.config.time_scale
                    ahead = due - time.perf_counter()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                    if runner.crashed:  # another call's crash took the process down
                        yield orjson.dumps({"error": RUNNER_DIED}) + b"\n"
                        return
                    yield self._chunk(asked, piece, chat, logprobs)
            eval_s = time.perf_counter() - t1
            final: dict[str, Any] = {"model": asked, "created_at": _now_rfc3339()}
            if chat:
                final["message"] = {"role": "assistant", "content": ""}
            else:
                final["response"] = ""
            # In Ollama's field order (api/types.go ChatResponse, GenerateResponse): done,
            # done_reason, /api/generate's context, then the metrics, last
            final.update({"done": True, "done_reason": reply.done_reason})
            if context is not None:
                final["context"] = context_tokens(context + reply.tokens)
            final.update({
                "total_duration": int((time.perf_counter() - started + load_s) * 1e9),
                "load_duration": max(1, int(load_s * 1e9)),  # not the slot wait
                "prompt_eval_count": reported_prompt_eval_count(sim.config.version,
                                                                prompt_tokens, cached),
                "prompt_eval_duration": int(prompt_s * 1e9),
                "eval_count": reply.tokens,
                "eval_duration": int(eval_s * 1e9),
            })
            model = runner.model
            if zero := left_out_duration(model.arch, model.embedding, sim.config.version,
                                         sim.config.new_engine, reply.tokens):
                del final[zero]
            # The runner frees the sequence's slot, and its cache, before the final response
            # goes out (0.12.6 runner/llamarunner/runner.go:321-331 removeSequence; llama-server
            # releases the slot, then sends the final result): the client's next call finds it
            if slot is not None:
                PromptCache.release(slot)
                slot = None
            if acquired:
                runner.slots.release()
                acquired = False
            yield orjson.dumps(final) + b"\n"
        finally:
            if slot is not None:
                PromptCache.release(slot)
            if acquired:
                runner.slots.release()
            sim.release(runner)

    @staticmethod
    def _chunk(model: str, piece: Piece, chat: bool, logprobs: int | None = None) -> bytes:
        """A piece in Ollama's chunk: the message's (or /api/generate's) `content` (or
        `response`), `thinking` or `tool_calls`, the text fields always present; its tokens'
        logprobs when asked (`logprobs`: how many alternatives)."""
        text = "content" if chat else "response"
        said: dict[str, Any] = {text: ""}
        said[text if piece.kind == "content" else piece.kind] = piece.value
        chunk: dict[str, Any] = {"model": model, "created_at": _now_rfc3339()}
        if chat:
            chunk["message"] = {"role": "assistant", **said}
        else:
            chunk.update(said)
        chunk["done"] = False
        if logprobs is not None:
            chunk["logprobs"] = sim_output.piece_logprobs(piece, logprobs)
        return orjson.dumps(chunk if chat else in_generate_order(chunk)) + b"\n"


class LocalHostsOnly:
    """Ollama's DNS-rebinding check on a loopback listener: a Host that is not local gets
    403 with no body (gin's AbortWithStatus), before any route or method check; an OPTIONS
    whose Host passes as a local name (not an IP) 204 with no body, on any path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.hostname = socket.gethostname()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        host = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"host"),
                    "")
        kind = sim_checks.host_kind(host, self.hostname)
        if scope["type"] != "http" or kind == "ip":
            await self.app(scope, receive, send)
        elif kind is None:
            await Response(status_code=403)(scope, receive, send)
        elif scope["method"] == "OPTIONS":  # (no CORS here: a preflight gets it too)
            await Response(status_code=204)(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class SimServer(ThreadedServer):
    """A simulator on a real loopback socket (see ThreadedServer for stop/start)."""

    def __init__(self, config: SimConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config
        self.sim = OllamaSim(config)
        app: Any = SimApp(self.sim).app
        if host == "localhost" or host.startswith("127.") or host == "::1":
            app = LocalHostsOnly(app)
        super().__init__(app, host, port, name=f"sim-{config.name}")

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
    module = __spec__.name if __spec__ else __name__  # loadtest.*, or the demo package
    p = argparse.ArgumentParser(prog=f"python -m {module}", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fleet", choices=["demo"], help="start a preset fleet of several GPUs")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=11501, help="first port")
    p.add_argument("--name", default="sim")
    p.add_argument("--vram", type=int, default=24564, help="each GPU's VRAM in MiB")
    p.add_argument("--gpus", type=int, default=1,
                   help="GPUs this one `ollama serve` runs on, each of --vram MiB")
    p.add_argument("--sched-spread", action="store_true",
                   help="OLLAMA_SCHED_SPREAD (every load over all the GPUs)")
    p.add_argument("--fit-target", type=int, default=0,
                   help="MiB llama-server's fit keeps free on each GPU (0.30+; llama.cpp's "
                        "default is 1024; 0 fits into all the free memory)")
    p.add_argument("--gpu-overhead", type=int, default=0, metavar="MIB",
                   help="OLLAMA_GPU_OVERHEAD, in MiB (Ollama takes bytes): kept per GPU")
    p.add_argument("--parallel", type=int, default=1, help="OLLAMA_NUM_PARALLEL")
    p.add_argument("--context", type=int, default=0, help="OLLAMA_CONTEXT_LENGTH (0 = auto)")
    p.add_argument("--max-loaded", type=int, default=3,
                   help="OLLAMA_MAX_LOADED_MODELS (0 = 3 per GPU)")
    p.add_argument("--kv-cache-type", default="f16", choices=["f16", "q8_0", "q4_0"],
                   help="OLLAMA_KV_CACHE_TYPE")
    p.add_argument("--flash-attention", choices=["on", "off"],
                   help="OLLAMA_FLASH_ATTENTION (unset by default: Ollama decides per model "
                        "and version)")
    p.add_argument("--no-gpu-flash-attention", action="store_true",
                   help="the GPUs do not run flash attention (Ollama's "
                        "FlashAttentionSupported false)")
    p.add_argument("--max-queue", type=int, default=512, help="OLLAMA_MAX_QUEUE")
    p.add_argument("--version", default=CURRENT_VERSION,
                   help="the Ollama version to behave as (0.12.x: its context default, "
                        "truncation, admission and reload rules)")
    p.add_argument("--new-engine", action="store_true",
                   help="OLLAMA_NEW_ENGINE (0.12: Ollama's own engine for every model it has)")
    p.add_argument("--tokens-per-s", type=float, default=50.0)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--alias", action="append", default=[], metavar="NAME=MODEL",
                   help="another name of a catalog model, as `ollama cp MODEL NAME` makes "
                        "(one manifest: one copy when loaded); repeatable")
    p.add_argument("--derived", action="append", default=[],
                   metavar="NAME=MODEL:NUM_CTX[,KEY=VALUE...]",
                   help="a model created FROM a catalog model with a SYSTEM prompt of "
                        "its own and, unless NUM_CTX is 0, `PARAMETER num_ctx NUM_CTX` (its "
                        "own manifest, the same weights file: one copy when loaded, shared "
                        "at one context, reloaded for the other's); each KEY=VALUE another "
                        "runner PARAMETER (num_batch, num_gpu, main_gpu, use_mmap, "
                        "num_thread) or adapter=NAME, a LoRA ADAPTER; repeatable")
    p.add_argument("--cloud-stub", action="append", default=[], metavar="NAME=REMOTE_MODEL",
                   help="a stub of a model Ollama's cloud runs, as `ollama pull "
                        "gpt-oss:120b-cloud` leaves (listed, never loaded; the simulator "
                        "answers for the cloud); repeatable")
    p.add_argument("--no-cloud", action="store_true", help="OLLAMA_NO_CLOUD (0.18+)")
    add_sharing_flags(p)
    return p.parse_args(argv)


def with_aliases(models: tuple[SimModel, ...], aliases: list[str]) -> tuple[SimModel, ...]:
    """`models` and, for each NAME=MODEL, MODEL under NAME as well."""
    by_name = {m.name: m for m in models}
    added = []
    for alias in aliases:
        name, _, model = alias.partition("=")
        if model not in by_name:
            raise SystemExit(f"--alias {alias}: no model {model!r} in the catalog")
        added.append(replace(by_name[model], name=name))
    return (*models, *added)


def with_derived(models: tuple[SimModel, ...], derived: list[str]) -> tuple[SimModel, ...]:
    """`models` and, for each NAME=MODEL:NUM_CTX, a model created FROM MODEL with a system
    prompt of its own that sets its num_ctx unless 0 (`dataclasses.replace` keeps MODEL's
    weights file)."""
    by_name = {m.name: m for m in models}
    added = []
    for spec in derived:
        name, _, rest = spec.partition("=")
        rest, *extra = rest.split(",")
        model, _, num_ctx = rest.rpartition(":")
        parameters, adapter = _runner_parameters(extra)
        if model not in by_name or not num_ctx.isdigit() or parameters is None:
            raise SystemExit(f"--derived {spec}: want NAME=MODEL:NUM_CTX[,KEY=VALUE...], "
                             f"MODEL in the catalog, KEY one of {', '.join(RUNNER_KEYS)} "
                             "or adapter")
        added.append(replace(by_name[model], name=name, modelfile_num_ctx=int(num_ctx),
                             system=f"You are {name}.", parameters=parameters,
                             adapter=sha256_hex(adapter) if adapter else ""))
    return (*models, *added)


RUNNER_KEYS = ("num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread")


def _runner_parameters(pairs: list[str]) -> tuple[tuple[tuple[str, int | bool], ...] | None,
                                                  str]:
    """KEY=VALUE runner PARAMETERs (None when one is not) and an adapter's name."""
    out: list[tuple[str, int | bool]] = []
    adapter = ""
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key == "adapter" and value:
            adapter = value
        elif key == "use_mmap" and value in ("true", "false"):
            out.append((key, value == "true"))
        elif key in RUNNER_KEYS and value.lstrip("-").isdigit():
            out.append((key, int(value)))
        else:
            return None, ""
    return tuple(out), adapter


def configs_from(argv: list[str] | None) -> list[SimConfig]:
    """The GPUs a command line asks for."""
    args = _parse_args(argv)
    if args.fleet:
        configs = demo_fleet(args.time_scale)
    else:
        gpus = max(args.gpus, 1)
        configs = [SimConfig(name=args.name, total_vram_mib=args.vram * gpus, models=CATALOG,
                             gpu_count=gpus, sched_spread=args.sched_spread,
                             fit_target_mib=args.fit_target, gpu_overhead_mib=args.gpu_overhead,
                             num_parallel=args.parallel, context_length=args.context,
                             max_loaded_models=args.max_loaded,
                             kv_cache_type=args.kv_cache_type, max_queue=args.max_queue,
                             flash_attention=None if args.flash_attention is None
                             else args.flash_attention == "on",
                             gpu_flash_attention=not args.no_gpu_flash_attention,
                             version=args.version, new_engine=args.new_engine,
                             tokens_per_s=args.tokens_per_s, time_scale=args.time_scale)]
    if args.alias:
        configs = [replace(c, models=with_aliases(c.models, args.alias)) for c in configs]
    if args.derived:
        configs = [replace(c, models=with_derived(c.models, args.derived)) for c in configs]
    stubs = tuple(sim_cloud.CloudStub(*s.split("=", 1)) for s in args.cloud_stub
                  if "=" in s)
    if stubs or args.no_cloud:
        configs = [replace(c, cloud_stubs=stubs, no_cloud=args.no_cloud) for c in configs]
    return [sharing_from(args, config) for config in configs]


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s.%(msecs)03d %(message)s",
                        datefmt="%H:%M:%S")
    servers = start_fleet(configs_from(argv), args.host, args.port)
    for s in servers:
        c = s.config
        gpus = f" on {c.gpu_count} GPUs" if c.gpu_count > 1 else ""
        print(f"{c.name}: {s.url}  ({c.total_vram_mib} MiB{gpus})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    for s in servers:
        s.stop()


if __name__ == "__main__":
    main()
