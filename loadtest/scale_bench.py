"""Many sidecars on one NATS, for sizing a deployment: what a sidecar costs idle, what
nats-server and the GPUs' probes cost as the fleet grows, and how calls fare under load.

For each count in `--sidecars`, a fresh fleet: the fleet soak's simulated GPUs, one real
nats-server with monitoring, `init-buckets`, one `publish` and that many `serve` processes
(sidecar i bound as the soak's PROFILES[i % 4]). The fleet sits untouched for `--idle`
seconds, then for `--load` seconds each sidecar serves one closed-loop agent on the official
`ollama` client, asking for its bound model four calls in five and otherwise for any of five
models that do not all fit at once (short prompts, half of them streamed), pausing up to
`--pause` seconds between calls.

Figures: CPU (% of one core) and RSS of each process from /proc; nats-server's messages from
its /varz; probe requests per second from the simulators' own counters (`/_sim/stats`);
placements from each sidecar's /metrics. Exits 1 if Ollama had to evict, reload or spill a
model on its own, ran out of memory or cut a prompt, if a ticket was left behind, or if a
call ended other than answered or refused as the contract says.

    python -m loadtest.scale_bench [--sidecars 4,16,32] [--idle 5] [--load 30] [--seed 1]
        [--fleet tight] [--time-scale 0.05] [--pause 0.05] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import ollama
from prometheus_client.parser import text_string_to_metric_families

from loadtest.fleet_soak import (
    CHURN,
    FLEETS,
    REFUSALS,
    gpu_totals,
    sidecar_env,
    start_gpus,
    start_publisher,
    start_sidecars,
    stop_all,
)
from loadtest.loadgen import percentile
from loadtest.nats_server import NatsServer
from loadtest.relay_bench import cpu_seconds, free_port

# What Ollama never has to do when the sidecars place its models (the simulators' counters).
NEVER = ("self_evictions", "reloads", "spills", "oom_events", "truncations", "too_long_refusals")
PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_MIB


def machine_cpu_s() -> tuple[float, float]:
    """Every core's busy and total CPU seconds so far (/proc/stat): busy is all but idle and
    I/O wait."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    clock = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / clock, sum(ticks) / clock


@dataclass(frozen=True)
class Fleet:
    gpus: list[str]
    sidecars: list[tuple[str, str]]  # (URL, bound model)
    all_pids: list[int]  # every process the bench started, nats-server's too
    sidecar_pids: list[int]
    publisher_pid: int
    nats: NatsServer
    monitor: str  # nats-server's monitoring endpoint


@dataclass(frozen=True)
class Sample:
    at: float
    sidecar_cpu_s: list[float]
    sidecar_rss_mib: list[float]
    publisher_cpu_s: float
    nats_cpu_s: float
    varz: dict[str, Any]
    probes: collections.Counter[str]  # by path, every GPU's
    bench_cpu_s: float  # every process of the bench, this one included
    machine_busy_s: float
    machine_total_s: float


def sample(fleet: Fleet) -> Sample:
    probes: collections.Counter[str] = collections.Counter()
    for gpu in fleet.gpus:
        probes.update(httpx.get(gpu + "/_sim/stats").json()["probes_by_path"])
    assert fleet.nats.proc is not None
    bench = sum(cpu_seconds(pid) for pid in [*fleet.all_pids, os.getpid()])
    return Sample(time.monotonic(), [cpu_seconds(pid) for pid in fleet.sidecar_pids],
                  [rss_mib(pid) for pid in fleet.sidecar_pids],
                  cpu_seconds(fleet.publisher_pid), cpu_seconds(fleet.nats.proc.pid),
                  httpx.get(fleet.monitor + "/varz").json(), probes, bench,
                  *machine_cpu_s())


