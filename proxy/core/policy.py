"""Every weight of the placement in one frozen object, with its default and its unit.

Costs are expected seconds before the call can start wherever a physical meaning exists
(queue wait, load, unload, reload); the few terms without a unit are weights scaled to
seconds so they only break near-ties.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Policy:
    # Memory.
    # CUDA context, fragmentation, runtime overhead, on each GPU of a provider ...
    reserve_min_mib: int = 2048
    reserve_fraction: float = 0.12  # ... or this share of the total, whichever is larger
    disk_to_vram_factor: float = 1.2  # occupancy guess from the on-disk size
    warm_scratch_mib: int = 512  # what a call sharing a loaded copy claims

    # Time (seconds).
    load_mib_per_s: float = 1024.0  # Ollama loads ~1 GiB/s; learned from load_duration
    # A runner's start-up before it reads the weights (process, backend and CUDA init): a
    # hardware figure, taken before any load is seen; a load is start-up + file / speed
    load_startup_s: float = 1.0
    unload_s: float = 1.0  # keep_alive:0 round trip plus the driver giving memory back
    # A call's length when nothing is known of it (docs/rules.md, "How long a call is
    # expected to take"): long, because a queue thought short can hide a minutes-long answer
    default_call_s: float = 30.0
    expiry_margin_s: float = 1.0  # an idle copy this close to its keep-alive expiry is gone
    # A decode step's extra time per other sequence in the same runner's batch, as a share of
    # the call's length: a hardware figure (memory-bound decode reads the weights once per
    # step; each sequence adds its cache reads), so a free slot beside busy ones is slower
    batch_share: float = 0.1

    # Weights without a physical unit, in seconds-equivalent.
    best_fit_s: float = 0.05  # x (usable - footprint) / footprint: small models, small cards
    best_fit_max_s: float = 2.0  # its most: a tie-breaker, never worth more than a short wait
    reliability_s: float = 10.0  # x (1 - success rate)
    spill_s: float = 20.0  # residents published beyond usable VRAM
    provider_weight_s: float = 0.01  # per point of provider weight: mulling -, triage +

    # Victims.
    max_victim_candidates: int = 10

    def reserve_mib(self, total_mib: int, gpus: int = 1) -> int:
        """Kept free on a provider of `gpus` GPUs: a copy spread over several pays a runner's
        CUDA context and llama.cpp's fit margin on each (docs/engine.md, "Several GPUs")."""
        return max(self.reserve_min_mib * max(1, gpus), int(total_mib * self.reserve_fraction))

    def usable_mib(self, total_mib: int, gpus: int = 1) -> int:
        return total_mib - self.reserve_mib(total_mib, gpus)


DEFAULT_POLICY = Policy()
