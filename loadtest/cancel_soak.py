"""Clients that misbehave mid-call, against real `kubemoot-proxy serve` processes in front of a
simulated GPU: each call is cut at a random moment (waiting for a GPU, during a load, before
the first chunk, mid-stream on every dialect, a slow reader, a body stopped half-way), and at
the end the sidecar must hold nothing for them: no ticket, no waiter, no call in flight, no
call running on the simulator, no extra connection to it, and flat RSS and open files.

    python -m loadtest.cancel_soak --cancel [--calls 2000] [--concurrency 50] [--nats]

Some calls take a held plan first (a fifth of those plans are released instead), some send
a second request on their connection before the first answer (pipelining).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtest.hostile_soak import rss_mib
from loadtest.loadgen import spawn, stop, wait_http
from loadtest.relay_bench import free_port
from loadtest.sim_output import answer_options

HI = [{"role": "user", "content": "hello there"}]
MODELS = ["llama3.2:3b", "qwen3:8b", "phi3:mini", "qwen3:14b"]
# Each path's streamed body (the answer's length set by the simulator's option)
STREAMED = {
    "/api/chat": lambda m, n: {"model": m, "messages": HI, "options": answer_options(n)},
    "/api/generate": lambda m, n: {"model": m, "prompt": "hi", "options": answer_options(n)},
    "/v1/chat/completions": lambda m, n: {"model": m, "messages": HI, "stream": True,
                                          "max_tokens": n},
    "/v1/messages": lambda m, n: {"model": m, "messages": HI, "stream": True, "max_tokens": n},
    "/v1/responses": lambda m, n: {"model": m, "input": "hi", "stream": True,
                                   "max_output_tokens": n},
}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def connections_to(pid: int, ports: set[int]) -> int:
    """The process's established TCP connections to any of `ports` (its upstream pool)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if fields[3] == "01" and fields[9] in inodes and remote_port in ports:
            count += 1
    return count


@dataclass
class Fleet:
    sims: list[str]
    sidecars: list[str]
    pids: list[int]
    sim_ports: set[int]


def leftovers(fleet: Fleet) -> dict[str, Any]:
    """What calls left behind, as the sidecars and the simulators report it."""
    out: dict[str, Any] = {}
    for i, url in enumerate(fleet.sidecars):
        state = httpx.get(f"{url}/kubemoot/v1/state", timeout=5).json()
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        in_flight = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                        if line.startswith("kubemoot_in_flight{"))
        waiters = sum(d["waiters"] for d in state["demand"].values())
        out[f"sidecar{i}"] = {"tickets": len(state["tickets"]), "waiters": waiters,
                              "plans": len(state["plans"]),
                              "demand_entries": state["demandEntries"], "in_flight": in_flight,
                              "upstream_conns": connections_to(fleet.pids[i], fleet.sim_ports),
                              "fds": open_fds(fleet.pids[i]),
                              "rss_mib": round(rss_mib(fleet.pids[i]), 1)}
    for i, url in enumerate(fleet.sims):
        stats = httpx.get(f"{url}/_sim/stats", timeout=5).json()
        ps = httpx.get(f"{url}/api/ps", timeout=5).json()["models"]
        out[f"sim{i}"] = {"decoding": stats["decoding"], "loaded": [m["name"] for m in ps]}
    return out


def busy(left: dict[str, Any]) -> bool:
    return any(v.get("tickets") or v.get("waiters") or v.get("plans") or v.get("in_flight")
               or v.get("decoding") for v in left.values())


async def settle(fleet: Fleet, timeout_s: float = 3.0) -> tuple[float, dict[str, Any]]:
    """Seconds until nothing is held any more (or the timeout), and what was left."""
    started = time.monotonic()
    while True:
        left = await asyncio.to_thread(leftovers, fleet)
        if not busy(left) or time.monotonic() - started > timeout_s:
            return time.monotonic() - started, left
        await asyncio.sleep(0.05)


