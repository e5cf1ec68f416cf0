"""OpenAI's /v1/audio/transcriptions through the sidecar, with the `openai` client: the form's
audio is placed and sent as the chat call Ollama makes of it, and answered as Ollama does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer
from tests.conftest import eventually

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
SCALE = 0.02
AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(64))
FORM = {"model": "qwen3:8b", "language": "en"}
PATH = "/v1/audio/transcriptions"


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def settled(url: str) -> bool:
    state = httpx.get(f"{url}/kubemoot/v1/state").json()
    return not state["tickets"] and not state.get("waiting")


def test_a_transcription_is_placed_and_answered_as_ollama_answers_it(
        sim_factory: Sims, sidecar_factory: Sidecars, mode: dict[str, Any]) -> None:
    small = sim_factory("small", total_vram_mib=8192, time_scale=SCALE)
    big = sim_factory("big", total_vram_mib=24564, time_scale=SCALE)
    httpx.post(f"{big.url}/api/generate", json={"model": "qwen3:8b"})  # warm on the big card
    sidecar = sidecar_factory([small, big], **mode)
    client = client_for(sidecar.url)

    raw = client.audio.transcriptions.with_raw_response.create(
        model="qwen3:8b", file=("clip.wav", AUDIO), language="en")
    assert (raw.headers["x-kubemoot-provider"], raw.headers["x-kubemoot-placement"]) == (
        "big", "warm")
    direct = httpx.post(f"{big.url}{PATH}", data=FORM, files={"file": ("clip.wav", AUDIO)})
    assert raw.http_response.json() == direct.json()
    assert raw.parse().text == direct.json()["text"] != ""

    text = client.audio.transcriptions.create(model="qwen3:8b", file=("clip.wav", AUDIO),
                                              response_format="text")
    assert isinstance(text, str) and text == direct.json()["text"]
    assert eventually(lambda: settled(sidecar.url))
    assert big.sim.stats.requests >= 3 and small.sim.stats.requests == 0


@pytest.mark.parametrize(("form", "files", "message"), [
    ({}, {"file": ("a.wav", AUDIO)}, "model is required"),
    (FORM, {}, "file is required: http: no such file"),
    (FORM, {"file": ("a.wav", b"")}, "audio file is empty"),
])
def test_a_form_ollama_refuses_gets_its_400(sim_factory: Sims, sidecar_factory: Sidecars,
                                           form: dict[str, str], files: dict[str, Any],
                                           message: str) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    sidecar = sidecar_factory([gpu])
    # (a form with no file is sent as one: httpx sends a bare form urlencoded)
    mine = httpx.post(f"{sidecar.url}{PATH}", data=form, files=files or {"x": ("", b"", "")})
    theirs = httpx.post(f"{gpu.url}{PATH}", data=form, files=files or {"x": ("", b"", "")})
    assert mine.status_code == theirs.status_code == 400
    assert mine.json()["error"]["message"] == theirs.json()["error"]["message"] == message
    assert mine.json()["error"]["type"] == "invalid_request_error"
    assert gpu.sim.stats.requests == 1  # only the direct one: the sidecar placed nothing


def test_a_body_that_is_no_form_gets_ollamas_400(sim_factory: Sims,
                                                 sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    sidecar = sidecar_factory([gpu])
    for url in (sidecar.url, gpu.url):
        answer = httpx.post(f"{url}{PATH}", json=FORM)
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == (
            "failed to parse multipart form: request Content-Type isn't multipart/form-data")


def test_the_models_refusals_come_in_openais_shape(sim_factory: Sims,
                                                   sidecar_factory: Sidecars) -> None:
    gpu = sim_factory("gpu", total_vram_mib=16376, time_scale=SCALE)
    client = client_for(sidecar_factory([gpu]).url)
    with pytest.raises(openai.NotFoundError) as missing:
        client.audio.transcriptions.create(model="nope:1b", file=("a.wav", AUDIO))
    assert "nope:1b" in missing.value.message
    with pytest.raises(openai.APIStatusError) as large:
        client.audio.transcriptions.create(model="qwen3:32b", file=("a.wav", AUDIO))
    assert large.value.status_code == 507
    assert large.value.response.json()["error"]["type"] == "api_error"


@pytest.mark.parametrize(("version", "served"), [("0.19.0", False), ("0.22.0", True),
                                                 ("0.27.0", False), ("0.30.0", True)])
def test_the_path_is_served_where_the_providers_ollama_serves_it(
        sim_factory: Sims, sidecar_factory: Sidecars, version: str, served: bool) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE, version=version)
    sidecar = sidecar_factory([gpu])
    assert eventually(lambda: httpx.get(f"{sidecar.url}/readyz").status_code == 200)
    files = {"file": ("a.wav", AUDIO)}
    direct = httpx.post(f"{gpu.url}{PATH}", data=FORM, files=files)
    mine = httpx.post(f"{sidecar.url}{PATH}", data=FORM, files=files)
    assert (direct.status_code, mine.status_code) == ((200, 200) if served else (404, 404))
    if served:
        assert mine.json() == direct.json()
    else:
        assert direct.text == "404 page not found"
        assert version in mine.json()["error"]["message"]


@pytest.mark.parametrize(("query", "form"), [
    ("?response_format=text", {**FORM, "response_format": "json"}),
    ("", {**FORM, "response_format": ["text", "json"]}),
])
def test_a_field_is_read_as_gos_formvalue_reads_it(sim_factory: Sims, sidecar_factory: Sidecars,
                                                   query: str, form: dict[str, Any]) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    sidecar = sidecar_factory([gpu])
    mine = httpx.post(f"{sidecar.url}{PATH}{query}", data=form,
                      files={"file": ("a.wav", AUDIO)})
    theirs = httpx.post(f"{gpu.url}{PATH}{query}", data=form,
                        files={"file": ("a.wav", AUDIO)})
    assert mine.status_code == theirs.status_code == 200
    # Go's FormValue: the query string's value before the form's, and of two the first:
    # response_format=text, the bare text rather than {"text": ...}
    assert mine.headers["content-type"].startswith("text/plain"), mine.text
    assert mine.text == theirs.text != ""


@pytest.mark.parametrize("raw", [
    b"",
    b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nqwen3:8b\r\n--b\r\n'
    b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF',
])
def test_a_form_go_cannot_read_gets_ollamas_parse_error(sim_factory: Sims,
                                                       sidecar_factory: Sidecars,
                                                       raw: bytes) -> None:
    gpu = sim_factory("gpu", time_scale=SCALE)
    sidecar = sidecar_factory([gpu])
    mine, theirs = (httpx.post(f"{url}{PATH}", content=raw, headers={
        "content-type": "multipart/form-data; boundary=b"}) for url in (sidecar.url, gpu.url))
    assert mine.status_code == theirs.status_code == 400
    assert mine.json()["error"]["message"] == theirs.json()["error"]["message"]
    assert mine.json()["error"]["message"].startswith("failed to parse multipart form: ")
