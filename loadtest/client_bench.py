"""What the HTTP client costs a forwarding proxy: httpx, aiohttp, and httpx over aiohttp.

A minimal Starlette app forwards each POST to the simulator with one client (no placement,
no logging), pinned to CPU 1; the simulator answers at once and the load generator runs on
CPU 0. The sidecar uses the third: httpx's API on httpx-aiohttp's transport.

    python -m loadtest.client_bench
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loadtest.loadgen import run_load, spawn, stop, wait_http
from loadtest.relay_bench import free_port

JSON = {"content-type": "application/json"}


def forwarder(client: str, upstream: str) -> Starlette:
    state: dict[str, Any] = {}

    async def via_httpx(request: Request) -> Response:
        import httpx

        if "c" not in state:
            state["c"] = httpx.AsyncClient(base_url=upstream, timeout=60)
        r = await state["c"].post("/api/chat", content=await request.body(), headers=JSON)
        return Response(r.content, media_type="application/json")

    async def via_aiohttp(request: Request) -> Response:
        import aiohttp

        if "s" not in state:
            state["s"] = aiohttp.ClientSession(upstream)
        async with state["s"].post("/api/chat", data=await request.body(), headers=JSON) as r:
            return Response(await r.read(), media_type="application/json")

    async def via_httpx_aiohttp(request: Request) -> Response:
        import httpx
        from httpx_aiohttp import AiohttpTransport

        if "h" not in state:
            state["h"] = httpx.AsyncClient(base_url=upstream, timeout=60,
                                           transport=AiohttpTransport())
        r = await state["h"].post("/api/chat", content=await request.body(), headers=JSON)
        return Response(r.content, media_type="application/json")

    endpoint = {"httpx": via_httpx, "aiohttp": via_aiohttp,
                "httpx+aiohttp": via_httpx_aiohttp}[client]
    return Starlette(routes=[Route("/api/chat", endpoint, methods=["POST"])])


def serve(client: str, upstream: str, port: int) -> None:
    import uvicorn

    uvicorn.run(forwarder(client, upstream), host="127.0.0.1", port=port, log_level="warning")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    import os

    os.sched_setaffinity(0, {0})
    sim_port = free_port()
    sim = spawn(["-m", "loadtest.ollama_sim", "--port", str(sim_port), "--parallel", "64",
                 "--tokens-per-s", "1000000", "--no-share-gpu"], cpus={0})
    upstream = f"http://127.0.0.1:{sim_port}"
    print("client   conc  direct_p50  proxy_p50  added_p50  added_p99  (ms)")
    try:
        wait_http(upstream)
        for client in ("httpx", "aiohttp", "httpx+aiohttp"):
            port = free_port()
            proc = spawn(["-m", "loadtest.client_bench", "--serve", client, upstream,
                          str(port)], cpus={1})
            url = f"http://127.0.0.1:{port}"
            try:
                wait_http(url + "/api/chat", 20)
                asyncio.run(run_load(url, 2, 20, False))
                for level in (1, 8, 32):
                    d = asyncio.run(run_load(upstream, level, 800 // level, False))
                    p = asyncio.run(run_load(url, level, 800 // level, False))
                    print(f"{client:<13} {level:4d}  {d.p50_ms:10.2f} {p.p50_ms:10.2f} "
                          f"{p.p50_ms - d.p50_ms:10.2f} {p.p99_ms - d.p99_ms:10.2f}", flush=True)
            finally:
                stop(proc)
    finally:
        stop(sim)


if __name__ == "__main__":
    main()
