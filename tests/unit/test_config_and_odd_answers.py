"""What an operator can get wrong, or a neighbour can answer oddly, refused or weathered:
settings that are no finite number or no URL, a ticket expiry JSON cannot hold, a DCGM
exporter answering garbage, an interval of 0, a host that does not resolve, a provider never
reached."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from proxy.adapters.dcgm import DcgmExporter
from proxy.core.tickets import Ticket, TicketSet
from proxy.service.codec import decode_ticket_set, encode_ticket_set
from proxy.service.prober import Prober
from proxy.settings import ConfigError, load_settings
from tests.unit.test_stale_free_memory import _Ps

PROVIDER = {"name": "a", "endpoint": "http://a:11434"}


def test_a_ticket_ttl_of_inf_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="KUBEMOOT_TICKET_TTL_SECONDS"):
        load_settings(ticket_ttl_seconds="inf", model_endpoint="http://x:1")


def test_a_ticket_whose_expiry_json_cannot_hold_is_counted_for_a_ttl() -> None:
    """orjson writes an infinite expiry as null (another writer's bug): the ticket still
    counts, and goes a default TTL after its start rather than never (or every call's 500)."""
    ticket = Ticket("t1", "a", "qwen3:8b", 6000, 1_800_000_000.0, math.inf)
    raw = encode_ticket_set(TicketSet({"t1": ticket}))
    assert b'"exp":null' in raw
    decoded = decode_ticket_set("a", raw).tickets["t1"]
    assert (decoded.footprint_mib, decoded.expires_at) == (6000, 1_800_000_060.0)


@pytest.mark.parametrize("setting, value", [
    ("state_stale_seconds", "inf"), ("probe_interval_seconds", "inf"),
    ("answer_timeout_seconds", "inf"), ("model_candidate_tolerance", "nan"),
    ("discuss_gpu_wait_limit_seconds", "nan")])
def test_a_timing_or_tolerance_that_is_no_finite_number_is_refused(setting: str,
                                                                     value: str) -> None:
    with pytest.raises(ConfigError, match=f"KUBEMOOT_{setting.upper()}"):
        load_settings(model_endpoint="http://x:1", **{setting: value})


@pytest.mark.parametrize("weight", [math.nan, math.inf])
def test_a_provider_weight_that_is_no_finite_number_is_refused(weight: float) -> None:
    with pytest.raises(ConfigError, match=r"KUBEMOOT_PROVIDERS\[0\]\.weight"):
        load_settings(providers=[{**PROVIDER, "weight": weight}])


@pytest.mark.parametrize("endpoint", ["http://", "http://h:99999", "http://h o:1"])
def test_a_provider_endpoint_that_is_no_url_is_refused(endpoint: str) -> None:
    with pytest.raises(ConfigError, match=r"KUBEMOOT_PROVIDERS\[0\]\.endpoint"):
        load_settings(providers=[{**PROVIDER, "endpoint": endpoint}])


def test_a_listen_host_that_does_not_resolve_is_said_plainly() -> None:
    from proxy.__main__ import _bind

    with pytest.raises(ConfigError) as caught:
        _bind("KUBEMOOT_LISTEN", "no-such-host.invalid:11434")
    assert "Unknown error" not in str(caught.value)


@pytest.fixture
def exporter_answering() -> Iterator[list[bytes]]:
    """A loopback HTTP server answering GET with the body the test puts in the list."""
    body: list[bytes] = [b""]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.end_headers()
            self.wfile.write(body[0])

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    body.append(f"http://127.0.0.1:{server.server_address[1]}/metrics".encode())
    try:
        yield body
    finally:
        server.shutdown()
        server.server_close()


GARBAGE = [b"<html><body>404 page not found</body></html>",
           b'DCGM_FI_DEV_FB_FREE{gpu="0"} NaN\nDCGM_FI_DEV_FB_USED{gpu="0"} 100\n',
           b'DCGM_FI_DEV_FB_FREE{gpu="0"} +Inf\n']


@pytest.mark.parametrize("answer", GARBAGE)
async def test_an_exporter_answering_garbage_gives_an_unknown_total(
        exporter_answering: list[bytes], answer: bytes) -> None:
    exporter_answering[0] = answer
    assert await DcgmExporter(2.0).total_mib(exporter_answering[1].decode()) is None


async def test_a_garbage_exporter_leaves_the_provider_probed(
        exporter_answering: list[bytes]) -> None:
    exporter_answering[0] = GARBAGE[0]
    settings = load_settings(providers=[{**PROVIDER,
                                         "dcgmUrl": exporter_answering[1].decode()}])
    prober = Prober(list(settings.providers), {"a": _Ps()}, None,  # type: ignore[dict-item]
                    gpu_memory=DcgmExporter(2.0))
    states = await prober.round(force=True)
    assert [(s.name, s.ready, s.total_vram_mib) for s in states] == [("a", True, None)]


@pytest.mark.parametrize("argv", [["publish", "--interval", "0"],
                                  ["publish", "--interval", "-1"],
                                  ["bind", "-f", "x", "--poll-interval", "0"],
                                  ["bind", "-f", "x", "--thread-ttl", "-5"],
                                  ["candidates", "-f", "x", "--concurrency-factor", "-1"],
                                  ["bind", "-f", "x", "--concurrency-factor", "0"],
                                  ["candidates", "-f", "x", "--eviction-overhead-mib", "-5"]])
def test_an_interval_that_is_not_positive_is_refused(argv: list[str]) -> None:
    from proxy.__main__ import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


class _Down(_Ps):
    async def version(self, timeout_s: float | None = None) -> str:
        from proxy.ports import UpstreamError

        raise UpstreamError("http://a:11434/api/version: cannot connect (Connection refused)")


async def test_a_provider_unreachable_from_the_start_is_logged() -> None:
    from structlog.testing import capture_logs

    settings = load_settings(providers=[{**PROVIDER, "totalVramMiB": 24576}])
    prober = Prober(list(settings.providers), {"a": _Down()}, None,  # type: ignore[dict-item]
                    gpu_memory=DcgmExporter(2.0))
    with capture_logs() as logs:
        states = await prober.round(force=True)
    assert [s.ready for s in states] == [False]
    assert any(entry.get("provider") == "a" for entry in logs)


def test_a_provider_of_no_memory_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"KUBEMOOT_PROVIDERS\[0\]\.totalVramMiB"):
        load_settings(providers=[{**PROVIDER, "totalVramMiB": 0}])


def test_a_model_provider_document_whose_endpoint_is_no_url_is_refused() -> None:
    from proxy.operator.documents import ProviderSpec

    with pytest.raises(ValueError, match="must start with http"):
        ProviderSpec(endpoint="gpu-b")
    assert ProviderSpec(endpoint="").endpoint == ""  # (left out: the live state's)


@pytest.mark.parametrize("answer", [{"version": None}, {"version": ""}, {"version": 5}, {}])
async def test_an_ollama_version_that_is_no_text_is_no_version(answer: dict[str, Any]) -> None:
    """Not the version "None": a version the sidecar would read rules from."""
    import httpx
    import respx

    from proxy.adapters.ollama import OllamaClient
    from proxy.ports import Timeouts

    router = respx.Router(base_url="http://ollama.test:11434")
    router.get("/api/version").mock(return_value=httpx.Response(200, json=answer))
    client = OllamaClient("http://ollama.test:11434", Timeouts(1, 1, 1),
                          httpx.MockTransport(router.async_handler))
    try:
        assert await client.version() is None
    finally:
        await client.close()


class _Upgraded(_Ps):
    """A card with 20 models on disk whose Ollama restarts at another version."""

    def __init__(self) -> None:
        super().__init__()
        self.running = "0.30.0"
        self.asked: list[str] = []
        self.in_flight = self.most_in_flight = 0

    async def version(self, timeout_s: float | None = None) -> str:
        return self.running

    async def tags(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        return [{"model": f"m{i}:latest", "size": 1 << 30, "digest": f"d{i}"}
                for i in range(20)]

    async def show(self, body: dict[str, Any], timeout_s: float | None = None) -> Any:
        import asyncio

        from proxy.ports import ShowAnswer

        self.asked.append(body["model"])
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        return ShowAnswer(200, b'{"model_info": {}}')


async def test_models_are_described_again_after_an_ollama_upgrade_a_few_at_a_time() -> None:
    settings = load_settings(providers=[{**PROVIDER, "totalVramMiB": 24576}])
    server = _Upgraded()
    prober = Prober(list(settings.providers), {"a": server}, None,  # type: ignore[dict-item]
                    gpu_memory=DcgmExporter(2.0))
    await prober.probe("a")
    await prober.probe("a")
    assert len(server.asked) == 20 and server.most_in_flight <= 8  # each once, 8 at a time
    server.running = "0.33.0"
    await prober.probe("a")
    assert len(server.asked) == 40  # the new version may describe them otherwise

