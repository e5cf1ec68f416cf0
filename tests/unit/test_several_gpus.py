"""A provider of several GPUs (`gpus`) planned as Ollama spreads copies over them
(proxy/core/gpus.py; docs/engine.md, "Several GPUs")."""

from __future__ import annotations

from dataclasses import replace

from proxy.core.gpus import (
    FIT_MARGIN_MIB,
    RUNNER_OVERHEAD_MIB,
    spread_fits,
    spread_graph_mib,
)
from proxy.core.occupancy import ticket_budget_ok
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.sizing import (
    COMPUTE_FLOOR_MIB,
    Footprint,
    Sizer,
    compute_mib,
    first_load_compute_mib,
)
from proxy.core.types import ModelInfo, ProviderView, Resident, Ticket
from tests.unit.builders import NOW

FOUR_SMALL = 4 * 12288


def test_a_spread_copy_holds_its_compute_buffers_on_each_gpu() -> None:
    """llm/llama_server.go:2821-2851: the buffers summed by device, compute on each."""
    assert spread_graph_mib(2048, 4) == 3 * 2048
    assert spread_graph_mib(768, 2) == 768
    assert spread_graph_mib(2048, 1) == 0


# Qwen3 8B's shape: its logits for a batch of 512 (151936 tokens) take 305 MiB
QWEN3_8B = ModelInfo(trained_context=40960, kv_bytes_per_token=36 * 8 * 256 * 2,
                     estimate_kv_bytes_per_token=36 * 8 * 256 * 2, architecture="qwen3",
                     family="qwen3", logits_bytes=4 * 512 * (4096 + 151936),
                     attention_heads=32, embedding_length=4096)


def _on_one_and_two_gpus(model: str, info: ModelInfo, disk_mib: int, context: int
                         ) -> tuple[ProviderView, ProviderView, Footprint, Footprint]:
    """A provider of one GPU and the same over two (0.33), and the model's footprint on
    each."""
    one = ProviderView("a", 34800, version="0.33.0", disk_mib={model: disk_mib},
                       models={model: info})
    two = replace(one, gpus=2)
    alone = Sizer((one,), 1.2).footprint(model, one, context)
    spread = Sizer((two,), 1.2).footprint(model, two, context)
    assert alone is not None and spread is not None
    return one, two, alone, spread


def test_the_compute_buffers_again_on_each_gpu_are_at_least_the_logits() -> None:
    """qwen3:8b at 16384 over 2 GPUs at 0.33: the compute on the second GPU is the batch's
    logits (305 MiB, above the 256 MiB floor) and the batch tier's surcharge, as on the
    first. Planned with the floor instead, the copy came out 49 MiB short and llama.cpp
    spilled it (one-card sweep seed 1964: 2 x 17400 MiB, 9268 MiB planned of 9285 free)."""
    _, two, alone, spread = _on_one_and_two_gpus("qwen3:8b", QWEN3_8B, 5000, 16384)
    assert first_load_compute_mib(QWEN3_8B) == 305 > COMPUTE_FLOOR_MIB
    compute = 305 + compute_mib(QWEN3_8B, two, 16384, 1)
    assert spread.total_mib == alone.total_mib + compute
    assert "spread over 2 GPUs" in spread.source


def test_every_copy_pays_a_context_on_every_gpu_and_each_gpu_the_fit_margin() -> None:
    held = [20020, 14397]
    room = FOUR_SMALL - sum(held) - 3 * 4 * RUNNER_OVERHEAD_MIB - 4 * FIT_MARGIN_MIB
    assert spread_fits(room, FOUR_SMALL, 4, held, FIT_MARGIN_MIB)
    assert not spread_fits(room + 1, FOUR_SMALL, 4, held, FIT_MARGIN_MIB)


def _load(model: str, footprint: int, estimate: int) -> Ticket:
    return Ticket("t-new", "a", model, footprint, NOW, NOW + 60, cold=True,
                  estimate_mib=estimate)


def test_a_load_within_the_usable_memory_is_refused_when_its_gpus_do_not_hold_it() -> None:
    """4 x 12 GiB at 0.33 with two copies spread (20020 and 14397 MiB, as /api/ps lists
    them): a load of 5500 MiB (spread already) fits the provider's usable 40960 MiB beside
    them (39917), but three copies' CUDA contexts on four GPUs (5484 MiB) and llama.cpp's
    margin on each (4096) bring it to 49497 MiB of 49152: llama.cpp would spill it."""
    view = ProviderView("a", FOUR_SMALL, gpus=4, version="0.33.0",
                        residents=(Resident("qwen3:8b", 20020, 40960),
                                   Resident("qwen3:14b", 14397, 8192)))
    load = _load("llama3.2:3b", 5500, 3100)
    ok, why = ticket_budget_ok([], load, view, DEFAULT_POLICY)
    assert not ok and "spread over the 4 GPUs" in why
    assert ticket_budget_ok([], _load("llama3.2:3b", 5100, 3100), view, DEFAULT_POLICY)[0]
    # before 0.30 no fit margin is kept (no llama-server): 45401 MiB
    assert ticket_budget_ok([], load, replace(view, version="0.12.6"), DEFAULT_POLICY)[0]


def test_an_encoder_spread_holds_the_compute_buffers_on_each_gpu_as_any_copy() -> None:
    """No architecture to size its graph by (nomic-bert keeps no cache): its figure, from
    its file or declared, takes the compute base again on each GPU but the first; one seen on
    this provider is its listing, spread already."""
    nomic = ModelInfo(trained_context=2048, architecture="nomic-bert", embedding=True)
    one, two, alone, spread = _on_one_and_two_gpus("nomic-embed-text", nomic, 262, 2048)
    assert spread.total_mib == alone.total_mib + COMPUTE_FLOOR_MIB
    declared = Sizer((two,), 1.2).footprint("nomic-embed-text", two, 2048, declared=600)
    assert declared is not None and declared.total_mib == 600 + COMPUTE_FLOOR_MIB
    seen = replace(two, observed={"nomic-embed-text": {2048: 700}})
    listed = Sizer((seen,), 1.2).footprint("nomic-embed-text", seen, 2048)
    assert listed is not None and listed.total_mib == 700
    elsewhere = Sizer((replace(one, name="b", observed=seen.observed), two), 1.2)
    assert (fp := elsewhere.footprint("nomic-embed-text", two, 2048)) is not None
    assert fp.total_mib == 700 + COMPUTE_FLOOR_MIB