async def raw_call(url: str, path: str, body: bytes, cut_after_s: float, read_bytes: int,
                   slow_body: bool = False, read_pause_s: float = 0.0, thread: str = "",
                   pipelined: bool = False) -> None:
    """One call on a raw connection, closed after `cut_after_s` or once `read_bytes` of the
    answer came; `slow_body` sends half the body and stops; `read_pause_s` reads a few
    bytes at a time with pauses between (a slow reader); `pipelined` sends a second request
    before the first's answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            + (f"X-Kubemoot-Thread: {thread}\r\n" if thread else "")
            + f"content-length: {len(body)}\r\n\r\n").encode()
    writer.write(head + (body[:len(body) // 2] if slow_body else body))
    if pipelined:
        writer.write(head + body)
    try:
        async with asyncio.timeout(cut_after_s):
            got = 0
            while got < read_bytes:
                chunk = await reader.read(64 if read_pause_s else 65536)
                if not chunk:
                    break
                got += len(chunk)
                if read_pause_s:
                    await asyncio.sleep(read_pause_s)
    except TimeoutError:
        pass
    writer.transport.abort()  # as a killed client: no FIN handshake to wait for


def random_cut(rng: random.Random, url: str) -> Any:
    path = rng.choice(list(STREAMED))
    model = rng.choice(MODELS)
    body = json.dumps(STREAMED[path](model, rng.randrange(4, 400))).encode()
    kind = rng.randrange(6)
    if kind == 0:  # a timeout anywhere: while waiting, loading, before or mid-stream
        return raw_call(url, path, body, rng.uniform(0.0, 0.5), 1 << 30)
    if kind == 1:  # leaves after some of the answer
        return raw_call(url, path, body, 5.0, rng.randrange(1, 3000))
    if kind == 2:  # a slow reader that gives up
        return raw_call(url, path, body, rng.uniform(0.2, 1.0), 1 << 30, read_pause_s=0.1)
    if kind == 3:  # a body stopped half-way
        return raw_call(url, path, body, rng.uniform(0.0, 0.3), 1 << 30, slow_body=True)
    if kind == 4:  # two requests on the connection at once (HTTP/1.1 pipelining)
        return raw_call(url, path, body, rng.uniform(0.0, 0.5), 1 << 30, pipelined=True)
    return planned_call(rng, url, path, model, body)  # takes a held plan, then leaves


async def planned_call(rng: random.Random, url: str, path: str, model: str, body: bytes
                       ) -> None:
    thread = f"t{rng.randrange(1 << 30)}"
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await client.post("/kubemoot/v1/plans", json={"thread": thread, "model": model,
                                                      "promptChars": 100})
        if rng.random() < 0.2:  # released while loading, or never used at all
            await client.delete(f"/kubemoot/v1/plans/{thread}")
            return
    await raw_call(url, path, body, rng.uniform(0.0, 0.5), 1 << 30, thread=thread)


async def good_calls(url: str, count: int) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        answers = await asyncio.gather(*(client.post("/api/chat", json={
            "model": "llama3.2:3b", "messages": HI, "stream": False,
            "options": {"num_predict": 8}}) for _ in range(count)))
    return sum(r.status_code == 200 for r in answers)


async def soak(fleet: Fleet, calls: int, concurrency: int, seed: int) -> None:
    rng = random.Random(seed)
    sent = 0
    await good_calls(fleet.sidecars[0], 4)  # the pools and caches of a working sidecar
    _, start = await settle(fleet)
    print("start", json.dumps(start), flush=True)

    async def worker() -> None:
        nonlocal sent
        while sent < calls:
            sent += 1
            if sent % max(1, calls // 10) == 0:
                left = await asyncio.to_thread(leftovers, fleet)
                print(f"{sent:6d} cut calls", json.dumps(left), flush=True)
            await random_cut(rng, rng.choice(fleet.sidecars))

    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - started
    seconds, end = await settle(fleet, timeout_s=10)
    print(f"{calls} cut calls in {elapsed:.1f} s; idle again after {seconds:.2f} s")
    print("end", json.dumps(end), flush=True)
    ok = await good_calls(fleet.sidecars[0], 20)
    _, after = await settle(fleet)
    print(f"then 20 good calls: {ok} answered; after", json.dumps(after), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cancel", action="store_true", help="the cut-calls soak")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--nats", action="store_true",
                        help="two sidecars sharing a real nats-server (else one, embedded)")
    parser.add_argument("--time-scale", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not args.cancel:
        parser.error("nothing to do: --cancel")
    sim_port = free_port()
    procs = [spawn(["-m", "loadtest.ollama_sim", "--port", str(sim_port), "--vram", "24564",
                    "--context", "4096", "--parallel", "2",
                    "--time-scale", str(args.time_scale)])]
    providers = [{"name": "gpu", "endpoint": f"http://127.0.0.1:{sim_port}",
                  "totalVramMiB": 24564, "contextLength": 4096, "maxParallel": 2}]
    nats_server = None
    env = {"KUBEMOOT_PROVIDERS": json.dumps(providers), "KUBEMOOT_LOG_LEVEL": "warning",
           "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS": "5"}
    if args.nats:
        from loadtest.nats_server import NatsServer

        nats_server = NatsServer().start()
        env["KUBEMOOT_NATS_URL"] = nats_server.url
    ports = [free_port() for _ in range(2 if args.nats else 1)]
    sidecars = [spawn(["-m", "proxy", "serve"], {**env, "KUBEMOOT_LISTEN": f"127.0.0.1:{p}"})
                for p in ports]
    procs += sidecars
    fleet = Fleet([f"http://127.0.0.1:{sim_port}"], [f"http://127.0.0.1:{p}" for p in ports],
                  [s.pid for s in sidecars], {sim_port})
    try:
        wait_http(fleet.sims[0])
        for url in fleet.sidecars:
            wait_http(url + "/readyz")
        asyncio.run(soak(fleet, args.calls, args.concurrency, args.seed))
    finally:
        for proc in procs:
            stop(proc)
        if nats_server is not None:
            nats_server.cleanup()


if __name__ == "__main__":
    main()
