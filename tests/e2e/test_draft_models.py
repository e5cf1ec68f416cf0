"""Models with a DRAFT model (speculative decoding, 0.30+), end to end: the sidecar, the
official ollama client, a simulated GPU that runs the draft as HEAD's llama-server does
(`--spec-draft-model`, llm/llama_server.go:807-823): the draft's weights, a KV cache of its
own for every slot's context (f16) and its compute buffers beside the model's.

qwen3:8b with a 0.6B draft at 16384 tokens holds 11520 MiB (8244 without the draft). Sized
as its file alone (/api/tags counts the draft's 500 MiB), it looked 8772: two of them fit
the 19360 MiB a 22000 MiB card leaves usable, and the second load spilled to the CPU.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import httpx
import ollama
import pytest

from loadtest.sim_model import CATALOG, SimModel
from tests.e2e.test_engine_fidelity import NOTHING, quiet
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims

QWEN3_8B = next(m for m in CATALOG if m.name == "qwen3:8b")
DRAFT = SimModel("qwen3-draft:0.6b", disk_mib=500, block_count=28, embedding_length=1024,
                 head_count=16, head_count_kv=8, key_length=128, value_length=128,
                 parameter_size="0.6B")
# two models with weights files of their own, each with the draft
SPEC_A = replace(QWEN3_8B, name="spec-a:latest", weights="", draft=DRAFT)
SPEC_B = replace(QWEN3_8B, name="spec-b:latest", weights="", draft=DRAFT)
REAL_MIB = 11520  # what the simulator's copy holds at 16384 x 1 (/api/ps)


def _verdict(url: str, model: str) -> dict[str, Any]:
    verdicts = httpx.get(f"{url}/kubemoot/v1/explain", timeout=10,
                         params={"model": model, "numCtx": 16384}).json()["verdicts"]
    return dict(verdicts[0])


def test_a_model_with_a_draft_is_sized_with_it_and_two_loads_never_overcommit(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=22000, context_length=16384,
                      models=(SPEC_A, SPEC_B), time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    # before any copy is seen: the file less its token table on the CPU and with its
    # logits (5700 - 333 + 305) + KV 2304 + compute 768, and the draft's cache taken at the
    # model's own 144 KiB a token (2304) + compute 768 + 256
    first = _verdict(url, "spec-a")
    assert (first["footprintDraftMiB"], first["footprintTotalMiB"]) == (3328, 12072)
    assert first["footprintTotalMiB"] >= REAL_MIB

    answers: list[str] = []

    def call(model: str) -> None:
        client = ollama.Client(host=url, timeout=60)
        answer = client.chat(model=model, messages=[{"role": "user", "content": "hi"}])
        answers.append(answer.message.content or "")

    calls = [threading.Thread(target=call, args=(m,)) for m in ("spec-a", "spec-b")]
    for thread in calls:
        thread.start()
    for thread in calls:
        thread.join(60)
    assert len(answers) == 2 and all(answers)
    # one at a time: the second load waited for the first call and replaced its copy
    ps = httpx.get(f"{gpu.url}/api/ps").json()["models"]
    assert [m["size"] >> 20 for m in ps] == [REAL_MIB]
    assert gpu.sim.stats.peak_vram_mib <= 22000
    assert (gpu.sim.stats.oom_events, quiet(gpu)) == (0, NOTHING)


@pytest.mark.parametrize("version", ["0.12.6"])
def test_before_0_30_a_draft_adds_nothing(sim_factory: Sims, sidecar_factory: Sidecars,
                                          version: str) -> None:
    """0.12 knows no DRAFT layer: its copy is the model alone, and /api/show names none; nor
    an automatic batch, whose compute (768 MiB at 16384 tokens) is 0.30's."""
    gpu = sim_factory("gpu", total_vram_mib=22000, context_length=16384, version=version,
                      models=(SPEC_A,), time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    verdict = _verdict(url, "spec-a")
    assert "footprintDraftMiB" not in verdict
    assert verdict["footprintTotalMiB"] == 5700 - 333 + 305 + 2304


def test_a_model_of_the_same_file_with_another_draft_joins_the_copy(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """needsReload compares draft_num_predict, not the DRAFT file (server/sched.go:
    1422-1424): a call for a model made FROM spec-a with a draft of its own runs on spec-a's
    copy, so the sidecar sends it there rather than unloading that copy and loading it
    again."""
    other = replace(SPEC_A, name="spec-a-other:latest",
                    draft=replace(DRAFT, name="other-draft:0.6b", weights=""))
    gpu = sim_factory("gpu", total_vram_mib=22000, context_length=16384,
                      models=(SPEC_A, other), time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    client = ollama.Client(host=url, timeout=60)
    for model in ("spec-a", "spec-a-other"):
        answer = client.chat(model=model, messages=[{"role": "user", "content": "hi"}])
        assert answer.message.content
    stats = gpu.sim.stats
    assert (stats.loads, stats.unloads, quiet(gpu)) == (1, 0, NOTHING)


# qwen3.5's MTP head: one layer inside the model's own file, run as its draft when the
# Modelfile sets draft_num_predict (llm/llama_server.go:837-842, 901-907)
MTP_HEAD = SimModel("mtp-head", disk_mib=0, block_count=1, embedding_length=4096,
                    head_count=32, head_count_kv=8, key_length=128, value_length=128,
                    parameter_size="0.1B")
MTP_ON = replace(QWEN3_8B, name="mtp-on:latest", weights="", mtp=MTP_HEAD,
                 parameters=(("draft_num_predict", 3),))


def test_a_model_with_an_mtp_head_is_sized_with_its_draft(
        sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    """The sidecar reads <arch>.nextn_predict_layers from /api/show: before any copy is seen
    the head is sized as a DRAFT (2304 + 768 + 256, more than its real 64 + 1073), never
    under the 9381 MiB the copy holds; without it the copy was sized 5200 - 333 + 305 +
    2304 + 768 = 8244."""
    gpu = sim_factory("gpu", total_vram_mib=22000, context_length=16384,
                      models=(MTP_ON,), time_scale=SCALE)
    url = sidecar_factory([gpu]).url
    verdict = _verdict(url, "mtp-on")
    assert (verdict["footprintDraftMiB"], verdict["footprintTotalMiB"]) == (3328, 11572)
    client = ollama.Client(host=url, timeout=60)
    assert client.chat(model="mtp-on", messages=[{"role": "user", "content": "hi"}]).message
    ps = httpx.get(f"{gpu.url}/api/ps").json()["models"]
    assert [m["size"] >> 20 for m in ps] == [9381]
    assert (gpu.sim.stats.oom_events, quiet(gpu)) == (0, NOTHING)
