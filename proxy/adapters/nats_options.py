"""How to reach NATS (servers, credentials, TLS), and what in it is bad configuration rather
than an outage: a configured file that is not there or not what it should be, a certificate
without its key, a server that refuses the credentials or the certificates."""

from __future__ import annotations

import errno
import importlib
import re
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats.errors

from proxy.ports import ConfigError, StoreUnavailable

CREDS, TLS_CA, TLS_CERT, TLS_KEY = ("KUBEMOOT_NATS_CREDS", "KUBEMOOT_NATS_TLS_CA",
                                    "KUBEMOOT_NATS_TLS_CERT", "KUBEMOOT_NATS_TLS_KEY")
# A credentials file as `nsc` writes it: the user's JWT, then the seed it signs with.
_CREDS_JWT = re.compile(r"-{3,}BEGIN NATS USER JWT-{3,}\s*\n\s*(\S+)")
_CREDS_SEED = re.compile(r"-{3,}BEGIN USER NKEY SEED-{3,}\s*\n\s*(\S+)")


class NatsConfigError(ConfigError, StoreUnavailable):
    """NATS settings that cannot work; the message is one line naming the setting(s). Also
    a StoreUnavailable: where it comes late (NATS came up after `serve` checked, and
    refuses), a sidecar serves from loaded copies alone as in an outage, rather than fail
    mid-start."""


@dataclass(frozen=True)
class NatsOptions:
    url: str
    creds_file: Path | None = None
    user: str | None = None
    password: str | None = None
    token: str | None = None
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    timeout_s: float = 2.0

    @property
    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",")]

    def connect_kwargs(self) -> dict[str, Any]:
        """nats-py's connect arguments; NatsConfigError when a configured file is missing or
        unusable (nats-py would retry such a connect without end)."""
        kwargs: dict[str, Any] = {
            "servers": self.servers,
            "connect_timeout": self.timeout_s,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            "name": "kubemoot-proxy",
        }
        if self.creds_file:
            check_creds_file(self.creds_file)
            kwargs["user_credentials"] = str(self.creds_file)
        if self.user:
            kwargs["user"], kwargs["password"] = self.user, self.password or ""
        if self.token:
            kwargs["token"] = self.token
        context = self.tls_context()
        if context is not None:
            kwargs["tls"] = context
        return kwargs

    def tls_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert or self.tls_key or
                any(u.startswith("tls://") for u in self.servers)):
            return None
        if self.tls_key and not self.tls_cert:
            raise NatsConfigError(f"{TLS_KEY}={self.tls_key}: set without {TLS_CERT}")
        for setting, path in ((TLS_CA, self.tls_ca), (TLS_CERT, self.tls_cert),
                              (TLS_KEY, self.tls_key)):
            if path is not None:
                read_file(setting, path)
        try:
            context = ssl.create_default_context(
                cafile=str(self.tls_ca) if self.tls_ca else None)
        except ssl.SSLError as exc:
            raise NatsConfigError(f"{TLS_CA}={self.tls_ca}: no PEM certificate in it "
                                  f"({exc.reason or exc})") from None
        if self.tls_cert:
            try:
                context.load_cert_chain(str(self.tls_cert),
                                        str(self.tls_key) if self.tls_key else None)
            except ssl.SSLError as exc:
                raise NatsConfigError(self._cert_problem(exc)) from None
        return context

    def _cert_problem(self, exc: ssl.SSLError) -> str:
        if self.tls_key is None:
            return f"{TLS_CERT}={self.tls_cert}: no private key in it and {TLS_KEY} not set"
        return (f"{TLS_CERT}={self.tls_cert}, {TLS_KEY}={self.tls_key}: not a certificate "
                f"and its key ({exc.reason or exc})")

    def auth_settings(self) -> str:
        """The settings that carry the credentials the server judged."""
        named = [name for name, value in (("KUBEMOOT_NATS_USER/PASSWORD", self.user),
                                          ("KUBEMOOT_NATS_TOKEN", self.token),
                                          (CREDS, self.creds_file)) if value]
        # nats-py sends a URL's user:password (or token@) only when neither setting is set
        if not (self.user or self.token) and any("@" in _authority(u) for u in self.servers):
            named.insert(0, "the credentials in KUBEMOOT_NATS_URL (user:password@ or token@)")
        return ", ".join(named) or \
            "the server wants credentials: set KUBEMOOT_NATS_USER/PASSWORD, TOKEN or CREDS"


