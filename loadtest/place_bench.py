"""Time of one `place()` call as the fleet grows (pure core, no I/O).

    python -m loadtest.place_bench [--repeat 2000] [--fresh]

Each fleet has half its cards holding two residents, a few calls in flight, and an
8-model candidate list whose preferred model is warm nowhere (so the planner walks all
five steps: the worst case short of waiting). Every model has an architecture, and each was
seen loaded on some card, so every footprint is calibrated and sized for the card's context,
slots and cache type.

Each call is placed on the same snapshot; with --fresh, on a snapshot built anew before
each call from the same cards' decoded mappings, as the sidecar builds one per placement
(proxy/service/snapshot.py), so facts kept per snapshot object are worked out every time.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

from loadtest.loadgen import percentile
from proxy.core.placement import place
from proxy.core.types import (
    CallSpec,
    Candidate,
    ModelInfo,
    ProviderHealth,
    ProviderView,
    Resident,
    Snapshot,
    Ticket,
)

MODELS = [f"m{i}:7b" for i in range(12)]
INFO = ModelInfo(trained_context=32768, kv_bytes_per_token=128 * 1024,
                 estimate_kv_bytes_per_token=128 * 1024, family="qwen3")


def fleet(n: int, seed: int = 7) -> tuple[Snapshot, CallSpec]:
    rng = random.Random(seed)
    views = []
    tickets = []
    for i in range(n):
        residents = tuple(Resident(m, rng.choice([3000, 6000, 12000]))
                          for m in rng.sample(MODELS[4:], 2)) if i % 2 else ()
        views.append(ProviderView(f"gpu-{i}", rng.choice([16376, 24564, 32768]),
                                  residents=residents, context_length=rng.choice([4096, 8192]),
                                  max_parallel=rng.choice([1, 2, 4]),
                                  disk_mib={m: 5000 for m in MODELS},
                                  models={m: INFO for m in MODELS}, version="0.33.0",
                                  kv_cache_type=rng.choice(["f16", "q8_0"]),
                                  observed={m: {4096: 5600} for m in MODELS[i % 12:][:2]}))
        for r in residents[:1]:
            tickets.append(Ticket(f"t{i}", f"gpu-{i}", r.model, 512, 990.0, 1060.0))
    health = {v.name: ProviderHealth(latency_ema_s=10.0) for v in views}
    snap = Snapshot(1000.0, tuple(views), tuple(tickets), {}, health)
    spec = CallSpec(tuple(Candidate(m, 100 - 5 * k) for k, m in enumerate(MODELS[:8])),
                    prompt_tokens=2000, tolerance=10)
    return snap, spec


def rebuilt(snap: Snapshot) -> Snapshot:
    """The same fleet in new objects, its cards' mappings shared (as decoded once)."""
    return replace(snap, providers=tuple(replace(v) for v in snap.providers),
                   tickets=tuple(list(snap.tickets)))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeat", type=int, default=2000)
    p.add_argument("--sizes", default="16,64,256")
    p.add_argument("--fresh", action="store_true",
                   help="a snapshot built anew for every call")
    a = p.parse_args(argv)
    print("providers  candidates  p50_us  p99_us  outcome")
    for n in (int(x) for x in a.sizes.split(",")):
        snap, spec = fleet(n)
        times = []
        decision = place(spec, snap)
        for _ in range(a.repeat):
            placed_on = rebuilt(snap) if a.fresh else snap
            t0 = time.perf_counter()
            place(spec, placed_on)
            times.append((time.perf_counter() - t0) * 1e6)
        print(f"{n:9d}  {len(spec.candidates):10d}  {percentile(times, 0.5):6.0f}"
              f"  {percentile(times, 0.99):6.0f}  {decision.outcome}/"
              f"{decision.placement.kind if decision.placement else '-'}", flush=True)


if __name__ == "__main__":
    main()
