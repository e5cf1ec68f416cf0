"""DNS-rebinding protection as Ollama's allowedHostsMiddleware (server/routes.go) applies it:
on a loopback listener a request whose Host is not local is refused with 403, so a web page
whose own name an attacker points at 127.0.0.1 cannot drive the sidecar from a browser."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.api.errors import dialect_of, error_response

LOCAL_TLDS = ("localhost", "local", "internal")
# Go's netip IsPrivate: RFC 1918 and RFC 4193 only (Python's is_private takes far more).
GO_PRIVATE = tuple(ipaddress.ip_network(n) for n in
                   ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def loopback_listener(host: str) -> bool:
    """Whether a listen address binds loopback only (`localhost` resolves there, as Go's
    listener reports it); a name or a wildcard address is checked by nothing, as in Ollama."""
    if host.lower() == "localhost":
        return True
    ip = parse_ip(host)
    return ip is not None and unmapped(ip).is_loopback


def split_host_port(hostport: str) -> str | None:
    """The host of `host:port` as Go's net.SplitHostPort reads it; None where Go errs (no
    port, too many colons, a stray bracket), and Ollama then takes the Host as it came."""
    colon = hostport.rfind(":")
    if colon < 0:
        return None
    skip_open = skip_close = 0  # where Go looks for a stray bracket
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or end + 1 != colon:
            return None
        host, skip_open, skip_close = hostport[1:end], 1, end + 1
    else:
        host = hostport[:colon]
        if ":" in host:
            return None
    if "[" in hostport[skip_open:] or "]" in hostport[skip_close:]:
        return None
    return host


def parse_ip(text: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def unmapped(ip: IpAddress) -> IpAddress:
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped or ip


def host_allowed(host_header: str, hostname: str, local_ips: frozenset[IpAddress]) -> bool:
    """Ollama's rule: an IP literal that is loopback, private, unspecified or one of this
    machine's; else empty, `localhost`, the machine's host name, or a name under .localhost,
    .local or .internal (any case)."""
    return local_ip(host_header, local_ips) or local_name(host_header, hostname)


def host_of(host_header: str) -> str:
    host = split_host_port(host_header)
    return host_header if host is None else host


def local_ip(host_header: str, local_ips: frozenset[IpAddress]) -> bool:
    """Whether the Host names a local IP: Ollama passes it on at once (an OPTIONS too)."""
    ip = parse_ip(host_of(host_header))
    if ip is None:
        return False
    plain = unmapped(ip)
    return plain.is_loopback or ip.is_unspecified or ip in local_ips or \
        any(plain in net for net in GO_PRIVATE)


def local_name(host_header: str, hostname: str) -> bool:
    """Ollama's allowedHost, which aborts an OPTIONS it lets through with 204."""
    host = host_of(host_header).lower()
    if host in ("", "localhost") or (hostname and host == hostname.lower()):
        return True
    return any(host.endswith("." + tld) for tld in LOCAL_TLDS)


def machine_addresses(hostname: str) -> frozenset[IpAddress]:
    """The addresses the host name resolves to: Ollama lists its interfaces' addresses,
    which the standard library cannot; loopback and private ones pass anyway."""
    try:
        infos = socket.getaddrinfo(hostname, None)
    except OSError:
        infos = []
    found = (parse_ip(str(info[4][0]).split("%")[0]) for info in infos)
    return frozenset(ip for ip in found if ip is not None)


class AllowedHosts:
    """Refuses a request whose Host is not local, 403 in the caller's dialect with reason
    `host-not-allowed` (Ollama's 403 has no body). An OPTIONS whose Host passes as a local
    name (not a local IP) is 204 with no body, on any path, as the middleware aborts it
    (one with an Origin and Access-Control-Request-Method is a preflight, CORS's before)."""

    def __init__(self, app: ASGIApp, hostname: str | None = None) -> None:
        self.app = app
        self.hostname = socket.gethostname() if hostname is None else hostname
        # Resolved on the first public IP a Host names, not at start: a name resolved
        # through DNS may take seconds
        self.local_ips: frozenset[IpAddress] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
        if await self.allowed(host):
            if scope["method"] == "OPTIONS" and \
                    not local_ip(host, self.local_ips or frozenset()):
                await Response(status_code=204)(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        refusal = error_response(
            403, "host-not-allowed",
            f"host {host[:256]!r} may not call the sidecar: on a loopback listener only a "
            "local Host is served (localhost, a loopback or private IP, this machine's name, "
            "*.localhost, *.local, *.internal)", dialect=dialect_of(scope["path"]))
        await refusal(scope, receive, send)

    async def allowed(self, host: str) -> bool:
        if host_allowed(host, self.hostname, self.local_ips or frozenset()):
            return True
        if self.local_ips is not None or parse_ip(host_of(host)) is None:
            return False
        self.local_ips = await asyncio.to_thread(machine_addresses, self.hostname)
        return host_allowed(host, self.hostname, self.local_ips)
