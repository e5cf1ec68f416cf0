"""Added latency of the sidecar (placed path, or the plain relay) against calling the
simulator directly.

One simulator process, one sidecar process, this process as the load generator. For each
concurrency level the same generator runs direct and through the sidecar, alternating
rounds so drift hits both alike; the added figure is the difference of the medians.

    python -m loadtest.relay_bench [--calls 400] [--rounds 3] [--nats] [--pin] [--relay-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import time
from collections.abc import Callable
from pathlib import Path

from loadtest.loadgen import median, run_load, spawn, stop, wait_http
from loadtest.nats_server import NatsServer

_HANDED_OUT: set[int] = set()
# Ports for tests on several xdist workers: below Linux's ephemeral range (32768-60999)
WORKER_PORTS_FROM, WORKER_PORTS = 20000, 12000


def free_port() -> int:
    """A free loopback port, never one this process handed out before: the kernel may offer
    a port again as soon as it is closed here, before the process it was meant for binds it,
    and the one that binds it answers for both. Under pytest-xdist each worker takes its
    ports from a range of its own below the kernel's ephemeral ones (which port-0 binds use),
    so no two workers, nor a server picking its own port, are handed the same one."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw")
    if workers <= 1 or not worker.isdigit():
        return _unused_port(lambda: 0)
    width = WORKER_PORTS // workers
    first = WORKER_PORTS_FROM + int(worker) % workers * width
    return _unused_port(lambda: first + random.randrange(width))


def _unused_port(candidate: Callable[[], int]) -> int:
    while True:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", candidate()))
            except OSError:  # taken
                continue
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=400, help="calls per level and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--tokens-per-s", type=float, default=400.0)
    parser.add_argument("--extra-env", default="{}", help="JSON env for the sidecar")
    parser.add_argument("--nats", action="store_true",
                        help="shared state in a real nats-server instead of embedded")
    parser.add_argument("--relay-only", action="store_true",
                        help="no providers, only KUBEMOOT_MODEL_ENDPOINT: the plain relay "
                             "with no placement and no tickets")
    parser.add_argument("--varied", action="store_true",
                        help="answer lengths drawn from 4-28 tokens (mean 16, the default) "
                             "instead of all 16: workers drift out of step as real agents "
                             "do, instead of arriving in lock-step bursts")
    parser.add_argument("--pin", action="store_true",
                        help="give the sidecar CPU 1 and the simulator and load generator "
                             "CPU 0, as a sidecar container with its own core would have")
    parser.add_argument("--idle", type=float, default=0.0, metavar="S",
                        help="only measure the sidecar's CPU over S seconds without calls")
    args = parser.parse_args(argv)
    load_cpus = {0} if args.pin else None
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
    nats = NatsServer().start() if args.nats else None

    sim_port, proxy_port = free_port(), free_port()
    # 64 slots of 1024 tokens: qwen3:8b takes ~16 GiB of the 48 GiB card. Slots decode at
    # full speed: the figure is the sidecar's time, not the card's.
    sim = spawn(["-m", "loadtest.ollama_sim", "--port", str(sim_port), "--parallel", "64",
                 "--vram", "49140", "--context", "1024", "--tokens-per-s",
                 str(args.tokens_per_s), "--no-share-gpu"], cpus=load_cpus)
    direct = f"http://127.0.0.1:{sim_port}"
    providers = [{"name": "gpu", "endpoint": direct, "totalVramMiB": 49140, "maxParallel": 64,
                  "contextLength": 1024}]
    upstream = ({"KUBEMOOT_MODEL_ENDPOINT": direct} if args.relay_only
                else {"KUBEMOOT_PROVIDERS": json.dumps(providers)})
    env = {**upstream, "KUBEMOOT_MODEL_MODEL": "qwen3:8b",
           "KUBEMOOT_LISTEN": f"127.0.0.1:{proxy_port}", "KUBEMOOT_LOG_LEVEL": "info",
           **json.loads(args.extra_env)}
    if nats is not None:
        env["KUBEMOOT_NATS_URL"] = nats.url
    sidecar = spawn(["-m", "proxy", "serve"], env, cpus={1} if args.pin else None)
    proxied = f"http://127.0.0.1:{proxy_port}"
    try:
        wait_http(direct)
        wait_http(proxied + "/healthz")
        asyncio.run(run_load(proxied, 4, 20, False))  # warm: model loaded, pools open
        if args.idle > 0:
            time.sleep(2)
            before = cpu_seconds(sidecar.pid)
            time.sleep(args.idle)
            used_ms = 1e3 * (cpu_seconds(sidecar.pid) - before)
            print(f"# sidecar idle, {'NATS' if nats else 'embedded'}: "
                  f"{used_ms / args.idle:.1f} ms of CPU a second over {args.idle:g} s")
            return
        path = "plain relay (static endpoint)" if args.relay_only else "placed path"
        print(f"# sidecar {path} vs direct, {'NATS' if nats else 'embedded'} state"
              f"{', sidecar pinned to its own CPU' if args.pin else ''}"
              f"{', answer lengths 4-28 tokens' if args.varied else ''}, "
              f"{args.calls} calls x {args.rounds} rounds per cell; ms")
        predict = (4, 28) if args.varied else None
        print("mode        conc  direct_p50 direct_p99  proxy_p50 proxy_p99  added_p50 "
              "added_p99  cpu_us/call  burst_added_max")
        for stream in (False, True):
            for level in (int(x) for x in args.levels.split(",")):
                per_worker = max(1, args.calls // level)
                d50, d99, p50, p99, cpu_us, burst = [], [], [], [], [], []
                for _ in range(args.rounds):
                    d = asyncio.run(run_load(direct, level, per_worker, stream, predict=predict))
                    before = cpu_seconds(sidecar.pid)
                    p = asyncio.run(run_load(proxied, level, per_worker, stream, predict=predict))
                    cpu_us.append(1e6 * (cpu_seconds(sidecar.pid) - before) / max(1, p.calls))
                    burst.append(p.first_max_ms - d.first_max_ms)
                    d50.append(d.p50_ms)
                    d99.append(d.p99_ms)
                    p50.append(p.p50_ms)
                    p99.append(p.p99_ms)
                    if d.errors or p.errors:
                        print(f"# errors: direct {d.errors}, proxy {p.errors}")
                mode = "stream-ttft" if stream else "non-stream"
                print(f"{mode:<11} {level:>4}  {median(d50):10.2f} {median(d99):10.2f} "
                      f"{median(p50):10.2f} {median(p99):9.2f} "
                      f"{median(p50) - median(d50):10.2f} {median(p99) - median(d99):9.2f} "
                      f"{median(cpu_us):11.0f} {median(burst):16.2f}",
                      flush=True)
    finally:
        stop(sidecar)
        stop(sim)
        if nats is not None:
            nats.cleanup()


if __name__ == "__main__":
    main()