def costs(a: Sample, b: Sample) -> dict[str, Any]:
    """What the fleet cost between two samples: CPU in % of one core, rates per second."""
    dt = b.at - a.at
    cpu = [100 * (y - x) / dt for x, y in zip(a.sidecar_cpu_s, b.sidecar_cpu_s, strict=True)]

    def rate(key: str) -> float:
        return (int(b.varz[key]) - int(a.varz[key])) / dt

    machine = b.machine_total_s - a.machine_total_s
    return {"seconds": dt,
            # how starved the run was, and how much of it others' work
            "machine_busy_pct": 100 * (b.machine_busy_s - a.machine_busy_s) / machine,
            "others_busy_pct": 100 * (b.machine_busy_s - a.machine_busy_s
                                      - (b.bench_cpu_s - a.bench_cpu_s)) / machine,
            "sidecar_cpu_pct_mean": statistics.mean(cpu), "sidecar_cpu_pct_max": max(cpu),
            "sidecar_rss_mib_mean": statistics.mean(b.sidecar_rss_mib),
            "sidecar_rss_mib_max": max(b.sidecar_rss_mib),
            "publisher_cpu_pct": 100 * (b.publisher_cpu_s - a.publisher_cpu_s) / dt,
            "nats_cpu_pct": 100 * (b.nats_cpu_s - a.nats_cpu_s) / dt,
            "nats_rss_mib": int(b.varz["mem"]) / 2**20,
            "nats_in_msgs_per_s": rate("in_msgs"), "nats_out_msgs_per_s": rate("out_msgs"),
            "nats_out_kib_per_s": rate("out_bytes") / 1024,
            "probes_per_s": {path: (b.probes[path] - a.probes[path]) / dt
                             for path in sorted(b.probes)}}


Figures = collections.defaultdict[str, float]


def placement_figures(exposition: str) -> Figures:
    """The placement figures of one sidecar's /metrics; the decision histogram's buckets as
    `decision_le_<bound>` (cumulative, as Prometheus keeps them)."""
    figures: Figures = collections.defaultdict(float)
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name == "kubemoot_decision_seconds_count":
                figures["decisions"] += s.value
            elif s.name == "kubemoot_decision_seconds_sum":
                figures["decision_s"] += s.value
            elif s.name == "kubemoot_decision_seconds_bucket":
                figures[f"decision_le_{s.labels['le']}"] += s.value
            elif s.name == "kubemoot_placements_total":
                waiting = s.labels["placement"] == "waiting"  # a call that had to wait
                figures["waited" if waiting else "placements"] += s.value
            elif s.name == "kubemoot_ticket_conflicts_total":
                figures["conflicts"] += s.value
            elif s.name == "kubemoot_ticket_claims_total":
                figures["claims"] += s.value
    return figures


def scrape(urls: list[str]) -> Figures:
    """Every sidecar's placement figures, summed."""
    total: Figures = collections.defaultdict(float)
    for url in urls:
        for key, value in placement_figures(httpx.get(url + "/metrics").text).items():
            total[key] += value
    return total


def since(after: Figures, before: Figures) -> Figures:
    return collections.defaultdict(float, {k: v - before[k] for k, v in after.items()})


def bucket_bound(counts: Figures, q: float) -> float:
    """The upper bound of the histogram bucket holding quantile q."""
    buckets = sorted((float(key.removeprefix("decision_le_")), count)
                     for key, count in counts.items() if key.startswith("decision_le_"))
    return next((bound for bound, count in buckets if count >= q * counts["decisions"]),
                float("inf"))


@dataclass
class Served:
    """One agent's calls: the seconds each answered call took, every call's outcome, and
    what each call that ended outside the contract was and saw."""

    seconds: list[float] = field(default_factory=list)
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[str] = field(default_factory=list)


