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


@pytest.mark.parametrize("path", ["/api/chat", "/kubemoot/v1/explain"])
def test_a_body_of_many_messages_does_not_stall_the_other_calls(
        sim_factory: Sims, sidecar_factory: Sidecars, path: str) -> None:
    """About 20 MB of 400,000 short messages (far beyond any context: a call is refused 413)
    takes the sidecar seconds to check; meanwhile no other request waits more than a fraction
    of that (on the event loop it waited for all of it)."""
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[2:3])
    url = sidecar_factory([gpu]).url
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)
    big = orjson.dumps({"model": "qwen3:8b", "stream": False, "messages": [
        {"role": "user", "content": f"m{i}"} for i in range(400_000)]})
    answer: list[httpx.Response] = []
    began = time.perf_counter()
    sender = threading.Thread(target=lambda: answer.append(
        httpx.post(f"{url}{path}", content=big, timeout=120)))
    sender.start()
    waits = []
    while sender.is_alive():
        asked = time.perf_counter()
        assert httpx.get(f"{url}/api/version", timeout=120).status_code == 200
        waits.append(time.perf_counter() - asked)
        time.sleep(0.01)
    took = time.perf_counter() - began
    if path == "/api/chat":
        assert answer[0].json()["reason"] == "prompt-too-large", answer[0].text
    else:
        assert answer[0].json()["decision"]["placement"] is None, answer[0].text
    assert len(waits) > 3, (took, waits)
    assert max(waits) < took / 3, (took, max(waits))
