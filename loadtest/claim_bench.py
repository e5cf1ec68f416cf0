"""Claim + release throughput and latency through a real NATS, spread over processes.

    python -m loadtest.claim_bench [--seconds 4] [--levels 1,8,32] [--procs 4]

Concurrent claimers are spread over the processes (1 -> 1x1, 8 -> 4x2, 32 -> 4x8). A small
budget (3 tickets) is also raced to count overcommits, which must stay 0.
"""

from __future__ import annotations

import argparse

from loadtest.claim_race import max_overlap, run_race
from loadtest.loadgen import percentile
from loadtest.nats_server import NatsServer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--procs", type=int, default=4)
    a = p.parse_args(argv)
    server = NatsServer().start()
    try:
        print("claimers  procs x tasks  cycles/s  claim_p50_ms  claim_p99_ms  release_p50_ms"
              "  conflicts/claim  overcommit")
        for level in (int(x) for x in a.levels.split(",")):
            procs = 1 if level == 1 else a.procs
            tasks = max(1, level // procs)
            results = run_race(server.url, procs, tasks, a.seconds, 0.0, 10**9, 1)
            claims = [x * 1000 for r in results for x in r["latencies"]]
            releases = [x * 1000 for r in results for x in r["release"]]
            conflicts = sum(r["conflicts"] for r in results)
            # Overcommit check on a 3-ticket budget with the same spread of claimers.
            tight = run_race(server.url, procs, tasks, min(2.0, a.seconds), 1.0, 3000, 1000)
            overlap = max_overlap([tuple(i) for r in tight for i in r["intervals"]])  # type: ignore[misc]
            print(f"{level:8d}  {procs:5d} x {tasks:<5d} {len(releases) / a.seconds:9.0f}"
                  f"  {percentile(claims, 0.5):12.2f}  {percentile(claims, 0.99):12.2f}"
                  f"  {percentile(releases, 0.5):14.2f}  {conflicts / max(1, len(claims)):15.2f}"
                  f"  {max(0, overlap - 3):10d}", flush=True)
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
