"""The demand board: who waits for, intends, uses and is selected for which model.

One key per model and agent (no compare-and-set needed), and one per waiting call; every
value carries expiresAt and readers ignore expired entries. Rates decay with a 10-minute
half-life.

A waiting call's entry (`wait.<model>.<agent>.<n>`) carries its arrival time (`since`, the
wall clock) and its turn (`turn`: the arrival plus its slack, core/waitline.py) so every
sidecar serves a model's waiters in the same order (docs/rules.md, "Late binding"); an
entry without a turn is due at its arrival. Its `also` lists the other models the call could
run on (in-tolerance candidates that fit a card): their copies are kept from eviction for it
too, while its place stays in its own model's line. It lives WAIT_TTL_S and is rewritten every
WAIT_REFRESH_S while the call waits: a sidecar that dies stops holding its place within
seconds. Its `<n>` is the lowest number the sidecar has free for the model (taken back once
the entry's delete is written): a deleted key leaves a marker in the bucket for its max age,
so a number per call ever made would leave one marker per waiting call (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import orjson

from proxy.core.conversations import KEEP_PER_COPY, Copy, Held
from proxy.core.types import ModelDemand, WaitNeed
from proxy.ports import MODEL_DEMAND, SYSTEM_CLOCK, Clock, Entry, StateStore, StoreUnavailable
from proxy.service.codec import escape_key, unescape_key

WAIT_TTL_S = 15.0
WAIT_REFRESH_S = 5.0
INTENT_TTL_S = 180.0
USE_TTL_S = 6 * 3600.0
HALF_LIFE_S = 600.0
# A sidecar writes its use counts at most once a second, not once per call: every write is a
# NATS round trip and a watch message to every other sidecar, and victim ordering does not
# need the last second.
USE_FLUSH_S = 1.0
VIEW_REUSE_S = 1.0  # the longest a demand view is reused when the board has not changed
# What this sidecar sent to each copy lately, for the others' expected prompt caches
# (docs/affinity.md): written with the use counts, one key per sidecar; a prompt older than
# this is not expected to be cached anywhere.
CACHE_TTL_S = 600.0
ANY_COPY = WaitNeed()  # a waiting call that said nothing of what it needs


def _any_copy(need: WaitNeed) -> bool:
    return True


def decayed(rate: float, at: float, now: float) -> float:
    return float(rate * 0.5 ** (max(0.0, now - at) / HALF_LIFE_S))


def decode_entries(entries: Mapping[str, Entry],
                   cache: dict[str, tuple[int, dict[str, Any]]] | None = None
                   ) -> list[tuple[str, dict[str, Any]]]:
    """Entries as (key, value); `cache` keeps decoded values by revision across calls."""
    out = []
    for key, entry in entries.items():
        hit = cache.get(key) if cache is not None else None
        if hit is not None and hit[0] == entry.revision:
            out.append((key, hit[1]))
            continue
        try:
            value = orjson.loads(entry.value)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            out.append((key, value))
            if cache is not None:
                cache[key] = (entry.revision, value)
    return out


def aggregate(entries: Mapping[str, Entry] | list[tuple[str, dict[str, Any]]], now: float
              ) -> dict[str, ModelDemand]:
    """Per model: waiters, intents, recent use, predicted demand and last use."""
    waiters: dict[str, int] = {}
    turns: dict[str, list[float]] = {}
    needs: dict[str, list[WaitNeed]] = {}
    backing: dict[str, list[WaitNeed]] = {}
    intents: dict[str, int] = {}
    use: dict[str, float] = {}
    last: dict[str, float] = {}
    predicted: dict[str, float] = {}
    values = decode_entries(entries) if isinstance(entries, Mapping) else entries
    for key, value in values:
        if float(value.get("expiresAt", 0)) <= now:
            continue
        kind, _, rest = key.partition(".")
        if kind == "sel":
            rate = decayed(float(value.get("rate", 0)), float(value.get("at", now)), now)
            for model in value.get("models") or []:
                predicted[model] = predicted.get(model, 0.0) + rate
            continue
        model = unescape_key(rest.partition(".")[0])
        if kind == "wait":
            waiters[model] = waiters.get(model, 0) + 1
            since = float(value.get("since", 0.0))
            turns.setdefault(model, []).append(float(value.get("turn", since)))
            need = wait_need(value)
            needs.setdefault(model, []).append(need)
            for other in also_models(value, model):
                backing.setdefault(other, []).append(need)
        elif kind == "intent":
            intents[model] = intents.get(model, 0) + 1
        elif kind == "use":
            at = float(value.get("at", now))
            use[model] = use.get(model, 0.0) + decayed(float(value.get("rate", 0)), at, now)
            last[model] = max(last.get(model, 0.0), at)
    models = set(waiters) | set(intents) | set(use) | set(predicted) | set(backing)
    return {m: ModelDemand(waiters.get(m, 0), intents.get(m, 0), use.get(m, 0.0),
                           predicted.get(m, 0.0), last.get(m, 0.0),
                           tuple(sorted(turns.get(m, ()))), tuple(needs.get(m, ())),
                           tuple(backing.get(m, ())))
            for m in models}


def also_models(value: dict[str, Any], model: str) -> list[str]:
    """A wait entry's `also`: the other models its call could run on (none when left out,
    as an older sidecar's entry is)."""
    also = value.get("also")
    return [m for m in also if isinstance(m, str) and m != model] \
        if isinstance(also, list) else []


