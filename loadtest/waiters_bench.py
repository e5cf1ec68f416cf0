"""What one sidecar's event loop pays for its waiting calls at production scale.

    python -m loadtest.waiters_bench [--providers 40] [--models 30] [--waiters 200]
        [--sidecars 20] [--rate 50] [--seconds 5] [--seed 7]

One sidecar's services, built as the app builds them (`proxy.app.build_services`) over the
embedded store, in this process and on this loop; nothing is probed or sent to a GPU. The
store holds what the fleet's probes and the other sidecars would have written: every card's
state (a few resident copies, each filling the card's memory so no load fits beside them),
a ticket for every slot of every copy (held by the sidecars in turn, so every slot is busy),
and on the demand board each sidecar's use counts, a selection and ten waiting calls; this
sidecar has learned how long each copy's calls take (one answer of each). This
sidecar's waiters are real calls in `Scheduler.place_call`, each asking for one resident
model: each is decided "wait", blocks, and is placed again on every change.

Figures:
- `place`: the pure core's time on this sidecar's snapshot, for fleets of 10 to
  `--providers` cards and 1, 4 and 8 candidates, and what a waiter pays in all per decision
  (its snapshot built, then `place`);
- one change with N waiters: from a ticket write (another sidecar's renewal) until every
  waiter has decided again: wall time, CPU time, and the longest the loop went without a
  turn for anything else (a streamed chunk waits that long);
- a burst: ticket writes at `--rate` a second for `--seconds`: the loop's longest stall and
  its p99 (a 2 ms ticker's lateness), the share of the loop the waiters take, decisions a
  second, and how long a new call waits for its own decision meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

import proxy.service.scheduler as scheduler_module
from loadtest.loadgen import percentile
from proxy.adapters.memory_kv import MemoryStore
from proxy.app import Services, build_services
from proxy.core.lengths import NO_LENGTHS, CallSample
from proxy.core.placement import place
from proxy.core.tickets import TicketSet
from proxy.core.types import CallSpec, Candidate, ModelInfo, Ticket
from proxy.observability.logging import configure_logging
from proxy.ports import (
    MODEL_DEMAND,
    PROVIDER_STATE,
    PROVIDER_TICKETS,
    SIDECAR_BUCKETS,
)
from proxy.service.codec import ProviderState, encode_ticket_set, escape_key
from proxy.service.routing import CallRequest, ProviderPool
from proxy.service.scheduler import Scheduler
from proxy.settings import load_settings

CARDS_MIB = (24564, 32768, 49140)
TICKET_TTL_S = 3600.0  # no ticket expires during a run: only the writes change the state


class NoGauge:
    """No DCGM exporter: nothing is probed in this bench."""

    async def total_mib(self, url: str, gpus: int = 1) -> int | None:
        return None


def model_info(i: int, weights: bool = False) -> ModelInfo:
    """`weights`: a weights file of its own, as /api/show names one for every model on a
    real Ollama (the checks for models of one file then run: docs/rules.md)."""
    return ModelInfo(trained_context=32768, kv_bytes_per_token=(64 + 16 * (i % 5)) * 1024,
                     weights=f"sha256-{i:064x}" if weights else "",
                     estimate_kv_bytes_per_token=(64 + 16 * (i % 5)) * 1024,
                     family="qwen3", architecture="qwen3",
                     capabilities=("completion", "tools"))


@dataclass
class Fleet:
    services: Services
    store: MemoryStore
    models: list[str]
    resident: list[str]  # models with a copy on some card
    tickets: dict[str, TicketSet]  # per card, as written


def fleet(providers: int, models: int, sidecars: int, seed: int, weights: bool = False
          ) -> Fleet:
    rng = random.Random(seed)
    names = [f"m{i:02d}:{rng.choice((4, 8, 14))}b" for i in range(models)]
    disk = {m: 2500 + 700 * (i % 17) for i, m in enumerate(names)}
    configs = []
    states = []
    sets: dict[str, TicketSet] = {}
    now = time.time()
    resident: set[str] = set()
    for p in range(providers):
        name, total = f"gpu-{p:03d}", rng.choice(CARDS_MIB)
        parallel = rng.choice((2, 4))
        configs.append({"name": name, "endpoint": f"http://127.0.0.1:{20000 + p}",
                        "totalVramMiB": total, "maxParallel": parallel,
                        "contextLength": 8192})
        loaded: dict[str, int] = {}
        free = total - 600
        for m in rng.sample(names, len(names)):
            mib = disk[m] + 1400
            if mib <= free:
                loaded[m], free = mib, free - mib
            if len(loaded) == 3:
                break
        loaded_models = list(loaded)
        # The last copy takes what is left: no load fits beside the busy copies
        loaded[loaded_models[-1]] += max(0, free - 300)
        resident.update(loaded)
        states.append(ProviderState(
            name, f"http://127.0.0.1:{20000 + p}", True, now, total, 8192, parallel, 0, 1,
            "f16", loaded_mib=dict(loaded), loaded_size_mib=dict(loaded),
            loaded_ctx={m: 8192 * parallel for m in loaded},
            loaded_expiry={m: now + 300 for m in loaded},
            available_mib=dict(disk),
            observed={m: {8192 * parallel: loaded[m]} for m in loaded},
            models={m: model_info(i, weights) for i, m in enumerate(names)}, version="0.33.0"))
        tickets = {}
        for m in loaded:
            for s in range(parallel):
                tid = f"{name}-{m}-{s}"
                tickets[tid] = Ticket(tid, name, m, 512, now, now + TICKET_TTL_S,
                                      holder=f"crew/agent-{(p + s) % sidecars}",
                                      context=8192 * parallel)
        sets[name] = TicketSet(tickets)
    settings = load_settings(providers=configs, agent_name="agent-0", namespace="crew",
                             discuss_gpu_wait_limit_seconds=3600.0)
    store = MemoryStore(SIDECAR_BUCKETS)
    pool = ProviderPool(settings.providers, None, None, lambda endpoint: None)  # type: ignore
    services = build_services(settings, store, pool, gpu_memory=NoGauge())
    for state in states:
        store._write(PROVIDER_STATE, escape_key(state.name), state.encode())
    for name, ticket_set in sets.items():
        store._write(PROVIDER_TICKETS, escape_key(name), encode_ticket_set(ticket_set))
    # What this sidecar learned of its answers: each copy's calls on its card
    lengths = NO_LENGTHS
    for state in states:
        for m in state.loaded_mib:
            tokens, rate = rng.randint(100, 600), rng.uniform(20, 80)
            lengths = lengths.observe(state.name, m, CallSample(
                tokens / rate + 1.0, tokens, tokens / rate, 2000, 1.0))
    services.experience.learning.lengths = lengths
    # The other sidecars on the demand board: use counts, a selection, ten waiting calls each
    order = sorted(resident)
    for s in range(1, sidecars):
        agent = f"crew.agent-{s}"
        for m in rng.sample(order, 5):
            store._write(MODEL_DEMAND, f"use.{escape_key(m)}.{agent}", orjson.dumps(
                {"rate": rng.uniform(1, 30), "at": now, "expiresAt": now + 3600}))
        store._write(MODEL_DEMAND, f"sel.{agent}", orjson.dumps(
            {"rate": 3.0, "at": now, "expiresAt": now + 3600, "models": rng.sample(order, 3)}))
        for w in range(10):
            since = now - rng.uniform(0, 20)
            store._write(MODEL_DEMAND, f"wait.{escape_key(rng.choice(order))}.{agent}.{w}",
                         orjson.dumps({"expiresAt": now + 3600, "since": since,
                                       "turn": since + rng.uniform(0, 5)}))
    return Fleet(services, store, names, order, sets)


def renew_one(f: Fleet, rng: random.Random) -> None:
    """Another sidecar renews one of its tickets: the card's set is rewritten (a change every
    waiter wakes for, and one that frees nothing)."""
    name = rng.choice(sorted(f.tickets))
    current = f.tickets[name]
    tid = rng.choice(sorted(current.tickets))
    t = current.tickets[tid]
    renewed = Ticket(t.ticket_id, t.provider, t.model, t.footprint_mib, t.started_at,
                     t.expires_at + 1.0, holder=t.holder, context=t.context)
    f.tickets[name] = TicketSet({**current.tickets, tid: renewed})
    f.store._write(PROVIDER_TICKETS, escape_key(name), encode_ticket_set(f.tickets[name]))


class Decisions:
    """Counts `place` calls made by the scheduler (the waiters' decisions)."""

    def __init__(self) -> None:
        self.count = 0
        self.outcomes: dict[str, int] = {}

    def install(self) -> None:
        def counted(spec: CallSpec, snapshot: Any, policy: Any = None) -> Any:
            decision = place(spec, snapshot, policy) if policy is not None else \
                place(spec, snapshot)
            self.count += 1
            self.outcomes[decision.outcome] = self.outcomes.get(decision.outcome, 0) + 1
            return decision
        scheduler_module.place = counted  # type: ignore[attr-defined,assignment]


class Ticker:
    """A task that wakes every `period_s`: how late each wake is, the loop's stalls."""

    def __init__(self, period_s: float = 0.002) -> None:
        self.period_s = period_s
        self.late_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t0 = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.late_ms.append((time.perf_counter() - t0 - self.period_s) * 1000)

    def start(self) -> None:
        self.late_ms = []
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> list[float]:
        assert self._task is not None
        self._task.cancel()
        return self.late_ms


def time_us(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return percentile(times, 0.5), percentile(times, 0.99)


def decide(s: Scheduler, spec: CallSpec) -> None:
    """What a waiter pays for one decision: its snapshot, then `place`."""
    place(spec, s.snapshot(time.time()), s.policy)


async def place_table(a: argparse.Namespace) -> None:
    print("providers  candidates  place_p50_us  p99_us  snapshot+place_p50_us  p99_us  outcome")
    sizes = sorted({n for n in (10, 20, a.providers) if n <= a.providers})
    for n in sizes:
        f = fleet(n, a.models, a.sidecars, a.seed, a.own_weights)
        s = f.services.scheduler
        for k in (1, 4, 8):
            spec = CallSpec(tuple(Candidate(m, 100 - 5 * i) for i, m in
                                  enumerate(f.resident[:k])), prompt_tokens=2000,
                            tolerance=10, wait_left_s=600.0)
            snap = s.snapshot(time.time())
            outcome = place(spec, snap, s.policy).outcome
            p50, p99 = time_us(partial(place, spec, snap, s.policy), a.repeat)
            full50, full99 = time_us(partial(decide, s, spec), a.repeat)
            print(f"{n:9d}  {k:10d}  {p50:12.0f}  {p99:6.0f}  {full50:21.0f}  {full99:6.0f}"
                  f"  {outcome}", flush=True)


async def start_waiters(f: Fleet, n: int, decisions: Decisions, rng: random.Random
                        ) -> list[asyncio.Task[object]]:
    s = f.services.scheduler
    tasks: list[asyncio.Task[object]] = []
    for _ in range(n):
        call = CallRequest("/api/chat", rng.choice(f.resident), num_predict=200)
        tasks.append(asyncio.ensure_future(s.place_call(call)))
        await asyncio.sleep(0)
    while decisions.count < n or len(f.services.demand._waits) < n:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # settled: every waiter blocked
    return tasks


async def one_change(f: Fleet, n: int, decisions: Decisions, ticker: Ticker,
                     rng: random.Random) -> tuple[float, float, float]:
    """Wall ms, CPU ms and the longest stall (ms) until all `n` waiters decided again."""
    before = decisions.count
    ticker.start()
    await asyncio.sleep(0.05)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    renew_one(f, rng)
    while decisions.count < before + n:  # noqa: ASYNC110 (each turn of the loop counts)
        await asyncio.sleep(0)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    await asyncio.sleep(0.02)
    late = ticker.stop()
    return wall * 1000, cpu * 1000, max(late)


async def burst(f: Fleet, a: argparse.Namespace, decisions: Decisions, ticker: Ticker,
                rng: random.Random) -> dict[str, float]:
    """Ticket writes at `a.rate` a second for `a.seconds`; a new call's decision is timed
    every 100 ms meanwhile."""
    s = f.services.scheduler
    new_call_ms: list[float] = []
    spec = CallSpec((Candidate(f.resident[0]),), prompt_tokens=2000, wait_left_s=600.0)

    async def writes() -> None:
        period = 1.0 / a.rate
        next_at = time.perf_counter()
        end = next_at + a.seconds
        while next_at < end:
            renew_one(f, rng)
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    async def new_calls() -> None:
        while True:
            await asyncio.sleep(0.1)
            t0 = time.perf_counter()
            reserved = await s.decide_and_reserve(spec)
            new_call_ms.append((time.perf_counter() - t0) * 1000)
            s.unreserve(reserved)

    before = decisions.count
    ticker.start()
    prober = asyncio.ensure_future(new_calls())
    wall0, cpu0 = time.perf_counter(), time.process_time()
    await writes()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    prober.cancel()
    late = ticker.stop()
    return {"stall_max_ms": max(late), "stall_p99_ms": percentile(late, 0.99),
            "loop_busy": cpu / wall, "decisions_per_s": (decisions.count - before) / wall,
            "new_call_p50_ms": statistics.median(new_call_ms) if new_call_ms else math.nan,
            "new_call_max_ms": max(new_call_ms) if new_call_ms else math.nan}


async def run(a: argparse.Namespace) -> None:
    rng = random.Random(a.seed)
    if a.part in ("all", "place"):
        await place_table(a)
    if a.part == "place":
        return
    decisions = Decisions()
    decisions.install()
    ticker = Ticker()
    print(f"\n{a.providers} providers, {a.models} models, {a.sidecars} sidecars' tickets and "
          "wait entries")
    print("waiters  change_wall_ms  change_cpu_ms  per_waiter_us  stall_max_ms")
    steps = sorted({w for w in (10, 50, a.waiters) if w <= a.waiters})
    f = fleet(a.providers, a.models, a.sidecars, a.seed, a.own_weights)
    tasks: list[asyncio.Task[object]] = []
    have = 0
    for n in steps:
        tasks += await start_waiters(f, n - have, decisions, rng)
        have = n
        runs = [await one_change(f, n, decisions, ticker, rng) for _ in range(a.changes)]
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        stall = max(r[2] for r in runs)
        print(f"{n:7d}  {wall:14.1f}  {cpu:13.1f}  {cpu * 1000 / n:13.0f}  {stall:12.1f}",
              flush=True)
    print(f"\nburst: a ticket write {a.rate:g}/s for {a.seconds:g} s with {have} waiters")
    r = await burst(f, a, decisions, ticker, rng)
    print("  ".join(f"{k} {v:.3g}" for k, v in r.items()), flush=True)
    print("outcomes:", dict(sorted(decisions.outcomes.items())))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--providers", type=int, default=40)
    p.add_argument("--models", type=int, default=30)
    p.add_argument("--waiters", type=int, default=200)
    p.add_argument("--sidecars", type=int, default=20)
    p.add_argument("--rate", type=float, default=50.0, help="ticket writes a second")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--changes", type=int, default=5, help="single changes timed per size")
    p.add_argument("--repeat", type=int, default=300)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--part", choices=("all", "place", "waiters"), default="all")
    p.add_argument("--own-weights", action="store_true",
                   help="every model with a weights file of its own, as on a real Ollama")
    configure_logging("warning")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
