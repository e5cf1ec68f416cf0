"""One Ollama over several GPUs (a provider's `gpus`): what a copy takes there beyond its
one-card footprint (docs/engine.md, "Several GPUs").

Ollama spreads a copy over every GPU when no single GPU's 80 % holds its estimate, and
always with OLLAMA_SCHED_SPREAD=1 (server/sched.go:1009-1028, 1060-1076). Each GPU a copy
uses holds its compute buffers (llm/llama_server.go:2821-2851) and the runner's CUDA context
(ml/device.go:359-364), and from 0.30 llama.cpp's fit keeps a margin free on each GPU. Which
GPU a copy is on is not known here, so every copy is planned as spread: right with
OLLAMA_SCHED_SPREAD=1 (the layout to run one Ollama over several GPUs with, Ollama issue
18349), and over the mark, never under, for a copy Ollama puts on one GPU.
"""

from __future__ import annotations

from collections.abc import Iterable

RUNNER_OVERHEAD_MIB = 457  # a runner's CUDA context on each GPU it uses (ml/device.go:359-364)
FIT_MARGIN_MIB = 1024  # llama.cpp's fit target on each GPU (common/common.h), 0.30+


def spread_graph_mib(compute_mib: int, gpus: int) -> int:
    """What a copy spread over `gpus` GPUs adds to its one-card footprint: its compute
    buffers (`compute_mib`: the default batch's, at least its logits, and the batch's
    surcharge) again on each GPU but one."""
    return compute_mib * (gpus - 1) if gpus > 1 else 0


def spread_fits(footprint_mib: int, total_mib: int, gpus: int, held: Iterable[int],
                margin_mib: int) -> bool:
    """Whether a copy of `footprint_mib` (spread already) fits beside the copies `held`
    (their sizes): all of them, a CUDA context for each on every GPU and the fit margin on
    every GPU within the GPUs' memory (llama.cpp's fit moves layers between GPUs, so the sum
    is what counts)."""
    sizes = list(held)
    contexts = (len(sizes) + 1) * gpus * RUNNER_OVERHEAD_MIB
    return sum(sizes) + footprint_mib + contexts + gpus * margin_mib <= total_mib
