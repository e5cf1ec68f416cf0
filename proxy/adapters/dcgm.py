"""HTTP adapter for an NVIDIA DCGM exporter: the total framebuffer of a provider's GPUs."""

from __future__ import annotations

import functools
import math
import ssl

import httpx
from prometheus_client.parser import text_string_to_metric_families

# The framebuffer's parts, in MiB: together they are the card's total.
FRAMEBUFFER = ("DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED")


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context every read shares: httpx would read the whole CA bundle into a new one
    for each client, about 0.1 s of CPU on the event loop at every probe."""
    return httpx.create_ssl_context()


class DcgmExporter:
    """Reads the total from an exporter's /metrics (the port's GpuMemoryGauge)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def total_mib(self, url: str, gpus: int = 1) -> int | None:
        """FB_FREE + FB_USED (+ FB_RESERVED) of the first `gpus` GPUs listed, in MiB: an
        exporter lists every GPU of its node, and the provider's Ollama runs on `gpus`."""
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, verify=_tls()) as client:
                answer = await client.get(url)
        except httpx.HTTPError:
            return None
        if not answer.is_success:
            return None
        per_gpu: dict[str, float] = {}
        try:  # (an answer that is no exposition text: unknown, not a failed probe)
            for family in text_string_to_metric_families(answer.text):
                if family.name in FRAMEBUFFER:
                    for sample in family.samples:
                        gpu = sample.labels.get("gpu") or sample.labels.get("UUID") or ""
                        per_gpu[gpu] = per_gpu.get(gpu, 0.0) + sample.value
        except ValueError:
            return None
        total = sum(list(per_gpu.values())[:max(1, gpus)])
        return int(total) if per_gpu and math.isfinite(total) and total > 0 else None
