"""One `ollama serve` over several GPUs: the per-GPU arithmetic, written from Ollama's Go
source (HEAD fb30760, v0.12.6) and llama.cpp's fit, not from the sidecar. Pure functions;
sim_sched.py applies them (docs/engine.md, "Several GPUs").

A copy's memory is its layered part (weights and KV cache, split by layer) and its compute
buffers, which every GPU it uses holds in full; each GPU it uses also holds the runner's
CUDA context (CUDA_CONTEXT_MIB, not in its buffers: the driver's figure, not /api/ps's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CUDA_CONTEXT_MIB = 457  # ml/device.go:359-364 MinimumMemory (v0.12.6 discover/gpu.go)
SPILL_MARGIN_MIB = 256  # what llama-server leaves free on a card it fills with a spill
LLAMA_FIT_TARGET_MIB = 1024  # llama.cpp common/common.h fit_params_target, per device


@dataclass(frozen=True)
class Parts:
    """Where one copy lives: MiB on each GPU of the server (0: not on it) and in CPU memory."""

    on_gpu: tuple[int, ...]
    cpu_mib: int = 0

    @property
    def vram_mib(self) -> int:
        return sum(self.on_gpu)

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(i for i, mib in enumerate(self.on_gpu) if mib > 0)


def gpu_sizes(total_mib: int, count: int) -> tuple[int, ...]:
    """Each GPU's memory: the server's total split evenly (the sidecar's provider `gpus`)."""
    count = max(count, 1)
    return (total_mib // count,) * count


def single_gpu_fit(predicted_mib: int, free: Sequence[int]) -> int | None:
    """HEAD's bestSingleGPUFit (server/sched.go:1060-1076, betterPlacementGPU :1078-1084):
    the GPU with the most free memory among those whose 80 % holds the estimate (integer
    arithmetic; the first on a tie), or None when no GPU alone does."""
    best: int | None = None
    for i, mib in enumerate(free):
        if predicted_mib > mib * 80 // 100:
            continue
        if best is None or mib > free[best]:
            best = i
    return best


def spread_admits(predicted_mib: int, free: Sequence[int]) -> bool:
    """HEAD's fit check beside loaded runners for a load over the whole GPU group
    (server/sched.go:544-551 on availableMemoryForLoad, :928-950): the estimate within 80 %
    of the GPUs' free memory summed."""
    return predicted_mib <= sum(free) * 80 // 100


def by_free(free: Sequence[int]) -> list[int]:
    """The GPUs by free memory, most first (v0.12.6 sort.Reverse(ByFreeMemory); a stable
    sort keeps the lower index first on a tie)."""
    return sorted(range(len(free)), key=lambda i: -free[i])


def lay_out(layered_mib: int, compute_mib: int, free: Sequence[int], use: Sequence[int],
            margin_mib: int = 0) -> Parts:
    """A copy's parts over the GPUs `use`, given what the driver says each GPU has free.
    Each GPU that takes layers holds the compute buffers too (llm/llama_server.go:2821-2851
    sums llama-server's buffers by device) and the runner's CUDA context; llama.cpp splits the
    layers in proportion to the GPUs' free memory (llama_model_load's default tensor split)
    and its fit moves layers off a GPU that would keep less than `margin_mib` free
    (fit_params_target), leaving out a GPU without room for its compute buffers. A copy
    that does not fit so fills each GPU to SPILL_MARGIN_MIB (or the margin) and puts the
    rest in CPU memory (a spill)."""
    parts = [0] * len(free)
    room = {i: free[i] - CUDA_CONTEXT_MIB - margin_mib - compute_mib for i in use}
    room = {i: mib for i, mib in room.items() if mib > 0}
    if room and sum(room.values()) >= layered_mib:
        for i, share in _proportional(layered_mib, room, {i: free[i] for i in room}).items():
            parts[i] = compute_mib + share
        return Parts(tuple(parts))
    keep = max(SPILL_MARGIN_MIB, margin_mib)
    filled = {i: free[i] - CUDA_CONTEXT_MIB - keep for i in use}
    filled = {i: mib for i, mib in filled.items() if mib > compute_mib}
    for i, mib in filled.items():
        parts[i] = mib
    need = layered_mib + compute_mib * len(filled)
    return Parts(tuple(parts), max(0, need - sum(parts)))


def _proportional(total: int, room: dict[int, int], weight: dict[int, int]) -> dict[int, int]:
    """`total` over the GPUs by `weight`, none over its `room` (what one caps goes to the
    rest, again by weight); sum(room) >= total."""
    shares = dict.fromkeys(room, 0)
    open_ = set(room)
    left = total
    while left > 0 and open_:
        weights = sum(max(weight[i], 1) for i in open_)
        given = 0
        for i in sorted(open_):
            want = left * max(weight[i], 1) // weights
            take = min(want, room[i] - shares[i])
            shares[i] += take
            given += take
        left -= given
        open_ = {i for i in open_ if shares[i] < room[i]}
        if given == 0:  # rounding: hand the rest out one MiB at a time
            for i in sorted(open_):
                if left == 0:
                    break
                shares[i] += 1
                left -= 1
    return shares


def fewest_gpus(layered_mib: int, compute_mib: int, free: Sequence[int], margin_mib: int = 0
                ) -> list[int] | None:
    """v0.12.6: the fewest GPUs, by free memory, that hold the whole copy (the llama engine's
    pickBestFullFitByLibrary, llm/memory.go:21-44; its own engine's assignLayers packs onto
    as few, llm/server.go:1003-1011); None when not even all of them do."""
    order = by_free(free)
    for n in range(1, len(order) + 1):
        use = order[:n]
        if not lay_out(layered_mib, compute_mib, free, use, margin_mib).cpu_mib:
            return use
    return None


def counted_by_ollama(parts: Parts, first_gpu_only_named: bool) -> tuple[int, ...]:
    """What updateFreeSpace counts of a copy on each GPU (server/sched.go:1295-1335 through
    VRAMByGPU, llm/llama_server.go:2857-2870): llama-server's buffers by the device name it
    logs. A copy alone on one GPU runs with only that GPU visible (ml/device.go:631-650), so
    llama-server logs it as the first device ("CUDA0") while Ollama looks it up under the
    GPU's own name: unless that GPU is the first, Ollama counts nothing of it there (Ollama
    issue 18349, from 0.30.0; `first_gpu_only_named`)."""
    gpus = parts.gpus
    if first_gpu_only_named and len(gpus) == 1 and gpus[0] != 0:
        return (0,) * len(parts.on_gpu)
    return parts.on_gpu
