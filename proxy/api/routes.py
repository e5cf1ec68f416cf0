"""FastAPI routes: Ollama's API on the outside, the call service and the relay inside."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.requests import ClientDisconnect
from starlette.responses import PlainTextResponse, Response

from proxy.api import gojson, layers, transcription, wire
from proxy.api.capabilities import call_needs, embeds
from proxy.api.errors import (
    JSON,
    Dialect,
    dialect_of,
    error_response,
    install_error_shapes,
    provider_refusal,
)
from proxy.api.relay import TRUNCATING_PATHS, Reshape, engine_error, forward
from proxy.core import engines
from proxy.core.affinity import shared_prompt_size
from proxy.core.context import NEWEST, Version, parse_version
from proxy.core.models import (
    CLOUD_SOURCE,
    INVALID_MODEL_NAME,
    SOURCE_SUFFIXES_SINCE,
    model_name,
    normalise_model,
    not_found,
    ollama_name_parts,
    resolve_model,
    split_source,
)
from proxy.core.tokens import (
    PromptSize,
    answers_tool_result,
    conversation_digests,
    longest_input_size,
    prompt_size,
)
from proxy.observability.logging import get_logger
from proxy.observability.metrics import Metrics
from proxy.ports import ModelEntry, ModelServer, UpstreamError
from proxy.service.codec import parse_rfc3339, rfc3339
from proxy.service.routing import NO_PROMPT, CallRequest, Calls, Granted, ProviderPool

log = get_logger("kubemoot.api")
W = TypeVar("W", bound=BaseModel)
VERSION_RETRY_S = 5  # about two probe rounds: when a provider comes back, it has been seen
# Model management, with the CLI command that does on one Ollama what each path would.
MODEL_COMMANDS = {"/api/push": "ollama push <model>",
                  "/api/create": "ollama create <model> -f <Modelfile>",
                  "/api/copy": "ollama cp <source> <destination>",
                  "/api/delete": "ollama rm <model>",
                  "/api/blobs": "ollama create <model> -f <Modelfile>"}  # a create's files
MODEL_MANAGEMENT = tuple(MODEL_COMMANDS)
# What Ollama's cloud answers through a provider's Ollama, signed in with its key: the account
# (`ollama signin` checks it, and `ollama run` before a cloud model, cmd/cmd.go:566), a web
# search or fetch (0.18+), and the models Ollama recommends (0.24+, `ollama launch`)
THROUGH_GATEWAY = {"/api/me": "POST", "/api/experimental/web_search": "POST",
                   "/api/experimental/web_fetch": "POST",
                   "/api/experimental/model-recommendations": "GET"}


# Before 0.18 (writeModelRefParseError's 400 `invalid model name`), each handler answered a
# name it cannot parse in its own words (v0.17.7, v0.12.6 server/routes.go): generate
# (:199-203) and embed (:695-697) a 404 `model '...' not found`, chat (:1998-2000) and the
# legacy embeddings (:842-844) a 400 `model is required`; the other dialects as the handler
# they go through. Show's is `invalid model name` on every version.
UNPARSABLE_BEFORE_0_18 = {"/api/generate": 404, "/v1/completions": 404, "/api/embed": 404,
                          "/v1/embeddings": 404, "/api/chat": 400, "/v1/chat/completions": 400,
                          "/v1/responses": 400, "/v1/messages": 400, "/api/embeddings": 400}
PHASES = ("mulling", "triage")
WAIT_VALUES = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def call_headers(request: Request, default_can_wait: bool) -> tuple[str, str | None, bool]:
    """The call's phase, thread and whether it can wait, from its X-Kubemoot-* headers (an
    empty header is an absent one); a value the contract does not list is refused rather than
    read as the default, so a typo cannot silently change where the call goes."""
    phase = request.headers.get("x-kubemoot-phase", "").strip().lower() or "mulling"
    if phase not in PHASES:
        raise wire.BadRequest(f"header 'X-Kubemoot-Phase': {phase!r} is not a phase; "
                              f"use one of {', '.join(PHASES)}", "X-Kubemoot-Phase")
    thread = request.headers.get("x-kubemoot-thread", "").strip() or None
    if thread is not None and len(thread) > wire.MAX_ID_LENGTH:
        raise wire.BadRequest(f"header 'X-Kubemoot-Thread': a thread id is at most "
                              f"{wire.MAX_ID_LENGTH} characters", "X-Kubemoot-Thread")
    return phase, thread, can_wait_header(request, default_can_wait)


def can_wait_header(request: Request, default: bool) -> bool:
    """Whether the call may wait for a GPU: its X-Kubemoot-Wait header, else `default` (the
    role's). A role whose calls never wait (coordinator) is not overruled by a header."""
    wait = request.headers.get("x-kubemoot-wait", "").strip().lower()
    if wait and wait not in WAIT_VALUES:
        raise wire.BadRequest(f"header 'X-Kubemoot-Wait': {wait!r} is not true or false "
                              f"(also taken: yes, no, 1, 0)", "X-Kubemoot-Wait")
    return default and WAIT_VALUES[wait] if wait else default


class RequestTooLarge(Exception):
    pass


BODY_TIMEOUT_S = 30.0  # a request's whole body, once its head is in


class BodyTooSlow(Exception):
    pass


async def read_capped(request: Request, cap: int) -> bytes:
    """The request body, refusing anything over `cap` bytes without reading it all, or that
    takes longer than BODY_TIMEOUT_S to arrive."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and \
            int(declared) > cap:
        raise RequestTooLarge
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise RequestTooLarge
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTooSlow from None
    return b"".join(chunks)


async def _disconnect(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# Where each path caps the answer, as Ollama turns it into num_predict: its own API's
# `options.num_predict`; OpenAI's chat and completions `max_tokens` (openai/openai.go:657,
# 806); the Responses API's `max_output_tokens` (responses.go:572); Anthropic's `max_tokens`
# (anthropic.go:337). Any other field is not read there (OpenAI's `max_completion_tokens`,
# a `max_tokens` on Ollama's own API or on the Responses API, `options` on the others): the
# answer is not capped by it.
ANSWER_CAPS = {"/v1/chat/completions": "max_tokens", "/v1/completions": "max_tokens",
               "/v1/responses": "max_output_tokens", "/v1/messages": "max_tokens"}


# The paths some Ollama versions do not have (their router's 404), with the versions that
# do, each from the first and before the second: the Responses API from 0.13.3, Anthropic's
# messages from 0.14.0, audio transcriptions on 0.20-0.24 and from 0.30
SERVED_IN: dict[str, tuple[tuple[Version, Version | None], ...]] = {
    "/v1/responses": (((0, 13, 3), None),), "/v1/messages": (((0, 14, 0), None),),
    transcription.PATH: transcription.SERVED}


def _dotted(version: Version) -> str:
    return ".".join(map(str, version))


# A body larger than this is read, checked and measured in a worker thread, a piece at a
# time: done on the event loop, 20 MB of small messages stalled every other call for seconds,
# and Go's words for 900 KB of cut function-call arguments (gojson) took 60 ms.
OFF_LOOP_BYTES = 256 << 10
R = TypeVar("R")
# What placement needs of a body's prompt: its size, its conversation's digests, the size of
# what its calls share, and whether its answer ends an agent's tool loop
Measured = tuple[PromptSize, tuple[int, ...], PromptSize, bool]


async def off_loop(large: bool, fn: Callable[..., R], *args: Any) -> R:
    """fn(*args): in a worker thread for a large body, so the event loop keeps serving the
    other calls meanwhile."""
    return await asyncio.to_thread(fn, *args) if large else fn(*args)


# From 0.30.7 a listed model's OpenAI id is its tags entry's `model`, else its `name`
# (openai/openai.go ToListCompletion, commit e09b3f9fb); before, its `name`
LISTED_BY_MODEL_SINCE: Version = (0, 30, 7)


def listed_id(entry: dict[str, Any], version: Version) -> str:
    """The id Ollama's /v1/models gives an /api/tags entry, as written there."""
    named = entry.get("model") if version >= LISTED_BY_MODEL_SINCE else None
    return str(named or entry.get("name") or "")


def measure(body: dict[str, Any], parsed: wire.Inference | None = None,
            version: Version = NEWEST) -> Measured:
    """What placement needs of the body's prompt (see `Measured`): an embedding's longest
    input, else everything that ends up in the prompt of the providers' Ollama `version` and
    its conversation (a chat's, when the body is not parsed: explain's)."""
    if isinstance(parsed, wire.EMBEDDINGS):
        return longest_input_size(body), (), NO_PROMPT, False
    size, conversation = prompt_size(body, version), conversation_digests(body)
    if not conversation:
        return size, conversation, NO_PROMPT, False
    return size, conversation, shared_prompt_size(body), answers_tool_result(body)


def nested_structs(parsed: object) -> wire.Shape:
    """The nested structs Ollama decodes a body into, by its schema or checked fields."""
    if parsed is wire.AnthropicMessages or isinstance(parsed, wire.AnthropicMessages):
        return wire.ANTHROPIC_NESTED_STRUCTS
    if parsed is wire.OpenAIResponses or isinstance(parsed, wire.OpenAIResponses):
        return wire.RESPONSES_NESTED_STRUCTS
    return wire.NESTED_STRUCTS


def answer_cap(path: str | None, body: dict[str, Any]) -> int:
    """The call's cap on its answer in tokens, from the field Ollama reads on `path`
    (ANSWER_CAPS); with no path (explain's body, of whichever dialect), the first of them
    the body has. 0 none (Ollama's -1 and -2 mean none too)."""
    options = body.get("options")
    native = options.get("num_predict") if isinstance(options, dict) else None
    if path is None:
        values = [native, *(body.get(key) for key in dict.fromkeys(ANSWER_CAPS.values()))]
    else:
        values = [body.get(ANSWER_CAPS[path]) if path in ANSWER_CAPS else native]
    return next((int(v) for v in values
                 if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 2**31),
                0)


def unix_time(stamp: Any) -> int:
    """An RFC 3339 time as Unix seconds (OpenAI's `created`); 0 when absent or unreadable."""
    try:
        return int(parse_rfc3339(stamp)) if isinstance(stamp, str) else 0
    except ValueError:
        return 0


def latest_first(entries: list[dict[str, Any]], field: str) -> list[dict[str, Any]]:
    """`entries` as Ollama orders a list of its own: by the Unix second of their time
    `field`, latest first, a stable sort (an unreadable time last), whatever time zone each
    provider writes."""
    def second(entry: dict[str, Any]) -> int:
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            return int(parse_rfc3339(str(entry.get(field))))
        return -(2 ** 63)

    return sorted(entries, key=second, reverse=True)


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


class SidecarApi:
    """The HTTP surface. Everything it needs is handed in by the composition root."""

    def __init__(self, *, calls: Calls, pool: ProviderPool,
                 holders: Callable[[str], list[str]],
                 unload: Callable[[str], Awaitable[list[str]]], metrics: Metrics,
                 max_request_bytes: int, chunk_timeout_s: float, default_can_wait: bool,
                 readiness: Callable[[], bool], shared_state: Callable[[], str],
                 prompt_tokens: Callable[[CallRequest], int],
                 probed_version: Callable[[], str | None] = lambda: None,
                 probed_versions: Callable[[], Collection[str]] = frozenset,
                 unreachable: Callable[[], Collection[str]] = frozenset) -> None:
        self.calls = calls
        self.pool = pool
        self.holders = holders
        self.unreachable = unreachable  # providers whose last probe found them down
        self.unload = unload
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes
        self.chunk_timeout_s = chunk_timeout_s
        self.default_can_wait = default_can_wait
        self.readiness = readiness
        self.shared_state = shared_state  # embedded, connected, or unavailable
        self.prompt_tokens = prompt_tokens  # the placement's own estimate of a prompt
        self.probed_version = probed_version  # what the prober last heard, if anything
        self.probed_versions = probed_versions  # every provider's, as last heard
        self.last_version: str | None = None  # the newest a provider told this endpoint

    def mount(self, app: FastAPI) -> None:
        # Plain Starlette routes: the handlers read the request themselves, so FastAPI's
        # per-request dependency machinery would only add latency on the hot path.
        add = app.router.add_route
        # The placed paths first: routes are matched in order, and these carry the load.
        for path, schema in wire.PLACED.items():
            add(path, self._inference(path, schema), methods=["POST"])
        add("/", self.root, methods=["GET", "HEAD"])
        add("/api/version", self.version, methods=["GET", "HEAD"])
        add("/api/tags", self.tags, methods=["GET", "HEAD"])
        add("/api/ps", self.ps, methods=["GET"])
        _without_head(app)
        add("/api/status", self.status, methods=["GET"])
        _without_head(app)
        add("/api/show", self.show, methods=["POST"])
        add("/api/pull", self.pull, methods=["POST"])
        for path in MODEL_MANAGEMENT:
            add(path, self.not_here, methods=["POST", "DELETE"])
        add("/api/blobs/{digest}", self.not_here, methods=["POST", "HEAD"])
        for path, method in THROUGH_GATEWAY.items():
            add(path, self.through_gateway, methods=[method])
            _without_head(app)
        add("/api/signout", self.not_signed_here, methods=["POST"])
        add("/api/user/keys/{key:path}", self.not_signed_here, methods=["DELETE"])
        add(transcription.PATH, self.transcribe, methods=["POST"])
        add("/v1/messages/count_tokens", self.count_tokens, methods=["POST"])
        add("/v1/models", self.openai_models, methods=["GET"])
        _without_head(app)
        # gin's `:model` takes one path segment (routes.go `/v1/models/:model`): a name with
        # a slash, `%2F` or not (gin reads the decoded path), is its router's 404
        add("/v1/models/{model}", self.openai_model, methods=["GET"])
        _without_head(app)
        add("/healthz", self.healthz, methods=["GET"])
        add("/readyz", self.readyz, methods=["GET"])
        add("/metrics", self.prometheus, methods=["GET"])
        app.add_exception_handler(404, self.not_found)
        install_error_shapes(app)

    # -- simple endpoints ------------------------------------------------------------------
    async def root(self, request: Request) -> Response:
        return PlainTextResponse("Ollama is running")

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        shared = self.shared_state()
        if self.readiness():
            return _json({"status": "ready", "sharedState": shared})
        # in the error shape every refusal has (CONTRACT.md), beside the probe's fields
        return _json({"status": "not ready", "error": "no provider can take calls and no "
                      "static endpoint is set (KUBEMOOT_MODEL_ENDPOINT)",
                      "reason": "no-provider", "sharedState": shared}, 503)

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def version(self, request: Request) -> Response:
        """The first provider's version; when none answers, the version one reported last
        (here or to the prober); when none ever did, 503: a made-up version would tell a
        client something no server said."""
        for _, client in self._answering():
            try:
                version = await client.version(2.0)
            except UpstreamError:
                continue
            if version:
                self.last_version = version
                return _json({"version": version})
        known = self.last_version or self.probed_version()
        if known:
            return _json({"version": known})
        return error_response(503, "no-provider", "no provider has answered the sidecar yet, "
                              "so there is no Ollama version to report", retry_after_s=
                              VERSION_RETRY_S)

    async def status(self, request: Request) -> Response:
        """Whether cloud models run (Ollama's /api/status, from 0.17): the answer of the
        provider the sidecar sends cloud calls through, whose settings are the ones that hold
        (else the next one's)."""
        for _, client in self._gateway_first():
            try:
                answer = await client.fetch("/api/status", 2.0)
            except UpstreamError:
                continue
            if answer.status_code < 400:
                return Response(answer.content, media_type=JSON)
        return error_response(404, "not-found", "no provider answered GET /api/status "
                              "(Ollama serves it from 0.17)")

    def _answering(self) -> list[tuple[str, ModelServer]]:
        """The providers to ask a question all of them may answer (`/api/tags`, `/api/ps`,
        the version): those known down are left out, so that one dead card does not hold
        every such answer for its timeout; all of them when every one is."""
        everything = self.pool.everything()
        down = self.unreachable()
        return [(n, c) for n, c in everything if n not in down] or everything

    def _gateway_first(self) -> list[tuple[str, ModelServer]]:
        """The providers, the one the sidecar reaches Ollama's cloud through first
        (core/cloud.py `gateway`), then the others in configured order."""
        first = self.calls.cloud_gateway()
        return sorted(self._answering(), key=lambda entry: entry[0] != first)

    async def through_gateway(self, request: Request) -> Response:
        """The provider's answer, as it came (a 401 `signin_url` included), from the one the
        sidecar sends cloud calls through: it is that Ollama's key they are signed with. The
        next provider only when it cannot be reached."""
        path = request.url.path
        raw = b""
        if request.method == "POST":
            read = await self._read_raw(request, "ollama")
            if isinstance(read, Response):
                return read
            raw = read
        for _, client in self._gateway_first():
            try:
                answer = await (client.post(path, raw, client.timeouts.first_byte_s)
                                if request.method == "POST" else
                                client.fetch(path, client.timeouts.first_byte_s))
            except UpstreamError:
                continue
            return Response(answer.content, status_code=answer.status_code,
                            media_type=answer.media_type)
        return error_response(502, "upstream-failed",
                              f"no provider answered {request.method} {path}")

    async def not_signed_here(self, request: Request) -> Response:
        return error_response(
            501, "not-supported",
            f"{request.url.path} signs one Ollama out of ollama.com; the sidecar fronts many, "
            f"so run it against each provider directly (OLLAMA_HOST=<provider> ollama signout)")

    async def _gather(self, listing: Callable[[ModelServer], Awaitable[list[ModelEntry]]]
                      ) -> list[tuple[str, list[ModelEntry]]]:
        """Each provider's models as `listing` asks for them; those that did not answer are
        left out."""
        targets = self._answering()
        results = await asyncio.gather(*(listing(c) for _, c in targets),
                                       return_exceptions=True)
        return [(name, r) for (name, _), r in zip(targets, results, strict=True)
                if isinstance(r, list)]

    async def _provider_models(self) -> dict[str, dict[str, Any]]:
        """Every provider's `/api/tags` entries, one per model name."""
        seen: dict[str, dict[str, Any]] = {}
        for _, listed in await self._gather(lambda c: c.tags(3.0)):
            for model in listed:
                seen.setdefault(model_name(model), model)
        return seen

    async def _on_a_provider(self, model: str) -> bool:
        """Whether some provider has the model: its fresh state says so, else its
        `/api/tags`. True when no provider answered: nothing says the model is missing."""
        if self.holders(model):
            return True
        gathered = await self._gather(lambda c: c.tags(3.0))
        return not gathered or any(normalise_model(model) in map(model_name, listed)
                                   for _, listed in gathered)

    async def tags(self, request: Request) -> Response:
        # As each Ollama lists its own: the most recently modified first
        # (server/model_list_cache.go:866-869; v0.12.6 server/routes.go:1219-1222)
        return _json({"models": latest_first(list((await self._provider_models()).values()),
                                             "modified_at")})

    async def ps(self, request: Request) -> Response:
        models = []
        for provider, listed in await self._gather(lambda c: c.ps(3.0)):
            for model in listed:
                models.append({**model, "provider": provider})
        # As each Ollama lists its own: the longest time left first (server/routes.go:2297-2300)
        return _json({"models": latest_first(models, "expires_at")})

    def engine_version(self) -> Version:
        """The Ollama version whose first checks a body gets: the one the providers last
        reported, the newest rules when none has yet."""
        return parse_version(self.probed_version() or self.last_version or "")

    def fleet_versions(self) -> list[Version]:
        """Every Ollama version the providers last reported, oldest first; the one version
        of `engine_version` when none has."""
        heard = sorted({parse_version(v) for v in self.probed_versions() if v})
        return heard or [self.engine_version()]

    async def _read(self, request: Request, schema: type[W], dialect: Dialect = "ollama"
                    ) -> tuple[dict[str, Any], W] | Response:
        """The request's body and its checked fields, or the error answer (413, 400)."""
        raw = await self._read_raw(request, dialect)
        if isinstance(raw, Response):
            return raw
        body: dict[str, Any] | None = None
        try:
            if request.url.path in wire.ZSTD_PATHS and \
                    request.headers.get("content-encoding") == "zstd":
                raw = await asyncio.to_thread(wire.decompress_zstd, raw)
            large = len(raw) > OFF_LOOP_BYTES
            request.state.large_body = large
            body = await off_loop(large, gojson.parse_request_body, raw, request.url.path)
            # the body sizing and checks read (what is sent on stays `body`)
            view = request.state.go_view = await off_loop(
                large, wire.nested_as_go_binds, body, nested_structs(schema))
            check = request.state.body_check = wire.BodyCheck(schema, view)
            parsed, request.state.refused_by = await off_loop(
                large, wire.validate_in_fleet, schema, view, self.fleet_versions(), check)
            return body, parsed
        except wire.BadRequest as exc:
            named = wire.named_model(body, also_name="name" in schema.model_fields)
            older = self._unparsable(request.url.path, named, dialect) \
                if str(exc) == INVALID_MODEL_NAME else None
            return older or self._bad_request(exc, dialect, named)

    async def _read_raw(self, request: Request, dialect: Dialect) -> bytes | Response:
        """The request's body as it came, or the error answer (413, 408)."""
        try:
            return await read_capped(request, self.max_request_bytes)
        except BodyTooSlow:
            return error_response(408, "request-timeout", f"the request's body did not "
                                  f"arrive within {BODY_TIMEOUT_S:.0f} s", dialect=dialect)
        except RequestTooLarge:
            return error_response(413, "request-too-large",
                                  f"request body exceeds the sidecar's limit of "
                                  f"{self.max_request_bytes} bytes (KUBEMOOT_MAX_REQUEST_BYTES)",
                                  dialect=dialect)
        except ClientDisconnect:  # gone before its body arrived: nobody to answer
            log.info("client went away while sending its request", path=request.url.path)
            return Response(status_code=499)

    def _unparsable(self, path: str, model: str | None, dialect: Dialect) -> Response | None:
        """Before 0.18 each handler refused a name Ollama cannot parse in its own words
        (`UNPARSABLE_BEFORE_0_18`); None: the `invalid model name` of every other case."""
        status = UNPARSABLE_BEFORE_0_18.get(path)
        if status is None or model is None or self.engine_version() >= SOURCE_SUFFIXES_SINCE:
            return None
        if status == 404:
            return error_response(404, "model-not-found", not_found(model), model,
                                  dialect=dialect)
        self.metrics.refusals.labels("bad-request").inc()
        return error_response(400, "bad-request", "model is required", model, dialect=dialect)

    def _bad_request(self, exc: wire.BadRequest, dialect: Dialect, model: str | None
                     ) -> Response:
        self.metrics.refusals.labels("bad-request").inc()
        return error_response(400, "bad-request", str(exc), model, dialect=dialect)

    async def show(self, request: Request) -> Response:
        read = await self._read(request, wire.ShowRequest)
        if isinstance(read, Response):
            return read
        body, show = read
        model = show.model or show.name
        if not model:  # Ollama's words (server/routes.go ShowHandler, 0.12.6 and 0.24.0)
            self.metrics.refusals.labels("bad-request").inc()
            return error_response(400, "bad-request", "model is required")
        holders = self.holders(model)
        candidates = [self.pool.clients[h] for h in holders] or [
            c for _, c in self._answering()]
        last: Response | None = None
        for client in candidates:
            try:
                # metadata read from disk: the first-byte limit, not a whole answer's
                upstream = await client.show(body, client.timeouts.first_byte_s)
            except UpstreamError:
                continue
            if upstream.status_code < 400:
                return Response(upstream.content, status_code=upstream.status_code,
                                media_type=JSON)
            message = engine_error(upstream.content)
            if upstream.status_code < 500:  # the provider's own refusal (e.g. 404): relayed
                last = Response(provider_refusal(upstream.status_code, message, model),
                                status_code=upstream.status_code, media_type=JSON)
            elif last is None:
                last = error_response(502, "upstream-failed", f"a provider failed /api/show "
                                      f"({upstream.status_code}: {message})", model)
        return last or error_response(502, "upstream-failed",
                                      "no provider answered /api/show", model)

    async def pull(self, request: Request) -> Response:
        """A pull of a model the providers already have succeeds at once (agents often pull
        before their first call); the sidecar never downloads to the GPUs itself."""
        read = await self._read(request, wire.PullRequest)
        if isinstance(read, Response):
            return read
        pull = read[1]
        model = pull.model or pull.name
        if not model:  # no name is one Ollama cannot parse (server/routes.go PullHandler:
            # 0.24.0 parseNormalizePullModelRef's ErrModelRequired falls back to these words)
            self.metrics.refusals.labels("bad-request").inc()
            return error_response(400, "bad-request", "invalid model name")
        # a cloud model needs no pull where the providers send its calls on (Ollama 0.18+); a
        # stub is among the models they list
        cloud = split_source(model)[1] == CLOUD_SOURCE and \
            self.engine_version() >= SOURCE_SUFFIXES_SINCE
        if not cloud and resolve_model(model, listed := await self._provider_models()) \
                not in listed:
            return error_response(
                501, "not-supported",
                f"model '{model}' is on no provider, and the sidecar does not download models "
                f"to GPUs; pull it on each provider (OLLAMA_HOST=<provider> ollama pull "
                f"{model})", model)
        if pull.stream is False:
            return _json({"status": "success"})
        lines = b"".join(orjson.dumps({"status": s}) + b"\n"
                         for s in ("pulling manifest", "success"))
        return Response(lines, media_type="application/x-ndjson")

    async def not_here(self, request: Request) -> Response:
        path = request.url.path
        command = MODEL_COMMANDS[path.rsplit("/", 1)[0] if "digest" in request.path_params
                                 else path]
        return error_response(
            501, "not-supported",
            f"{path} changes one Ollama's model store; the sidecar fronts many GPUs, so run "
            f"it against each provider directly (OLLAMA_HOST=<provider> {command})")

    async def not_found(self, request: Request, exc: Exception) -> Response:
        path = request.url.path
        hint = ("; Ollama's /v1/models/{model} takes a name without '/', so a namespaced "
                "model is known only from the list (GET /v1/models)"
                if path.startswith("/v1/models/") else "")
        return error_response(
            404, "not-found",
            f"{request.method} {path} is not served by the sidecar{hint}; it serves "
            "Ollama's /api/*, OpenAI's /v1/chat/completions, /v1/completions, /v1/responses, "
            "/v1/embeddings, /v1/audio/transcriptions and /v1/models, Anthropic's "
            "/v1/messages and /v1/messages/count_tokens, and its own /kubemoot/v1/* "
            "(explain, plans, state, events), /kubemoot/ui, /metrics, /healthz and /readyz",
            dialect=dialect_of(request.url.path))

    @staticmethod
    def _openai_model(name: str, entry: dict[str, Any]) -> dict[str, Any]:
        """Ollama's OpenAI model object: `owned_by` is the name's namespace, "library" for a
        plain name (openai/openai.go:462 ToListCompletion, :519 ToModel)."""
        return {"id": name, "object": "model", "created": unix_time(entry.get("modified_at")),
                "owned_by": ollama_name_parts(name)["namespace"]}

    async def openai_models(self, request: Request) -> Response:
        models, version = await self._provider_models(), self.engine_version()
        return _json({"object": "list", "data": [
            self._openai_model(listed_id(e, version), e) for e in models.values()]})

    async def openai_model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if split_source(name)[1] == CLOUD_SOURCE and (cloud := await self._cloud_model(name)):
            return cloud
        models = await self._provider_models()
        key = resolve_model(name, models)
        if key not in models:
            return error_response(404, "model-not-found", not_found(name), name,
                                  dialect="openai")  # Ollama's ShowHandler's words
        return _json(self._openai_model(name, models[key]))  # ToModel: the name as asked

    async def _cloud_model(self, name: str) -> Response | None:
        """A cloud model's OpenAI model object, as the first provider that sends the
        question on to its cloud answers it (0.18+, cloud_proxy.go
        cloudModelPathPassthroughMiddleware); None when none does."""
        for _, client in self._answering():
            try:
                answer = await client.fetch(f"/v1/models/{name}", client.timeouts.first_byte_s)
            except UpstreamError:
                continue
            # the cloud's answer, or the refusal of a sign-in it lacks or a cloud turned off;
            # an Ollama before 0.18 has no such name (404, or 400 for a `:cloud` suffix)
            if answer.status_code < 400 or answer.status_code in (401, 403):
                return Response(answer.content, status_code=answer.status_code,
                                media_type=JSON)
        return None

    async def count_tokens(self, request: Request) -> Response:
        """Anthropic's token count, as the sidecar sizes the prompt to place it (the
        characters per token it has learned from this agent's answers)."""
        read = await self._read(request, wire.AnthropicMessages, "anthropic")
        if isinstance(read, Response):
            return read
        body, parsed = read
        body = request.state.go_view  # as Ollama binds its nested keys
        measured = await off_loop(getattr(request.state, "large_body", False), measure, body,
                                   parsed, self.engine_version())
        try:
            call = self.call_request(request, "/v1/messages", body, parsed, measured)
        except wire.BadRequest as exc:
            return self._bad_request(exc, "anthropic", parsed.model or None)
        return _json({"input_tokens": self.prompt_tokens(call)})

    # -- inference -------------------------------------------------------------------------
    def _inference(self, path: str, schema: type[wire.Inference]
                   ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            return await self._infer(request, path, schema)
        return handle

    def call_request(self, request: Request, path: str, body: dict[str, Any],
                     parsed: wire.Inference, measured: Measured | None = None) -> CallRequest:
        phase, thread, can_wait = call_headers(request, self.default_can_wait)
        size, conversation, shared, ends_loop = measured or measure(body, parsed)
        model, source = self.model_source(parsed.model)
        return CallRequest(
            path=path,
            model=model,
            source=source,
            phase=phase,
            thread=thread,
            can_wait=can_wait,
            prompt=size,
            # (Only Ollama's own API has options; on the others an `options` field is extra.)
            num_ctx=wire.requested_num_ctx(body) if dialect_of(path) == "ollama" else None,
            num_predict=answer_cap(path, body),
            context_tokens=len(parsed.context or ()) if path == "/api/generate" and
            isinstance(parsed, wire.OllamaInference) else 0,
            unloads_after=wire.zero_keep_alive(parsed),
            keep_alive_s=wire.keep_alive_seconds(parsed),
            cut_allowed=path in TRUNCATING_PATHS and body.get("truncate") is True,
            conversation=conversation,
            ends_loop_unless_tool_called=ends_loop,
            shared_prompt=shared,
            needs=call_needs(path, body, model or self.calls.bound_model(phase, thread),
                             self.engine_version()),
            embeds=embeds(path, body),
            served=SERVED_IN.get(path, ()),
            refused_by=getattr(request.state, "refused_by", ()),
            body_check=getattr(request.state, "body_check", None),
            disconnected=lambda: _disconnect(request),
            arrived=getattr(request.state, "arrived", None),
        )

    def _cloud_attempt(self, request: Request, path: str, parsed: wire.Inference
                       ) -> Granted | None:
        """How a provider's Ollama sends the call on to its cloud, None when it does not; a
        call whose headers are wrong is no such call (its 400 comes where it always has)."""
        model, source = self.model_source(parsed.model)
        try:
            phase, thread, _ = call_headers(request, self.default_can_wait)
        except wire.BadRequest:
            return None
        return self.calls.cloud_attempt(CallRequest(path, model, phase, thread, source=source))

    def model_source(self, name: str | None) -> tuple[str | None, str]:
        """The call's model and the source its name asks for (core/models.py split_source),
        as the providers' Ollama reads it."""
        if not name:
            return None, ""
        return split_source(name, self.engine_version() >= SOURCE_SUFFIXES_SINCE)

    async def _infer(self, request: Request, path: str, schema: type[wire.Inference]
                     ) -> Response:
        started = time.perf_counter()
        request.state.arrived = self.calls.clock.monotonic()  # (the wait limit's start)
        dialect = dialect_of(path)
        if missing := self._not_served(path, dialect):
            return missing
        read = await self._read(request, schema, dialect)
        if isinstance(read, Response):
            return read
        return await self._serve(request, path, *read, started, dialect)

    def _not_served(self, path: str, dialect: Dialect) -> Response | None:
        """Ollama's router's 404 for a path the providers' version does not have, answered
        before anything is read, as Ollama does (`SERVED_IN`); None where it is served."""
        ranges, versions = SERVED_IN.get(path), self.fleet_versions()
        # in a fleet of mixed versions the path is served where one has it: placement
        # then leaves the others out (core/engines.py path_refusal)
        if ranges is None or any(engines.serves(ranges, version) for version in versions):
            return None
        run = " and ".join(_dotted(version) for version in versions)
        return error_response(404, "not-found", f"POST {path} is served by Ollama "
                              f"{engines.served_words(ranges)}; the providers run {run}",
                              dialect=dialect)

    async def transcribe(self, request: Request) -> Response:
        """OpenAI's transcription form, served as the chat call Ollama makes of it
        (api/transcription.py) where the providers' Ollama serves the path."""
        started = time.perf_counter()
        request.state.arrived = self.calls.clock.monotonic()
        if missing := self._not_served(transcription.PATH, "openai"):
            return missing
        version = self.engine_version()
        raw = await self._read_raw(request, "openai")
        if isinstance(raw, Response):
            return raw
        large = request.state.large_body = len(raw) > OFF_LOOP_BYTES
        try:
            asked = await transcription.read_form(raw, request.headers, request.query_params)
            body = await off_loop(large, transcription.chat_body, asked, version)
            parsed = wire.validate(wire.OllamaInference, body, version)
        except (transcription.FormError, wire.BadRequest) as exc:
            return self._bad_request(wire.BadRequest(str(exc)), "openai", None)
        return await self._serve(request, "/api/chat", body, parsed, started, "openai",
                                 lambda chat: transcription.answer(chat, asked.response_format))

    async def _serve(self, request: Request, path: str, body: dict[str, Any],
                     parsed: wire.Inference, started: float, dialect: Dialect,
                     reshape: Reshape | None = None) -> Response:
        """A checked call placed and sent on: `path` is what the provider is asked, `dialect`
        the caller's, `reshape` what becomes of a complete answer before the caller has it."""
        large = getattr(request.state, "large_body", False)
        # A cloud call is sent on as it came: Ollama does so before the checks below
        # (server/routes.go 267-272, 308-362, before its option, unload, raw and input ones)
        cloud = self._cloud_attempt(request, path, parsed)
        view = getattr(request.state, "go_view", body)  # its nested keys as Ollama binds them
        if cloud is None and (wrong := await off_loop(large, self._layer_refusal, request,
                                                  path, view)):
            return self._bad_request(wire.BadRequest(wrong), dialect, wire.named_model(body))
        measured = await off_loop(large, measure, view, parsed, self.engine_version())
        try:
            call = self.call_request(request, path, view, parsed, measured)
        except wire.BadRequest as exc:
            return self._bad_request(exc, dialect, parsed.model or None)
        if cloud is not None:
            return await self._forward(call, path, body, parsed, started, dialect, reshape,
                                       cloud)
        if call.model and wire.asks_to_unload(parsed):
            return await self._unload(call.model, path, parsed.model or call.model)
        if wrong := await off_loop(large, layers.found_error, path, view):
            # Ollama looks for the model first (and unloads before this check): one no
            # provider has is the placement's 404
            model = call.model or self.calls.bound_model(call.phase, call.thread)
            if not model or await self._on_a_provider(model):
                return self._bad_request(wire.BadRequest(wrong), dialect, wire.named_model(body))
        return await self._forward(call, path, body, parsed, started, dialect, reshape)

    def _layer_refusal(self, request: Request, path: str, view: dict[str, Any]) -> str | None:
        """The 400 of the path's layer (api/layers.py) when every Ollama version of the
        fleet refuses the body so, in the words of the version that a body gets the first
        checks of; one some versions take goes to their cards (the body's BodyCheck, and
        `refused_by`, gain the layer's refusals)."""
        check: wire.BodyCheck[Any] | None = getattr(request.state, "body_check", None)
        if check is None:
            return layers.layer_error(path, view, self.engine_version())
        check.layer = functools.partial(layers.layer_error, path, view)
        versions = sorted(set(self.fleet_versions()), reverse=True)
        refused = {version: words for version in versions if (words := check(version))}
        if len(refused) == len(versions):
            return refused.get(self.engine_version()) or refused[versions[0]]
        request.state.refused_by = tuple(refused.items())
        return None

    async def _forward(self, call: CallRequest, path: str, body: dict[str, Any],
                       parsed: wire.Inference, started: float, dialect: Dialect,
                       reshape: Reshape | None, cloud: Granted | None = None) -> Response:
        if isinstance(parsed, wire.EMBEDDINGS):
            stream = False
        else:
            # Ollama's own API streams unless told not to; OpenAI's and Anthropic's only when asked.
            stream = parsed.stream is not False if dialect == "ollama" else bool(parsed.stream)
        return await forward(self.calls.attempts(call, started, cloud), path, body, stream,
                             self.chunk_timeout_s, dialect=dialect,
                             disconnected=call.disconnected, reshape=reshape)

    async def _unload(self, model: str, path: str, asked: str) -> Response:
        """Ollama's answer to an unload, after asking every provider that has the model; a
        model no provider has is Ollama's 404, which it answers before it looks for a copy
        to unload (server/routes.go:289 before :404 generate, :2485 before :2505 chat; v0.12.6
        :198 before :293, :1830 before :1840)."""
        if not await self._on_a_provider(model):
            return error_response(404, "model-not-found", f"model '{model}' not found", model)
        await self.unload(model)
        answer: dict[str, Any] = {"model": asked, "created_at": rfc3339(time.time()), "done": True,
                                  "done_reason": "unload"}
        if path == "/api/chat":
            answer["message"] = {"role": "assistant", "content": ""}
        else:
            answer["response"] = ""
        return _json(answer)


def _without_head(app: FastAPI) -> None:
    """The route just added answers GET alone: Starlette adds HEAD to every GET route, and
    Ollama's router answers HEAD only on /, /api/version and /api/tags (405 elsewhere,
    server/routes.go:1870-1887)."""
    route = app.router.routes[-1]
    methods = getattr(route, "methods", None)
    if methods is not None:
        methods.discard("HEAD")
