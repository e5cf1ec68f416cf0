"""`POST /kubemoot/v1/explain` with a call's own body weighs it as the call is weighed: the
sidecar on a simulated GPU, the call sent after the dry run."""

from __future__ import annotations

import httpx

from loadtest.sim_model import CATALOG
from tests.conftest import eventually
from tests.e2e.test_scheduling import Sidecars, Sims


def test_explain_reads_the_calls_num_ctx_as_the_call_does(sim_factory: Sims,
                                                          sidecar_factory: Sidecars) -> None:
    """A prompt of about 8000 tokens with `num_ctx` 4096 gets a copy of 4096 tokens, which
    cannot hold it: the call is refused 413, and explain says so rather than planning a copy
    at the card's 16384."""
    gpu = sim_factory("gpu", total_vram_mib=24564, context_length=16384, models=CATALOG[2:3])
    url = sidecar_factory([gpu]).url
    assert eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)
    body = {"model": "qwen3:8b", "stream": False, "options": {"num_ctx": 4096},
            "messages": [{"role": "user", "content": "word " * 6000}]}
    dry = httpx.post(f"{url}/kubemoot/v1/explain", json=body, timeout=30).json()
    call = httpx.post(f"{url}/api/chat", json=body, timeout=30)
    assert call.json()["reason"] == "prompt-too-large", call.text
    assert dry["decision"]["placement"] is None, dry["decision"]
    assert "4096" in dry["verdicts"][0]["reason"], dry["verdicts"]
    roomy = httpx.post(f"{url}/kubemoot/v1/explain", timeout=30, json={
        **body, "options": {"num_ctx": 12288}}).json()
    assert roomy["decision"]["placement"]["numCtx"] == 12288, roomy["decision"]
    bad = httpx.post(f"{url}/kubemoot/v1/explain", json={**body, "options": {"num_ctx": "x"}})
    assert (bad.status_code, bad.json()["error"]) == (
        400, 'option "num_ctx" must be of type integer')
