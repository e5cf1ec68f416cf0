"""A long hostile run: many malformed, oversized, deeply nested and wrong-method requests
(and some good calls) against a real `kubemoot-proxy serve` process in front of a simulated
GPU; reports the sidecar's memory (RSS) as it goes and its CPU per request.

    python -m loadtest.hostile_soak [--requests 20000] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from pathlib import Path

import httpx

from loadtest.loadgen import spawn, stop, wait_http
from loadtest.relay_bench import cpu_seconds, free_port

PATHS = ["/api/chat", "/api/generate", "/api/embed", "/v1/chat/completions", "/v1/messages",
         "/v1/responses", "/api/show", "/api/pull", "/kubemoot/v1/plans",
         "/kubemoot/v1/explain", "/api/tags/", "/nope"]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def hostile(rng: random.Random) -> tuple[str, str, bytes, dict[str, str]]:
    path = rng.choice(PATHS)
    method = rng.choice(["POST"] * 6 + ["GET", "PUT", "DELETE", "PATCH"])
    kind = rng.randrange(8)
    good = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}],
            "prompt": "hi", "stream": False, "max_tokens": 2}
    if kind == 0:
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))  # not UTF-8
    elif kind == 1:
        depth = rng.randrange(100, 5000)
        body = b"[" * depth + b"]" * depth
    elif kind == 2:
        body = json.dumps({**good, "model": "m" * rng.randrange(200, 100_000)}).encode()
    elif kind == 3:
        body = json.dumps({**good, "messages": "x" * rng.randrange(10, 500_000)}).encode()
    elif kind == 4:
        body = json.dumps({**good, "keep_alive": "0" * rng.randrange(10, 60) + "x"}).encode()
    elif kind == 5:
        body = json.dumps({**good, "options": {"num_ctx": "big", "num_predict": [1]}}).encode()
    elif kind == 6:
        body = json.dumps({"thread": "t" * rng.randrange(1, 600), "promptChars": -1}).encode()
    else:
        body = json.dumps(good).encode()  # a good call now and then
    headers = {"X-Kubemoot-Thread": "x" * rng.randrange(0, 2000),
               "X-Kubemoot-Phase": rng.choice(["triage", "mulling", "?" * 100])}
    return method, path, body, headers


async def run(url: str, total: int, concurrency: int, pid: int, seed: int) -> None:
    rng = random.Random(seed)
    statuses: dict[int, int] = {}
    sent = 0
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:

        async def worker() -> None:
            nonlocal sent
            while sent < total:
                sent += 1
                n = sent
                method, path, body, headers = hostile(rng)
                r = await client.request(method, path, content=body, headers=headers,
                                         params={"promptChars": "9" * rng.randrange(1, 30)})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if n % max(1, total // 10) == 0:
                    print(f"{n:6d} requests  RSS {rss_mib(pid):6.1f} MiB", flush=True)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    print("statuses", dict(sorted(statuses.items())))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sim_port, proxy_port = free_port(), free_port()
    sim = spawn(["-m", "loadtest.ollama_sim", "--port", str(sim_port), "--vram", "24564",
                 "--context", "2048", "--time-scale", "0.001"])
    providers = [{"name": "gpu", "endpoint": f"http://127.0.0.1:{sim_port}",
                  "totalVramMiB": 24564, "contextLength": 2048}]
    sidecar = spawn(["-m", "proxy", "serve"], {
        "KUBEMOOT_PROVIDERS": json.dumps(providers), "KUBEMOOT_LOG_LEVEL": "warning",
        "KUBEMOOT_LISTEN": f"127.0.0.1:{proxy_port}",
        "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS": "1"})
    url = f"http://127.0.0.1:{proxy_port}"
    try:
        wait_http(f"http://127.0.0.1:{sim_port}")
        wait_http(url + "/healthz")
        before_rss, before_cpu = rss_mib(sidecar.pid), cpu_seconds(sidecar.pid)
        print(f"start: RSS {before_rss:.1f} MiB", flush=True)
        asyncio.run(run(url, args.requests, args.concurrency, sidecar.pid, args.seed))
        cpu = cpu_seconds(sidecar.pid) - before_cpu
        print(f"end: RSS {rss_mib(sidecar.pid):.1f} MiB (start {before_rss:.1f}); sidecar CPU "
              f"{cpu:.1f} s, {cpu / args.requests * 1e6:.0f} µs a request")
    finally:
        stop(sidecar)
        stop(sim)


if __name__ == "__main__":
    main()
