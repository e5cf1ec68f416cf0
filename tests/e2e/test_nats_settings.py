"""NATS settings against real nats-servers, through the real commands: credentials files in
operator mode, passwords and TLS. Settings a server refuses, or files that are not there, end
`serve`, `init-buckets` and `publish` with one line naming the setting; a server that does not
answer is an outage the sidecar waits through, said once when it starts and once when it
ends."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from loadtest.nats_server import NatsServer, nats_server_binary
from loadtest.ollama_sim import SimServer
from loadtest.relay_bench import free_port
from proxy.adapters.nats_kv import RETRY_CONNECT_S
from proxy.ports import PROVIDER_STATE
from tests.commands import finish, run_all, start
from tests.conftest import eventually, provider_entry
from tests.e2e.test_scheduling import chat
from tests.nats_auth import OperatorMode, TlsFiles, start_operator_mode, tls_files

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.nats,
              pytest.mark.skipif(nats_server_binary() is None, reason="no nats-server binary")]
needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None,
                                   reason="openssl CLI not installed")


def command(*args: str, timeout_s: float = 30, **env: str) -> subprocess.CompletedProcess[str]:
    return finish(start_command(*args, **env), timeout_s)


def start_command(*args: str, **env: str) -> subprocess.Popen[str]:
    """A command left running, to be collected with `finish` once the test needs it."""
    return start(args, {**os.environ, **env})


class Serve:
    """`kubemoot-proxy serve` as its own process, its stderr kept in a file."""

    def __init__(self, directory: Path, providers: list[SimServer], **env: str) -> None:
        self.port = free_port()
        self.log = directory / f"serve-{self.port}.log"
        with self.log.open("wb") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "proxy", "serve"], cwd=ROOT, stdout=subprocess.DEVNULL,
                stderr=stderr, env={**os.environ, "KUBEMOOT_LISTEN": f"127.0.0.1:{self.port}",
                                    "KUBEMOOT_PROVIDERS": json.dumps(
                                        [provider_entry(p) for p in providers]), **env})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def shared_state(self) -> str | None:
        try:
            return str(httpx.get(f"{self.url}/readyz", timeout=2).json()["sharedState"])
        except httpx.HTTPError:
            return None

    def exit(self, timeout_s: float = 30) -> tuple[int, list[str]]:
        rc = self.proc.wait(timeout_s)
        return rc, self.log.read_text().splitlines()

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()
                if line.startswith("{")]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def serve(tmp_path: Path, sim_factory: Callable[..., SimServer]) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []
    gpu = sim_factory("gpu", time_scale=0.05)

    def start(**env: str) -> Serve:
        started.append(Serve(tmp_path, [gpu], **env))
        return started[-1]

    yield start
    for process in started:
        process.stop()


@pytest.fixture(scope="module")
def operator_mode(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorMode]:
    mode = start_operator_mode(tmp_path_factory.mktemp("operator"))
    yield mode
    mode.server.cleanup()


async def provider_states(url: str, creds: Path) -> list[str]:
    nc = await nats.connect(url, user_credentials=str(creds))
    try:
        kv = await nc.jetstream().key_value(PROVIDER_STATE)
        return list(await kv.keys())
    finally:
        await nc.close()


def test_a_creds_file_in_operator_mode_creates_the_buckets_and_a_sidecar_shares_state(
        operator_mode: OperatorMode, serve: Callable[..., Serve]) -> None:
    url, creds = operator_mode.server.url, str(operator_mode.creds)
    init = command("init-buckets", KUBEMOOT_NATS_URL=url, KUBEMOOT_NATS_CREDS=creds)
    assert init.returncode == 0, init.stderr
    assert f"{PROVIDER_STATE}: created" in init.stdout and not init.stderr
    sidecar = serve(KUBEMOOT_NATS_URL=url, KUBEMOOT_NATS_CREDS=creds)
    again = start_command("init-buckets", KUBEMOOT_NATS_URL=url, KUBEMOOT_NATS_CREDS=creds)
    assert eventually(lambda: sidecar.shared_state() == "connected", timeout_s=30)
    assert chat(sidecar.url, "qwen3:8b").status_code == 200
    assert asyncio.run(provider_states(url, operator_mode.creds)) == ["gpu"]  # its prober's
    assert f"{PROVIDER_STATE}: exists" in finish(again).stdout


def test_creds_the_server_does_not_trust_end_every_command_with_one_line(
        operator_mode: OperatorMode, serve: Callable[..., Serve], tmp_path: Path) -> None:
    env = {"KUBEMOOT_NATS_URL": operator_mode.server.url,
           "KUBEMOOT_NATS_CREDS": str(operator_mode.foreign_creds)}
    said = (f"NATS at {operator_mode.server.url}: authorization violation: check "
            "KUBEMOOT_NATS_CREDS")
    garbage = tmp_path / "g.creds"
    garbage.write_text("garbage\n")
    untrusted = serve(**env)
    not_creds = serve(KUBEMOOT_NATS_URL=operator_mode.server.url,
                      KUBEMOOT_NATS_CREDS=str(garbage))
    init, publish = run_all([
        (["init-buckets"], {**os.environ, **env}),
        (["publish", "--once"], {**os.environ, **env, "KUBEMOOT_PROVIDERS": json.dumps(
            [{"name": "gpu", "endpoint": "http://127.0.0.1:9"}])})])
    rc, lines = untrusted.exit()
    assert (rc, lines) == (2, [f"kubemoot-proxy: bad configuration: {said}"])
    assert (init.returncode, init.stderr) == (1, f"kubemoot-proxy init-buckets: {said}\n")
    assert (publish.returncode, publish.stderr) == (1, f"kubemoot-proxy publish: {said}\n")
    rc, lines = not_creds.exit()
    assert (rc, lines) == (2, [f"kubemoot-proxy: bad configuration: KUBEMOOT_NATS_CREDS="
                               f"{garbage}: not a NATS credentials file (no user JWT in it)"])


SUBCOMMANDS = [["serve"], ["init-buckets"], ["publish", "--once"], ["bind", "-f", "docs.yaml"]]


@pytest.mark.parametrize(("url", "said"), [
    ("nats://nats:42x2", "'nats://nats:42x2': the port must be a number from 1 to 65535"),
    ("nats://127.0.0.1:4222,tls://agent:s3cret@127.0.0.1:99999",
     "'tls://***@127.0.0.1:99999': the port must be a number from 1 to 65535"),
    ("nast://127.0.0.1:4222", "'nast://127.0.0.1:4222': the scheme must be nats://, tls://, "
                              "ws:// or wss://"),
])
def test_a_nats_url_that_is_no_url_ends_every_command_with_one_line(url: str, said: str
                                                                    ) -> None:
    """Before any connect: nats-py would take a mistyped scheme for a host and wait for it
    without end, and a bad port ended `serve` with a traceback."""
    env = {**os.environ,
           "KUBEMOOT_PROVIDERS": json.dumps([{"name": "gpu", "endpoint": "http://127.0.0.1:9"}])}
    specs: list[tuple[list[str], dict[str, str]]] = [
        *[(args, {**env, "KUBEMOOT_NATS_URL": url}) for args in SUBCOMMANDS],
        (["init-buckets", "--nats-url", url], env)]
    for (args, _), done in zip(specs, run_all(specs), strict=True):
        assert (done.returncode, done.stdout, done.stderr) == (
            2, "", f"kubemoot-proxy: bad configuration: KUBEMOOT_NATS_URL: {said}\n"), args


@pytest.mark.parametrize(("server_args", "env", "settings"), [
    (["--user", "agent", "--pass", "s3cret"],
     {"KUBEMOOT_NATS_USER": "agent", "KUBEMOOT_NATS_PASSWORD": "wrong"},
     "KUBEMOOT_NATS_USER/PASSWORD"),
    (["--auth", "t0ken"], {"KUBEMOOT_NATS_TOKEN": "wrong"}, "KUBEMOOT_NATS_TOKEN"),
    (["--auth", "t0ken"], {},
     "the server wants credentials: set KUBEMOOT_NATS_USER/PASSWORD, TOKEN or CREDS"),
])
def test_a_wrong_password_or_token_ends_serve_with_one_line(
        serve: Callable[..., Serve], server_args: list[str], env: dict[str, str],
        settings: str) -> None:
    server = NatsServer(extra_args=server_args).start()
    try:
        rc, lines = serve(KUBEMOOT_NATS_URL=server.url, **env).exit()
    finally:
        server.cleanup()
    assert (rc, lines) == (2, [f"kubemoot-proxy: bad configuration: NATS at {server.url}: "
                               f"authorization violation: check {settings}"])


def test_a_server_asked_for_over_tls_that_offers_none_gets_no_credentials(
        serve: Callable[..., Serve]) -> None:
    # nats-py goes on in plain text when the server's INFO does not require TLS: the token
    # would cross the network in the clear, to whatever answers on that port.
    server = NatsServer(extra_args=["--auth", "t0ken"]).start()
    try:
        url = server.url.replace("nats://", "tls://")
        rc, lines = serve(KUBEMOOT_NATS_URL=url, KUBEMOOT_NATS_TOKEN="t0ken").exit()
    finally:
        server.cleanup()
    assert (rc, lines) == (2, [f"kubemoot-proxy: bad configuration: NATS at {url}: TLS: the "
                               "server offers no TLS, so nothing was sent to it in plain "
                               "text: check KUBEMOOT_NATS_URL (tls://) and the server's TLS "
                               "settings"])


def refusals(server: NatsServer) -> int:
    """Connections the server turned away for their credentials, as its log tells them."""
    return (server.dir / "server.log").read_text().count("authentication error")


def test_a_nats_that_comes_after_serve_and_refuses_it_is_said_once_as_an_error(
        serve: Callable[..., Serve]) -> None:
    server = NatsServer(extra_args=["--user", "agent", "--pass", "s3cret"]).start()
    server.stop()  # nothing listens when serve checks its settings: an outage
    try:
        sidecar = serve(KUBEMOOT_NATS_URL=server.url, KUBEMOOT_NATS_USER="agent",
                        KUBEMOOT_NATS_PASSWORD="wrong")
        assert eventually(lambda: sidecar.shared_state() == "unavailable", timeout_s=30)
        server.start()
        refused = f"NATS at {server.url}: authorization violation: check " \
                  "KUBEMOOT_NATS_USER/PASSWORD"
        assert eventually(lambda: any(e.get("error") == refused for e in sidecar.events()),
                          timeout_s=15)
        said_at = refusals(server)
        # two more refusals, not said again
        assert eventually(lambda: refusals(server) >= said_at + 2,
                          timeout_s=RETRY_CONNECT_S * 2 + 15)
    finally:
        server.cleanup()
    assert sidecar.proc.poll() is None and sidecar.shared_state() == "unavailable"
    assert [(e["level"], e["event"]) for e in sidecar.events()] == [
        ("warning", "shared state unavailable; only loaded copies serve calls, no load or unload "
                    "until NATS answers"),
        ("error", "nats refuses this sidecar's settings; only loaded copies serve calls, no load "
                  "or unload until it takes them")]


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, TlsFiles]]:
    """A NATS that verifies its clients' certificates against the same CA as its own."""
    tls = tls_files(tmp_path_factory.mktemp("tls"))
    server = NatsServer(extra_args=["--tls", "--tlscert", str(tls.cert), "--tlskey",
                                    str(tls.key), "--tlsverify", "--tlscacert", str(tls.ca)]
                        ).start()
    yield f"tls://127.0.0.1:{server.port}", tls
    server.cleanup()


