"""A first copy without flash attention, end to end: the sidecar's figure before the load
against what the simulated Ollama then holds (its runner's VRAM; /api/ps reports Ollama's
estimate before 0.30, "The llama engine's estimate in the simulator"), where the copy's compute
holds a batch's attention scores (docs/engine.md, "Flash attention")."""

from __future__ import annotations

from typing import Any

import httpx
import ollama
import pytest

from loadtest.sim_engine import MIB
from loadtest.sim_model import CATALOG
from tests.conftest import eventually
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims

LLAMA = next(m for m in CATALOG if m.name == "llama3.2:3b")
CONTEXT = 32768


def _verdict(url: str) -> dict[str, Any]:
    verdicts = httpx.get(f"{url}/kubemoot/v1/explain",
                         params={"model": LLAMA.name, "numCtx": CONTEXT}).json()["verdicts"]
    return next(v for v in verdicts if v["provider"] == "gpu")


@pytest.mark.parametrize(("version", "setting"), [
    ("0.12.6", None),  # llama runs without it before 0.13.4 unless it is set
    ("0.33.0", False),  # OLLAMA_FLASH_ATTENTION=0
])
def test_a_first_copy_without_flash_attention_is_counted_with_its_scores(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, setting: bool | None
        ) -> None:
    gpu = sim_factory("gpu", total_vram_mib=24564, version=version, models=(LLAMA,),
                      flash_attention=setting, time_scale=SCALE)
    assert not gpu.config.flash_attention_for(LLAMA)
    sidecar = sidecar_factory([gpu], probe_interval_seconds=0.1)
    assert eventually(lambda: "without flash attention" in
                      str(_verdict(sidecar.url).get("footprintSource")), timeout_s=10)
    counted = _verdict(sidecar.url)["footprintTotalMiB"]
    ollama.Client(host=sidecar.url).generate(model=LLAMA.name, prompt="hi",
                                             options={"num_ctx": CONTEXT, "num_predict": 4})
    reported = httpx.get(f"{gpu.url}/api/ps").json()["models"][0]["size_vram"]
    held = gpu.sim.runners[LLAMA.name].vram_mib  # what the card holds
    # before 0.30 /api/ps reports Ollama's estimate of a llama-engine copy (7780 MiB at
    # 0.12.6: SimModel.llama_estimate), from 0.30 what it holds
    assert reported == (held * MIB if version == "0.33.0" else
                        LLAMA.llama_estimate(CONTEXT, 1, 512, "f16", version).reported_bytes)
    # llama3.2's 24 heads over 32768 tokens: 1624 MiB of scores, 600 over the compute the
    # copy holds with flash attention
    batch = gpu.sim.resolve(LLAMA, {"model": LLAMA.name,
                                    "options": {"num_ctx": CONTEXT}}).num_batch
    with_fa = LLAMA.footprint_mib(CONTEXT, 1, batch=batch, version=version)
    assert held == LLAMA.footprint_mib(CONTEXT, 1, batch=batch, version=version,
                                       flash_attention=False) > with_fa + 512
    assert held <= counted <= held + 300, (held, counted)
