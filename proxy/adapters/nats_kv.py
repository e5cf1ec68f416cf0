"""NATS JetStream KV: the shared, distributed store.

One long-lived watch per bucket per process mirrors the bucket locally and advances the
change counter; compare-and-set goes to the server (`update(last=rev)`), so two sidecars
that read the same budget cannot both win it. On reconnect the watches are rebuilt; the
views stay as they were until each new watch has replayed its bucket, and the store counts
as connected only from then (a server may come back without its storage).

A watch can also stop with the connection up: its consumer lived on the node that led the
bucket, and that node went. nats-py notices only after two missed heartbeats (10 s or
more), and meanwhile the view looks current. So each write of ours is a probe: a watch
that has not shown it within `WATCH_LAG_S` is rebuilt.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)

from proxy.adapters.nats_options import (
    NatsConfigError,
    NatsOptions,
    PlainTextServer,
    reason_of,
    redact,
    refusal,
    unreachable,
    wants_tls,
)
from proxy.observability.logging import drop_harmless_asyncio_lines, get_logger
from proxy.ports import BUCKETS, BucketSpec, CasConflict, ChangeCounter, Entry, StoreUnavailable

__all__ = ["NatsConfigError", "NatsOptions", "NatsStore", "check_nats", "connect_client",
           "default_replicas", "ensure_buckets", "reason_of", "redact"]
log = get_logger("kubemoot.nats")
WATCH_INACTIVE_S = 10.0  # server drops an abandoned watch consumer after this
RETRY_CONNECT_S = 2.0  # while NATS was never reached, how often to try again
SERVING_PROBE_S = 1.0  # while JetStream answers nothing, how often to ask again
WATCH_LAG_S = 3.0  # a write of ours its watch has not shown by then: the watch is lost


class TlsOnlyClient(NATS):
    """nats-py's client, which goes on in plain text when a server asked for over TLS
    offers none (it starts TLS only when the server's INFO requires it): such a server is
    refused before the CONNECT, which would carry the credentials in the clear."""

    def __init__(self, wants_tls: bool) -> None:
        super().__init__()
        self._wants_tls = wants_tls

    def _connect_command(self) -> bytes:
        server = self._current_server
        if self._wants_tls and not self._server_info.get("tls_required") and (
                server is None or server.uri.scheme not in ("ws", "wss")):
            raise PlainTextServer("nats: the server offers no TLS")
        return super()._connect_command()


async def connect_client(options: NatsOptions, give_up_unreachable: int = 0,
                         **callbacks: Any) -> Any:
    """A connected client within `options.timeout_s`; else NatsConfigError when the settings
    are wrong (a file, or the server refusing the credentials or certificates: said at the
    refusal, not after the timeout), or StoreUnavailable naming the URL and the last error
    met (nats-py retries an absent server without end while connecting, and reports each
    attempt only to its error callback), at once after `give_up_unreachable` attempts
    that found no server listening, when that is not 0."""
    errors: list[Exception] = []
    on_error = callbacks.pop("error_cb", None)
    stop = asyncio.Event()  # a refusal, or as many servers away as the caller waits for
    connecting, away = True, 0

    async def error(exc: Exception) -> None:
        nonlocal away
        errors.append(exc)
        away += unreachable(exc)
        if connecting and (refusal(exc, options) is not None or away == give_up_unreachable):
            stop.set()  # not raised here: nats-py must first close the failed connection
        if on_error is not None:
            await on_error(exc)

    kwargs = options.connect_kwargs()
    drop_harmless_asyncio_lines()  # said by asyncio for each TLS connection nats-py closes
    client = TlsOnlyClient(wants_tls(options))
    connect = asyncio.ensure_future(client.connect(**kwargs, error_cb=error, **callbacks))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait((connect, stopped), timeout=options.timeout_s,
                       return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    connecting = False
    if connect.done() and not connect.cancelled() and connect.exception() is None:
        return client
    connect.cancel()
    with contextlib.suppress(BaseException):  # nats raises a zoo of types
        await connect
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), options.timeout_s)
    last = connect.exception() if connect.done() and not connect.cancelled() else None
    for exc in ([last] if last else []) + errors[::-1]:
        if (refused := refusal(exc, options)) is not None:
            raise refused from None
    if last is not None:
        reason = reason_of(last)
    elif errors:
        reason = reason_of(errors[-1])
    else:
        reason = f"no answer within {options.timeout_s:g} s"
    raise StoreUnavailable(f"cannot connect to NATS at {redact(options.url)}: {reason}")


def check_nats(options: NatsOptions) -> None:
    """Raise NatsConfigError, before the sidecar serves, when its NATS settings cannot work:
    a configured file missing or unusable, or the server refusing them. A server that does
    not answer is an outage, not bad configuration: that returns (the store keeps trying),
    at once when no server listens, else after the connect timeout (a server that answers
    may refuse on a second attempt: a TLS 1.3 client learns that its certificate was
    refused only after the handshake, sometimes as a bare end of file)."""

    async def first_contact() -> None:
        try:
            client = await connect_client(options, give_up_unreachable=len(options.servers))
        except NatsConfigError:
            raise
        except StoreUnavailable:  # an outage: the store waits it out
            return
        await client.close()

    asyncio.run(first_contact())


# What nats-py reports as the connection goes (before it calls disconnected_cb).
CONNECTION_LOST = (OSError, nats.errors.UnexpectedEOF, nats.errors.StaleConnectionError,
                   nats.errors.ConnectionClosedError)


class _Outage:
    """A connection's time away: what ended it and its failed reconnects, counted rather
    than each logged."""

    def __init__(self) -> None:
        self.since = time.monotonic()
        self.attempts = 0
        self.cause = ""  # the error that came with the loss, if any
        self.first_error = ""  # the first reconnect's

    def failed(self, exc: Exception) -> None:
        self.attempts += 1
        self.first_error = self.first_error or reason_of(exc)

    def begin(self) -> dict[str, Any]:
        said = {"error": self.cause} if self.cause else {}
        self.since, self.attempts, self.cause, self.first_error = time.monotonic(), 0, "", ""
        return said

    def end(self) -> dict[str, Any]:
        said: dict[str, Any] = {"failed_attempts": self.attempts,
                                "down_s": round(time.monotonic() - self.since, 1)}
        if self.first_error:
            said["error"] = self.first_error
        return said


def _stamp(created: Any) -> float:
    """An entry's write time (the stream's stamp, a datetime in nats-py), else now."""
    try:
        return float(created.timestamp())
    except (AttributeError, TypeError, ValueError, OverflowError):
        return time.time()


class ReplayEnd:
    """Where a watch's replay of what its bucket held ends. nats-py marks it with a None,
    but it asks the consumer what is pending only after subscribing: when the server has
    sent every entry already and none is handled yet, that None comes first, before the
    whole replay. So a first None counts only if the bucket holds nothing; otherwise the
    replay ends at the entry with nothing pending after it. nats-py skips some messages
    (markers of a reason it does not know): when the replay's last is one, that entry
    never comes, so a replay quiet for `quiet_s` while the server is `reachable` has ended
    too (the server sends it without pause; cut by an outage, it is not whole)."""

    def __init__(self, holds_nothing: Callable[[], Awaitable[bool]], quiet_s: float,
                 reachable: Callable[[], bool] = lambda: True) -> None:
        self._holds_nothing = holds_nothing
        self._quiet_s = quiet_s
        self._reachable = reachable
        self._seen = False
        self._quiet = False
        self._over = False

    async def items(self, watcher: Any) -> AsyncIterator[Any]:
        """The watch's items, and a None when its replay has gone quiet."""
        while True:
            try:
                item = await (anext(watcher) if self._over else
                              asyncio.wait_for(anext(watcher), self._quiet_s))
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not self._reachable():
                    continue
                self._quiet, item = True, None
            yield item

    async def at(self, entry: Any) -> bool:
        """Whether the replay ends with `entry` (a watch's next item, None the marker)."""
        if entry is None:
            self._over = self._seen or self._quiet or await self._holds_nothing()
        else:
            self._seen = True
            self._over = entry.delta == 0
        return self._over