@needs_openssl
def test_tls_settings_that_cannot_work_end_serve_with_one_line_naming_them(
        tls_server: tuple[str, TlsFiles], serve: Callable[..., Serve],
        tmp_path: Path) -> None:
    url, tls = tls_server
    other = tls_files(tmp_path / "other")
    cases = [
        ({"KUBEMOOT_NATS_TLS_CA": str(tls.ca)},
         f"NATS at {url}: TLS: the server refused the client certificate "
         "(TLSV13_ALERT_CERTIFICATE_REQUIRED): check KUBEMOOT_NATS_TLS_CERT, "
         "KUBEMOOT_NATS_TLS_KEY"),
        ({"KUBEMOOT_NATS_TLS_CA": str(other.ca), "KUBEMOOT_NATS_TLS_CERT": str(tls.cert),
          "KUBEMOOT_NATS_TLS_KEY": str(tls.key)},
         f"NATS at {url}: TLS: the server's certificate is not trusted (unable to get local "
         "issuer certificate): check KUBEMOOT_NATS_TLS_CA"),
        ({"KUBEMOOT_NATS_TLS_CA": "/nonexistent/ca.pem"},
         "KUBEMOOT_NATS_TLS_CA=/nonexistent/ca.pem: no such file"),
        ({"KUBEMOOT_NATS_TLS_CA": str(tls.ca), "KUBEMOOT_NATS_TLS_CERT": str(tls.cert)},
         f"KUBEMOOT_NATS_TLS_CERT={tls.cert}: no private key in it and KUBEMOOT_NATS_TLS_KEY "
         "not set"),
    ]
    sidecars = [serve(KUBEMOOT_NATS_URL=url, **env) for env, _ in cases]
    for (env, said), sidecar in zip(cases, sidecars, strict=True):
        rc, lines = sidecar.exit()
        assert (rc, lines) == (2, [f"kubemoot-proxy: bad configuration: {said}"]), env


