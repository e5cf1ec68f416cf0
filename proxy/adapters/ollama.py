"""HTTP adapter for one Ollama server: one pooled httpx client per provider.

Foreign exceptions are translated here into `UpstreamError`, so the rest of the program
never sees httpx.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import orjson

JSON_HEADERS = {"content-type": "application/json"}


class UpstreamError(Exception):
    """The provider could not be reached or answered garbage."""

    def __init__(self, message: str, *, before_first_byte: bool = True) -> None:
        super().__init__(message)
        self.before_first_byte = before_first_byte


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 3.0
    first_byte_s: float = 180.0
    chunk_s: float = 60.0


class OllamaClient:
    """Talks to one Ollama endpoint. Cheap to share; close() at shutdown."""

    def __init__(self, endpoint: str, timeouts: Timeouts | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeouts = timeouts or Timeouts()
        t = self.timeouts
        self._client = httpx.AsyncClient(
            base_url=self.endpoint,
            # read covers the wait for the first byte (model loads included); the relay
            # enforces the shorter between-chunk limit itself.
            timeout=httpx.Timeout(connect=t.connect_s, read=t.first_byte_s, write=t.connect_s,
                                  pool=t.first_byte_s),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
            transport=transport,
        )

    async def close(self) -> None:
        await self._client.aclose()

    async def open(self, path: str, payload: bytes) -> httpx.Response:
        """POST and return once the status line and headers are in (body still streaming)."""
        request = self._client.build_request("POST", path, content=payload, headers=JSON_HEADERS)
        try:
            return await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise UpstreamError(f"{self.endpoint}{path}: timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{self.endpoint}{path}: {type(exc).__name__}: {exc}") from exc

    async def get_json(self, path: str, timeout_s: float | None = None) -> Any:
        return await self._json("GET", path, None, timeout_s)

    async def post_json(self, path: str, body: dict[str, Any],
                        timeout_s: float | None = None) -> Any:
        return await self._json("POST", path, body, timeout_s)

    async def _json(self, method: str, path: str, body: dict[str, Any] | None,
                    timeout_s: float | None) -> Any:
        timeout = httpx.Timeout(timeout_s) if timeout_s is not None else httpx.USE_CLIENT_DEFAULT
        try:
            response = await self._client.request(
                method, path, content=orjson.dumps(body) if body is not None else None,
                headers=JSON_HEADERS if body is not None else None, timeout=timeout)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{self.endpoint}{path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise UpstreamError(f"{self.endpoint}{path}: HTTP {response.status_code}: "
                                f"{response.text[:200]}")
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(f"{self.endpoint}{path}: response is not JSON") from exc

    async def show(self, body: dict[str, Any]) -> httpx.Response:
        """/api/show as the raw response, so 404s relay unchanged."""
        try:
            return await self._client.post("/api/show", content=orjson.dumps(body),
                                           headers=JSON_HEADERS)
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{self.endpoint}/api/show: {type(exc).__name__}") from exc

    async def load(self, model: str, timeout_s: float | None = None) -> None:
        """Start (and wait for) a model load: `/api/generate {"model": m}`."""
        await self.post_json("/api/generate", {"model": model}, timeout_s)

    async def unload(self, model: str) -> None:
        """Ask Ollama to release a model (`keep_alive: 0`); it returns at once."""
        await self.post_json("/api/generate", {"model": model, "keep_alive": 0},
                             self.timeouts.connect_s + 5)
