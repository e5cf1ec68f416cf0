"""The transcription form read as Go reads it, and the chat call Ollama makes of it."""

from __future__ import annotations

import base64

import httpx
import pytest
from starlette.datastructures import Headers, QueryParams

from proxy.api import transcription
from proxy.api.transcription import FormError, Transcription


async def read(data: dict[str, str], files: dict[str, tuple[str, bytes]] | None = None,
               query: str = "") -> Transcription:
    request = httpx.Request("POST", "http://x/", data=data, files=files)
    return await transcription.read_form(request.read(), Headers(dict(request.headers)),
                                         QueryParams(query))


async def test_a_field_is_read_as_gos_formvalue_reads_it() -> None:
    """The query string's value first, then the form's: Go's Request.Form puts them so."""
    asked = await read({"language": "de"}, {"file": ("a.wav", b"abc")},
                       "model=qwen3:8b&language=fr")
    assert (asked.model, asked.language, asked.audio) == ("qwen3:8b", "fr", b"abc")


async def test_a_file_sent_as_a_text_field_is_no_file() -> None:
    with pytest.raises(FormError, match=r"^file is required: http: no such file$"):
        await read({"model": "m", "file": "abc"}, {"other": ("a.wav", b"abc")})


async def test_a_form_without_its_boundary_is_refused_in_gos_words() -> None:
    headers = Headers({"content-type": "multipart/form-data"})
    with pytest.raises(FormError, match="no multipart boundary param in Content-Type"):
        await transcription.read_form(b"", headers, QueryParams(""))
    broken = Headers({"content-type": "multipart/form-data; boundary=xyz"})
    with pytest.raises(FormError, match=r"^failed to parse multipart form: "):
        await transcription.read_form(b"--xyz\r\nno headers end", broken, QueryParams(""))


@pytest.mark.parametrize(("version", "question"), [
    ((0, 22, 0), "Transcribe this audio."),
    ((0, 30, 0), "What exact words are spoken in this audio?")])
def test_the_chat_call_is_ollamas_own(version: tuple[int, int, int], question: str) -> None:
    body = transcription.chat_body(Transcription("m", b"\x00\x01", "", "en", "names: Ada"),
                                   version)
    system, user = body["messages"]
    assert system["content"].endswith(" The audio is in en. Context: names: Ada")
    assert (user["content"], base64.b64decode(user["images"][0])) == (question, b"\x00\x01")
    assert (body["options"], body["stream"]) == ({"temperature": 0}, False)


def test_the_answer_is_the_chats_text_trimmed() -> None:
    chat = b'{"message":{"role":"assistant","content":"  hello there\\n"},"done":true}'
    assert transcription.answer(chat, "json") == (b'{"text":"hello there"}\n',
                                                   "application/json")
    assert transcription.answer(chat, "text") == (b"hello there", "text/plain")


async def test_a_large_file_is_not_spilled_to_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod's root file system is read-only: a temporary file cannot be made."""
    import tempfile

    def no_disk(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", no_disk)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", no_disk)
    monkeypatch.setattr(tempfile, "mkstemp", no_disk)
    audio = bytes(range(256)) * (12 << 12)  # 12 MiB
    asked = await read({"model": "m"}, {"file": ("a.wav", audio)})
    assert asked.audio == audio
