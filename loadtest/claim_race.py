"""Many processes claim VRAM tickets on one provider through a real NATS server.

Used by the race test (is the budget ever exceeded?) and the claim benchmark (how fast?).
Each worker process runs `tasks` claimers in a loop for `seconds`; every won claim is held
for `hold_ms`, then released. Each process prints one JSON line: its holding intervals and
claim latencies.

    python -m loadtest.claim_race --url nats://127.0.0.1:4222 --procs 4 --tasks 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from proxy.adapters.nats_kv import NatsOptions, NatsStore
from proxy.core.policy import Policy
from proxy.core.types import ProviderView
from proxy.service.tickets import TicketBook

PROVIDER = "race-gpu"


async def worker(url: str, tasks: int, seconds: float, hold_ms: float, total_mib: int,
                 ticket_mib: int) -> dict[str, Any]:
    store = NatsStore(NatsOptions(url))
    await store.start()
    await store.replayed(5)
    # No reserve: the whole card is the budget the claims race for.
    book = TicketBook(store, Policy(reserve_min_mib=0, reserve_fraction=0.0), ttl_s=30)
    view = ProviderView(PROVIDER, total_mib)
    intervals: list[tuple[float, float]] = []
    latencies: list[float] = []
    release_latencies: list[float] = []
    refused = 0
    conflicts = 0
    deadline = time.monotonic() + seconds

    async def claimer() -> None:
        nonlocal refused, conflicts
        while time.monotonic() < deadline:
            ticket_id = uuid.uuid4().hex
            # A model of its own: two loads of one model are refused by rule, not by budget.
            ticket = book.new_ticket(ticket_id, PROVIDER, f"m-{ticket_id}", ticket_mib, True,
                                     {}, "race")
            t0 = time.perf_counter()
            result = await book.claim(ticket, view)
            latencies.append(time.perf_counter() - t0)
            conflicts += result.conflicts
            if not result.ok:
                refused += 1
                await asyncio.sleep(0.001)
                continue
            start = time.time()
            if hold_ms:
                await asyncio.sleep(hold_ms / 1000)
            end = time.time()
            intervals.append((start, end))
            t1 = time.perf_counter()
            await book.release(ticket)
            release_latencies.append(time.perf_counter() - t1)

    await asyncio.gather(*(claimer() for _ in range(tasks)))
    await store.close()
    return {"intervals": intervals, "latencies": latencies, "release": release_latencies,
            "refused": refused, "conflicts": conflicts}


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda x: (x[0], x[1]))
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def run_race(url: str, procs: int, tasks: int, seconds: float, hold_ms: float,
             total_mib: int, ticket_mib: int) -> list[dict[str, Any]]:
    args = [sys.executable, "-m", "loadtest.claim_race", "--worker", "--url", url,
            "--tasks", str(tasks), "--seconds", str(seconds), "--hold-ms", str(hold_ms),
            "--total-mib", str(total_mib), "--ticket-mib", str(ticket_mib)]
    with tempfile.TemporaryDirectory() as tmp:
        outs = [Path(tmp) / f"worker-{i}.json" for i in range(procs)]
        children = [subprocess.Popen([*args, "--out", str(out)]) for out in outs]
        for child in children:
            child.wait(timeout=seconds + 60)
        return [json.loads(out.read_text()) for out in outs]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--hold-ms", type=float, default=0.0)
    p.add_argument("--total-mib", type=int, default=10**9)
    p.add_argument("--ticket-mib", type=int, default=1)
    p.add_argument("--out", type=Path, help="worker: where to write its results (JSON)")
    a = p.parse_args(argv)
    if a.worker:
        job = worker(a.url, a.tasks, a.seconds, a.hold_ms, a.total_mib, a.ticket_mib)
        try:  # the loop `serve` runs on
            import uvloop
        except ImportError:
            out = asyncio.run(job)
        else:
            out = uvloop.run(job)
        a.out.write_text(json.dumps(out))
        return
    results = run_race(a.url, a.procs, a.tasks, a.seconds, a.hold_ms, a.total_mib,
                       a.ticket_mib)
    intervals = [tuple(i) for r in results for i in r["intervals"]]
    print(json.dumps({"wins": len(intervals), "max_overlap": max_overlap(intervals)}))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
