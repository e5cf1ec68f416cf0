"""Which Host a loopback listener serves, by Ollama's allowedHost and allowedHostsMiddleware
(server/routes.go, the same in 0.12.6 and 0.24.0)."""

from __future__ import annotations

import ipaddress

import pytest

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
