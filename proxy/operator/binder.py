"""`kubemoot-proxy bind`: the operator's filter -> score -> bind as a long-running service.

It reads the documents (re-read when their content changes; a mounted ConfigMap swaps a
symlink, so content is compared, not times), watches the providers' live state and the
discussions' asks in NATS, and writes each agent's binding and each asking discussion's
binding to `kubemoot_bindings` (docs/binding.md). A burst of changes is evaluated once, when
it has been quiet for a moment; a binding whose substance did not change is not written.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from proxy.adapters.nats_bus import NatsBus
from proxy.adapters.nats_kv import NatsStore
from proxy.observability.logging import get_logger
from proxy.operator import binding as b
from proxy.operator import candidates
from proxy.operator import scheduling as s
from proxy.ports import BINDINGS, PROVIDER_STATE, SYSTEM_CLOCK, Clock, Entry, StoreUnavailable
from proxy.service.codec import ProviderState, rfc3339, unescape_key

log = get_logger("kubemoot.binder")


@dataclass(frozen=True)
class BinderTiming:
    poll_s: float = 0.5  # how often the documents are read again
    quiet_s: float = 0.1  # a burst of changes ends after this long without another
    burst_max_s: float = 1.0  # ... or after this long, whatever keeps changing
    stale_s: float = 15.0  # provider state older than this: the provider is not Ready
    thread_ttl_s: float = 3600.0  # a discussion nobody asked about for this long is dropped
    echo_s: float = 2.0  # at most this long for the watch to show the binder's own writes
    # The markers its deletes leave in the bindings bucket (no max age: they stay for good, a
    # discussion's each) are purged this often, once this old
    markers_s: float = 600.0


class DocumentSource:
    """The documents under the paths given; `poll()` reads them again when their bytes
    changed. A document that does not parse keeps the last good set in force."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = list(paths)
        self.docs: candidates.Documents | None = None
        self.error: str | None = None
        self._digest: bytes | None = None

    def _read(self) -> bytes:
        digest = hashlib.sha256()
        for path in candidates.files(self.paths):
            digest.update(str(path).encode() + b"\0")
            with contextlib.suppress(OSError):  # gone between the listing and the read
                digest.update(path.read_bytes())
        return digest.digest()

    def poll(self) -> bool:
        """True when the documents changed (parsed or not)."""
        try:
            digest = self._read()
        except candidates.DocumentError as exc:
            digest = str(exc).encode()
        if digest == self._digest:
            return False
        self._digest = digest
        try:
            # A provider may be known from its published state alone (docs/binding.md)
            docs = candidates.load(self.paths, references=False)
        except candidates.DocumentError as exc:
            self.error = str(exc)
            if self.docs is not None:  # at start there are none: `bind` says it in one line
                log.error("documents not read; the last good ones stay in force",
                          error=str(exc))
            return True
        self.docs, self.error = docs, None
        for problem in (*candidates.validate_phases(docs), *candidates.check_references(docs)):
            log.warning("document problem", problem=problem)
        return True