def bucket_config(spec: BucketSpec, replicas: int = 1) -> KeyValueConfig:
    return KeyValueConfig(bucket=spec.name, history=spec.history, ttl=spec.ttl_s,
                          storage=StorageType.FILE, direct=True, replicas=replicas)


def cluster_size(nc: Any) -> int:
    """Servers in the cluster, as the one connected to announces them (its connect_urls)."""
    return len({(u.hostname, u.port) for u in nc.servers}) or 1


def default_replicas(nc: Any) -> int:
    """Three copies of every bucket when the cluster has at least three servers, else one."""
    return 3 if cluster_size(nc) >= 3 else 1


# JetStream's answers to a number of replicas it cannot place (nats-server's errors.json):
# a server that is not clustered, a cluster with fewer servers than copies asked for.
REPLICAS_REFUSED = {10074: "this NATS server is not clustered",
                    10005: "the cluster has fewer servers than that",
                    10023: "the cluster has not the resources for that many copies"}


def replicas_refusal(exc: BaseException, replicas: int | None) -> str | None:
    """One line naming KUBEMOOT_NATS_REPLICAS when JetStream refused the copies it asked for
    (a setting to change, not an outage to wait through); None otherwise."""
    why = REPLICAS_REFUSED.get(getattr(exc, "err_code", None) or 0)
    if replicas is None or why is None or not isinstance(exc, APIError):
        return None
    return f"KUBEMOOT_NATS_REPLICAS={replicas}: {why} ({exc.description})"


