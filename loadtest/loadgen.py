"""A closed-loop load generator and the process plumbing the benchmarks share.

Each worker sends one call, waits for it, sends the next. Non-streaming calls are timed to
the last byte; streaming calls to the first chunk (time to first token). A worker's first
call opens its connection and arrives together with every other worker's first call: it is
timed apart (`first_max_ms`, the cold burst), so p50/p99 describe the steady state.

The generator uses aiohttp: httpx needs ~0.9 ms of CPU per call at 32 concurrent, which
makes the generator the bottleneck it is meant to measure.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import orjson

from loadtest.sim_output import ANSWER_TOKENS

BODY = {"model": "qwen3:8b", "messages": [{"role": "user", "content": "hello there"}]}


@dataclass(frozen=True)
class Sample:
    p50_ms: float
    p99_ms: float
    calls: int
    errors: int
    first_max_ms: float = float("nan")  # the slowest of the workers' first calls


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def bodies(stream: bool, body: dict[str, object] | None, predict: tuple[int, int] | None
           ) -> list[bytes]:
    """The request bodies a run draws from: one, or one per answer length in `predict`."""
    payload = {**(body or BODY), "stream": stream}
    if predict is None:
        return [orjson.dumps(payload)]
    low, high = predict
    return [orjson.dumps({**payload, "options": {"num_predict": n, ANSWER_TOKENS: n}})
            for n in range(low, high + 1)]


async def run_load(url: str, concurrency: int, calls_per_worker: int, stream: bool,
                   body: dict[str, object] | None = None, path: str = "/api/chat",
                   predict: tuple[int, int] | None = None, seed: int = 7) -> Sample:
    """`predict`: answer lengths drawn uniformly from this range (same draws for the same
    seed), so workers drift out of step as real agents do; None: every answer alike."""
    choices = bodies(stream, body, predict)
    draw = random.Random(seed)
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    first_calls: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(url, connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            nonlocal errors
            for index in range(calls_per_worker + 1):
                timed = first_calls if index == 0 else latencies
                data = choices[draw.randrange(len(choices))]
                started = time.perf_counter()
                try:
                    async with session.post(path, data=data, headers=headers) as response:
                        if stream:
                            first = True
                            async for _chunk in response.content.iter_any():
                                if first:
                                    timed.append(time.perf_counter() - started)
                                    first = False
                        else:
                            await response.read()
                            timed.append(time.perf_counter() - started)
                        if response.status != 200:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    ms = [x * 1000 for x in latencies]
    return Sample(percentile(ms, 0.5), percentile(ms, 0.99), len(ms), errors,
                  max(first_calls, default=float("nan")) * 1000)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spawn(args: list[str], env: dict[str, str] | None = None,
          cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
    """A Python child process, optionally pinned to `cpus` (Linux)."""
    full_env = {**os.environ, **(env or {})}

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen([sys.executable, *args], env=full_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent,
                            preexec_fn=pin if cpus else None)


def local_client(timeout: float = 5.0) -> httpx.Client:
    """A client for plain-HTTP servers on the loopback. httpx loads a CA bundle for every
    client it makes, `httpx.get`'s one-off client included: 50-150 ms of CPU each, which a
    poll every 50 ms pays each time, on the cores the processes it waits for start on."""
    return httpx.Client(timeout=timeout, verify=False)


def wait_http(url: str, deadline_s: float = 20.0) -> None:
    deadline = time.monotonic() + deadline_s
    with local_client(timeout=1) as client:
        while time.monotonic() < deadline:
            try:
                if client.get(url).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not come up")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
