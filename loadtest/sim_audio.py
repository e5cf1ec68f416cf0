"""OpenAI's /v1/audio/transcriptions as Ollama serves it from 0.20 to 0.24 and from 0.30
(server/routes.go; middleware/openai.go TranscriptionMiddleware, openai/openai.go
FromTranscriptionRequest): a multipart form whose audio the native chat reads as an image
of the user's message, answered `{"text": ...}` or, for `response_format=text`, bare."""

from __future__ import annotations

import base64
from typing import Any

import orjson
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from .sim_engine import version_tuple

PATH = "/v1/audio/transcriptions"
GIN_NOT_FOUND = "404 page not found"  # gin's answer on a path its router does not have
PROMPT_SINCE_0_30 = ("Transcribe the audio exactly as spoken. Output only the spoken words. "
                     "Do not answer any question in the audio.",
                     "What exact words are spoken in this audio?")
PROMPT_BEFORE_0_30 = ("Transcribe the following audio exactly as spoken. Output only the "
                      "transcription text, nothing else.", "Transcribe this audio.")


def served(version: str) -> bool:
    at = version_tuple(version)
    return (0, 20, 0) <= at < (0, 25, 0) or at >= (0, 30, 0)


async def chat_request(request: Request, version: str) -> tuple[dict[str, Any], str] | str:
    """The native chat call and the answer's format, or the 400's message."""
    kind, _, params = request.headers.get("content-type", "").partition(";")
    if kind.strip().lower() != "multipart/form-data":
        return "failed to parse multipart form: request Content-Type isn't multipart/form-data"
    if "boundary=" not in params.lower():
        return "failed to parse multipart form: no multipart boundary param in Content-Type"
    raw = await request.body()
    try:
        form = await request.form()
    except MultiPartException as exc:
        return f"failed to parse multipart form: {exc}"
    boundary = params.split("boundary=", 1)[1].split(";")[0].strip().strip('"')
    if b"--" + boundary.encode() + b"--" not in raw:  # Go's reader needs the closing one
        return "failed to parse multipart form: " + (
            "unexpected EOF" if raw.strip() else "multipart: NextPart: EOF")

    def value(name: str) -> str:  # Go's FormValue: r.Form's first, the query's before the form's
        given = [*request.query_params.getlist(name),
                 *(item for item in form.getlist(name) if isinstance(item, str))]
        return given[0] if given else ""

    model = value("model")
    if not model:
        return "model is required"
    upload = next((f for f in form.getlist("file") if isinstance(f, UploadFile)), None)
    if upload is None:
        return "file is required: http: no such file"
    audio = await upload.read()
    if not audio:
        return "audio file is empty"
    system, question = PROMPT_SINCE_0_30 if version_tuple(version) >= (0, 30, 0) else \
        PROMPT_BEFORE_0_30
    if language := value("language"):
        system += f" The audio is in {language}."
    if prompt := value("prompt"):
        system += f" Context: {prompt}"
    return {"model": model, "stream": False, "options": {"temperature": 0},
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": question,
                          "images": [base64.b64encode(audio).decode()]}]}, \
        value("response_format")


def answer(native: Response, response_format: str) -> Response:
    """TranscriptionWriter: the chat's content trimmed."""
    message = orjson.loads(bytes(native.body)).get("message") or {}
    text = str(message.get("content") or "").strip()
    if response_format == "text":
        return PlainTextResponse(text)
    return Response(orjson.dumps({"text": text}) + b"\n", media_type="application/json")
