"""A large body is read, checked and measured off the event loop, a piece at a time: the
sidecar on a simulated GPU keeps answering other calls while it works through one."""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest

from loadtest.sim_model import CATALOG
from tests.conftest import eventually
from tests.e2e.test_scheduling import Sidecars, Sims


def _while_sent(url: str, path: str, body: bytes) -> tuple[httpx.Response, float, list[float]]:
    """`body` sent to `path`; its answer, how long it took, and how long each /api/version
    asked meanwhile waited."""
    answer: list[httpx.Response] = []
    began = time.perf_counter()
    sender = threading.Thread(target=lambda: answer.append(
        httpx.post(f"{url}{path}", content=body, timeout=120)))
    sender.start()
    waits = []
    while sender.is_alive():
        asked = time.perf_counter()
        assert httpx.get(f"{url}/api/version", timeout=120).status_code == 200
        waits.append(time.perf_counter() - asked)
        time.sleep(0.01)
    return answer[0], time.perf_counter() - began, waits


@pytest.mark.parametrize("path", ["/api/chat", "/kubemoot/v1/explain"])
def test_a_body_of_many_messages_does_not_stall_the_other_calls(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str) -> None:
    """About 10 MB of 200,000 short messages (far beyond any context: a call is refused 413)
    takes the sidecar seconds to check; meanwhile no other request waits more than a fraction
    of that (on the event loop it waited for all of it)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[2:3])
    url = sidecar_factory([gpu]).url
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)
    big = orjson.dumps({"model": "qwen3:8b", "stream": False, "messages": [
        {"role": "user", "content": f"m{i}"} for i in range(200_000)]})
    answer, took, waits = _while_sent(url, path, big)
    if path == "/api/chat":
        assert answer.json()["reason"] == "prompt-too-large", answer.text
    else:
        assert answer.json()["decision"]["placement"] is None, answer.text
    assert len(waits) > 3, (took, waits)
    # A blocked loop holds a request for most of the check; half leaves room for a busy
    # machine's scheduling (a wait of a third of it was seen under three test workers).
    assert max(waits) < took / 2, (took, max(waits))


def test_a_large_format_ollama_cannot_use_does_not_stall_the_other_calls(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """A `format` of 10 MB that is no schema object: its refusal quotes it as Go's %q does
    (each of these characters escaped, a second and more of work), off the event loop."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[2:3])
    url = sidecar_factory([gpu]).url
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)
    body = orjson.dumps({"model": "qwen3:8b", "stream": False, "format": ["\u0085" * 5_000_000],
                         "messages": [{"role": "user", "content": "hi"}]})
    answer, took, waits = _while_sent(url, "/api/chat", body)
    assert answer.status_code == 400 and "invalid format" in answer.json()["error"]
    assert max(waits) < max(0.5, took / 3), (took, max(waits))