@needs_openssl
def test_a_sidecar_over_tls_with_its_certificate_logs_no_asyncio_line(
        tls_server: tuple[str, TlsFiles], serve: Callable[..., Serve]) -> None:
    url, tls = tls_server
    sidecar = serve(KUBEMOOT_NATS_URL=url, KUBEMOOT_NATS_TLS_CA=str(tls.ca),
                    KUBEMOOT_NATS_TLS_CERT=str(tls.cert), KUBEMOOT_NATS_TLS_KEY=str(tls.key),
                    KUBEMOOT_LOG_LEVEL="debug")
    assert eventually(lambda: sidecar.shared_state() == "connected", timeout_s=30)
    assert chat(sidecar.url, "qwen3:8b").status_code == 200
    sidecar.stop()  # its TLS connections close: where asyncio spoke of eof_received()
    lines = sidecar.log.read_text().splitlines()
    assert lines and all(line.startswith("{") for line in lines), lines[:5]


def test_an_outage_is_said_once_when_it_begins_and_once_when_it_ends(
        serve: Callable[..., Serve]) -> None:
    server = NatsServer().start()
    server.stop()  # its port known, nothing listening: the sidecar starts before NATS
    try:
        sidecar = serve(KUBEMOOT_NATS_URL=server.url)
        assert eventually(lambda: sidecar.shared_state() == "unavailable", timeout_s=30)
        time.sleep(RETRY_CONNECT_S * 2)
        server.start()
        assert eventually(lambda: sidecar.shared_state() == "connected", timeout_s=30)
        server.stop()
        assert eventually(lambda: sidecar.shared_state() == "unavailable", timeout_s=10)
        time.sleep(3)  # six reconnects, 0.5 s apart
        server.start()
        assert eventually(lambda: sidecar.shared_state() == "connected", timeout_s=30)
        assert sidecar.proc.poll() is None
        said = sidecar.events()
    finally:
        server.cleanup()
    nats_said = [e for e in said if "nats" in e["event"] or "shared state" in e["event"]]
    # A bucket operation in flight as the server goes may fail before the client sees the
    # connection lost: the store then says JetStream stopped serving, just before the loss
    # (and says it serves again once back). That is the same outage, told from its first sign.
    not_serving = [e for e in nats_said if e["event"].startswith("nats connected but not serving")]
    serving_again = [e for e in nats_said if e["event"] == "nats serving the buckets again"]
    assert len(not_serving) <= 1 and len(serving_again) == len(not_serving), nats_said
    if not_serving:
        at = nats_said.index(not_serving[0])
        assert nats_said[at + 1]["event"].startswith("nats disconnected"), nats_said
        assert nats_said.index(serving_again[0]) > at + 1, nats_said
    outage = [e for e in nats_said if e not in not_serving + serving_again]
    assert [(e["level"], e["event"]) for e in outage] == [
        ("warning", "shared state unavailable; only loaded copies serve calls, no load or unload "
                    "until NATS answers"),
        ("info", "nats connected"),
        ("warning", "nats disconnected; only loaded copies serve calls, no load or unload until it "
                    "returns"),
        ("info", "nats reconnected")]
    _, joined, lost, back = outage
    assert joined["attempts"] >= 2
    # nats-py names the cause when its error callback came first (under load it may not)
    assert lost.get("error", "nats: unexpected EOF") == "nats: unexpected EOF"
    assert back["failed_attempts"] >= 4 and back["down_s"] >= 2.5
    assert back["error"].endswith("Connection refused")