def _ttl(seconds: float) -> str:
    return f"ttl {seconds:.0f} s" if seconds else "no ttl"


async def ensure_buckets(js: Any, buckets: tuple[BucketSpec, ...] = BUCKETS,
                         replicas: int = 1, keep_more: bool = False) -> list[str]:
    """Create the buckets if missing, with `replicas` copies each; a bucket that exists with
    another TTL, history or number of replicas (made by hand, `nats kv add`, or by an older
    release) is updated to them (idempotent). `keep_more`: `replicas` is a guess from the
    cluster's size (KUBEMOOT_NATS_REPLICAS unset), which never takes copies away: a server
    that restarts announces its cluster only once its routes are up, and a guess of 1 then
    would leave every bucket on one server. What was done, per bucket."""
    done = []
    for spec in buckets:
        try:
            await js.key_value(spec.name)
        except BucketNotFoundError:
            await js.create_key_value(config=bucket_config(spec, replicas))
            done.append(f"{spec.name}: created ({_ttl(spec.ttl_s)}, history {spec.history}, "
                        f"replicas {replicas})")
            continue
        config = (await js.stream_info(f"KV_{spec.name}")).config
        copies = max(replicas, config.num_replicas or 1) if keep_more else replicas
        # A TTL shorter than the writers' interval would drop live entries between writes;
        # none would keep every ticket and demand entry ever written, replayed at each start.
        current = {"ttl": float(config.max_age or 0), "history": config.max_msgs_per_subject,
                   "replicas": config.num_replicas or 1}
        wanted = {"ttl": spec.ttl_s, "history": spec.history, "replicas": copies}
        changes = [_change(key, current[key], wanted[key]) for key in wanted
                   if current[key] != wanted[key]]
        if not changes:
            done.append(f"{spec.name}: exists (replicas {copies})")
            continue
        await js.update_stream(replace(config, max_age=spec.ttl_s,
                                       max_msgs_per_subject=spec.history,
                                       num_replicas=copies))
        done.append(f"{spec.name}: {', '.join(changes)}")
    return done


def _change(key: str, old: float, new: float) -> str:
    if key == "ttl":
        return f"{_ttl(old)} -> {_ttl(new).removeprefix('ttl ')}"
    return f"{key} {old:.0f} -> {new:.0f}"