async def agent(url: str, model: str, seed: int, deadline: float, pause_s: float,
                served: Served) -> None:
    """One call at a time until the deadline, its bound model four calls in five, pausing
    up to `pause_s` between calls."""
    rng = random.Random(seed)
    client = ollama.AsyncClient(host=url, timeout=120)
    paused = 0.0
    while time.monotonic() < deadline:
        asked = model if rng.random() < 0.8 else rng.choice(CHURN)
        messages = [{"role": "user", "content": "w " * (rng.randint(100, 4000) // 2)}]
        options = {"num_predict": rng.randint(4, 40)}
        started = time.monotonic()
        stream = rng.random() < 0.5
        try:
            if stream:
                async for part in await client.chat(model=asked, messages=messages,
                                                    stream=True, options=options):
                    if part.get("error"):  # a stream that fails after its first line
                        raise ollama.ResponseError(part["error"], -1)
            else:
                await client.chat(model=asked, messages=messages, options=options)
            served.seconds.append(time.monotonic() - started)
            served.outcomes["200"] += 1
        except Exception as exc:  # counted and reported with the rest, not a dead run
            outcome = (str(exc.status_code) if isinstance(exc, ollama.ResponseError)
                       else type(exc).__name__)
            served.outcomes[outcome] += 1
            if not (outcome.isdigit() and int(outcome) in REFUSALS):
                served.failures.append(
                    f"{url} {asked}{' streamed' if stream else ''}: {outcome} {exc!r} "
                    f"{time.monotonic() - started:.2f} s into the call, "
                    f"{paused:.2f} s after the last one")
        paused = rng.uniform(0.0, pause_s)
        await asyncio.sleep(paused)


async def drive(fleet: Fleet, seconds: float, seed: int, pause_s: float) -> list[Served]:
    deadline = time.monotonic() + seconds
    served = [Served() for _ in fleet.sidecars]
    await asyncio.gather(*(agent(url, model, seed * 1000 + i, deadline, pause_s, served[i])
                           for i, (url, model) in enumerate(fleet.sidecars)))
    return served


def start_fleet(count: int, args: argparse.Namespace, nats: NatsServer, monitor: str,
                logs: Path, procs: list[subprocess.Popen[bytes]]) -> tuple[Fleet, float]:
    """The GPUs, the publisher and the sidecars on a running nats-server, each process in
    `procs` as it starts; and how long the sidecars took to answer /healthz."""
    cards = FLEETS[args.fleet]
    gpus, _ = start_gpus(cards, args.time_scale, logs, procs)
    common = {**sidecar_env(cards, gpus, args.log_level), "KUBEMOOT_NATS_URL": nats.url}
    publisher = start_publisher(common, logs, procs)
    began = time.monotonic()
    sidecars = start_sidecars(count, common, logs, procs, ready_s=30.0 + 2 * count)
    startup_s = time.monotonic() - began
    pids = [proc.pid for proc in procs[-count:]]
    assert nats.proc is not None
    return Fleet(gpus, sidecars, [nats.proc.pid, *(proc.pid for proc in procs)], pids,
                 publisher.pid, nats, monitor), startup_s


def run_size(count: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    """One fleet of `count` sidecars, measured idle then under load, then stopped."""
    procs: list[subprocess.Popen[bytes]] = []
    monitor_port = free_port()
    nats = NatsServer(extra_args=["-m", str(monitor_port)])
    try:
        nats.start()
        fleet, startup_s = start_fleet(count, args, nats, f"http://127.0.0.1:{monitor_port}",
                                       logs, procs)
        time.sleep(args.settle)  # the start-up's imports and first probes are not idle cost
        first = sample(fleet)
        time.sleep(args.idle)
        idle = costs(first, sample(fleet))
        urls = [url for url, _ in fleet.sidecars]
        placed_before, loaded = scrape(urls), sample(fleet)
        served = asyncio.run(drive(fleet, args.load, args.seed, args.pause))
        load = costs(loaded, sample(fleet))
        placed = since(scrape(urls), placed_before)
        time.sleep(1.0)  # the last releases reach NATS
        tickets = max(len(httpx.get(url + "/kubemoot/v1/state").json()["tickets"])
                      for url in urls)
        gpus = gpu_totals(fleet.gpus)
    finally:
        stop_all(procs, nats)
    models = [model for _, model in fleet.sidecars]
    return figures(count, startup_s, idle, load, placed, served, models, gpus, tickets)


def figures(count: int, startup_s: float, idle: dict[str, Any], load: dict[str, Any],
            placed: Figures, served: list[Served], models: list[str],
            gpus: collections.Counter[str], tickets: int) -> dict[str, Any]:
    seconds = [s for agent in served for s in agent.seconds]
    outcomes = sum((agent.outcomes for agent in served), collections.Counter[str]())
    answered = outcomes["200"]
    answered_per_s = answered / load["seconds"]
    per_sidecar = [agent.outcomes["200"] for agent in served]
    by_model: dict[str, list[int]] = collections.defaultdict(list)
    for model, answered_there in zip(models, per_sidecar, strict=True):
        by_model[model].append(answered_there)
    unexpected = {k: v for k, v in outcomes.items()
                  if k != "200" and not (k.isdigit() and int(k) in REFUSALS)}
    failures = [failure for agent in served for failure in agent.failures]
    problems = [f"{key}: {gpus[key]}" for key in NEVER if gpus[key]]
    problems += [f"tickets left: {tickets}"] if tickets else []
    problems += [f"calls ended otherwise: {unexpected}", *failures[:10]] if unexpected else []
    return {
        "sidecars": count, "startup_s": startup_s,
        "idle": idle, "load": load,
        "calls": sum(outcomes.values()), "outcomes": dict(sorted(outcomes.items())),
        "served": answered, "served_per_s": answered_per_s,
        "seconds_p50": percentile(seconds, 0.5), "seconds_p95": percentile(seconds, 0.95),
        "served_per_sidecar_min": min(per_sidecar), "served_per_sidecar_max": max(per_sidecar),
        # sidecars bound to a model only one card holds wait for it: compare like with like
        "served_per_sidecar_by_model": {m: [min(n), max(n)] for m, n in by_model.items()},
        "decisions_per_served": placed["decisions"] / max(1, answered),
        "placements_per_served": placed["placements"] / max(1, answered),
        "decision_ms_mean": 1000 * placed["decision_s"] / max(1, placed["decisions"]),
        "decision_ms_p95_at_most": 1000 * bucket_bound(placed, 0.95),
        "decision_ms_per_served": 1000 * placed["decision_s"] / max(1, answered),
        "waited_per_served": placed["waited"] / max(1, answered),
        "conflicts_per_claim": placed["conflicts"] / max(1, placed["claims"]),
        # writes to the buckets, and what nats-server sends every sidecar's watches of them
        "nats_in_msgs_per_served": load["nats_in_msgs_per_s"] / max(1e-9, answered_per_s),
        "nats_out_msgs_per_served": load["nats_out_msgs_per_s"] / max(1e-9, answered_per_s),
        "gpus": dict(gpus), "tickets_left": tickets, "failures": failures, "problems": problems,
    }


def f1(value: float) -> str:
    return f"{value:.1f}"


def f2(value: float) -> str:
    return f"{value:.2f}"


def probes(phase: dict[str, Any]) -> str:
    return ", ".join(f"{path.removeprefix('/api/')} {f2(per_s)}"
                     for path, per_s in phase["probes_per_s"].items() if per_s)


def busy(phase: dict[str, Any]) -> str:
    return f"{phase['machine_busy_pct']:.0f} / {phase['others_busy_pct']:.0f}"


Row = tuple[str, Callable[[dict[str, Any]], str]]
ROWS: list[Row] = [
    ("sidecars up (s)", lambda r: f1(r["startup_s"])),
    ("**idle** machine CPU busy, % of all cores / others'", lambda r: busy(r["idle"])),
    ("sidecar CPU, % of a core: mean / max",
     lambda r: f"{f2(r['idle']['sidecar_cpu_pct_mean'])} / {f2(r['idle']['sidecar_cpu_pct_max'])}"),
    ("sidecar RSS MiB: mean / max",
     lambda r: f"{f1(r['idle']['sidecar_rss_mib_mean'])} / {f1(r['idle']['sidecar_rss_mib_max'])}"),
    ("publisher CPU %", lambda r: f2(r["idle"]["publisher_cpu_pct"])),
    ("nats-server CPU % / RSS MiB",
     lambda r: f"{f2(r['idle']['nats_cpu_pct'])} / {f1(r['idle']['nats_rss_mib'])}"),
    ("NATS msgs/s in / out",
     lambda r: f"{f1(r['idle']['nats_in_msgs_per_s'])} / {f1(r['idle']['nats_out_msgs_per_s'])}"),
    ("NATS KiB/s out", lambda r: f1(r["idle"]["nats_out_kib_per_s"])),
    ("GPU probes/s, all cards", lambda r: probes(r["idle"])),
    ("**load** calls answered (calls/s)", lambda r: f"{r['served']} ({f1(r['served_per_s'])})"),
    ("other outcomes",
     lambda r: ", ".join(f"{k}: {v}" for k, v in r["outcomes"].items() if k != "200") or "-"),
    ("call seconds p50 / p95", lambda r: f"{f2(r['seconds_p50'])} / {f2(r['seconds_p95'])}"),
    ("answered per sidecar min / max",
     lambda r: f"{r['served_per_sidecar_min']} / {r['served_per_sidecar_max']}"),
    ("the same, by bound model", lambda r: ", ".join(
        f"{model} {low}-{high}"
        for model, (low, high) in r["served_per_sidecar_by_model"].items())),
    ("machine CPU busy, % of all cores / others'", lambda r: busy(r["load"])),
    ("sidecar CPU % mean / max",
     lambda r: f"{f1(r['load']['sidecar_cpu_pct_mean'])} / {f1(r['load']['sidecar_cpu_pct_max'])}"),
    ("nats-server CPU % / msgs/s out",
     lambda r: f"{f1(r['load']['nats_cpu_pct'])} / {r['load']['nats_out_msgs_per_s']:.0f}"),
    ("NATS msgs in / out per answered call",
     lambda r: f"{f1(r['nats_in_msgs_per_served'])} / {r['nats_out_msgs_per_served']:.0f}"),
    ("GPU probes/s", lambda r: probes(r["load"])),
    ("placements / decisions per answered call",
     lambda r: f"{f2(r['placements_per_served'])} / {f1(r['decisions_per_served'])}"),
    ("decision ms mean / p95 at most",
     lambda r: f"{f2(r['decision_ms_mean'])} / {r['decision_ms_p95_at_most']:g}"),
    ("decision ms per answered call", lambda r: f1(r["decision_ms_per_served"])),
    ("calls that waited, per answered", lambda r: f2(r["waited_per_served"])),
    ("ticket conflicts per claim", lambda r: f2(r["conflicts_per_claim"])),
    ("GPU loads / unloads", lambda r: f"{r['gpus']['loads']} / {r['gpus']['unloads']}"),
    ("Ollama's own evictions / reloads / spills", lambda r: " / ".join(
        str(r["gpus"][k]) for k in ("self_evictions", "reloads", "spills"))),
    ("out of memory / prompts cut / refused too long", lambda r: " / ".join(
        str(r["gpus"][k]) for k in ("oom_events", "truncations", "too_long_refusals"))),
    ("tickets left", lambda r: str(r["tickets_left"])),
]


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| sidecars | " + " | ".join(str(r["sidecars"]) for r in results) + " |",
             "|---|" + "---|" * len(results)]
    lines += [f"| {label} | " + " | ".join(cell(r) for r in results) + " |"
              for label, cell in ROWS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecars", default="4,16,32",
                        help="comma-separated sidecar counts, each a fresh fleet")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds measured idle")
    parser.add_argument("--load", type=float, default=30.0, help="seconds under load")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds between the sidecars answering and the idle sample")
    parser.add_argument("--pause", type=float, default=0.05, metavar="SECONDS",
                        help="an agent pauses up to this long between calls (uniform): "
                             "longer for agents that think or run tools between calls")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--fleet", choices=sorted(FLEETS), default="tight")
    parser.add_argument("--time-scale", type=float, default=0.05,
                        help="simulated durations x this (0.05: 20 times faster than real)")
    parser.add_argument("--log-level", default="info", help="the sidecars' log level")
    parser.add_argument("--logs", type=Path, help="where the processes' logs go "
                                                  "(default: a new temporary directory)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write every figure there")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.sidecars.split(",")]
    logs = args.logs or Path(tempfile.mkdtemp(prefix="scale-bench-"))
    # A stop request unwinds like Ctrl-C, so every process started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started_load = os.getloadavg()[0]
    results = []
    for count in counts:
        (logs / str(count)).mkdir(parents=True, exist_ok=True)
        results.append(run_size(count, args, logs / str(count)))
        print(f"# {count} sidecars done", file=sys.stderr, flush=True)
    print(f"# scale bench: {args.fleet} fleet, idle {args.idle:g} s, load {args.load:g} s, "
          f"seed {args.seed}, time scale {args.time_scale}, {os.cpu_count()} cores, "
          f"load average at start {started_load:.1f}; logs in {logs}")
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    problems = [f"{r['sidecars']} sidecars: {p}" for r in results for p in r["problems"]]
    for problem in problems:
        print("PROBLEM", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