def _authority(server: str) -> str:
    """`user:password@host:port` of a server URL, with or without its scheme."""
    return server.split("://", 1)[-1].split("/", 1)[0]


def read_file(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NatsConfigError(f"{setting}={path}: no such file") from None
    except IsADirectoryError:
        raise NatsConfigError(f"{setting}={path}: a directory, not a file") from None
    except OSError as exc:
        raise NatsConfigError(f"{setting}={path}: cannot read it: "
                              f"{exc.strerror or exc}") from None


def check_creds_file(path: Path) -> None:
    """A readable credentials file with a user JWT and a valid seed (nats-py reads it only
    while connecting, and on a file with no JWT in it fails with "object of type 'NoneType' has
    no len()", naming neither the file nor the setting)."""
    text = read_file(CREDS, path).decode("utf-8", errors="replace")
    jwt, seed = _CREDS_JWT.search(text), _CREDS_SEED.search(text)
    if jwt is None or seed is None:
        raise NatsConfigError(f"{CREDS}={path}: not a NATS credentials file (no "
                              f"{'user JWT' if jwt is None else 'user nkey seed'} in it)")
    try:
        nkeys = importlib.import_module("nkeys")
    except ImportError:
        raise NatsConfigError(f"{CREDS}: needs the nkeys package: "
                              "pip install 'nats-py[nkeys]'") from None
    try:
        nkeys.from_seed(bytearray(seed.group(1).encode()))
    except Exception:  # nkeys raises its own errors, and binascii's
        raise NatsConfigError(f"{CREDS}={path}: its user nkey seed is not valid") from None


class PlainTextServer(nats.errors.Error):
    """A server asked for over TLS that offers none (raised before the CONNECT, which carries
    the credentials)."""


def wants_tls(options: NatsOptions) -> bool:
    """TLS asked for: a `tls://` server or a TLS file. (`wss://` is TLS below the protocol,
    whatever the server's INFO says.)"""
    return bool(options.tls_ca or options.tls_cert or options.tls_key or
                any(u.startswith("tls://") for u in options.servers))


def redact(urls: str) -> str:
    """Server URLs without any user:password@ part, fit for logs."""
    return re.sub(r"(?<=://)[^@/,]*@", "***@", urls)


def reason_of(exc: BaseException) -> str:
    """An exception's message, or its type when the message is empty (a timeout's is)."""
    return str(exc) or type(exc).__name__


# The connect found nothing to talk to: no listener, no route, no such host.
_UNREACHABLE = {errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                errno.EADDRNOTAVAIL, errno.ECONNABORTED}


def unreachable(exc: BaseException) -> bool:
    return isinstance(exc, socket.gaierror) or (
        isinstance(exc, OSError) and not isinstance(exc, ssl.SSLError)
        and exc.errno in _UNREACHABLE)


# What nats-server says when it judged the credentials (server/client.go's auth errors)
REFUSED_CREDENTIALS = ("authorization violation", "authentication expired",
                       "authentication revoked")


def refusal(exc: BaseException, options: NatsOptions) -> NatsConfigError | None:
    """The server's answer to a connect, when it means the settings are wrong (not that the
    server is away): the credentials refused, the certificates not trusted one way or the
    other. None for anything else."""
    where = f"NATS at {redact(options.url)}"
    text = str(exc).lower()
    # Not "authentication timeout": a slow CONNECT (an overloaded server), an outage
    if isinstance(exc, nats.errors.AuthorizationError) or any(
            refused in text for refused in REFUSED_CREDENTIALS):
        return NatsConfigError(f"{where}: authorization violation: check "
                               f"{options.auth_settings()}")
    if isinstance(exc, PlainTextServer):
        return NatsConfigError(f"{where}: TLS: the server offers no TLS, so nothing was sent "
                               f"to it in plain text: check KUBEMOOT_NATS_URL (tls://) and "
                               "the server's TLS settings")
    if isinstance(exc, ssl.SSLCertVerificationError):
        return NatsConfigError(f"{where}: TLS: the server's certificate is not trusted "
                               f"({exc.verify_message}): check {TLS_CA}")
    if isinstance(exc, ssl.SSLError) and "alert" in text:  # the server's verdict on ours
        return NatsConfigError(f"{where}: TLS: the server refused the client certificate "
                               f"({exc.reason or exc}): check {TLS_CERT}, {TLS_KEY}")
    return None