async def _make_bucket_by_hand(url: str, name: str, ttl_s: float, history: int) -> None:
    from nats.js.api import KeyValueConfig

    nc = await nats.connect(url)
    try:
        await nc.jetstream().create_key_value(config=KeyValueConfig(
            bucket=name, ttl=ttl_s, history=history))
    finally:
        await nc.close()


async def _bucket_settings(url: str, name: str) -> tuple[float, int]:
    nc = await nats.connect(url)
    try:
        config = (await nc.jetstream().stream_info(f"KV_{name}")).config
        return float(config.max_age or 0), int(config.max_msgs_per_subject or 0)
    finally:
        await nc.close()


def test_init_buckets_puts_right_a_bucket_made_with_other_settings(
        nats_server: NatsServer) -> None:
    # `nats kv add` by hand (or an older release): provider state aging out in 5 s, between
    # two of the publisher's writes; tickets never aging out. It said "exists" and left them.
    from tests.conftest import empty_buckets

    url = nats_server.url
    asyncio.run(empty_buckets(url))
    asyncio.run(_make_bucket_by_hand(url, PROVIDER_STATE, 5, 10))
    asyncio.run(_make_bucket_by_hand(url, "kubemoot_provider_tickets", 0, 1))
    first = command("init-buckets", KUBEMOOT_NATS_URL=url)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert f"{PROVIDER_STATE}: ttl 5 s -> 3600 s, history 10 -> 1" in lines
    assert "kubemoot_provider_tickets: no ttl -> 21600 s" in lines
    assert asyncio.run(_bucket_settings(url, PROVIDER_STATE)) == (3600.0, 1)
    assert asyncio.run(_bucket_settings(url, "kubemoot_provider_tickets")) == (21600.0, 1)
    again = command("init-buckets", KUBEMOOT_NATS_URL=url)  # idempotent
    assert again.stdout.splitlines() == [
        f"{name}: exists (replicas 1)" for name in (
            PROVIDER_STATE, "kubemoot_provider_tickets", "kubemoot_model_demand",
            "kubemoot_bindings")]


def test_more_replicas_than_the_server_can_keep_is_said_naming_the_setting(
        nats_server: NatsServer, tmp_path: Path) -> None:
    # It was JetStream's "nats: ServerError: code=500 err_code=10074 ..." alone.
    from tests.conftest import empty_buckets

    asyncio.run(empty_buckets(nats_server.url))
    said = ("KUBEMOOT_NATS_REPLICAS=3: this NATS server is not clustered (replicas > 1 not "
            "supported in non-clustered mode)")
    env = {"KUBEMOOT_NATS_URL": nats_server.url, "KUBEMOOT_NATS_REPLICAS": "3"}
    (tmp_path / "docs.yaml").write_text("")
    init, bind = run_all([(["init-buckets"], {**os.environ, **env}),
                          (["bind", "-f", str(tmp_path / "docs.yaml")], {**os.environ, **env})])
    assert (init.returncode, init.stderr) == (1, f"kubemoot-proxy init-buckets: {said}\n")
    assert (bind.returncode, bind.stderr.splitlines()[-1]) == (1, f"kubemoot-proxy bind: {said}")
