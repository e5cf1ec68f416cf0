"""The DCGM exporter adapter against a mocked exporter (respx): the GPU's total VRAM."""

from __future__ import annotations

import ssl

import httpx
import pytest
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


def _node(*gpus: tuple[float, float]) -> str:
    """An exporter's page for a node: each GPU's free and used framebuffer, MiB."""
    lines = ["# TYPE DCGM_FI_DEV_FB_FREE gauge"]
    lines += [f'DCGM_FI_DEV_FB_FREE{{gpu="{i}",UUID="GPU-{i}"}} {free}'
              for i, (free, _) in enumerate(gpus)]
    lines += ["# TYPE DCGM_FI_DEV_FB_USED gauge"]
    lines += [f'DCGM_FI_DEV_FB_USED{{gpu="{i}",UUID="GPU-{i}"}} {used}'
              for i, (_, used) in enumerate(gpus)]
    return "\n".join(lines) + "\n"


@respx.mock
async def test_a_one_gpu_provider_counts_the_first_gpu_listed() -> None:
    respx.get(URL).respond(text=_node((1000, 500), (9000, 0)))
    assert await DcgmExporter(2.0).total_mib(URL) == 1500


@respx.mock
async def test_a_provider_on_several_gpus_counts_as_many_of_the_node() -> None:
    respx.get(URL).respond(text=_node((20000, 4564), (24564, 0), (24564, 0), (1, 2)))
    assert await DcgmExporter(2.0).total_mib(URL, gpus=2) == 2 * 24564
    assert await DcgmExporter(2.0).total_mib(URL, gpus=3) == 3 * 24564
    assert await DcgmExporter(2.0).total_mib(URL, gpus=8) == 3 * 24564 + 3  # all it lists


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


@respx.mock
async def test_reads_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each read made a client that loaded the whole CA bundle again: ~0.1 s of CPU on the
    event loop at every probe of a provider whose total comes from its exporter."""
    made: list[object] = []
    create = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context",
                        lambda *a, **k: made.append(a) or create(*a, **k))
    respx.get(URL).respond(text=_gauge("DCGM_FI_DEV_FB_FREE", 16000)
                           + _gauge("DCGM_FI_DEV_FB_USED", 8000))
    exporter = DcgmExporter(2.0)
    for _ in range(3):
        assert await exporter.total_mib(URL) == 24000
    assert len(made) <= 1
