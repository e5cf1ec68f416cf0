"""HTTP adapter for an NVIDIA DCGM exporter: a GPU's total framebuffer from its metrics."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The framebuffer's parts, in MiB: together they are the card's total.
FRAMEBUFFER = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")


class DcgmExporter:
    """Reads the total from an exporter's /metrics (the port's GpuMemoryGauge)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def total_mib(self, url: str) -> int | None:
        """FB_FREE + FB_USED (+ FB_RESERVED) of the first GPU listed, in MiB."""
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                text = (await client.get(url)).text
        except httpx.HTTPError:
            return None
        total = 0.0
        seen = False
        for family in text_string_to_metric_families(text):
            if family.name in FRAMEBUFFER:
                for sample in family.samples[:1]:  # one GPU per Ollama
                    total += sample.value
                    seen = True
        return int(total) if seen else None
