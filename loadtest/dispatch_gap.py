"""The dispatch gap of late binding, with NATS: from a slot freeing to the next waiting call
starting.

One simulator with one slot, two sidecars sharing a real nats-server, this process as the
agents. Each round, a streamed call holds the slot through sidecar one and another call
waits for it (through the same sidecar, or through sidecar two: then the release reaches it
through NATS). The gap is the waiting call's first token after the holder's last one, less
what a call's first token takes through a sidecar when the slot is free (the median of
`--calls` such calls): what is left is the time the waiting call took to be dispatched.

    python -m loadtest.dispatch_gap [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx

from loadtest.loadgen import median, percentile, spawn, stop, wait_http
from loadtest.nats_server import NatsServer
from loadtest.relay_bench import free_port
from loadtest.sim_output import ANSWER_TOKENS

BODY = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def first_token(client: httpx.AsyncClient, url: str, tokens: int) -> tuple[float, float]:
    """A streamed call: when its first chunk and its last arrived (monotonic seconds)."""
    first = 0.0
    body = {**BODY, "options": {"num_predict": tokens, ANSWER_TOKENS: tokens}}
    async with client.stream("POST", f"{url}/api/chat", json=body) as response:
        response.raise_for_status()
        async for _ in response.aiter_lines():
            first = first or time.monotonic()
    return first, time.monotonic()


async def one_round(client: httpx.AsyncClient, holder: str, waiter: str) -> float:
    """ms from the holder's last chunk to the waiting call's first."""
    holding = asyncio.create_task(first_token(client, holder, 200))
    await asyncio.sleep(0.15)  # the holder has its slot
    waiting = asyncio.create_task(first_token(client, waiter, 2))
    (_, freed), (started, _) = await asyncio.gather(holding, waiting)
    return 1e3 * (started - freed)


async def measure(one: str, two: str, rounds: int, calls: int) -> dict[str, list[float]]:
    async with httpx.AsyncClient(timeout=60) as client:
        for url in (one, two):  # warm: the copy is loaded, the pools are open
            await first_token(client, url, 2)
        free = []
        for _ in range(calls):
            began = time.monotonic()
            started, _ = await first_token(client, one, 2)
            free.append(1e3 * (started - began))
        out: dict[str, list[float]] = {"free slot, first token": free}
        same, across = [], []
        for _ in range(rounds):
            same.append(await one_round(client, one, one))
            across.append(await one_round(client, one, two))
        base = median(free)
        out["after a freed slot, same sidecar"] = same
        out["after a freed slot, across (NATS)"] = across
        out["gap, same sidecar"] = [g - base for g in same]
        out["gap, across sidecars (NATS)"] = [g - base for g in across]
        return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--calls", type=int, default=40, help="free-slot calls for the base")
    args = parser.parse_args(argv)
    nats = NatsServer().start()
    sim_port = free_port()
    # 200 tokens at 400/s hold the slot ~0.5 s; the waiting call's 2 tokens take 5 ms.
    sim = spawn(["-m", "loadtest.ollama_sim", "--port", str(sim_port), "--parallel", "1",
                 "--vram", "24564", "--tokens-per-s", "400"])
    direct = f"http://127.0.0.1:{sim_port}"
    providers = [{"name": "gpu", "endpoint": direct, "totalVramMiB": 24564, "maxParallel": 1}]
    sidecars, urls = [], []
    try:
        wait_http(direct)
        for name in ("one", "two"):
            port = free_port()
            sidecars.append(spawn(["-m", "proxy", "serve"], {
                "KUBEMOOT_PROVIDERS": json.dumps(providers), "KUBEMOOT_MODEL_MODEL": "qwen3:8b",
                "KUBEMOOT_LISTEN": f"127.0.0.1:{port}", "KUBEMOOT_LOG_LEVEL": "warning",
                "KUBEMOOT_NATS_URL": nats.url, "KUBEMOOT_AGENT_NAME": name}))
            urls.append(f"http://127.0.0.1:{port}")
            wait_http(urls[-1] + "/healthz")
        results = asyncio.run(measure(urls[0], urls[1], args.rounds, args.calls))
        print(f"# dispatch gap with NATS, {args.rounds} rounds each; ms")
        print(f"{'ms':<36} {'p50':>7} {'p95':>7} {'max':>7}")
        for label, values in results.items():
            print(f"{label:<36} {percentile(values, 0.5):7.2f} {percentile(values, 0.95):7.2f} "
                  f"{max(values):7.2f}")
    finally:
        for sidecar in sidecars:
            stop(sidecar)
        stop(sim)
        nats.cleanup()


if __name__ == "__main__":
    main()
