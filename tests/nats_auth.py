"""NATS authentication for the tests. Operator mode: an operator, a system account, an
account with JetStream and its user, each an nkey, their JWTs signed here (base64url(header).
base64url(claims).base64url(the issuer's ed25519 signature)), a nats-server configured to
trust them, and the user's `.creds` file, as `nsc` would write them. TLS: a throwaway CA and
a certificate for 127.0.0.1 signed by it (openssl CLI)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys

from loadtest.nats_server import NatsServer

UNLIMITED = -1


def new_key(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def public(key: nkeys.KeyPair) -> str:
    return str(key.public_key.decode())


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_jwt(issuer: nkeys.KeyPair, subject: str, name: str, nats: dict[str, Any]) -> str:
    claims: dict[str, Any] = {"iat": int(time.time()), "iss": public(issuer), "name": name,
                              "sub": subject, "nats": {**nats, "version": 2}}
    # jti: the claims' own hash, as the Go library computes it (the server does not check it)
    claims["jti"] = base64.b32encode(hashlib.sha256(
        json.dumps(claims, sort_keys=True).encode()).digest()).decode().rstrip("=")
    signed = ".".join([_b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode()),
                       _b64(json.dumps(claims).encode())])
    return f"{signed}.{_b64(issuer.sign(signed.encode()))}"


def account_jwt(operator: nkeys.KeyPair, account: nkeys.KeyPair, name: str,
                jetstream: bool) -> str:
    limits: dict[str, Any] = {"subs": UNLIMITED, "data": UNLIMITED, "payload": UNLIMITED,
                              "imports": UNLIMITED, "exports": UNLIMITED, "wildcards": True,
                              "conn": UNLIMITED, "leaf": UNLIMITED}
    if jetstream:
        limits |= {"mem_storage": UNLIMITED, "disk_storage": UNLIMITED,
                   "streams": UNLIMITED, "consumer": UNLIMITED}
    return sign_jwt(operator, public(account), name, {"type": "account", "limits": limits})


def creds_file(path: Path, user_jwt: str, user: nkeys.KeyPair) -> Path:
    path.write_text(f"""-----BEGIN NATS USER JWT-----
{user_jwt}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
{user.seed.decode()}
------END USER NKEY SEED------
""")
    path.chmod(0o600)
    return path


@dataclass
class OperatorMode:
    server: NatsServer
    creds: Path  # a user of the JetStream account
    foreign_creds: Path  # a user signed by an account the server does not know


def start_operator_mode(directory: Path) -> OperatorMode:
    """A JetStream nats-server trusting one operator, with the system account and an
    application account preloaded in its memory resolver, and two users' creds files."""
    operator = new_key(nkeys.PREFIX_BYTE_OPERATOR)
    system, app, stranger = (new_key(nkeys.PREFIX_BYTE_ACCOUNT) for _ in range(3))
    operator_jwt = sign_jwt(operator, public(operator), "kubemoot-test",
                            {"type": "operator", "system_account": public(system)})
    preload = {public(system): account_jwt(operator, system, "SYS", jetstream=False),
               public(app): account_jwt(operator, app, "APP", jetstream=True)}
    config = directory / "operator.conf"
    config.write_text(json.dumps({
        "operator": operator_jwt, "system_account": public(system),
        "resolver": "MEMORY", "resolver_preload": preload}))

    def user_creds(account: nkeys.KeyPair, name: str) -> Path:
        user = new_key(nkeys.PREFIX_BYTE_USER)
        user_jwt = sign_jwt(account, public(user), name, {
            "type": "user", "pub": {}, "sub": {}, "subs": UNLIMITED, "data": UNLIMITED,
            "payload": UNLIMITED})
        return creds_file(directory / f"{name}.creds", user_jwt, user)

    server = NatsServer(extra_args=["-c", str(config)]).start()
    return OperatorMode(server, user_creds(app, "sidecar"), user_creds(stranger, "stranger"))


@dataclass
class TlsFiles:
    ca: Path
    cert: Path  # for 127.0.0.1, fit for a server and a client alike
    key: Path


def tls_files(directory: Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (directory / n for n in
                                  ("ca.key", "ca.pem", "cert.key", "cert.csr", "cert.pem"))
    ext = directory / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out",
            str(ca), "-days", "1", "-subj", "/CN=kubemoot-test-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
            "-subj", "/CN=127.0.0.1")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
            "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return TlsFiles(ca, cert, key)
