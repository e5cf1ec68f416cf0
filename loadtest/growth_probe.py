"""What grows in a sidecar with the names and ids its callers invent.

A sidecar in front of one simulated GPU gets N calls, each with a new value of one kind
(a thread id, a model name no provider has, an `x:cloud` name, a conversation, a num_ctx,
a held plan); then every dict, set, list and deque reachable from the app's objects (and the
proxy modules' globals) is measured again, with the size of `/metrics` and, with `--nats`,
each bucket's messages and keys in a real nats-server. What grew by more than a tenth of N
is printed: run it at two Ns to tell a bound from a leak.

    PYTHONPATH=. .venv/bin/python -m loadtest.growth_probe threads 300 --nats
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httpx

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from loadtest.sim_model import CATALOG, SimConfig
from proxy.app import build_app
from proxy.ports import BUCKETS
from proxy.settings import load_settings

CONTAINERS = (dict, set, frozenset, list, tuple, deque)


def _attributes(obj: Any) -> list[tuple[str, Any]]:
    found = list(getattr(obj, "__dict__", {}).items())
    for cls in type(obj).__mro__:
        found += [(s, getattr(obj, s)) for s in getattr(cls, "__slots__", ()) or ()
                  if hasattr(obj, s)]
    return found


def sizes(roots: dict[str, Any]) -> dict[str, int]:
    """len() of every container reachable from `roots` through the project's objects (and
    the first few items of each container), by the path it was first reached at."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    todo: deque[tuple[str, Any]] = deque(roots.items())
    while todo:
        path, obj = todo.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, CONTAINERS):
            out[path] = len(obj)
            items = list(obj.values() if isinstance(obj, dict) else obj)[:3]
            todo.extend((f"{path}[]", item) for item in items)
        elif (type(obj).__module__ or "").startswith(("proxy.", "prometheus_client")):
            todo.extend((f"{path}.{name}", value) for name, value in _attributes(obj))
    return out


def _module_globals() -> dict[str, Any]:
    return {f"{name}:{key}": value for name, module in list(sys.modules.items())
            if name.startswith("proxy") for key, value in vars(module).items()
            if isinstance(value, (dict, list, set)) and not key.startswith("__")}


def _send(client: httpx.Client, kind: str, i: int) -> None:
    def chat(model: str = "qwen3:8b", headers: dict[str, str] | None = None,
             messages: list[dict[str, str]] | None = None, **extra: Any) -> None:
        client.post("/api/chat", headers=headers or {}, json={
            "model": model, "stream": False,
            "messages": messages or [{"role": "user", "content": "hi"}], **extra})

    def plan(thread: str) -> None:
        client.post("/kubemoot/v1/plans", json={"thread": thread, "phase": "mulling"})
        client.delete(f"/kubemoot/v1/plans/{thread}")

    senders: dict[str, Callable[[], None]] = {
        "threads": lambda: chat(headers={"X-Kubemoot-Thread": f"t-{i}"}),
        "models": lambda: chat(model=f"bogus-{i}:latest"),
        "cloud": lambda: chat(model=f"bogus-{i}:cloud"),
        "conversations": lambda: chat(messages=[
            {"role": "system", "content": f"you are agent {i} " * 20},
            {"role": "user", "content": f"question {i} " * 30}]),
        "numctx": lambda: chat(options={"num_ctx": 2048 + 16 * i}),
        "plans": lambda: plan(f"p-{i}"),
    }
    senders[kind]()


async def bucket_counts(url: str) -> dict[str, tuple[int, int]]:
    """Per bucket: its stream's messages (deletes' markers included) and its live keys."""
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    out = {}
    for spec in BUCKETS:
        info = await js.stream_info(f"KV_{spec.name}")
        try:
            keys = len(await (await js.key_value(spec.name)).keys())
        except Exception:  # (nats-py raises when there are none)
            keys = 0
        out[spec.name] = (info.state.messages, keys)
    await nc.close()
    return out


def probe(kind: str, n: int, nats_url: str | None) -> None:
    sim = SimServer(SimConfig(name="gpu", models=CATALOG, time_scale=0.002)).start()
    settings = load_settings(providers=[sim.config.provider_entry(sim.url)],
                             model_model="qwen3:8b", log_level="warning",
                             **({"nats_url": nats_url} if nats_url else {}))
    app = build_app(settings)
    sidecar = ThreadedServer(app, name="sidecar").start()
    client = httpx.Client(base_url=sidecar.url, timeout=300)

    def measure() -> tuple[dict[str, int], int]:
        gc.collect()
        roots = {name: getattr(app.state, name)
                 for name in ("api", "scheduler", "status", "metrics")}
        return sizes({**roots, **_module_globals()}), len(client.get("/metrics").content)

    try:
        for i in range(3):
            _send(client, "threads", -1 - i)  # warm: the model loaded, the series there
        time.sleep(1.5)
        before, metrics_before = measure()
        started = time.monotonic()
        for i in range(n):
            _send(client, kind, i)
        time.sleep(1.5)
        after, metrics_after = measure()
        print(f"{kind} x {n} in {time.monotonic() - started:.1f} s: /metrics "
              f"{metrics_before} -> {metrics_after} bytes")
        for path, size in sorted(after.items(), key=lambda kv: before.get(kv[0], 0) - kv[1]):
            if size - before.get(path, 0) >= max(3, n // 10):
                print(f"  {path}: {before.get(path, 0)} -> {size}")
        if nats_url:
            for bucket, (messages, keys) in asyncio.run(bucket_counts(nats_url)).items():
                print(f"  bucket {bucket}: {messages} messages, {keys} keys")
    finally:
        client.close()
        sidecar.stop()
        sim.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["threads", "models", "cloud", "conversations",
                                         "numctx", "plans"])
    parser.add_argument("n", type=int)
    parser.add_argument("--nats", action="store_true", help="shared state in a nats-server")
    args = parser.parse_args()
    server = NatsServer().start() if args.nats else None
    try:
        probe(args.kind, args.n, server.url if server else None)
    finally:
        if server is not None:
            server.stop()
            server.cleanup()


if __name__ == "__main__":
    main()
