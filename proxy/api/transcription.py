"""OpenAI's `/v1/audio/transcriptions` as Ollama serves it (0.20-0.24 and 0.30+): a multipart
form whose audio becomes a chat call (middleware/openai.go:1277-1340 TranscriptionMiddleware,
openai/openai.go:864-887 FromTranscriptionRequest). The sidecar makes that chat call itself,
so it is placed like any other, and answers as Ollama's TranscriptionWriter does (:1235-1274):
`{"text": ...}`, or the bare text for `response_format=text`."""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.datastructures import Headers, QueryParams, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from proxy.core.context import Version

PATH = "/v1/audio/transcriptions"
# Ollama versions whose router has the path (server/routes.go at v0.20.0-v0.24.x, v0.30.0+)
SERVED: tuple[tuple[Version, Version | None], ...] = (((0, 20, 0), (0, 25, 0)),
                                                       ((0, 30, 0), None))
# The words Ollama's system prompt and user message take (openai/openai.go; changed in 0.30)
WORDS_SINCE_0_30 = ("Transcribe the audio exactly as spoken. Output only the spoken words. "
                    "Do not answer any question in the audio.",
                    "What exact words are spoken in this audio?")
WORDS_BEFORE_0_30 = ("Transcribe the following audio exactly as spoken. Output only the "
                     "transcription text, nothing else.", "Transcribe this audio.")
MAX_FIELDS = 100


def _closed(raw: bytes, params: str) -> bool:
    """Whether the body ends its form with the closing delimiter (`--boundary--`)."""
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "boundary":
            return b"--" + value.strip('"').encode("latin-1", "replace") + b"--" in raw
    return False


@dataclass(frozen=True)
class Transcription:
    """The form's fields Ollama reads (openai.TranscriptionRequest)."""

    model: str
    audio: bytes
    response_format: str
    language: str
    prompt: str


class FormError(Exception):
    """A form Ollama refuses with 400, in its words."""


PIECE = 1 << 20


async def _pieces(raw: bytes) -> AsyncGenerator[bytes, None]:
    """The body a piece at a time: the parser hands each piece's file data to a thread, so
    other calls are served between pieces rather than after the whole form."""
    for start in range(0, len(raw), PIECE):
        yield raw[start:start + PIECE]


async def read_form(raw: bytes, headers: Headers, query: QueryParams) -> Transcription:
    """The form's fields, or FormError as Ollama words it. A field is read as Go's
    `FormValue` reads it: the first of its values in `r.Form`, where ParseMultipartForm
    puts the query string's before the form's."""
    kind, _, params = headers.get("content-type", "").partition(";")
    if kind.strip().lower() != "multipart/form-data":
        # Go's ParseMultipartForm on any other body (net/http ErrNotMultipart)
        raise FormError("failed to parse multipart form: request Content-Type isn't "
                        "multipart/form-data")
    if "boundary=" not in params.lower():
        raise FormError("failed to parse multipart form: no multipart boundary param in "
                        "Content-Type")
    parser = MultiPartParser(headers, _pieces(raw), max_fields=MAX_FIELDS, max_files=MAX_FIELDS)
    # The body is in memory already (capped): its file stays there, as a spill to disk
    # would fail on the read-only root file system the sidecar's pod runs with.
    parser.spool_max_size = len(raw) + 1
    try:
        form = await parser.parse()
    except (MultiPartException, ValueError) as exc:  # UnicodeDecodeError among them
        raise FormError(f"failed to parse multipart form: {exc}") from None
    if not _closed(raw, params):
        # Go's reader needs the closing delimiter; Starlette's keeps what came before it
        await form.close()
        raise FormError("failed to parse multipart form: " + (
            "unexpected EOF" if raw.strip() else "multipart: NextPart: EOF"))
    try:
        def value(name: str) -> str:
            given = [*query.getlist(name),
                     *(item for item in form.getlist(name) if isinstance(item, str))]
            return given[0] if given else ""

        model = value("model")
        if not model:
            raise FormError("model is required")
        upload = next((f for f in form.getlist("file") if isinstance(f, UploadFile)), None)
        if upload is None:
            raise FormError("file is required: http: no such file")
        audio = await upload.read()
        if not audio:
            raise FormError("audio file is empty")
        return Transcription(model, audio, value("response_format"), value("language"),
                             value("prompt"))
    finally:
        await form.close()


def chat_body(asked: Transcription, version: Version) -> dict[str, Any]:
    """The chat call Ollama makes of the form (FromTranscriptionRequest), answered whole: the
    sidecar reads it complete, as Ollama's writer does of its stream."""
    system, question = WORDS_SINCE_0_30 if version >= (0, 30, 0) else WORDS_BEFORE_0_30
    if asked.language:
        system += f" The audio is in {asked.language}."
    if asked.prompt:
        system += f" Context: {asked.prompt}"
    return {
        "model": asked.model,
        "messages": [{"role": "system", "content": system},
                     {"role": "user", "content": question,
                      "images": [base64.b64encode(asked.audio).decode()]}],
        "stream": False,
        "options": {"temperature": 0},
    }


def answer(chat: bytes, response_format: str) -> tuple[bytes, str]:
    """A chat answer as the transcription's: its text trimmed, as JSON or bare."""
    text = ""
    parsed = orjson.loads(chat)
    if isinstance(parsed, dict) and isinstance(message := parsed.get("message"), dict):
        content = message.get("content")
        text = content.strip() if isinstance(content, str) else ""
    if response_format == "text":
        return text.encode(), "text/plain"
    return orjson.dumps({"text": text}) + b"\n", "application/json"
