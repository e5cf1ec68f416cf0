"""The DCGM exporter adapter against a mocked exporter (respx): the GPU's total VRAM."""

from __future__ import annotations

import httpx
import respx

from proxy.adapters.dcgm import DcgmExporter

URL = "http://dcgm.test:9400/metrics"


def _gauge(name: str, value: float, gpu: int = 0) -> str:
    return (f"# TYPE {name} gauge\n"
            f'{name}{{gpu="{gpu}",UUID="GPU-{gpu}"}} {value}\n')


@respx.mock
async def test_the_total_is_free_plus_used_plus_reserved() -> None:
    respx.get(URL).respond(text=_gauge("DCGM_FI_DEV_FB_FREE", 20000)
                           + _gauge("DCGM_FI_DEV_FB_USED", 4000)
                           + _gauge("DCGM_FI_DEV_FB_RESERVED", 564)
                           + _gauge("DCGM_FI_DEV_GPU_TEMP", 61))
    assert await DcgmExporter(2.0).total_mib(URL) == 24564


@respx.mock
async def test_an_exporter_without_reserved_memory_counts_free_and_used() -> None:
    respx.get(URL).respond(text=_gauge("DCGM_FI_DEV_FB_FREE", 16000)
                           + _gauge("DCGM_FI_DEV_FB_USED", 8000))
    assert await DcgmExporter(2.0).total_mib(URL) == 24000


@respx.mock
async def test_only_the_first_gpu_listed_counts() -> None:
    respx.get(URL).respond(text="# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
                           'DCGM_FI_DEV_FB_FREE{gpu="0"} 1000\n'
                           'DCGM_FI_DEV_FB_FREE{gpu="1"} 9000\n'
                           + _gauge("DCGM_FI_DEV_FB_USED", 500))
    assert await DcgmExporter(2.0).total_mib(URL) == 1500


@respx.mock
async def test_no_framebuffer_metric_is_no_total() -> None:
    respx.get(URL).respond(text=_gauge("DCGM_FI_DEV_GPU_TEMP", 61))
    assert await DcgmExporter(2.0).total_mib(URL) is None


@respx.mock
async def test_an_unreachable_exporter_is_no_total() -> None:
    respx.get(URL).mock(side_effect=httpx.ConnectError("refused"))
    assert await DcgmExporter(2.0).total_mib(URL) is None


@respx.mock
async def test_a_slow_exporter_is_no_total() -> None:
    respx.get(URL).mock(side_effect=httpx.ReadTimeout("slow"))
    assert await DcgmExporter(2.0).total_mib(URL) is None
