"""Before 0.30 Ollama loads a model beside others only when the free memory (the driver's, or
the total less what the loaded runners report, the smaller) holds what its fit check asks:
the sidecar's figure for that check against the simulator's, which follows Ollama's source
(loadtest/sim_model.py LlamaEstimate), and the rule applied to a card's residents."""

from __future__ import annotations

import pytest

from loadtest.sim_engine import own_engine
from loadtest.sim_model import CATALOG, MIB, SimConfig, SimModel
from loadtest.sim_sched import OllamaSim
from proxy.core import fit_before_030
from proxy.core.context import parse_version
from proxy.core.engines import own_engine as own_engine_from
from proxy.core.occupancy import Load, ollama_refuses
from proxy.core.sizing import Sizer, compute_mib, first_load_compute_mib
from proxy.core.types import ModelInfo, Placement, ProviderView
from proxy.service.claims import left_loaded
from proxy.service.prober import model_info


def llama_engine(version: str) -> list[SimModel]:
    """The catalog's models the version runs on the llama engine (sim_engine.own_engine)."""
    return [m for m in CATALOG if not own_engine(m.arch, m.embedding, False, version)]


@pytest.mark.parametrize("version", ["0.12.6", "0.12.11", "0.24.0"])
@pytest.mark.parametrize("slots", [1, 2])
@pytest.mark.parametrize("flash_attention", [None, False])
def test_what_the_sidecar_counts_ollama_to_ask_is_never_less_than_it_asks(
        version: str, slots: int, flash_attention: bool | None) -> None:
    """Every llama-engine model of the catalog at four contexts, first copy and a copy seen
    at /api/ps's size: at least Ollama's requirement, over it by at most 300 MiB (an
    encoder sized from its file, which the sidecar cannot see holds no cache)."""
    config = SimConfig(models=CATALOG, version=version, num_parallel=slots,
                       flash_attention=flash_attention)
    sim = OllamaSim(config)
    # nomic-bert is required from 0.13.1 (v0.13.1 fs/ggml/ggml.go:254)
    embedder = {"nomic-embed-text:latest"} if version != "0.24.0" else set()
    assert {m.name for m in llama_engine(version)} == {"llama3.2:3b", "phi3:mini"} | embedder
    for model in llama_engine(version):
        info = model_info(sim.show(model, verbose=True))
        assert not own_engine_from(info, parse_version(version)), (model.name, version)
        for context in (2048, 4096, 8192, 32768):
            ctx = min(context, model.trained_ctx)
            held_slots = model.slots(slots, version)
            asked = model.llama_estimate(ctx, held_slots, 512, config.cache_type_for(model),
                                         version)
            for observed in ({}, {model.name: {context: asked.reported_bytes // MIB}}):
                card = ProviderView("gpu", 98304, context_length=context, max_parallel=slots,
                                    version=version, flash_attention=flash_attention,
                                    models={model.name: info},
                                    disk_mib={model.name: model.disk_mib}, observed=observed)
                counted = Sizer((card,), 1.2).footprint(model.name, card, context)
                assert counted is not None
                over = counted.estimate_mib - asked.required_bytes / MIB
                assert 0 <= over <= 300, (model.name, context, observed, counted, over)


def test_a_copy_on_ollamas_own_engine_asks_its_memory_and_the_minimum() -> None:
    card = ProviderView("gpu", 24564, version="0.24.0")
    qwen3 = ModelInfo(architecture="qwen3", kv_bytes_per_token=147456)
    assert fit_before_030.required_free_mib(qwen3, card, 6000, 5000, 576, 300, 4096, 1,
                                            seen=False) == 6000 + 457


def test_without_flash_attention_in_its_sums_a_first_copy_asks_ollamas_full_graph() -> None:
    """llama3.2:3b at 32768 on 0.24 with flash attention (llama.cpp's `auto`): it holds about
    260 MiB of compute, but Ollama's estimate counts 4 x 512 x (1 + 4E + c(1 + H)) B, 1.6 GiB,
    and reports that in /api/ps; the buffer layer and the partial graph's excess on top. A
    load's copy counts at that report until a probe lists it."""
    model = next(m for m in CATALOG if m.name == "llama3.2:3b")
    info = model_info(OllamaSim(SimConfig(models=CATALOG, version="0.24.0")).show(model))
    card = ProviderView("gpu", 98304, context_length=32768, version="0.24.0",
                        models={model.name: info}, disk_mib={model.name: model.disk_mib})
    counted = Sizer((card,), 1.2).footprint(model.name, card, 32768)
    assert counted is not None and compute_mib(info, card, 32768, 1) == 0
    full, partial = fit_before_030.graph_bytes(info, 32768, 1)
    assert partial > full  # the partial graph has the output matrix too
    assert full == 4 * 512 * (1 + 4 * 3072 + 32768 * 25)
    assert counted.estimate_mib - counted.total_mib > full // MIB - 300 + 457
    # until a probe lists it, the copy counts at what Ollama will list it at, not its 5767
    listed = model.llama_estimate(32768, 1, 512, "f16", "0.24.0").reported_bytes / MIB
    assert counted.total_mib < listed <= fit_before_030.taken_mib(counted.total_mib,
                                                                  counted.estimate_mib)
    placed = Placement("gpu", model.name, "cold", 4, counted.total_mib, listed_mib=7200)
    residency = left_loaded(placed, 0.0)
    assert residency is not None and residency.mib == 7200


@pytest.mark.parametrize(("version", "taken", "fits"), [
    ("0.24.0", 16000 - 4000, True), ("0.24.0", 16000 - 3999, False),
    ("0.12.6", 16000 - 4000, False), ("0.12.6", 16000 - 4001, True),  # strictly more
])
def test_the_check_is_at_least_as_much_free_from_0_12_11_and_strictly_more_before(
        version: str, taken: int, fits: bool) -> None:
    card = ProviderView("gpu", 16000, version=version)
    assert fit_before_030.fits(4000, 16000, taken, card) is fits


def test_each_copy_on_the_card_takes_its_cuda_context_and_a_load_in_flight_its_report() -> None:
    """Three copies of ~3 GiB beside a fourth on a 13650 MiB card: the memory holds them
    (12324 MiB with four CUDA contexts) but not Ollama's check, which asks 3945 MiB free for
    the fourth where 3936 are (the simulator's llama-3 of tests/e2e/test_engine_fidelity)."""
    card = ProviderView("gpu", 13650, version="0.24.0")
    residents = {"a": 2631, "b": 2781, "c": 2931}
    assert ollama_refuses(card, residents, [Load("d", 3081, 3945)], {}) is not None
    assert ollama_refuses(card, residents, [Load("d", 3081, 3945, evicts={"a"})], {}) is None
    # a load in flight counts what Ollama's estimate will report of it, when that is larger
    flight = Load("c", 2000, 2931 + 457 + 100)
    assert ollama_refuses(card, {"a": 2631, "b": 2781}, [flight, Load("d", 3081, 3945)],
                          {}) is not None
    # from 0.30 the 80 % rule stands instead; over several GPUs the layout's own check
    assert not fit_before_030.applies(ProviderView("gpu", 13650, version="0.30.0"))
    assert not fit_before_030.applies(ProviderView("gpu", 13650, version="0.24.0", gpus=2))


@pytest.mark.parametrize("version", ["0.12.11", "0.24.0"])
@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
def test_a_listed_copy_counts_at_least_what_it_holds_in_ollamas_check(version: str,
                                                                      cache: str) -> None:
    """Ollama's estimate, which /api/ps lists a llama-engine copy at, can be less than the
    copy holds: a quantized cache at 1 or 0.5 byte an element where llama.cpp holds 34/32 or
    18/32, and phi3's graph (KV x gqa / 6, 64 MiB at 4096 with q4_0) where it holds 256 MiB
    of compute. Its listing and what the sidecar adds to it are never less than it holds."""
    config = SimConfig(models=CATALOG, version=version, flash_attention=True,
                       kv_cache_type=cache)
    sim = OllamaSim(config)
    for model in (m for m in CATALOG if m.name in ("llama3.2:3b", "phi3:mini")):
        info = model_info(sim.show(model, verbose=True))
        card = ProviderView("gpu", 98304, version=version, flash_attention=True,
                            kv_cache_type=cache, models={model.name: info})
        for context in (2048, 4096, 8192, 32768):
            ctx = min(context, model.trained_ctx)
            listed = model.llama_estimate(ctx, 1, 512, config.cache_type_for(model),
                                          version).reported_bytes // MIB
            held = model.footprint_mib(ctx, 1, config.cache_type_for(model), 512, version,
                                       flash_attention=True)
            compute = first_load_compute_mib(info) + compute_mib(info, card, ctx, 1)
            short = fit_before_030.listed_short_mib(info, card, ctx, 1, compute)
            assert held <= listed + short <= max(listed, held) + 2, (model.name, ctx, listed,
                                                                    short, held)
