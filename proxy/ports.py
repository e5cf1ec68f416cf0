"""The ports the shell depends on. Adapters implement them; services see only these."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

PROVIDER_STATE = "kubemoot_provider_state"
PROVIDER_TICKETS = "kubemoot_provider_tickets"
MODEL_DEMAND = "kubemoot_model_demand"
WAIT_KEY_PREFIX = "wait."  # a waiting call's entry on the demand board (service/demand.py)
BINDINGS = "kubemoot_bindings"


@dataclass(frozen=True, slots=True)
class BucketSpec:
    name: str
    ttl_s: float  # entries age out this long after their last write (garbage collection); 0 never
    history: int = 1
    # Whether rewriting an existing key moves `changes`. Waiting calls decide again on every
    # move; a bucket whose rewrites only refresh (wait entries every few seconds, use counts
    # every second) would wake every waiter on every refresh: N waiters, N^2 decisions.
    wake_on_rewrite: bool = True
    # Keys with these prefixes do not move `changes` when they first appear either: a call
    # that starts waiting frees nothing (its leaving does wake the calls standing aside for it).
    quiet_arrivals: tuple[str, ...] = ()

    def wakes(self, key: str, rewrite: bool) -> bool:
        """Whether writing `key` (an existing one when `rewrite`) moves `changes`."""
        return self.wake_on_rewrite if rewrite else not key.startswith(self.quiet_arrivals)


BUCKETS = (
    BucketSpec(PROVIDER_STATE, ttl_s=3600.0),
    BucketSpec(PROVIDER_TICKETS, ttl_s=6 * 3600.0),
    # A wait going, an intent coming or going wake waiters; refreshes and use counts do not.
    BucketSpec(MODEL_DEMAND, ttl_s=6 * 3600.0, wake_on_rewrite=False,
               quiet_arrivals=(WAIT_KEY_PREFIX,)),
    # A binding stays until the binder replaces it: unchanged bindings are never rewritten,
    # so an age limit would drop them; the binder prunes the discussions' keys itself.
    BucketSpec(BINDINGS, ttl_s=0.0),
)
# A sidecar reads its binding at each call and waits for none: a binding's or a discussion's
# ask written (by any agent) wakes none of its waiting calls. The binder waits for them.
SIDECAR_BUCKETS = tuple(replace(b, wake_on_rewrite=False, quiet_arrivals=("",))
                        if b.name == BINDINGS else b for b in BUCKETS)


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: bytes
    revision: int


class CasConflict(Exception):
    """The key moved on since the revision the writer read."""


class ConfigError(Exception):
    """Bad configuration; the message is one line that names the setting. Settings raise it,
    and an adapter that finds its settings wrong when it first uses them (NATS credentials)."""


class StoreUnavailable(Exception):
    """The shared store cannot be reached right now."""


class StateStore(Protocol):
    """Key-value buckets with revisions, compare-and-set, expiry and change notification.

    `view()` is a local mirror kept fresh by one long-lived watch per bucket; `get` and
    `cas` go to the authoritative store. `changes` counts every write seen by the watch.
    """

    changes: ChangeCounter

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def connected(self) -> bool:
        """The views are the store's: connected, and replayed since the last (re)connect."""
        ...

    @property
    def generation(self) -> int:
        """Moves each time a replayed view replaces the one before (after a reconnect): a
        revision read before may mean nothing now (a server that came back without its
        storage numbers its writes anew)."""
        ...

    def view(self, bucket: str) -> Mapping[str, Entry]: ...

    def version(self, bucket: str) -> int:
        """Moves whenever the bucket's view changes: an equal version means an equal view."""
        ...

    async def get(self, bucket: str, key: str) -> Entry | None: ...

    async def put(self, bucket: str, key: str, value: bytes) -> int: ...

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        """Write only if the key is still at `last_revision` (0: the key must be absent)."""
        ...

    async def delete(self, bucket: str, key: str) -> None: ...

    async def replayed(self, timeout_s: float) -> bool:
        """Wait until every view holds what its bucket held when the watch began; False
        when that did not happen within `timeout_s`."""
        ...


class Clock(Protocol):
    """What time it is, injected into every service and the memory store so that tests run
    on a virtual clock. Sleeps and timeouts are the event loop's own (asyncio), which tests
    fast-forward; a test clock reads the loop's time too."""

    def now(self) -> float:
        """Wall-clock seconds since the epoch: what travels between processes (a ticket's
        expiry, a probe's stamp, a demand entry's expiry)."""
        ...

    def monotonic(self) -> float:
        """Seconds that only move forward, for waits and ages within this process."""
        ...


