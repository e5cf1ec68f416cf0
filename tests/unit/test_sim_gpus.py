"""The simulator's per-GPU arithmetic for one `ollama serve` over several GPUs (sim_gpus.py),
each rule against the Ollama source line it is written from (docs/engine.md, "Several GPUs")."""

from __future__ import annotations

from loadtest.sim_gpus import (
    CUDA_CONTEXT_MIB,
    SPILL_MARGIN_MIB,
    Parts,
    counted_by_ollama,
    fewest_gpus,
    gpu_sizes,
    lay_out,
    single_gpu_fit,
    spread_admits,
)


def test_a_load_goes_to_the_single_gpu_with_the_most_free_memory_within_80_percent() -> None:
    """bestSingleGPUFit, server/sched.go:1060-1076 (strict > on the 80 %), betterPlacementGPU
    :1078-1084 (the most available; the first on a tie)."""
    assert single_gpu_fit(9000, [12000, 20000]) == 1
    assert single_gpu_fit(9600, [12000, 11000]) == 0  # 9600 <= 12000 * 80 // 100
    assert single_gpu_fit(9601, [12000, 11000]) is None
    assert single_gpu_fit(1000, [24564, 24564]) == 0


def test_a_spread_load_is_admitted_on_the_gpus_free_memory_summed() -> None:
    """server/sched.go:544-551 on availableMemoryForLoad (:928-950): 80 % of the sum."""
    assert spread_admits(16000, [10000, 10000])
    assert not spread_admits(16001, [10000, 10000])


def test_each_gpu_a_copy_uses_holds_its_compute_buffers_and_the_layers_split_by_free() -> None:
    """Compute buffers on every GPU used (llm/llama_server.go:2821-2851 sums them by device),
    the CUDA context beside them (ml/device.go:359-364), layers in proportion to free memory
    (llama.cpp's default tensor split)."""
    parts = lay_out(20000, 1000, [24000, 12000], [0, 1])
    assert parts.cpu_mib == 0 and parts.gpus == (0, 1)
    assert parts.vram_mib == 20000 + 2 * 1000
    assert abs((parts.on_gpu[0] - 1000) - 2 * (parts.on_gpu[1] - 1000)) <= 2


def test_llamas_fit_keeps_its_margin_on_each_gpu_or_the_copy_spills() -> None:
    """The fit target (llama.cpp fit_params_target) is kept on every GPU used: one layer
    split that holds it is found when the rooms add up; else the GPUs are filled and the
    rest goes to the CPU."""
    free = [12288, 12288]
    room = 12288 - CUDA_CONTEXT_MIB - 1024 - 500
    fits = lay_out(2 * room, 500, free, [0, 1], margin_mib=1024)
    assert fits.cpu_mib == 0 and fits.on_gpu == (500 + room, 500 + room)
    spills = lay_out(2 * room + 1, 500, free, [0, 1], margin_mib=1024)
    assert spills.on_gpu == (12288 - CUDA_CONTEXT_MIB - 1024,) * 2
    assert spills.cpu_mib == 2 * room + 1 + 2 * 500 - spills.vram_mib
    lopsided = lay_out(10000, 500, [12288, 4000], [0, 1], margin_mib=1024)
    assert lopsided.cpu_mib == 0 and lopsided.on_gpu[1] == 4000 - CUDA_CONTEXT_MIB - 1024


def test_a_gpu_without_room_for_its_compute_buffers_takes_no_layers() -> None:
    """llama.cpp's fit leaves out a GPU that cannot hold the compute buffers with its margin:
    the copy goes over the others, each with its own buffers, nothing on the full one."""
    parts = lay_out(16205, 2304, [3459, 11831, 11831, 11831], [0, 1, 2, 3], margin_mib=1024)
    assert parts.cpu_mib == 0 and parts.gpus == (1, 2, 3)
    assert parts.vram_mib == 16205 + 3 * 2304


def test_one_gpu_keeps_the_simulators_single_card_rule() -> None:
    """A copy that fits in the free memory less the CUDA context is whole; one that does
    not leaves SPILL_MARGIN_MIB free (what sim_sched applied before it had several GPUs)."""
    assert lay_out(9000, 500, [10000], [0]) == Parts((9500,))
    assert lay_out(9200, 500, [10000], [0]) == Parts(
        (10000 - CUDA_CONTEXT_MIB - SPILL_MARGIN_MIB,),
        9700 - (10000 - CUDA_CONTEXT_MIB - SPILL_MARGIN_MIB))


def test_0_12_packs_a_copy_onto_the_fewest_gpus_by_free_memory() -> None:
    """v0.12.6 llm/memory.go:21-44 (1, 2, ... GPUs, most free first), llm/server.go:1003-1011."""
    assert fewest_gpus(8000, 500, [10000, 12000, 12000]) == [1]
    assert fewest_gpus(15000, 500, [10000, 12000, 12000]) == [1, 2]
    assert fewest_gpus(40000, 500, [10000, 12000, 12000]) is None


def test_ollama_counts_nothing_of_a_copy_alone_on_a_gpu_but_the_first() -> None:
    """Ollama issue 18349: the runner sees its one GPU as CUDA0 (ml/device.go:631-650) while
    Ollama looks it up under the GPU's own name (llm/llama_server.go:2610, 2622, 2866)."""
    alone_on_second = Parts((0, 9000))
    assert counted_by_ollama(alone_on_second, True) == (0, 0)
    assert counted_by_ollama(alone_on_second, False) == (0, 9000)
    assert counted_by_ollama(Parts((9000, 0)), True) == (9000, 0)
    assert counted_by_ollama(Parts((5000, 5000)), True) == (5000, 5000)
    assert gpu_sizes(49152, 4) == (12288,) * 4