def wait_need(value: dict[str, Any]) -> WaitNeed:
    """A wait entry's `ctx`, `tokens` and `not` (each left out when none)."""
    ctx, tokens, excludes = value.get("ctx"), value.get("tokens"), value.get("not")
    return WaitNeed(ctx if type(ctx) is int else 0, tokens if type(tokens) is int else 0,
                    frozenset(p for p in excludes if isinstance(p, str))
                    if isinstance(excludes, list) else frozenset())


def need_value(need: WaitNeed) -> dict[str, object]:
    """`need` as a wait entry carries it: only what it says."""
    return {**({"ctx": need.num_ctx} if need.num_ctx else {}),
            **({"tokens": need.prompt_tokens} if need.prompt_tokens else {}),
            **({"not": sorted(need.excludes)} if need.excludes else {})}


def without_waiter(demand: Mapping[str, ModelDemand], model: str, turn: float,
                   also: tuple[str, ...] = (), need: WaitNeed = ANY_COPY
                   ) -> Mapping[str, ModelDemand]:
    """The demand as one waiting call sees it: without its own entry (in its model's line,
    and backing the `also` models' copies)."""
    found = demand.get(model)
    backed = [m for m in also if m != model and (b := demand.get(m)) is not None and b.backing]
    if (found is None or not found.waiters) and not backed:
        return demand
    out = dict(demand)
    if found is not None and found.waiters:
        turns = list(found.turns)
        if turn in turns:
            turns.remove(turn)
        out[model] = replace(found, waiters=found.waiters - 1, turns=tuple(turns))
    for other in backed:
        backing = list(out[other].backing)
        backing.remove(need if need in backing else backing[-1])
        out[other] = replace(out[other], backing=tuple(backing))
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class WaitEntry:
    """One waiting call's place on the board."""

    key: str
    model: str
    since: float  # when the call arrived (wall clock: compared across sidecars)
    turn: float  # when it is due a free slot (core/waitline.py; wall clock)
    need: WaitNeed = ANY_COPY  # what it needs of a copy (a kept preload's, calls.py)
    also: tuple[str, ...] = ()  # the other models it could run on (their copies kept for it)


