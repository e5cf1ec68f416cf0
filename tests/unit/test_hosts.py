"""Which Host a loopback listener serves, by Ollama's allowedHost and allowedHostsMiddleware
(server/routes.go, the same in 0.12.6 and 0.24.0)."""

from __future__ import annotations

import ipaddress

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from proxy.api import hosts
from proxy.api.hosts import host_allowed, loopback_listener, split_host_port

MACHINE_IP = ipaddress.ip_address("203.0.113.7")


@pytest.mark.parametrize(("host", "allowed"), [
    ("localhost", True), ("LOCALHOST:11434", True), ("127.0.0.1:11434", True),
    ("127.8.9.1", True), ("[::1]:11434", True), ("::1", True), ("0.0.0.0:11434", True),
    ("10.1.2.3:80", True), ("172.16.0.1", True), ("192.168.1.10:11434", True),
    ("[fd00::1]:80", True), ("203.0.113.7:11434", True), ("", True),
    ("myhost", True), ("MyHost.:1", False), ("app.localhost:3000", True),
    ("printer.local", True), ("svc.internal:8080", True),
    ("evil.example", False), ("evil.example:11434", False), ("localhost.evil.example", False),
    ("8.8.8.8:11434", False), ("169.254.169.254", False), ("100.64.0.1", False),
    ("[::1]", False), ("local", False), ("notlocalhost", False), ("x.local.evil", False)])
def test_hosts_as_ollama_allows_them(host: str, allowed: bool) -> None:
    assert host_allowed(host, "myhost", frozenset({MACHINE_IP})) is allowed


@pytest.mark.parametrize(("hostport", "host"), [
    ("a:1", "a"), ("[::1]:2", "::1"), ("a", None), ("::1", None), ("[::1]", None),
    ("[::1]x:1", None), ("a]:1", None), ("localhost:", "localhost")])
def test_host_port_split_as_go_splits_it(hostport: str, host: str | None) -> None:
    assert split_host_port(hostport) == host


@pytest.mark.parametrize(("listen", "checked"), [
    ("127.0.0.1", True), ("localhost", True), ("::1", True), ("127.0.0.2", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("sidecar.example", False)])
def test_only_a_loopback_listener_checks_hosts(listen: str, checked: bool) -> None:
    assert loopback_listener(listen) is checked


async def test_the_machines_own_public_address_is_looked_up_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ollama's isLocalIP: a Host naming one of the machine's addresses passes; the sidecar
    resolves them only when a Host names a public IP, once."""
    looked: list[str] = []

    def addresses(hostname: str) -> frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        looked.append(hostname)
        return frozenset({MACHINE_IP})

    monkeypatch.setattr(hosts, "machine_addresses", addresses)
    app = Starlette(routes=[Route("/api/tags", lambda _: PlainTextResponse("ok"))])
    guarded = hosts.AllowedHosts(app, hostname="myhost")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded),
                                 base_url="http://localhost") as client:
        assert (await client.get("/api/tags")).status_code == 200
        assert (await client.get("/api/tags", headers={"Host": "myhost:1"})).status_code == 200
        assert looked == []
        for _ in range(2):
            own = await client.get("/api/tags", headers={"Host": "203.0.113.7:11434"})
            assert own.status_code == 200
            other = await client.get("/v1/models", headers={"Host": "203.0.113.8"})
            assert other.status_code == 403 and other.json()["reason"] == "host-not-allowed"
            assert other.json()["error"]["type"] == "api_error"
        assert looked == ["myhost"]


async def test_an_options_from_a_local_name_is_204_on_any_path() -> None:
    """Ollama's allowedHost (a local name, not a local IP) aborts an OPTIONS it lets through
    with 204, no body, whatever the path serves; a local IP goes on to the routes, as an
    unknown one refused (server/routes.go allowedHostsMiddleware, 0.12.6 and 0.24.0)."""
    app = Starlette(routes=[Route("/api/tags", lambda _: PlainTextResponse("ok"))])
    guarded = hosts.AllowedHosts(app, hostname="myhost")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded),
                                 base_url="http://localhost:11434") as client:
        for host in ("localhost:11434", "myhost", "app.localhost"):
            for path in ("/api/tags", "/no/such/path"):
                r = await client.options(path, headers={"Host": host})
                assert (r.status_code, r.content) == (204, b"")
        assert (await client.get("/api/tags")).text == "ok"
        for host in ("127.0.0.1:11434", "[::1]:11434", "10.0.0.8"):
            assert (await client.options("/api/tags", headers={"Host": host})
                    ).status_code == 405
        refused = await client.options("/api/tags", headers={"Host": "rebind.example"})
        assert refused.status_code == 403
