"""Names of one model (one manifest digest: `ollama cp`, or `qwen3` and `qwen3:8b` as
ollama.com tags them): Ollama runs them on one copy, so the sidecar places them as one
model and sends each card a name it has (docs/rules.md, "Names of one model")."""

from __future__ import annotations

import threading
from dataclasses import replace

import httpx

from loadtest.sim_model import CATALOG
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims, chat, stream_in_background

QWEN3_8B = next(m for m in CATALOG if m.name == "qwen3:8b")
QWEN3_LATEST = replace(QWEN3_8B, name="qwen3:latest")  # the same manifest, another name
WITHOUT_8B = tuple(m for m in CATALOG if m.name != "qwen3:8b")


def listed(url: str) -> list[str]:
    return sorted(m["name"] for m in httpx.get(f"{url}/api/ps", timeout=5).json()["models"])


def test_a_card_with_the_model_under_another_name_serves_it(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    small = sim_factory("small", total_vram_mib=4096, time_scale=SCALE)
    big = sim_factory("big", total_vram_mib=24564, models=(*WITHOUT_8B, QWEN3_LATEST),
                      time_scale=SCALE)
    url = sidecar_factory([small, big]).url
    r = chat(url, "qwen3:8b")  # too large for the card that has it under this name
    assert r.status_code == 200, r.text
    assert (r.headers["x-kubemoot-provider"], r.headers["x-kubemoot-placement"]) == (
        "big", "cold")
    assert listed(big.url) == ["qwen3:latest"]  # sent under the name that card has


def test_ollama_stop_under_another_name_unloads_the_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, models=(*CATALOG, QWEN3_LATEST),
                      time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    assert chat(url, "qwen3:8b").status_code == 200
    stop = httpx.post(f"{url}/api/generate", json={"model": "qwen3", "keep_alive": 0},
                      timeout=30)
    assert stop.status_code == 200, stop.text
    assert stop.json()["model"] == "qwen3"  # answered under the name asked, as Ollama does
    for _ in range(100):
        if not listed(gpu.url):
            break
        httpx.get(f"{gpu.url}/api/version", timeout=5)  # (a moment for the unload)
    assert listed(gpu.url) == []


def test_a_victim_listed_under_another_name_is_waited_for_until_it_is_gone(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, models=(*CATALOG, QWEN3_LATEST),
                      time_scale=0.1)
    # loaded under the alias, then busy with a call the sidecar never sees (sent to Ollama
    # directly): asked to unload, Ollama keeps it, listed as `qwen3:latest`, until it ends
    started = threading.Event()
    outside = stream_in_background(gpu.url, "qwen3", 1500, started)  # about 3 s
    assert listed(gpu.url) == ["qwen3:latest"]
    url = sidecar_factory([gpu]).url  # (its first probe sees the copy)
    r = chat(url, "qwen3:14b")  # the 8b copy must go first
    assert r.status_code == 200, r.text
    assert r.headers.get("x-kubemoot-evicted") == "qwen3:8b", dict(r.headers)
    outside.join(30)
    # the 14b was sent once the copy was gone, not beside it: Ollama unloaded nothing itself
    assert gpu.sim.stats.self_evictions == 0


def test_a_name_that_is_another_manifest_on_another_card_is_no_alias_there(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """`ollama cp` on one card makes `mine` a name of that card's qwen3:8b; another card's
    qwen3:8b is another manifest (pulled at another time; two Ollama versions write two
    manifests for one GGUF, as a real 0.12.6 and 0.24.0 do). A call for `mine` is not sent
    to the other card as its qwen3:8b, warm there or not: only the card that has `mine` runs
    it, and answers under that name."""
    other = replace(QWEN3_8B, system="You are helpful.")  # its own manifest digest
    assert other.digest != QWEN3_8B.digest
    first = sim_factory("first", total_vram_mib=24564, time_scale=SCALE)
    second = sim_factory("second", total_vram_mib=24564, time_scale=SCALE,
                         models=(*WITHOUT_8B, other, replace(other, name="mine")))
    assert chat(first.url, "qwen3:8b").status_code == 200  # warm on the first card
    url = sidecar_factory([first, second]).url
    r = chat(url, "mine")
    assert r.status_code == 200, r.text
    assert (r.headers["x-kubemoot-provider"], r.json()["model"]) == ("second", "mine")
    assert listed(second.url) == ["mine"]