class DemandBoard:
    def __init__(self, store: StateStore, agent_id: str,
                 clock: Clock = SYSTEM_CLOCK, crew: str = "") -> None:
        self.store = store
        self.agent = escape_key(agent_id)
        self.crew = {"crew": crew} if crew else {}  # said in each entry, for the operator
        self.clock = clock
        self._decoded: dict[str, tuple[int, dict[str, Any]]] = {}
        self._unwritten_use: dict[str, int] = {}
        self._view: tuple[tuple[int, int], float, Mapping[str, ModelDemand]] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._waits: dict[str, WaitEntry] = {}  # this sidecar's waiting calls
        self._numbers: dict[str, set[int]] = {}  # per model, the wait numbers in use
        # this sidecar's held plans per model: they share one intent entry, which goes with
        # the last of them
        self._intents: dict[str, int] = {}
        self._own_version = 0  # moves when a wait entry of ours comes or goes
        self._refresher: asyncio.Task[None] | None = None
        self._ending: set[asyncio.Task[None]] = set()  # deletes of entries whose write was cut
        self._held: dict[Copy, tuple[Held, ...]] = {}  # mine, newest first
        self._held_unwritten = False
        self._shared: tuple[int, Mapping[Copy, tuple[Held, ...]]] | None = None

    def _own_wait(self, key: str) -> bool:
        kind, _, agent, *_ = [*key.split("."), "", ""]
        return kind == "wait" and agent == self.agent

    def _key(self, kind: str, model: str) -> str:
        return f"{kind}.{escape_key(model)}.{self.agent}"

    async def _put(self, key: str, value: dict[str, object]) -> None:
        # Demand only orders victims; losing a write is harmless.
        with contextlib.suppress(StoreUnavailable):
            await self.store.put(MODEL_DEMAND, key, orjson.dumps({**value, **self.crew}))

    async def _drop(self, key: str) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.store.delete(MODEL_DEMAND, key)

    async def waiting(self, model: str, since: float | None = None,
                      turn: float | None = None, need: WaitNeed = ANY_COPY,
                      also: tuple[str, ...] = ()) -> WaitEntry:
        """A call starts waiting for `model` (due a slot at `turn`, by default its arrival;
        `also`: the other models it could run on); it counts in this sidecar's view at once,
        in the others' once the write arrives."""
        arrived = self.clock.now() if since is None else since
        entry = WaitEntry(f"{self._key('wait', model)}.{self._take_number(model)}", model,
                          arrived, arrived if turn is None else turn, need, also)
        self._waits[entry.key] = entry
        self._own_version += 1
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_waits())
        try:
            await self._write_wait(entry)
        except BaseException:  # (cancelled: its caller has no entry to end, so it ends here)
            self.stop_waiting(entry)
            ending = asyncio.get_running_loop().create_task(self.done_waiting(entry))
            self._ending.add(ending)
            ending.add_done_callback(self._ending.discard)
            raise
        return entry

    def _take_number(self, model: str) -> int:
        used = self._numbers.setdefault(model, set())
        number = next(n for n in itertools.count(1) if n not in used)
        used.add(number)
        return number

    def _free_number(self, entry: WaitEntry) -> None:
        used = self._numbers.get(entry.model)
        if used is not None:
            used.discard(int(entry.key.rpartition(".")[2]))
            if not used:
                del self._numbers[entry.model]

    async def _write_wait(self, entry: WaitEntry) -> None:
        await self._put(entry.key, self._wait_value(entry, self.clock.now()))

    @staticmethod
    def _wait_value(entry: WaitEntry, now: float) -> dict[str, object]:
        return {"expiresAt": now + WAIT_TTL_S, "since": entry.since, "turn": entry.turn,
                **need_value(entry.need), **({"also": list(entry.also)} if entry.also else {})}

    async def _refresh_waits(self) -> None:
        while self._waits:
            await asyncio.sleep(WAIT_REFRESH_S)
            for entry in list(self._waits.values()):
                if self._waits.get(entry.key) is entry:  # (its number may be taken anew)
                    await self._write_wait(entry)

    def others_waiting(self, model: str, could_run: Callable[[WaitNeed], bool] | None = None
                       ) -> bool:
        """Whether calls of other sidecars wait for `model`, or could run on it while
        waiting for another (this one's are not counted); with `could_run`, only those
        whose needs the copy in question meets (a call whose num_ctx or prompt its context
        cannot hold, or kept off its card, waits for another copy)."""
        found = self.view().get(model)
        if found is None or not (found.waiters or found.backing):
            return False
        runs = could_run or _any_copy
        waiting = sum(map(runs, (*(found.needs or (ANY_COPY,) * found.waiters),
                                 *found.backing)))
        return waiting > sum(runs(e.need) for e in self._waits.values()
                             if e.model == model or model in e.also)

    def stop_waiting(self, entry: WaitEntry) -> bool:
        """Leave this sidecar's view at once (the board's entry goes with done_waiting);
        False when it had left already."""
        if self._waits.pop(entry.key, None) is None:
            return False
        self._own_version += 1
        return True

    async def done_waiting(self, entry: WaitEntry) -> None:
        self.stop_waiting(entry)
        try:
            await self._drop(entry.key)
        finally:  # (its number is used again only once the delete is written, or failed)
            self._free_number(entry)

    async def intend(self, model: str) -> None:
        self._intents[model] = self._intents.get(model, 0) + 1
        await self._put(self._key("intent", model), {"expiresAt": self.clock.now() + INTENT_TTL_S})

    async def drop_intent(self, model: str) -> None:
        left = self._intents.pop(model, 1) - 1
        if left > 0:
            self._intents[model] = left
            return
        await self._drop(self._key("intent", model))

    async def _bump(self, key: str, extra: dict[str, object], count: float = 1.0) -> None:
        now = self.clock.now()
        previous = self.store.view(MODEL_DEMAND).get(key)
        rate = 0.0
        if previous is not None:
            old = orjson.loads(previous.value)
            rate = decayed(float(old.get("rate", 0)), float(old.get("at", now)), now)
        await self._put(key, {"rate": rate + count, "at": now, "expiresAt": now + USE_TTL_S,
                              **extra})

    def note_use(self, model: str) -> None:
        """Count a finished call; the count reaches the board within USE_FLUSH_S."""
        self._unwritten_use[model] = self._unwritten_use.get(model, 0) + 1
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(USE_FLUSH_S)
        await self.flush_uses()

    async def flush_uses(self) -> None:
        pending, self._unwritten_use = self._unwritten_use, {}
        for model, count in pending.items():
            await self._bump(self._key("use", model), {}, count)
        if self._held_unwritten:
            self._held_unwritten = False
            now = self.clock.now()
            # (what no cache is expected to hold any more goes: copies of models run once,
            # or removed, would stay in every write)
            self._held = {copy: kept for copy, held in self._held.items()
                          if (kept := tuple(h for h in held if now - h.at < CACHE_TTL_S))}
            await self._put(f"cache.{self.agent}", {
                "expiresAt": now + CACHE_TTL_S,
                "copies": [[provider, model, [list(_held_row(h)) for h in held]]
                           for (provider, model), held in self._held.items()]})

    def note_held(self, sent: list[tuple[Copy, Held]]) -> None:
        """Prompts this sidecar sent to copies; the others see them within USE_FLUSH_S (with
        the use counts: no write of its own per call)."""
        if not sent:
            return
        for copy, held in sent:
            mine = [h for h in self._held.get(copy, ()) if h.ident != held.ident]
            # (a loop's end re-shares an entry sent earlier: it goes back to its place)
            self._held[copy] = tuple(sorted((held, *mine), key=lambda h: -h.at)
                                     )[:KEEP_PER_COPY]
        self._held_unwritten = True
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_later())

    def shared_caches(self) -> Mapping[Copy, tuple[Held, ...]]:
        """What the other sidecars sent to each copy lately (reread when the board
        changes)."""
        version = self.store.version(MODEL_DEMAND)
        if self._shared is not None and self._shared[0] == version:
            return self._shared[1]
        now = self.clock.now()
        shared: dict[Copy, list[Held]] = {}
        mine = f"cache.{self.agent}"
        entries = self.store.view(MODEL_DEMAND)
        for _key, value in decode_entries({k: e for k, e in entries.items()
                                          if k.startswith("cache.") and k != mine},
                                         self._decoded):
            if float(value.get("expiresAt", 0)) <= now:
                continue
            for row in value.get("copies") or []:
                try:
                    provider, model, held = str(row[0]), str(row[1]), row[2]
                    shared.setdefault((provider, model), []).extend(
                        _held_of(h) for h in held)
                except (IndexError, TypeError, ValueError):
                    continue  # another version's shape: nothing to share
        result = MappingProxyType({k: tuple(v) for k, v in shared.items()})
        self._shared = (version, result)
        return result

    async def close(self) -> None:
        """Write what is counted and stop the timer (at shutdown)."""
        if self._flusher is not None:
            self._flusher.cancel()
        if self._refresher is not None:
            self._refresher.cancel()
        await self.flush_uses()

    async def selected(self, models: Iterable[str]) -> None:
        await self._bump(f"sel.{self.agent}", {"models": list(models)})

    def view(self) -> Mapping[str, ModelDemand]:
        """Demand per model. Every decision asks and a cluster's board holds an entry per
        agent and model, so the answer is reused while the board has not changed, for up to
        VIEW_REUSE_S (rates decay over minutes; entries expire to the second)."""
        version, now = (self.store.version(MODEL_DEMAND), self._own_version), self.clock.now()
        cached = self._view
        if cached is not None and cached[0] == version and 0 <= now - cached[1] < VIEW_REUSE_S:
            return cached[2]
        entries = self.store.view(MODEL_DEMAND)
        for gone in set(self._decoded) - set(entries):
            del self._decoded[gone]
        # This sidecar's own waiting calls as it knows them, not as the store echoes them
        values = [(k, v) for k, v in decode_entries(entries, self._decoded)
                  if k in self._waits or not self._own_wait(k)]
        seen = {k for k, _ in values}
        values += [(e.key, self._wait_value(e, now))
                   for e in self._waits.values() if e.key not in seen]
        demand = MappingProxyType(aggregate(values, now))
        self._view = (version, now, demand)
        return demand


def _held_row(held: Held) -> tuple[int | float, ...]:
    return (held.first, held.ident, held.last, held.items, held.tokens, held.shared_tokens,
            round(held.at, 3), int(held.finished), round(held.pause, 3))


def _held_of(row: list[int | float]) -> Held:
    first, ident, last, items, tokens, shared = (int(x) for x in row[:6])
    # older sidecars' rows end after `at`: a live loop, its cadence unknown
    finished = len(row) > 7 and bool(row[7])
    pause = float(row[8]) if len(row) > 8 else 0.0
    return Held(first, ident, last, items, tokens, shared, float(row[6]), pause, finished)