class SystemClock:
    """The machine's clocks (the default everywhere but in tests)."""

    now = staticmethod(time.time)
    monotonic = staticmethod(time.monotonic)


SYSTEM_CLOCK: Clock = SystemClock()


class ChangeCounter:
    """A counter waiters block on: every observed change to state or tickets advances it."""

    def __init__(self) -> None:
        self.value = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.value += 1
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait_past(self, seen: int, timeout_s: float) -> bool:
        """Block until the counter moves past `seen` or `timeout_s` passes; True if it moved."""
        if self.value != seen:
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            return self.value != seen
        return True


# The model server: one inference engine (an Ollama server) the sidecar forwards calls to.


class UpstreamError(Exception):
    """The model server could not be reached or answered garbage."""

    def __init__(self, message: str, *, before_first_byte: bool = True) -> None:
        super().__init__(message)
        self.before_first_byte = before_first_byte


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 3.0
    first_byte_s: float = 180.0
    chunk_s: float = 60.0
    # A complete (non-streamed) answer or a planned load, from sending to its last byte:
    # Ollama writes nothing before, and a load alone may take its OLLAMA_LOAD_TIMEOUT
    # (5 min by default) of silence (envconfig/config.go LoadTimeout)
    answer_s: float = 900.0


class UpstreamResponse(Protocol):
    """An answer whose status and headers are in and whose body may still be streaming.
    Its reads raise UpstreamError (after the first byte) when the body breaks off."""

    status_code: int
    content_type: str | None

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, chunk by chunk, undecoded."""
        ...

    async def aclose(self) -> None:
        """Close the stream; mid-body this drops the connection, which stops the engine."""
        ...


# One model of an /api/ps or /api/tags answer, every field as the server sent it (the API
# relays them whole); `proxy.core.models.model_name` reads its name.
ModelEntry = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ShowAnswer:
    """/api/show's answer (or another passed through) whatever its status: the body's bytes
    as sent, so that an error (a 404 for an unknown model) can be relayed unchanged."""

    status_code: int
    content: bytes
    media_type: str = "application/json"

    def details(self) -> Any:
        """The parsed answer; UpstreamError when it is an error or not JSON."""
        if self.status_code >= 400:
            raise UpstreamError(f"/api/show: HTTP {self.status_code}: "
                                f"{self.content[:200].decode(errors='replace')}")
        try:
            return orjson.loads(self.content)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError("/api/show: response is not JSON") from exc


class ModelServer(Protocol):
    """One inference engine. Every method raises UpstreamError when the server cannot be
    reached or answers with an error; `timeout_s` None means the server's own limits."""

    timeouts: Timeouts

    async def open(self, path: str, payload: bytes) -> UpstreamResponse:
        """POST an inference call; returns once the status and headers are in."""
        ...

    async def version(self, timeout_s: float | None = None) -> str | None:
        """The server's version; None when its answer names none."""
        ...

    async def ps(self, timeout_s: float | None = None) -> list[ModelEntry]:
        """The models loaded now."""
        ...

    async def fetch(self, path: str, timeout_s: float | None = None) -> ShowAnswer:
        """GET `path` (what the sidecar passes through: /api/status, a cloud model's
        /v1/models entry); an error status is an answer, not an exception."""
        ...

    async def tags(self, timeout_s: float | None = None) -> list[ModelEntry]:
        """The models on disk."""
        ...

    async def show(self, body: dict[str, Any], timeout_s: float | None = None
                   ) -> ShowAnswer:
        """/api/show with the body given; an error status is an answer, not an exception."""
        ...

    async def post(self, path: str, content: bytes, timeout_s: float | None = None
                   ) -> ShowAnswer:
        """POST `content` as it came to `path` (what the sidecar passes through: the
        account's and the web search's paths); an error status is an answer."""
        ...

    async def load(self, model: str, num_ctx: int = 0, timeout_s: float | None = None,
                   embedding: bool = False) -> None:
        """Load a model and wait until it is in, with the context planned for it (0: the
        server's own); `embedding`: a model that only embeds (it loads through an embed)."""
        ...

    async def unload(self, model: str) -> None:
        """Ask for a model to be released; returns at once, before it is gone."""
        ...

    async def close(self) -> None: ...


class GpuMemoryGauge(Protocol):
    """Reads a provider's GPU memory total from a metrics source (a DCGM exporter)."""

    async def total_mib(self, url: str, gpus: int = 1) -> int | None:
        """The total of `gpus` GPUs at `url` in MiB; None when it cannot be read."""
        ...
