"""HTTP adapter for one Ollama server: one pooled client per provider.

httpx is the client API; its transport is aiohttp (httpx-aiohttp): a forwarded call costs
~0.5 ms of CPU on it against ~0.8 ms on httpx's own pool (BENCHMARKS.md §4). Foreign
exceptions are translated here into the port's `UpstreamError`, so the rest of the program
sees neither library.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from proxy.core.engine_errors import body_excerpt
from proxy.ports import ModelEntry, ShowAnswer, Timeouts, UpstreamError

JSON_HEADERS = {"content-type": "application/json"}
# Streams are relayed byte for byte: ask for them uncompressed (aiohttp would offer gzip).
CALL_HEADERS = {**JSON_HEADERS, "accept-encoding": "identity"}
# What either layer may raise: httpx-aiohttp maps most aiohttp errors, not all of them.
TRANSPORT_ERRORS = (httpx.HTTPError, aiohttp.ClientError)


# What an operator reads in an error, for the transport failures that have a plain name.
CUT_OFF = (aiohttp.ClientPayloadError, httpx.ReadError)
HUNG_UP = (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError)


def describe(exc: BaseException) -> str:
    """The root cause in a few words, without the client libraries' internals: httpx-aiohttp
    re-raises aiohttp's errors under coarse httpx names (a refused connection arrives as
    ConnectTimeout), so the original is named."""
    cause = exc.__cause__ if isinstance(exc, httpx.HTTPError) and exc.__cause__ else exc
    if isinstance(cause, TimeoutError | httpx.TimeoutException):
        return "timed out"
    if isinstance(cause, CUT_OFF):
        return "the connection closed before the answer was complete"
    if isinstance(cause, HUNG_UP):
        return "the server disconnected"
    if isinstance(cause, aiohttp.ClientConnectorError):
        return f"cannot connect ({cause.strerror or 'connection failed'})"
    text = str(cause)
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def _hung_up_before_answering(exc: BaseException) -> bool:
    """The server closed the connection without a status line. On a kept-alive connection
    that is most often the race with the server's idle timeout (uvicorn closes after 5 s;
    proxies and meshes have their own). Nothing was answered, so one fresh try is safe: at
    worst the engine sees the call twice, the first one abandoned."""
    cause = exc.__cause__ if isinstance(exc, httpx.HTTPError) and exc.__cause__ else exc
    return isinstance(cause, HUNG_UP)


class OllamaResponse:
    """An answer whose status and headers are in and whose body may still be streaming
    (the port's UpstreamResponse)."""

    __slots__ = ("_response", "content_type", "status_code")

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status_code = response.status_code
        self.content_type: str | None = response.headers.get("content-type")

    async def read(self) -> bytes:
        try:
            return await self._response.aread()
        except TRANSPORT_ERRORS as exc:
            raise UpstreamError(describe(exc), before_first_byte=False) from exc

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, chunk by chunk, undecoded."""
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except TRANSPORT_ERRORS as exc:
            raise UpstreamError(describe(exc), before_first_byte=False) from exc

    async def aclose(self) -> None:
        """Close the stream; mid-body this drops the connection, which stops Ollama."""
        await self._response.aclose()


class OllamaClient:
    """Talks to one Ollama endpoint. Cheap to share; close() at shutdown."""

    def __init__(self, endpoint: str, timeouts: Timeouts | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeouts = timeouts or Timeouts()
        t = self.timeouts
        # The relay bounds a call itself (the first byte of a stream, the whole of a complete
        # answer, the silence between chunks); read is only the outer limit.
        timeout = httpx.Timeout(connect=t.connect_s, read=max(t.first_byte_s, t.answer_s),
                                write=t.connect_s, pool=t.first_byte_s)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        self._transport = transport or AiohttpTransport(limits=limits)
        # Providers are called directly, never through HTTP(S)_PROXY from the environment.
        self._client = httpx.AsyncClient(base_url=self.endpoint, timeout=timeout,
                                         transport=self._transport, trust_env=False)
        self._call_extensions = {"timeout": timeout.as_dict()}
        self._urls: dict[str, httpx.URL] = {}

    async def close(self) -> None:
        await self._client.aclose()

    async def open(self, path: str, payload: bytes) -> OllamaResponse:
        """POST and return once the status line and headers are in (body still streaming).

        The hot path goes to the transport directly: the client's cookie, auth, redirect and
        URL-merging layers cost ~0.1 ms per call and an Ollama server needs none of them.
        """
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.endpoint + path)
        for attempt in (1, 2):
            request = httpx.Request("POST", url, content=payload, headers=CALL_HEADERS,
                                    extensions=self._call_extensions)
            try:
                return OllamaResponse(await self._transport.handle_async_request(request))
            except TRANSPORT_ERRORS as exc:
                if attempt == 1 and _hung_up_before_answering(exc):
                    continue  # most likely a pooled connection the server had just closed
                raise UpstreamError(f"{self.endpoint}{path}: {describe(exc)}") from exc
        raise AssertionError("unreachable")

    async def version(self, timeout_s: float | None = None) -> str | None:
        data = await self._object("/api/version", timeout_s)
        version = data.get("version")
        return version if isinstance(version, str) and version else None

    async def ps(self, timeout_s: float | None = None) -> list[ModelEntry]:
        return list((await self._object("/api/ps", timeout_s)).get("models") or [])

    async def fetch(self, path: str, timeout_s: float | None = None) -> ShowAnswer:
        return _answer(await self._request("GET", path, None, timeout_s))

    async def post(self, path: str, content: bytes, timeout_s: float | None = None
                   ) -> ShowAnswer:
        return _answer(await self._request("POST", path, content, timeout_s))

    async def tags(self, timeout_s: float | None = None) -> list[ModelEntry]:
        return list((await self._object("/api/tags", timeout_s)).get("models") or [])

    async def _object(self, path: str, timeout_s: float | None) -> dict[str, Any]:
        data = await self._get_json(path, timeout_s)
        if not isinstance(data, dict):
            raise UpstreamError(f"{self.endpoint}{path}: response is not a JSON object")
        return data

    async def _get_json(self, path: str, timeout_s: float | None = None) -> Any:
        return await self._json("GET", path, None, timeout_s)

    async def _post_json(self, path: str, body: dict[str, Any],
                        timeout_s: float | None = None) -> Any:
        return await self._json("POST", path, body, timeout_s)

    async def _json(self, method: str, path: str, body: dict[str, Any] | None,
                    timeout_s: float | None) -> Any:
        response = await self._request(method, path, body, timeout_s)
        if response.status_code >= 400:
            raise UpstreamError(f"{self.endpoint}{path}: HTTP {response.status_code}: "
                                f"{body_excerpt(response.content)}")
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(f"{self.endpoint}{path}: response is not JSON") from exc

    async def show(self, body: dict[str, Any], timeout_s: float | None = None
                   ) -> ShowAnswer:
        return _answer(await self._request("POST", "/api/show", body, timeout_s))

    async def _request(self, method: str, path: str, body: dict[str, Any] | bytes | None,
                       timeout_s: float | None) -> httpx.Response:
        # A long wait for the answer (a load) must not mean a long wait to connect
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, self.timeouts.connect_s)) \
            if timeout_s is not None else httpx.USE_CLIENT_DEFAULT
        content = orjson.dumps(body) if isinstance(body, dict) else body
        try:
            return await self._client.request(
                method, path, content=content,
                headers=JSON_HEADERS if body is not None else None, timeout=timeout)
        except TRANSPORT_ERRORS as exc:
            raise UpstreamError(f"{self.endpoint}{path}: {describe(exc)}") from exc

    async def load(self, model: str, num_ctx: int = 0, timeout_s: float | None = None,
                   embedding: bool = False) -> None:
        """Start (and wait for) a model load: `/api/generate {"model": m}`, or for an
        embedding model `/api/embed {"model": m, "input": ""}` (generate refuses a model
        without "completion" before loading it, server/routes.go:466-469; embed loads any
        model and answers no vectors for no input, :843-865), with the context planned for
        it (0: Ollama's own). Ollama answers once loaded, so by default the wait is a
        complete answer's (it covers OLLAMA_LOAD_TIMEOUT)."""
        body: dict[str, Any] = {"model": model}
        if embedding:
            body["input"] = ""
        if num_ctx:
            body["options"] = {"num_ctx": num_ctx}
        await self._post_json("/api/embed" if embedding else "/api/generate", body,
                              self.timeouts.answer_s if timeout_s is None else timeout_s)

    async def unload(self, model: str) -> None:
        """Ask Ollama to release a model (`keep_alive: 0`); it returns at once, but for a
        copy of 0.12-0.24's own engine still reading its weights: then once it runs."""
        await self._post_json("/api/generate", {"model": model, "keep_alive": 0},
                             self.timeouts.connect_s + 5)


def _answer(response: httpx.Response) -> ShowAnswer:
    """An answer passed through: status, bytes and media type as the server sent them."""
    kind = response.headers.get("content-type", "application/json").split(";")[0].strip()
    return ShowAnswer(response.status_code, response.content, kind or "application/json")
