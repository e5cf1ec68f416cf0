from __future__ import annotations
import httpx, openai
from tests.e2e.test_transcriptions import AUDIO, FORM, PATH, SCALE, client_for, settled
from tests.conftest import eventually, CATALOG


def test_cloud(sim_factory, sidecar_factory):
    gpu = sim_factory("gpu", total_vram_mib=24564, models=CATALOG)
    off = sim_factory("off", total_vram_mib=24564, models=CATALOG, no_cloud=True)
    for provs in ([gpu], [off]):
        sidecar = sidecar_factory(provs)
        url = sidecar.url
        eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200)
        form = {"model": "gpt-oss:120b-cloud"}
        mine = httpx.post(f"{url}{PATH}", data=form, files={"file": ("a.wav", AUDIO)})
        theirs = httpx.post(f"{provs[0].url}{PATH}", data=form, files={"file": ("a.wav", AUDIO)})
        print("CLOUD", mine.status_code, mine.text[:200], "|", theirs.status_code, theirs.text[:200], mine.headers.get("x-kubemoot-placement"))
        print("SETTLED", eventually(lambda: settled(url)))