class NatsStore:
    def __init__(self, options: NatsOptions, buckets: tuple[BucketSpec, ...] = BUCKETS,
                 create_buckets: bool = True, replicas: int | None = None) -> None:
        self.options = options
        self.buckets = buckets
        self.create_buckets = create_buckets  # those missing (never changes existing ones)
        self.replicas = replicas  # for buckets it creates; None: by the cluster's size
        self.changes = ChangeCounter()
        self._nc: Any = None
        self._kv: dict[str, Any] = {}
        self._mirror: dict[str, dict[str, Entry]] = {b.name: {} for b in buckets}
        # NATS tells no watch when an entry ages past the bucket's max age, so the view
        # drops it itself: per key the wall-clock time of its last write (the server's
        # stamp), and when the oldest may be due (as in the embedded store; without it every
        # key of a sidecar that left, or of a model asked once, stayed in every view)
        self._ttl = {b.name: b.ttl_s or math.inf for b in buckets}  # 0: never
        self._written_at: dict[str, dict[str, float]] = {b.name: {} for b in buckets}
        self._next_expiry = {b.name: math.inf for b in buckets}
        self._versions = {b.name: 0 for b in buckets}
        # Set once a bucket's watch has replayed what the bucket held (reset on rewatch)
        self._replayed = {b.name: asyncio.Event() for b in buckets}
        self._generation = 0  # moves each time a replayed view replaces the one before
        self._watch_tasks: list[asyncio.Task[None]] = []
        self._watchers: list[Any] = []
        self._seen = {b.name: 0 for b in buckets}  # the newest revision each watch showed
        # per bucket, the revisions of our writes the watch has yet to show, with deadlines
        self._awaited: dict[str, deque[tuple[int, float]]] = {b.name: deque() for b in buckets}
        self._lag_check: asyncio.Task[None] | None = None
        self._rewatching = asyncio.Lock()  # (a reconnect and a lagging watch may both ask)
        self._connected = False
        self._retry: asyncio.Task[None] | None = None
        self._closing = False
        # Connected, yet JetStream answers nothing (its leader for the buckets lost, say):
        # every sidecar then serves from loaded copies alone, as when NATS is away.
        self._failing: asyncio.Task[None] | None = None
        # Called with each new client once its buckets are bound (the messaging beside them).
        self.on_connect: list[Callable[[Any], Awaitable[None]]] = []

    @property
    def connected(self) -> bool:
        """Reachable, and every view replayed since the watches were last rebuilt: until
        then the views are what was seen before, and the sidecar places as in an outage."""
        return self._reachable and all(e.is_set() for e in self._replayed.values())

    @property
    def _reachable(self) -> bool:
        """The server answers and the watches are in place (their replay may be under way):
        reads and writes go to the server, which checks every compare-and-set."""
        return self._connected and self._failing is None and self._nc is not None and \
            self._nc.is_connected

    @property
    def generation(self) -> int:
        return self._generation

    def _unavailable(self, exc: Exception) -> StoreUnavailable:
        """What an operation that failed though NATS is connected means: JetStream is not
        serving the buckets. Said at once (connected reads false), until it serves again."""
        if self._failing is None and self._connected and not self._closing:
            log.warning("nats connected but not serving the buckets; only loaded copies "
                        "serve calls, no load or unload until it does",
                        error=str(exc) or type(exc).__name__)
            self._failing = asyncio.create_task(self._until_serving())
            self.changes.bump()
        return StoreUnavailable(str(exc) or type(exc).__name__)

    async def _until_serving(self) -> None:
        """Ask JetStream about the buckets every second until it answers (their leader is
        back, or another was elected); then rebuild the watches (they may have stopped)."""
        while True:
            await asyncio.sleep(SERVING_PROBE_S)
            if self._nc.is_connected and await self._serving():
                break
        self._failing = None
        log.info("nats serving the buckets again")
        await self._rewatch(rebind=False)

    async def start(self) -> None:
        """Connect, bind the buckets and start the watches. If NATS cannot be reached, or
        refuses the settings (NatsConfigError), raise StoreUnavailable and keep trying in the
        background (a command exits on it; `serve` checked the settings before, with
        check_nats, and serves from loaded copies alone until NATS takes it)."""
        try:
            await self._connect()
        except StoreUnavailable:
            if self._retry is None:
                self._retry = asyncio.create_task(self._keep_trying())
            raise

    async def _keep_trying(self) -> None:
        """Connect once NATS answers; the outage was said by start()'s caller, its end is
        said here, and a refusal of the settings (NATS back, yet not for us) once."""
        attempts, since, refused = 0, time.monotonic(), ""
        while True:
            await asyncio.sleep(RETRY_CONNECT_S)
            attempts += 1
            try:
                await self._connect()
            except NatsConfigError as exc:
                if str(exc) != refused:
                    refused = str(exc)
                    log.error("nats refuses this sidecar's settings; only loaded copies "
                              "serve calls, no load or unload until it takes them",
                              error=refused)
            except StoreUnavailable:
                pass
            else:
                log.info("nats connected", attempts=attempts,
                         waited_s=round(time.monotonic() - since, 1))
                return

    async def _connect(self) -> None:
        # Until the first connection, what goes wrong is said once, by StoreUnavailable.
        outage = _Outage()

        async def disconnected() -> None:
            was_connected, self._connected = self._connected, False
            said = outage.begin()
            if was_connected and not self._closing:
                log.warning("nats disconnected; only loaded copies serve calls, no load or unload "
                            "until it returns", **said)
            self.changes.bump()

        async def reconnected() -> None:
            log.info("nats reconnected", **outage.end())
            await self._rewatch()

        async def error(exc: Exception) -> None:
            if self._nc is None:
                return
            if not self._nc.is_connected:  # one per reconnect, each 0.5 s: counted
                outage.failed(exc)
            elif isinstance(exc, CONNECTION_LOST):  # the loss: said by disconnected()
                outage.cause = reason_of(exc)
            else:  # an error the connection lives through: rare, said
                log.warning("nats error", error=reason_of(exc))

        client = await connect_client(self.options, disconnected_cb=disconnected,
                                      reconnected_cb=reconnected, error_cb=error)
        self._nc = client
        try:
            await self._bind()
        except Exception as exc:
            refused = replicas_refusal(exc, self.replicas)
            if refused:
                raise NatsConfigError(refused) from exc
            raise StoreUnavailable(f"NATS JetStream KV unavailable: {exc}") from exc
        await self._rewatch(rebind=False)
        if self._lag_check is None:
            self._lag_check = asyncio.create_task(self._check_watch_lag())
        for hook in self.on_connect:
            await hook(client)

    async def _serving(self) -> bool:
        """Whether every bucket's stream has a leader to take writes (its info comes from
        the leader; reads alone could be answered by any replica)."""
        js = self._nc.jetstream(timeout=self.options.timeout_s)
        answers = await asyncio.gather(*(js.stream_info(f"KV_{spec.name}")
                                         for spec in self.buckets), return_exceptions=True)
        return not any(isinstance(a, BaseException) for a in answers)

    async def _bind(self) -> None:
        js = self._nc.jetstream(timeout=self.options.timeout_s)
        if self.create_buckets:
            missing = []
            for spec in self.buckets:
                try:
                    await js.key_value(spec.name)
                except BucketNotFoundError:
                    missing.append(spec)
            if missing:
                await ensure_buckets(js, tuple(missing),
                                     self.replicas or default_replicas(self._nc))
        for spec in self.buckets:
            self._kv[spec.name] = await js.key_value(spec.name)

    async def _rewatch(self, rebind: bool = True) -> None:
        async with self._rewatching:
            await self._rewatch_now(rebind)

    async def _rewatch_now(self, rebind: bool) -> None:
        for replayed in self._replayed.values():  # not connected until the views are anew
            replayed.clear()
        for awaited in self._awaited.values():  # the new watches replay them
            awaited.clear()
        self._seen = dict.fromkeys(self._seen, 0)  # (a server back empty counts anew)
        for task in self._watch_tasks:
            task.cancel()
        for watcher in self._watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()
        self._watch_tasks, self._watchers = [], []
        try:
            if rebind:  # a server that came back empty needs its buckets again
                await self._bind()
            for spec in self.buckets:
                watcher = await self._kv[spec.name].watch(
                    ">", inactive_threshold=WATCH_INACTIVE_S)
                self._watchers.append(watcher)
                self._watch_tasks.append(asyncio.create_task(
                    self._drain(spec.name, watcher), name=f"watch-{spec.name}"))
            self._connected = True
        except Exception as exc:
            self._connected = False
            log.warning("nats watch failed; trying again", error=str(exc) or type(exc).__name__)
            if self._failing is None and not self._closing:
                self._failing = asyncio.create_task(self._until_serving())
        self.changes.bump()

    async def _drain(self, bucket: str, watcher: Any) -> None:
        """Fill a new view from the watch; it replaces the old one once the bucket is
        replayed (the old one stands meanwhile: what was seen, as in an outage)."""
        mirror: dict[str, Entry] = {}
        written_at: dict[str, float] = {}
        replayed = self._replayed[bucket]
        spec = next(s for s in self.buckets if s.name == bucket)
        woken = False  # an entry since the last bump wakes waiters: bump at the burst's end
        end = ReplayEnd(lambda: self._holds_nothing(bucket), self.options.timeout_s,
                        lambda: self._reachable)
        async for entry in end.items(watcher):
            if entry is not None:
                woken = self._show(bucket, spec, entry, mirror, written_at, woken)
            if not replayed.is_set() and await end.at(entry):
                self._mirror[bucket] = mirror
                self._written_at[bucket] = written_at
                self._next_expiry[bucket] = -math.inf  # (the replay may hold old ones)
                self._versions[bucket] += 1
                self._generation += 1
                replayed.set()
                self.changes.bump()

    def _show(self, bucket: str, spec: BucketSpec, entry: Any, mirror: dict[str, Entry],
              written_at: dict[str, float], woken: bool) -> bool:
        """Put a watched entry into `mirror`; whether a wake is owed since the last bump."""
        replayed = self._replayed[bucket]
        self._seen[bucket] = max(self._seen[bucket], entry.revision)
        wakes = True
        if entry.operation in ("DEL", "PURGE") or entry.value is None:
            mirror.pop(entry.key, None)
            written_at.pop(entry.key, None)
        else:
            wakes = spec.wakes(entry.key, entry.key in mirror)
            mirror[entry.key] = Entry(entry.key, entry.value, entry.revision)
            # a live write's age from its arrival, so a clock ahead of the server's
            # cannot age it early; a replayed one's from the server's stamp
            written_at[entry.key] = time.time() if replayed.is_set() else \
                _stamp(entry.created)
            if replayed.is_set():
                self._next_expiry[bucket] = min(self._next_expiry[bucket],
                                                written_at[entry.key] + self._ttl[bucket])
        if replayed.is_set():
            self._versions[bucket] += 1
            woken = woken or wakes
            if entry.delta == 0 and woken:
                self.changes.bump()
                woken = False
        return woken

    async def _holds_nothing(self, bucket: str) -> bool:
        try:
            info = await self._nc.jetstream(timeout=self.options.timeout_s).stream_info(
                f"KV_{bucket}")
        except Exception:
            return True  # (unknown: take nats-py's word)
        return int(info.state.messages) == 0

    def _written(self, bucket: str, revision: int) -> int:
        """Note a write of ours at `revision`, for the watch to show in time."""
        if self.connected:  # (while a watch replays, it shows the write anyway)
            self._awaited[bucket].append((revision, time.monotonic() + WATCH_LAG_S))
        return revision

    async def _check_watch_lag(self) -> None:
        while True:
            await asyncio.sleep(WATCH_LAG_S / 4)
            now = time.monotonic()
            for bucket, awaited in self._awaited.items():
                while awaited and awaited[0][0] <= self._seen[bucket]:
                    awaited.popleft()
                if awaited and awaited[0][1] < now and self.connected:
                    log.warning("nats watch stopped showing writes; rebuilding it",
                                bucket=bucket, written=awaited[0][0], shown=self._seen[bucket])
                    try:
                        await self._rewatch(rebind=False)
                    except Exception as exc:  # (it says its own failures): checked again
                        log.warning("nats watch not rebuilt", error=reason_of(exc))
                    break

    async def close(self) -> None:
        self._closing = True
        for task in (self._retry, self._failing, self._lag_check):
            if task is not None:
                task.cancel()
        for task in self._watch_tasks:
            task.cancel()
        for watcher in self._watchers:
            with contextlib.suppress(Exception):
                await watcher.stop()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()
        self._connected = False

    def _expire(self, bucket: str) -> None:
        """Drop what the bucket's max age has removed on the server (a scan only once the
        oldest entry may be due: view() is on every placement's path)."""
        now = time.time()
        if now < self._next_expiry[bucket]:
            return
        mirror, written_at, ttl = self._mirror[bucket], self._written_at[bucket], \
            self._ttl[bucket]
        for key in [k for k, at in written_at.items() if now - at > ttl]:
            del written_at[key]
            if mirror.pop(key, None) is not None:
                self._versions[bucket] += 1
        self._next_expiry[bucket] = min(written_at.values(), default=math.inf) + ttl

    def view(self, bucket: str) -> Mapping[str, Entry]:
        self._expire(bucket)
        return self._mirror[bucket]

    async def replayed(self, timeout_s: float) -> bool:
        """Wait until every bucket's view holds what the bucket held when its watch began
        (after a connect or reconnect); False when that did not happen in time, or at once
        when NATS is away."""
        if not self._reachable:
            return False
        waits = [asyncio.ensure_future(e.wait()) for e in self._replayed.values()]
        _, pending = await asyncio.wait(waits, timeout=timeout_s)
        for task in pending:
            task.cancel()
        return not pending and self.connected

    def version(self, bucket: str) -> int:
        self._expire(bucket)
        return self._versions[bucket]

    def _bucket(self, bucket: str) -> Any:
        if not self._reachable:
            raise StoreUnavailable("NATS is not connected")
        return self._kv[bucket]

    async def get(self, bucket: str, key: str) -> Entry | None:
        try:
            entry = await self._bucket(bucket).get(key)
        except KeyNotFoundError:
            return None
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc
        if entry.value is None:  # an expiry marker, not a value
            return None
        return Entry(key, entry.value, entry.revision)

    async def put(self, bucket: str, key: str, value: bytes) -> int:
        try:
            return self._written(bucket, int(await self._bucket(bucket).put(key, value)))
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        kv = self._bucket(bucket)
        try:
            if last_revision == 0:  # (create also re-creates over a tombstone)
                return self._written(bucket, int(await kv.create(key, value)))
            return self._written(bucket, int(await kv.update(key, value, last=last_revision)))
        except KeyWrongLastSequenceError as exc:
            raise CasConflict(str(exc)) from exc
        except BadRequestError as exc:
            if getattr(exc, "err_code", None) == 10071:
                raise CasConflict(str(exc)) from exc
            raise self._unavailable(exc) from exc
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc

    async def purge_deleted(self, bucket: str, older_than_s: float) -> int:
        """Remove the markers that deletes left in `bucket` once older than `older_than_s`:
        a bucket without a max age keeps them for good, and every watch begun replays them.
        The watches running have shown them by then (a later one needs them not). How many
        were removed."""
        kv = self._bucket(bucket)
        old: list[tuple[str, int]] = []
        try:
            watcher = await kv.watchall(inactive_threshold=WATCH_INACTIVE_S)
            try:
                now = time.time()
                end = ReplayEnd(lambda: self._holds_nothing(bucket), self.options.timeout_s)
                async for entry in end.items(watcher):
                    if entry is not None and entry.operation in ("DEL", "PURGE") and \
                            now - _stamp(entry.created) > older_than_s:
                        old.append((entry.key, entry.revision))
                    if await end.at(entry):
                        break
            finally:
                with contextlib.suppress(Exception):
                    await watcher.stop()
            js = self._nc.jetstream(timeout=self.options.timeout_s)
            prefix = getattr(kv, "_pre", f"$KV.{bucket}.")
            for key, revision in old:  # up to the marker: a write since stays
                await js.purge_stream(f"KV_{bucket}", seq=revision + 1, subject=prefix + key)
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return len(old)

    async def delete(self, bucket: str, key: str) -> None:
        try:
            await self._bucket(bucket).delete(key)
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise self._unavailable(exc) from exc
