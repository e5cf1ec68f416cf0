"""NATS settings that cannot work are bad configuration, said in one line naming the setting
before any connect; nats-py loads a credentials file written as `nsc` writes it."""

from __future__ import annotations

import base64
import logging
import shutil
import socket
import ssl
from pathlib import Path

import nats.errors
import nkeys
import pytest
import structlog
from nats.aio.client import Client

from proxy.adapters.nats_options import NatsConfigError, NatsOptions, refusal, unreachable
from proxy.observability.logging import configure_logging
from proxy.settings import ConfigError
from tests.nats_auth import creds_file, new_key, public, sign_jwt, tls_files

URL = "tls://127.0.0.1:4222"
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None,
                                   reason="openssl CLI not installed")


def problem(options: NatsOptions) -> str:
    with pytest.raises(NatsConfigError) as info:
        options.connect_kwargs()
    assert isinstance(info.value, ConfigError)  # main() turns it into exit 2, one line
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("field, setting", [
    ("creds_file", "KUBEMOOT_NATS_CREDS"), ("tls_ca", "KUBEMOOT_NATS_TLS_CA"),
    ("tls_cert", "KUBEMOOT_NATS_TLS_CERT")])
def test_a_configured_file_that_is_not_there_is_named_with_its_setting(
        tmp_path: Path, field: str, setting: str) -> None:
    missing = tmp_path / "nowhere.pem"
    assert problem(NatsOptions(URL, **{field: missing})) == f"{setting}={missing}: no such file"
    assert problem(NatsOptions(URL, **{field: tmp_path})) == \
        f"{setting}={tmp_path}: a directory, not a file"


def test_a_key_without_its_certificate_and_a_ca_without_certificates_are_refused(
        tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("not used\n")
    assert problem(NatsOptions(URL, tls_key=key)) == \
        f"KUBEMOOT_NATS_TLS_KEY={key}: set without KUBEMOOT_NATS_TLS_CERT"
    ca = tmp_path / "ca.pem"
    ca.write_text("no certificate here\n")
    assert problem(NatsOptions(URL, tls_ca=ca)).startswith(
        f"KUBEMOOT_NATS_TLS_CA={ca}: no PEM certificate in it")


@needs_openssl
def test_a_certificate_without_its_key_is_refused_and_with_it_makes_a_context(
        tmp_path: Path) -> None:
    tls = tls_files(tmp_path)
    assert problem(NatsOptions(URL, tls_ca=tls.ca, tls_cert=tls.cert)) == \
        (f"KUBEMOOT_NATS_TLS_CERT={tls.cert}: no private key in it and KUBEMOOT_NATS_TLS_KEY "
         "not set")
    other = tls_files(tmp_path / "other")
    assert "not a certificate and its key" in problem(
        NatsOptions(URL, tls_ca=tls.ca, tls_cert=tls.cert, tls_key=other.key))
    kwargs = NatsOptions(URL, tls_ca=tls.ca, tls_cert=tls.cert, tls_key=tls.key
                         ).connect_kwargs()
    assert isinstance(kwargs["tls"], ssl.SSLContext)


def test_a_file_that_is_not_credentials_is_refused_before_nats_py_reads_it(
        tmp_path: Path) -> None:
    garbage = tmp_path / "g.creds"
    garbage.write_text("garbage\n")  # nats-py: "object of type 'NoneType' has no len()"
    assert problem(NatsOptions(URL, creds_file=garbage)) == \
        f"KUBEMOOT_NATS_CREDS={garbage}: not a NATS credentials file (no user JWT in it)"
    user = new_key(nkeys.PREFIX_BYTE_USER)
    bad_seed = creds_file(tmp_path / "bad.creds", "e30.e30.c2ln", user)
    bad_seed.write_text(bad_seed.read_text().replace(user.seed.decode(), "SUNOTASEED"))
    assert problem(NatsOptions(URL, creds_file=bad_seed)) == \
        f"KUBEMOOT_NATS_CREDS={bad_seed}: its user nkey seed is not valid"


def test_nats_py_loads_the_credentials_file_and_signs_the_server_nonce_with_its_seed(
        tmp_path: Path) -> None:
    account, user = new_key(nkeys.PREFIX_BYTE_ACCOUNT), new_key(nkeys.PREFIX_BYTE_USER)
    user_jwt = sign_jwt(account, public(user), "sidecar", {"type": "user"})
    creds = creds_file(tmp_path / "sidecar.creds", user_jwt, user)
    kwargs = NatsOptions("nats://127.0.0.1:4222", creds_file=creds).connect_kwargs()
    client = Client()
    client._user_credentials = kwargs["user_credentials"]  # what connect() sets, then:
    client._setup_nkeys_connect()
    assert bytes(client._user_jwt_cb()).decode() == user_jwt
    signature = base64.b64decode(client._signature_cb("nonce-from-the-server"))
    assert user.verify(b"nonce-from-the-server", signature)


def test_refusals_name_the_settings_that_carry_the_credentials() -> None:
    authorization = nats.errors.Error("nats: 'Authorization Violation'")
    said = refusal(authorization, NatsOptions("nats://u:p@h:4222", user="agent", password="x"))
    assert str(said) == ("NATS at nats://***@h:4222: authorization violation: check "
                         "KUBEMOOT_NATS_USER/PASSWORD")
    assert "the server wants credentials: set KUBEMOOT_NATS_USER/PASSWORD, TOKEN or CREDS" in \
        str(refusal(nats.errors.AuthorizationError(), NatsOptions("nats://h:4222")))
    # credentials in the URL alone were told to "set" the settings, as if none were sent
    assert str(refusal(authorization, NatsOptions("nats://h:1,nats://u:p@h:4222"))) == (
        "NATS at nats://h:1,nats://***@h:4222: authorization violation: check the credentials "
        "in KUBEMOOT_NATS_URL (user:password@ or token@)")
    assert refusal(ConnectionRefusedError(111, "Connect call failed"),
                   NatsOptions("nats://h:4222")) is None  # not listening: an outage
    assert refusal(TimeoutError(), NatsOptions("nats://h:4222")) is None
    # a server too busy to take CONNECT in time judged nothing: an outage
    assert refusal(nats.errors.Error("nats: 'Authentication Timeout'"),
                   NatsOptions("nats://h:4222", user="agent", password="x")) is None
    assert refusal(nats.errors.Error("nats: 'User Authentication Expired'"),
                   NatsOptions("nats://h:4222", creds_file=Path("/c.creds"))) is not None


def test_only_a_server_not_listening_or_not_found_is_unreachable() -> None:
    assert unreachable(ConnectionRefusedError(111, "Connect call failed"))
    assert unreachable(OSError(113, "No route to host"))
    assert unreachable(socket.gaierror(-2, "Name or service not known"))
    assert not unreachable(nats.errors.UnexpectedEOF())  # it answered, then hung up
    assert not unreachable(ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED]"))
    assert not unreachable(TimeoutError())


def test_asyncio_says_nothing_of_tls_end_of_file_nor_of_its_selector(
        caplog: pytest.LogCaptureFixture) -> None:
    asyncio_log = logging.getLogger("asyncio")
    configure_logging("debug")
    try:
        caplog.set_level(logging.DEBUG)
        asyncio_log.debug("Using selector: EpollSelector")
        asyncio_log.warning("returning true from eof_received() has no effect when using ssl")
        asyncio_log.warning("Task was destroyed but it is pending!")
    finally:
        structlog.reset_defaults()  # the process's other tests log as if never configured
        asyncio_log.setLevel(logging.NOTSET)
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == \
        ["Task was destroyed but it is pending!"]
