"""What only the engine refuses reaches the caller as Ollama's own 400 through the sidecar,
and is no failure of the card: the sidecar does not check these itself, so without the
simulator refusing them as Ollama does (docs/engine.md, "What the simulator refuses") the
demo would answer them."""

from __future__ import annotations

import httpx
import ollama
import pytest

from loadtest.sim_model import CATALOG
from tests.e2e.test_scheduling import Sidecars, Sims

RAW_REFUSAL = "raw mode does not support template, system, or context"
EFFORT_REFUSAL = ('invalid reasoning value: "bogus" (must be "minimal", "low", "medium", '
                  '"high", "xhigh", "ultra", "max", or "none")')


def test_an_engine_400_is_the_callers_error_not_the_cards(sim_factory: Sims,
                                                            sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG[1:4])
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url)
    for _ in range(3):  # as many as open a failing card's circuit
        with pytest.raises(ollama.ResponseError) as caught:
            client.generate(model="llama3.2:3b", prompt="hi", raw=True, system="be brief")
        assert (caught.value.status_code, caught.value.error) == (400, RAW_REFUSAL)
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "llama3.2:3b", "reasoning_effort": "bogus",
            "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["message"] == EFFORT_REFUSAL
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    assert [p["circuit"] for p in state["providers"]] == ["closed"]
    assert 'kubemoot_upstream_errors_total{provider="gpu"}' not in httpx.get(
        f"{url}/metrics").text
    assert client.generate(model="llama3.2:3b", prompt="hi", raw=True).done


@pytest.mark.parametrize(("version", "model", "message"), [
    ("0.12.6", "llama3.2:3b", 'think value "high" is not supported for this model'),
    ("0.12.6", "qwen3:8b", 'think value "high" is not supported for this model'),
    ("0.24.0", "llama3.2:3b", '"llama3.2:3b" does not support thinking'),
    ("0.24.0", "qwen3:8b", None)])
def test_a_think_level_is_refused_in_the_cards_versions_words(
        version: str, model: str, message: str | None, sim_factory: Sims,
        sidecar_factory: Sidecars) -> None:
    """`think: "high"`: before 0.17.7 Ollama refuses a level on any model but gpt-oss's,
    in its own words (v0.12.6 server/routes.go:323-327); later only a model that cannot
    think refuses it, as any thinking (v0.24.0 :411-413)."""
    gpu = sim_factory("gpu", version=version, total_vram_mib=24564, models=CATALOG[2:4])
    client = ollama.Client(host=sidecar_factory([gpu]).url)
    client.list()  # the sidecar has heard the card: its version and the models'
    for _ in range(2):
        if message is None:
            assert client.generate(model=model, prompt="hi", think="high").done
            continue
        with pytest.raises(ollama.ResponseError) as caught:
            client.generate(model=model, prompt="hi", think="high")
        assert (caught.value.status_code, caught.value.error) == (400, message)


def test_a_think_level_skips_a_warm_copy_on_a_card_that_would_refuse_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """qwen3 warm on a 0.12.6 card, which refuses a think level on any model but gpt-oss's
    before loading anything: the call loads it on the 0.24.0 card, which takes it."""
    old = sim_factory("old", version="0.12.6", total_vram_mib=24564, models=CATALOG[2:4])
    new = sim_factory("new", version="0.24.0", total_vram_mib=24564, models=CATALOG[2:4])
    assert httpx.post(f"{old.url}/api/generate", json={"model": "qwen3:8b", "keep_alive": -1},
                      timeout=30).status_code == 200
    url = sidecar_factory([old, new]).url
    ollama.Client(host=url).list()  # both cards heard: their versions and models
    r = httpx.post(f"{url}/api/chat", timeout=30, json={
        "model": "qwen3:8b", "think": "high", "stream": False,
        "messages": [{"role": "user", "content": "hi"}]})
    assert (r.status_code, r.headers["x-kubemoot-provider"]) == (200, "new"), r.text