class Binder:
    def __init__(self, store: NatsStore, bus: NatsBus, source: DocumentSource,
                 options: s.Options, timing: BinderTiming = BinderTiming(),
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.bus = bus  # the discussions' subjects (what must outlive a listener is in KV)
        self.source = source
        self.options = options
        self.timing = timing
        self.clock = clock
        self.evaluations = 0
        self._logged: dict[str, Any] = {}  # agent -> the unschedulable phases last logged
        self._documents_changed = asyncio.Event()
        self._no_agents = False  # logged once, not every evaluation
        self._purged_at = -math.inf  # when the delete markers were last purged

    # -- the loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        poller = asyncio.create_task(self._poll_documents())
        try:
            while True:
                seen = self.store.changes.value
                try:
                    await self.evaluate()
                except StoreUnavailable as exc:
                    log.warning("bindings not written; trying again", error=str(exc))
                    await asyncio.sleep(1.0)
                    continue
                await self._next_burst(seen)
        finally:
            poller.cancel()

    async def _poll_documents(self) -> None:
        while True:
            await asyncio.sleep(self.timing.poll_s)
            if await asyncio.to_thread(self.source.poll):
                self._documents_changed.set()

    async def _next_burst(self, seen: int) -> None:
        """Return once something changed (documents, live state, asks, the connection, a
        state turning stale) and the burst of changes is over."""
        wake = self._wake_in()
        await self._changed(seen, wake)
        started = self.clock.monotonic()
        while self.clock.monotonic() - started < self.timing.burst_max_s:
            seen = self.store.changes.value
            if not await self._changed(seen, self.timing.quiet_s):
                return

    async def _changed(self, seen: int, timeout_s: float) -> bool:
        documents = asyncio.ensure_future(self._documents_changed.wait())
        store = asyncio.ensure_future(self.store.changes.wait_past(seen, timeout_s))
        done, pending = await asyncio.wait({documents, store}, timeout=timeout_s,
                                           return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        changed = documents in done or (store in done and store.result())
        self._documents_changed.clear()
        return changed

    def _wake_in(self) -> float:
        now = self.clock.now()
        stale_at = b.next_stale_at(self._states(), now, self.timing.stale_s)
        longest = min(60.0, self.timing.thread_ttl_s)  # also prunes old discussions
        return longest if stale_at is None else max(0.01, min(longest, stale_at - now + 0.01))

    # -- one evaluation ------------------------------------------------------------------------
    def _states(self) -> dict[str, ProviderState]:
        out = {}
        for key, entry in self.store.view(PROVIDER_STATE).items():
            with contextlib.suppress(ValueError, KeyError, orjson.JSONDecodeError):
                state = ProviderState.decode(entry.value)
                out[state.name or unescape_key(key)] = state
        return out

    async def evaluate(self) -> int:
        """Bind every agent and every asking discussion; returns the bindings written."""
        if self.source.docs is None:
            await asyncio.to_thread(self.source.poll)
        docs = self.source.docs
        if docs is None or not self.store.connected:
            return 0
        if not await self.store.replayed(self.timing.echo_s):
            raise StoreUnavailable("the bindings' watch has not replayed the bucket yet")
        self.evaluations += 1
        now = self.clock.now()
        live = replace(docs, providers=b.live_providers(docs.providers, self._states(), now,
                                                         self.timing.stale_s))
        written: dict[str, int] = {}
        bindings: dict[str, dict[str, Any]] = {}
        agents: dict[str, tuple[s.Agent, str | None]] = {}
        view = self.store.view(BINDINGS)
        for agent, crew in live.agents:
            key = b.agent_key(agent.namespace, agent.name)
            binding = b.agent_binding(agent, crew, live, self.options, _decode(view.get(key)))
            who = b.agent_id(agent.namespace, agent.name)
            bindings[who], agents[who] = binding, (agent, crew)
            self._log_unschedulable(who, binding)
            revision = await self._write_if_changed(key, binding, now)
            if revision is not None:
                written[key] = revision
                log.info("agent bound", agent=who, preferred=binding["preferred"],
                         phases={p: c and c["model"] for p, c in binding["phases"].items()},
                         generation=binding["generation"])
        written.update(await self._bind_discussions(bindings, agents, live, now))
        namespaces = {a.namespace for a, _ in live.agents} | {p.namespace for p in live.policies}
        await self._drop_gone_agents(set(bindings), namespaces)
        await self._await_echo(written)
        await self._purge_markers()
        return len(written)

    async def _purge_markers(self) -> None:
        """Purge the old markers of the discussions and agents dropped (an outage leaves
        them for the next time)."""
        now = self.clock.monotonic()
        if now - self._purged_at < self.timing.markers_s:
            return
        self._purged_at = now
        try:
            purged = await self.store.purge_deleted(BINDINGS, self.timing.markers_s)
        except StoreUnavailable as exc:
            log.warning("delete markers not purged", error=str(exc))
            return
        if purged:
            log.info("delete markers purged", bucket=BINDINGS, markers=purged)

    async def _drop_gone_agents(self, present: set[str], namespaces: set[str]) -> None:
        """Delete the agent bindings of agents no document declares any more, in the
        namespaces the documents declare (another crew's binder owns the others; b.gone_agents
        says which keys count; docs/binding.md)."""
        if not present:
            # No Agent at all is more likely an empty mount than a crew dismissed: keep them
            if not self._no_agents:
                log.warning("no Agent documents: agent bindings left as they are")
            self._no_agents = True
            return
        self._no_agents = False
        for key, who in b.gone_agents(self.store.view(BINDINGS), present, namespaces):
            await self.store.delete(BINDINGS, key)
            self._logged.pop(who, None)
            log.info("agent binding dropped", agent=who, reason="no Agent document declares it")

    async def _bind_discussions(self, bindings: Mapping[str, dict[str, Any]],
                                agents: Mapping[str, tuple[s.Agent, str | None]],
                                docs: candidates.Documents, now: float) -> dict[str, int]:
        view = self.store.view(BINDINGS)
        asks: dict[tuple[str, str], list[tuple[str, b.Ask]]] = {}
        for key, entry in view.items():
            if key.startswith("ask."):
                ask = _decode_ask(entry)
                if ask is not None:
                    asks.setdefault((ask.thread, ask.phase), []).append((key, ask))
        written: dict[str, int] = {}
        for (thread, phase), keyed in sorted(asks.items()):
            key = b.thread_key(thread, phase)
            if now - max(a.at for _, a in keyed) > self.timing.thread_ttl_s:
                for ask_key, _ in keyed:
                    await self.store.delete(BINDINGS, ask_key)
                if key in view:
                    await self.store.delete(BINDINGS, key)
                log.info("discussion binding dropped", thread=thread, phase=phase)
                continue
            current = _decode(view.get(key))
            entries = b.discussion_agents([a for _, a in keyed], current, bindings, agents,
                                          docs, self.options)
            binding = {"thread": thread, "phase": phase, "agents": entries}
            revision = await self._write_if_changed(key, binding, now)
            if revision is not None:
                written[key] = revision
                await self.bus.publish(b.thread_subject(thread, phase), orjson.dumps(binding))
                log.info("discussion bound", thread=thread, phase=phase,
                         agents={a: e["model"] for a, e in entries.items()},
                         generation=binding["generation"])
        return written

    async def _write_if_changed(self, key: str, binding: dict[str, Any], now: float
                                ) -> int | None:
        """Write the binding with the next generation unless its substance is what the
        bucket holds; the revision written, or None."""
        current = _decode(self.store.view(BINDINGS).get(key))
        if current is not None and b.substance(current) == b.substance(binding):
            binding.update(generation=current.get("generation"),
                           observedAt=current.get("observedAt"))
            return None
        generation = int((current or {}).get("generation") or 0) + 1
        binding.update(generation=generation, observedAt=rfc3339(now))
        return await self.store.put(BINDINGS, key, orjson.dumps(binding))

    async def _await_echo(self, written: Mapping[str, int]) -> None:
        """Until the watch shows the binder's own writes: the next evaluation compares with
        what the bucket holds, so it must not read a mirror from before them."""
        deadline = self.clock.monotonic() + self.timing.echo_s
        while True:
            seen = self.store.changes.value
            view = self.store.view(BINDINGS)
            if all((e := view.get(k)) is not None and e.revision >= r
                   for k, r in written.items()):
                return
            left = deadline - self.clock.monotonic()
            if left <= 0:
                return
            await self.store.changes.wait_past(seen, left)  # each watched write moves it

    def _log_unschedulable(self, who: str, binding: Mapping[str, Any]) -> None:
        """Logged once per change: the same zero match every second is noise."""
        failed = binding.get("unschedulable") or []
        if self._logged.get(who) == failed:
            return
        self._logged[who] = failed
        for entry in failed:
            log.warning("agent unschedulable", agent=who, phase=entry["phase"],
                        reason=entry["reason"],
                        crew_scheduling_policy=entry["crewSchedulingPolicy"])
        if not failed:
            log.info("agent schedulable", agent=who)


def _decode(entry: Entry | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    try:
        value = orjson.loads(entry.value)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _decode_ask(entry: Entry) -> b.Ask | None:
    value = _decode(entry)
    if value is None:
        return None
    try:
        return b.Ask(str(value["thread"]), str(value["phase"]), str(value["namespace"]),
                     str(value["agent"]), float(value["at"]))
    except (KeyError, TypeError, ValueError):
        return None


def paths_exist(paths: Iterable[str]) -> list[str]:
    """The paths that are neither a file nor a directory."""
    return [p for p in paths if not Path(p).exists()]
