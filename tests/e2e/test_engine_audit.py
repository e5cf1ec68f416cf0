"""Rules of Ollama's that the simulator follows and the sidecar once did not (an audit of
Ollama's source at HEAD fb30760 and v0.12.6). A departure found so goes in as a strict
xfail until the sidecar follows it."""

from __future__ import annotations

from dataclasses import replace

import httpx

from loadtest.sim_model import CATALOG
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims, chat
from tests.e2e.test_weights_siblings import openai_chat
from tests.integration.test_engine_audit import QWEN3_16K


def test_a_model_created_from_a_loaded_one_is_planned_as_a_reload_of_its_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """`ollama create qwen3-16k` FROM qwen3:8b with `PARAMETER num_ctx 16384` shares the 8b's
    model blob, and Ollama's scheduler finds runners by that blob (schedulerModelKey, HEAD
    server/sched.go:111-128, 198-200, 246-248; v0.12.6 s.loaded[ModelPath], :107, 151): the
    call finds the 8b's runner, needsReload sees another num_ctx, and the one copy is
    reloaded at 16384. Planned as a cold load beside the 8b, the sidecar counts memory for
    two copies, then takes the next qwen3:8b call for a warm join that reloads it again.
    /api/show's modelfile names the blob (FROM .../blobs/sha256-...), which is how a
    sidecar could tell. (The call comes over the OpenAI API, which cannot carry the copy's
    num_ctx: over Ollama's own it would join the copy at 4096.)"""
    gpu = sim_factory("gpu", total_vram_mib=16376, models=(*CATALOG, QWEN3_16K),
                      time_scale=SCALE)  # default context: 4096
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    url = sidecar_factory([gpu]).url
    r = openai_chat(url, "qwen3-16k")
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == "evict", dict(r.headers)
    assert r.headers["x-kubemoot-evicted"] == "qwen3:8b"


def test_a_call_for_another_name_of_a_loaded_model_joins_its_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """`qwen3` (qwen3:latest) and qwen3:8b are one manifest on ollama.com (`ollama cp` makes
    such aliases too): /api/tags lists both with one digest, and Ollama's scheduler finds
    the loaded runner by the model blob (HEAD server/sched.go:111-128, 198-202; v0.12.6
    :107-110) and joins it when the load options match. Planned as a cold load, the call
    costs a load it never takes and, on a full card, an eviction of some other model."""
    alias = replace(next(m for m in CATALOG if m.name == "qwen3:8b"), name="qwen3:latest")
    gpu = sim_factory("gpu", total_vram_mib=16376, models=(*CATALOG, alias), time_scale=SCALE)
    httpx.post(f"{gpu.url}/api/generate", json={"model": "qwen3:8b"}, timeout=30)
    url = sidecar_factory([gpu]).url
    r = chat(url, "qwen3")
    assert r.status_code == 200, r.text
    assert r.headers["x-kubemoot-placement"] == "warm", dict(r.headers)
