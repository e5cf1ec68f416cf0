"""The streaming relay: forward one placed call and pass the answer through chunk by chunk.

Nothing is buffered but the tail of the stream (to read the engine's final metrics). Every
attempt is reported to the call's `Attempts` exactly once, whatever happens: success, upstream
failure, client disconnect or timeout; the service decides whether another attempt follows.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.api.errors import (
    JSON,
    Dialect,
    error_response,
    provider_refusal,
    refusal_response,
    responses_failed_event,
    stream_error_line,
)
from proxy.api.wire import go_field_key, past_go_duration
from proxy.core.context import unshifted_answer_cap
from proxy.core.engine_errors import SERVER_BUSY, body_excerpt, callers_error, prompt_too_long
from proxy.core.models import cloud_echo, model_key, ollama_name_parts, split_source
from proxy.observability.logging import get_logger
from proxy.ports import UpstreamError, UpstreamResponse
from proxy.service.routing import CLOUD, STATIC, Attempt, Attempts, CallOutcome, Refusal

log = get_logger("kubemoot.relay")

NDJSON = "application/x-ndjson"


def attempt_headers(attempt: Attempt, model: str) -> dict[str, str]:
    """The placed response's headers; `model` as the body names it (CONTRACT.md: the
    body's `model` says the same)."""
    headers = {
        "X-Kubemoot-Provider": attempt.provider,
        "X-Kubemoot-Model": model,
        "X-Kubemoot-Placement": attempt.placement,
        "X-Kubemoot-Waited-Ms": str(attempt.waited_ms),
    }
    if attempt.evicted:
        headers["X-Kubemoot-Evicted"] = ",".join(attempt.evicted)
    return headers


CLOSING_KEYS = ("prompt_eval_count", "usage", "response", "error")
# A count as a JSON key and its integer, or a `usage` block's start. A key inside a string has
# its quotes escaped, so a match is a key (outside any string): a scan from it reads the JSON.
COUNT = re.compile(rb'(?<!\\)"(?:(prompt_eval_count|prompt_eval_duration|eval_count'
                   rb'|eval_duration|load_duration|total_duration|prompt_eval_cached_count'
                   rb'|prompt_tokens|completion_tokens|input_tokens|output_tokens)":\s*(\d+)'
                   rb'|(usage)":\s*(?=\{))')
USAGE_KEYS = (b"prompt_tokens", b"completion_tokens", b"input_tokens", b"output_tokens")


def final_metrics(tail: bytes) -> dict[str, Any]:
    """The answer's closing figures: the last JSON object (an NDJSON line or an SSE `data:`
    event) that carries counts or an error. Anthropic's stream sends `message_stop` after
    its counts, so the very last object is not always the one. A closing line longer than
    the tail comes cut at its start: its counts are read from what is left."""
    for line in reversed(tail.strip().split(b"\n")):
        line = line.removeprefix(b"data:").strip()
        if not line.startswith(b"{"):
            continue  # `event:` lines, `[DONE]`, a cut-off line
        with contextlib.suppress(orjson.JSONDecodeError):
            data = orjson.loads(line)
            if isinstance(data, dict) and any(key in data for key in CLOSING_KEYS):
                return data
    for line in reversed(tail.strip().split(b"\n")):
        if counts := counts_in_fragment(line.removeprefix(b"data:").strip()):
            return counts
    return {}


def counts_in_fragment(line: bytes) -> dict[str, Any]:
    """The counts of a closing object whose start is cut off: Ollama's own in the object
    itself, OpenAI's and Anthropic's in a `usage` block (the last of each), not a key of the
    same name deeper in (a tool call's arguments, a tool's schema). Ollama's longest closing
    line is a streamed /api/generate's: its `context` (the tokens of the whole prompt and
    answer, server/routes.go:712-719) runs to tens of kilobytes, the metrics follow it and
    the tool calls a built-in parser found follow them (api/types.go:891-930
    GenerateResponse); a Responses stream's `response.completed` repeats the whole answer
    before its usage."""
    marks = {m.start(): m for m in COUNT.finditer(line)}
    if not marks or not line.endswith(b"}"):
        return {}
    seen = []  # (key, count, depth, directly in a usage block)
    depth, usage_depths, usage_next = 0, set(), False
    in_string = escaped = False
    for i in range(min(marks), len(line)):
        c = line[i]
        if in_string:
            in_string, escaped = escaped or c != 0x22, not escaped and c == 0x5C
            continue
        if (m := marks.get(i)) is not None:
            usage_next = m[3] is not None
            if m[1] is not None:
                seen.append((m[1].decode(), int(m[2]), depth, depth in usage_depths))
        if c == 0x22:
            in_string = True
        elif c in b"{[":
            depth += 1
            if usage_next and c == 0x7B:
                usage_depths.add(depth)
            usage_next = False
        elif c in b"}]":
            usage_depths.discard(depth)
            depth -= 1
    top = depth + 1  # the depth of the object the line's last brace closes
    counts: dict[str, Any] = {key: n for key, n, at, _ in seen
                              if at == top and key.encode() not in USAGE_KEYS}
    # (a usage block is the object's own, or its `response`'s or `message`'s)
    usage = {key: n for key, n, at, in_usage in seen
             if in_usage and key.encode() in USAGE_KEYS and at - top in (1, 2)}
    if usage:
        counts["usage"] = usage
    return counts


def _count(final: dict[str, Any], native: str, openai: str, anthropic: str) -> int | None:
    """A count from the closing figures: Ollama's own key, else the `usage` block (OpenAI's
    or Anthropic's key; the Responses API's stream carries it in the closing `response`)."""
    count = final.get(native)
    if count is None:
        closing = final.get("response")
        usage = final.get("usage") or (closing.get("usage") if isinstance(closing, dict)
                                       else None)
        if isinstance(usage, dict):
            count = usage.get(openai, usage.get(anthropic))
    return count if isinstance(count, int) else None


def prompt_tokens(final: dict[str, Any]) -> int | None:
    """The engine's prompt count: `prompt_eval_count`, `usage.prompt_tokens` or
    `usage.input_tokens`."""
    return _count(final, "prompt_eval_count", "prompt_tokens", "input_tokens")


def answer_tokens(final: dict[str, Any]) -> int | None:
    """The engine's count of the answer: `eval_count`, `usage.completion_tokens` or
    `usage.output_tokens`."""
    return _count(final, "eval_count", "completion_tokens", "output_tokens")


def _seconds(final: dict[str, Any], key: str) -> float | None:
    nanoseconds = final.get(key)
    return nanoseconds / 1e9 if isinstance(nanoseconds, int) else None


# How an answer calls a tool, as a JSON key or value: Ollama's and OpenAI's `tool_calls`,
# Anthropic's `tool_use` blocks, the Responses API's `function_call` items (that API's
# events also echo the request's tools, hence the item's type). In the answer's text the
# quotes would be escaped, so the model writing these words does not match.
TOOL_CALL = re.compile(rb'"(?:tool_calls|tool_use)"|"type":\s*"function_call"')
MARK_OVERLAP = 31  # longer than any mark: one may straddle two chunks
# An answer stopped at its token cap: a tool call cut off there comes back as text.
CUT_SHORT = re.compile(rb'"(?:done_reason|finish_reason)":\s*"length"'
                       rb'|"stop_reason":\s*"max_tokens"|"status":\s*"incomplete"')


def calls_tool(data: bytes) -> bool:
    return TOOL_CALL.search(data) is not None


def answer_calls_tool(data: bytes, called: bool) -> bool | None:
    """Whether a whole answer (or, with `called`, a stream seen calling one; `data` its
    tail) called a tool; None when it was cut short at its token cap."""
    if called:
        return True
    return None if CUT_SHORT.search(data) else False


def outcome_from(metrics: dict[str, Any], started: float, ok: bool,
                 error: str | None = None, called_tools: bool | None = None) -> CallOutcome:
    """The call's outcome from the engine's final metrics (ignored when it failed)."""
    metrics = metrics if ok else {}
    return CallOutcome(
        healthy=ok,
        seconds=time.perf_counter() - started,
        prompt_eval_count=prompt_tokens(metrics),
        load_seconds=_seconds(metrics, "load_duration"),
        error=error,
        answer_tokens=answer_tokens(metrics),
        answer_seconds=_seconds(metrics, "eval_duration"),
        prompt_seconds=_seconds(metrics, "prompt_eval_duration"),
        prompt_cached_count=cached_tokens(metrics),
        called_tools=called_tools if ok else None,
    )


def cached_tokens(final: dict[str, Any]) -> int | None:
    """The prompt tokens the engine says it found cached, when it says so in Ollama's key
    (`prompt_eval_cached_count`); no Ollama version does yet, and its Responses API's
    `cached_tokens` is always 0, so OpenAI's and Anthropic's usage keys are not read."""
    count = final.get("prompt_eval_cached_count")
    return count if isinstance(count, int) and count >= 0 else None


class Silence:
    """The between-chunk limit of one stream: one timer, re-armed only when it fires, that
    cancels the relaying task once the wait for the next chunk has lasted `limit_s` (a
    timeout armed for every chunk would cost ~12 % of a streamed call's CPU). Time spent
    sending to a slow client does not count."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self.task = task
        self.since: float | None = None  # when the wait for the next chunk began
        self.expired = False
        self._timer = self.loop.call_later(limit_s, self._check)

    def _check(self) -> None:
        if self.task.done():
            return
        now = self.loop.time()
        if self.since is not None and now - self.since >= self.limit_s:
            self.expired = True
            self.task.cancel()
            return
        start = now if self.since is None else self.since
        self._timer = self.loop.call_at(start + self.limit_s, self._check)

    def timed_out(self) -> bool:
        """Whether the cancellation being handled is this limit's (then it is taken back)."""
        return self.expired and self.task.uncancel() == 0

    def stop(self) -> None:
        self._timer.cancel()


# The event Ollama's OpenAI and Anthropic layers write only once the answer is done
# (middleware/openai.go:176-184, openai/responses.go:1619, anthropic/anthropic.go:972): its
# error line mid-stream becomes an empty chunk and the stream ends without it
# (middleware/openai.go:80-160, middleware/anthropic.go:53-70)
END_EVENTS = {"/v1/chat/completions": b"data: [DONE]", "/v1/completions": b"data: [DONE]",
              "/v1/messages": b"event: message_stop",
              "/v1/responses": b"event: response.completed"}


# A Responses stream Ollama ends as failed (middleware/openai.go writeWebSearchError), and
# how much of such a stream's start is kept to name the response in a failure of our own
RESPONSE_FAILED = b"event: response.failed"
HEAD_BYTES = 4096


# Its web search service's refusals (a sign-in, a rate limit) say nothing of the GPU, as
# their 401 or 429 before a stream does not (writeWebSearchError's codes for them)
SEARCH_REFUSALS = frozenset(("authentication_error", "rate_limit_exceeded"))


def failed_error(final: dict[str, Any]) -> tuple[str, str]:
    """The code and message of a `response.failed` event's error."""
    response = final.get("response")
    error = response.get("error") if isinstance(response, dict) else None
    error = error if isinstance(error, dict) else {}
    code, message = error.get("code"), error.get("message")
    return (code if isinstance(code, str) else "",
            message if isinstance(message, str) else "no message")


# The last line of an answer Ollama streams as NDJSON (`"done":true` inside a string would
# have its quotes escaped)
ANSWER_DONE = b'"done":true'


# How Ollama ends an NDJSON stream that failed after it started (server/routes.go:2116-2124,
# streamResponse): a line of its own with nothing but the error, the last of the stream.
OLLAMAS_ERROR_LINE = b'{"error":'
# Held back at most this much: past it, what began like the error line is not Ollama's last
# line, and goes to the agent as it came
MAX_HELD_ERROR_BYTES = 64 * 1024


def ollamas_error_line_at(chunk: bytes, at_line_start: bool) -> int:
    """Where Ollama's closing error line begins in `chunk`, or -1. Only at a line's start:
    the same bytes inside a line are a nested object (a tool call's arguments)."""
    if at_line_start and chunk.startswith(OLLAMAS_ERROR_LINE):
        return 0
    found = chunk.find(b"\n" + OLLAMAS_ERROR_LINE)
    return found + 1 if found >= 0 else -1


def with_reason(error_line: bytes) -> bytes:
    """Ollama's closing error line with the `reason` CONTRACT.md gives every failure after a
    stream began, its message kept; anything else as it came."""
    try:
        data = orjson.loads(error_line)
    except orjson.JSONDecodeError:
        return error_line
    if not isinstance(data, dict) or not isinstance(data.get("error"), str):
        return error_line
    return orjson.dumps({**data, "reason": "upstream-failed"}) + b"\n"


class RelayStream(StreamingResponse):
    """A streaming response whose cleanup runs even when the client goes away.

    The attempt settles at the stream's end, before the client sees it end. Starlette cancels
    the body iterator on disconnect; then `__call__`'s finally settles the attempt and closes
    the upstream (which tells Ollama to stop).
    """

    def __init__(self, upstream: UpstreamResponse, attempt: Attempt, attempts: Attempts,
                 started: float, chunk_timeout_s: float, headers: dict[str, str],
                 dialect: Dialect = "ollama", path: str = "", strip_usage: bool = False
                 ) -> None:
        self.upstream = upstream
        self._usage = UsageEventFilter() if strip_usage else None
        self.dialect = dialect
        self.end_event = END_EVENTS.get(path)
        # What says the answer is whole: a client that leaves once it has it (the openai
        # client at `[DONE]`) has not left mid-answer, and the call settles as answered
        self._last_mark = self.end_event or (ANSWER_DONE if dialect == "ollama" else None)
        self._answered = False
        # The upstream has ended and the outcome is known: a client that leaves on reading
        # the last bytes (an error line) no longer cuts the relay or its settling short
        self._ended = False
        self.attempt = attempt
        self.attempts = attempts
        self.started = started
        self.chunk_timeout_s = chunk_timeout_s
        self._tail = b""
        self._head = b""  # a Responses stream's start: the response its events belong to
        self._responses = path == "/v1/responses"
        self._watch = attempt.watches_tool_calls
        self._called_tools = False
        self._final: dict[str, Any] = {}
        self._ok = False
        self._error: str | None = "client disconnected"
        self._engine_failed = False
        self._settled = False
        super().__init__(self._relay(), headers=headers,
                         media_type=upstream.content_type or NDJSON)

    async def _relay(self) -> AsyncIterator[bytes]:
        ended_with_newline = True
        # Ollama's closing error line, held back from its start to the stream's end to be
        # sent with a reason (NDJSON only: on the SSE paths Ollama's layers drop it)
        held: bytes | None = None
        ndjson = self.dialect == "ollama"
        iterator = self.upstream.chunks()
        silence = Silence(self.chunk_timeout_s)
        try:
            while True:
                silence.since = silence.loop.time()
                try:
                    chunk = await anext(iterator, None)
                except asyncio.CancelledError:
                    if silence.timed_out():
                        raise TimeoutError from None
                    raise
                silence.since = None
                if chunk is None:
                    break
                if self._watch and not self._called_tools:  # (may straddle, mid-line)
                    self._called_tools = calls_tool(chunk) or (
                        not ended_with_newline and calls_tool(
                            self._tail[-MARK_OVERLAP:] + chunk[:MARK_OVERLAP]))
                if self._last_mark and not self._answered:  # (may straddle two chunks)
                    self._answered = self._last_mark in \
                        self._tail[-len(self._last_mark):] + chunk
                at_line_start = ended_with_newline
                ended_with_newline = chunk.endswith(b"\n")
                self._tail = (self._tail + chunk)[-8192:]
                if self._responses and len(self._head) < HEAD_BYTES:
                    self._head += chunk[:HEAD_BYTES - len(self._head)]
                if held is not None:
                    held += chunk
                elif ndjson and (start := ollamas_error_line_at(chunk, at_line_start)) >= 0:
                    held, chunk = chunk[start:], chunk[:start]
                    if chunk:
                        yield chunk
                else:
                    if self._usage is not None:
                        chunk = self._usage.feed(chunk)
                    if chunk:
                        yield chunk
                    continue
                if len(held) > MAX_HELD_ERROR_BYTES:
                    chunk, held = held, None
                    yield chunk
            self._ok, self._error = True, None
            self._final = final_metrics(self._tail)
            closing = b""
            if "error" in self._final:  # Ollama ends a failed stream this way
                self._ok = False
                self._engine_failed = True
                self._error = f"provider reported an error mid-stream: {self._final['error']}"
            elif self._responses and RESPONSE_FAILED in self._tail:
                # Ollama's own end of a failed Responses stream (its web search's): whole
                code, message = failed_error(self._final)
                self._ok = code in SEARCH_REFUSALS
                self._error = f"provider reported the response failed: {message}"
            elif self._last_mark and not self._answered:
                # the agent must hear of the failure, and it is not a finished call (Ollama
                # ends every stream with `"done":true` or its error line)
                self._ok = False
                self._engine_failed = True
                self._error = (f"provider {self.attempt.provider} ended the stream without "
                               f"{self._last_mark.decode().removeprefix('data: ')}: the "
                               "engine failed mid-answer")
                closing = (b"" if ended_with_newline else b"\n") + self._error_end(
                    self._error)
            self._ended = True
            if held is not None:
                yield with_reason(held)
            if self._usage is not None and (rest := self._usage.flush()):
                yield rest
            if closing:
                yield closing
        except (UpstreamError, TimeoutError) as exc:
            cause = (f"no data for {self.chunk_timeout_s:g} s"
                     if isinstance(exc, TimeoutError) else str(exc))
            self._error = f"provider {self.attempt.provider} failed mid-stream: {cause}"
            self._ended = True
            if self._usage is not None and (rest := self._usage.flush()):
                yield rest
            # (an error line held back began a line: what was sent ends with a newline)
            at_line_start = ended_with_newline or held is not None
            yield (b"" if at_line_start else b"\n") + self._error_end(self._error)
        finally:
            silence.stop()
        # Before the stream's end reaches the client: its next call must find this one's
        # ticket gone. (A client that leaves mid-stream is settled by __call__.) A client
        # that leaves once it has the last event does not cut the relay or the settling short
        # (__call__): what the call taught (its prompt's count, its length, a tool loop's
        # end) would be lost.
        await self._settle()

    def _error_end(self, message: str) -> bytes:
        """The stream's closing error in its dialect (the Responses API's own event)."""
        if self._responses:
            return responses_failed_event(message, self._head, self._tail)
        return stream_error_line(message, self.dialect)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Starlette's own __call__ watches for the client leaving with an anyio task group
        # per response (~0.1 ms of CPU per streamed call); a plain task does the same job.
        relaying = asyncio.current_task()
        assert relaying is not None
        left = False

        async def watch() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            if not (self._answered or self._ended):
                relaying.cancel()

        watcher = asyncio.create_task(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not left:
                raise  # cancelled from outside (shutdown), not by the client leaving
            relaying.uncancel()
        finally:
            watcher.cancel()
            if not self._settled:  # the client left before the stream's end
                await asyncio.shield(self._settle(client_left=True))

    async def _settle(self, client_left: bool = False) -> None:
        self._settled = True
        outcome = outcome_from(self._final, self.started, self._ok, self._error,
                               answer_calls_tool(self._tail, self._called_tools)
                               if self._watch else None)
        outcome = replace(outcome, engine_failed=self._engine_failed)
        try:
            await self.attempts.settle(replace(outcome, client_left=True) if client_left
                                       else outcome)
        finally:
            with contextlib.suppress(Exception):
                await self.upstream.aclose()


class SettlingResponse(Response):
    """A complete answer that settles its attempt after the last byte is sent.

    The ticket release, metrics and log line are off the caller's critical path; `finally`
    settles the attempt also when sending fails.
    """

    def __init__(self, content: bytes, attempts: Attempts, outcome: CallOutcome,
                 **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.attempts = attempts
        self.outcome = outcome

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Not shielded: the service's own writes are (a shield here costs a task per call).
            await self.attempts.settle(self.outcome)


# Load options: a call whose values differ from the loaded copy's makes Ollama reload it
# (server/sched.go needsReload), as does a `shift` from 0.30. The sidecar loads every copy
# with Ollama's own values for these, so it leaves them out of what it sends.
RELOADING_OPTIONS = frozenset(("num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread",
                               "draft_num_predict"))
SHIFTING_PATHS = frozenset(("/api/chat", "/api/generate"))  # where Ollama reads `shift`


# Where Ollama cuts a prompt (an embedding's input) longer than the context unless told
# `truncate: false`: then it refuses it (docs/engine.md, "A prompt that does not fit"), which
# the sidecar answers by placing the call again at that size, or by refusing it.
TRUNCATING_PATHS = frozenset(("/api/chat", "/api/generate", "/api/embed"))


# A streamed OpenAI chat answer carries the engine's counts only in a last event the agent
# asks for (`stream_options.include_usage`, middleware/openai.go:144-156; v0.12.6 :90-103);
# without them the sidecar learns nothing of the call. It asks for that event itself and
# drops it from what the agent sees (UsageEventFilter). /v1/completions is left alone: there
# include_usage puts a `usage` in every chunk (:195-197).
USAGE_PATH = "/v1/chat/completions"


def usage_added(path: str, body: dict[str, Any]) -> bool:
    """Whether the sidecar asks for the usage event of this call on the agent's behalf: a
    streamed OpenAI chat whose agent did not ask for it (a `stream_options` that is not an
    object is left for Ollama to refuse)."""
    if path != USAGE_PATH or body.get("stream") is not True:
        return False
    options = body.get("stream_options")
    return options is None or (isinstance(options, dict) and
                               _include_usage(options) in (None, False))  # null: false


def _include_usage(options: dict[str, Any]) -> Any:
    """`include_usage` as Go binds it into openai.StreamOptions: its key matched without
    case (`Include_Usage`), the last of the keys naming it winning."""
    named = [value for key, value in options.items() if go_field_key(key) == "include_usage"]
    return named[-1] if named else None


def _usage_asked(options: Any) -> dict[str, Any]:
    """The agent's stream_options with include_usage set, no other spelling of it left to
    win over it in Go's binding."""
    kept = options if isinstance(options, dict) else {}
    return {**{k: v for k, v in kept.items() if go_field_key(k) != "include_usage"},
            "include_usage": True}


class UsageEventFilter:
    """Drops the usage event (`"choices":[]`, only that event has it: inside a string the
    quotes are escaped) from a server-sent event stream, whatever the chunks' bounds; an
    event is held back only while it is incomplete and could be that one."""

    MARK = b'"choices":[]'

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.pending and chunk.endswith(b"\n\n") and self.MARK not in chunk:
            return chunk
        data = self.pending + chunk
        cut = data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
        complete, self.pending = data[:cut], data[cut:]
        if len(self.pending) > MAX_HELD_ERROR_BYTES:  # far longer than a usage event: not it
            complete, self.pending = data, b""
        if self.MARK not in complete:
            return complete
        events = complete.split(b"\n\n")
        return b"\n\n".join(e for e in events
                             if not (self.MARK in e and e.startswith(b"data: {")))

    def flush(self) -> bytes:
        rest, self.pending = self.pending, b""
        return rest


def payload_for(attempt: Attempt, body: dict[str, Any], path: str = "") -> bytes:
    """The body as the chosen provider gets it: the picked model, num_ctx set to the context
    of the copy planned, no other option that would make Ollama reload it, `truncate` off
    unless the agent asked for it, and `shift` as the engine can take it without a reload."""
    out = {**body, "model": _as_asked(body.get("model"), attempt)}
    if attempt.strip_keep_alive:
        out.pop("keep_alive", None)
    elif past_go_duration(out.get("keep_alive")):
        out["keep_alive"] = -1
    if path in TRUNCATING_PATHS and out.get("truncate") is None:
        out["truncate"] = False
    if usage_added(path, body):
        out["stream_options"] = _usage_asked(body.get("stream_options"))
    if attempt.placement == STATIC:
        return orjson.dumps(out)
    shift = out.pop("shift", None)
    options = out.get("options")
    if isinstance(options, dict) or attempt.num_ctx:
        kept = options if isinstance(options, dict) else {}
        out["options"] = {k: v for k, v in kept.items() if k not in RELOADING_OPTIONS}
        if attempt.num_ctx:
            out["options"]["num_ctx"] = attempt.num_ctx
    if path in SHIFTING_PATHS and shift is not None:
        out.update(shift_payload(attempt, shift, out.get("options")))
    return orjson.dumps(out)


def _as_asked(asked: object, attempt: Attempt) -> str:
    """The model to name to Ollama: the name the agent asked for when the provider has it
    under that name (its own spelling where the engine finds a model under any spelling:
    Ollama echoes the name as the call spelled it, server/routes.go:408, 2985), else the
    provider's own name of the model picked."""
    names = attempt.names_here or (attempt.model,)
    if isinstance(asked, str) and asked:
        ref = split_source(asked)[0] if attempt.reads_source else asked
        for name in names:
            if model_key(ref) == model_key(name):
                # (Before 0.15.5 the manifest is read under the name as spelled: the asked
                # name when it is the same path, the parts Ollama fills in aside, as Ollama
                # then echoes it; the provider's spelling when only the case differs.)
                same_path = ollama_name_parts(ref) == ollama_name_parts(name)
                return asked if attempt.any_spelling or same_path else name
    return names[0]


def shift_payload(attempt: Attempt, shift: object, options: object) -> dict[str, Any]:
    """What stands for the call's `shift` in the body sent. Before 0.30 the engine takes it
    per call: sent as it is. From 0.30 it is a load option (another value reloads the copy),
    so it is left out, and `shift: false` is kept by capping num_predict where the answer
    would reach the end of the context: it stops there with done_reason "length", as Ollama
    ends it without shift, instead of shifting. (A copy whose context is not known cannot
    be capped: there `shift: false` is sent, and Ollama reloads the copy to honour it.)"""
    if not attempt.shift_at_load or (shift is False and not attempt.context_length):
        return {"shift": shift}
    if shift is not False:
        return {}
    cap = unshifted_answer_cap(attempt.context_length, attempt.estimated_tokens)
    kept = dict(options) if isinstance(options, dict) else {}
    asked = kept.get("num_predict")
    if isinstance(asked, bool) or not isinstance(asked, int | float) or not 0 < asked <= cap:
        kept["num_predict"] = cap
    return {"options": kept}


def engine_error(data: bytes) -> str:
    """The message of an error answer in any dialect (Ollama's `error` string, OpenAI's and
    Anthropic's `error.message`); an HTML page's title (an ingress's 502, a sign-in
    proxy's 401); else the start of the body."""
    with contextlib.suppress(orjson.JSONDecodeError):
        body = orjson.loads(data)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str) and error:
            return error[:300]
    return body_excerpt(data) or "no message"


def not_ollamas(content_type: str | None, data: bytes | None) -> str | None:
    """Why a successful answer cannot be Ollama's, or None: Ollama answers JSON, NDJSON or
    (its OpenAI and Anthropic layers) server-sent events. Something else answering at the
    endpoint (an ingress's or a sign-in proxy's HTML page) is the provider's failure, not
    the call's answer."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media and not media.endswith("json") and media != "text/event-stream":
        return f"the answer is {media}, not Ollama's JSON (is something else at the endpoint?)"
    if data is None or media == "text/event-stream" or media.endswith("ndjson"):
        return None
    # Its ends are enough to tell: parsing a whole answer (an embedding's MBs) on every call
    # would cost more than the rest of the relay
    if data[:64].lstrip()[:1] in (b"{", b"[") and data[-64:].rstrip()[-1:] in (b"}", b"]"):
        return None
    return f"the answer is not JSON: {data[:100].decode(errors='replace').strip()!r}"


class ClientGone(Exception):
    """The agent closed its connection before the answer began."""


class AnswerFailed(Exception):
    """The provider answered, then failed or fell silent before its answer was complete."""


@contextlib.asynccontextmanager
async def client_watch(disconnected: Callable[[], Awaitable[None]] | None
                       ) -> AsyncIterator[None]:
    """Cancel what runs inside when the agent leaves, and raise ClientGone instead. Cancelling
    a call to Ollama closes its connection, and Ollama stops. (The work stays on this task: a
    task of its own would cost a loop turn before relaying starts.)"""
    if disconnected is None:
        yield
        return
    current = asyncio.current_task()
    assert current is not None
    active, left = True, False

    async def watch() -> None:
        nonlocal left
        await disconnected()
        if active:
            left = True
            current.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    except asyncio.CancelledError:
        if not left:
            raise  # cancelled from outside (shutdown), not by the agent leaving
        current.uncancel()
        raise ClientGone from None
    finally:
        active = False
        watcher.cancel()


@dataclass(frozen=True)
class Unanswered:
    """An attempt that ended before its answer began: how, and what to answer when no other
    attempt follows."""

    outcome: CallOutcome
    answer: Response


# What a complete answer becomes before the caller has it: its body and media type
Reshape = Callable[[bytes], tuple[bytes, str]]


async def forward(attempts: Attempts, path: str, body: dict[str, Any], stream: bool,
                  chunk_timeout_s: float, dialect: Dialect = "ollama",
                  disconnected: Callable[[], Awaitable[None]] | None = None,
                  reshape: Reshape | None = None) -> Response:
    """Send `body` to each attempt the service places for the call, until one answers (or
    the service has no other), and relay that answer (or the failure); `reshape` turns a
    complete answer (not an error) into what the caller gets."""
    placed = await attempts.first()
    while not isinstance(placed, Refusal):
        try:
            sent = await send_attempt(placed, attempts, path, body, stream, chunk_timeout_s,
                                      dialect, disconnected, reshape)
        except BaseException as exc:
            # Shutdown, or a fault of the relay's own: the ticket must not stay held. Nothing
            # is known of the provider's health.
            await asyncio.shield(attempts.settle(CallOutcome(
                False, 0.0, error=f"relay stopped: {type(exc).__name__}", client_left=True,
                began=False)))
            raise
        if isinstance(sent, Response):
            return sent
        another = await attempts.again(sent.outcome)
        if another is None:
            return sent.answer
        placed = another
    return refusal_response(placed, dialect)


async def send_attempt(attempt: Attempt, attempts: Attempts, path: str, body: dict[str, Any],
                       stream: bool, chunk_timeout_s: float, dialect: Dialect,
                       disconnected: Callable[[], Awaitable[None]] | None,
                       reshape: Reshape | None = None) -> Response | Unanswered:
    """One attempt: its answer, or how it ended before its answer began.

    A provider that fails before any byte of its answer (the connection fails, or it answers
    with a 5xx: a load that ran out of memory, a full queue) ends the attempt unanswered, as
    does one that says it does not have the model (its catalog changed since it was last
    probed; not counted against its health) and an engine that refuses the prompt as longer
    than its context. An agent that leaves before its answer begins (a client timeout
    during a load or a long complete answer) has the call to Ollama cancelled with it.
    """
    started = time.perf_counter()
    sent = _as_asked(body.get("model"), attempt)
    headers = attempt_headers(attempt, cloud_echo(sent) if attempt.placement == CLOUD and
                              attempt.reads_source else sent)

    def failed(cause: str, healthy: bool = False, answer: Response | None = None,
               engine: bool = False, missing: bool = False) -> Unanswered:
        outcome = CallOutcome(healthy, time.perf_counter() - started, error=cause, began=False,
                              engine_failed=engine, model_missing=missing)
        return Unanswered(outcome, answer or error_response(
            502, "upstream-failed", f"provider {attempt.provider} failed before answering: "
            f"{cause}", attempt.model, dialect=dialect))

    async def exchange() -> tuple[UpstreamResponse, bytes | None]:
        """The answer's head, and its whole body unless it is to be streamed."""
        upstream = await attempt.client.open(path, payload_for(attempt, body, path))
        if upstream.status_code < 400 and stream:
            return upstream, None
        try:
            return upstream, await upstream.read()
        except UpstreamError as exc:
            raise AnswerFailed(str(exc)) from exc
        finally:  # read whole, failed, or cancelled as the agent left: the connection is done
            await upstream.aclose()

    # Ollama sends a stream's first chunk once loaded and a complete answer only when done
    # (server/routes.go:2387-2434): a complete answer's limit covers a load and the answer.
    timeouts = attempt.client.timeouts
    limit_s, setting = (timeouts.first_byte_s, "FIRST_BYTE") if stream else \
        (timeouts.answer_s, "ANSWER")
    try:
        async with client_watch(disconnected), asyncio.timeout(limit_s):
            upstream, data = await exchange()
    except UpstreamError as exc:
        return failed(str(exc))
    except TimeoutError:
        cause = f"no answer within {limit_s:g} s (KUBEMOOT_{setting}_TIMEOUT_SECONDS)"
        if stream:  # a stream's first chunk comes once loaded: another card may take it
            return failed(cause)
        # A complete answer past its generous limit: a hung model as far as the card's health
        # goes (its web server still answers probes), and not retried (the agent has waited
        # long already).
        await attempts.settle(CallOutcome(False, time.perf_counter() - started, error=cause,
                                          began=False))
        return error_response(504, "upstream-timeout",
                              f"provider {attempt.provider} accepted the call but sent "
                              f"{cause}", attempt.model, dialect=dialect)
    except AnswerFailed as exc:
        await attempts.settle(CallOutcome(False, time.perf_counter() - started,
                                          error=str(exc)))
        return error_response(502, "upstream-failed",
                              f"provider {attempt.provider} failed while answering: {exc}",
                              attempt.model, dialect=dialect)
    except ClientGone:
        log.info("client went away before its answer began; call to the provider cancelled",
                 provider=attempt.provider, model=attempt.model)
        await attempts.settle(CallOutcome(False, time.perf_counter() - started,
                                          error="client disconnected", client_left=True,
                                          began=False))
        return Response(status_code=499)

    if upstream.status_code < 400 and (alien := not_ollamas(upstream.content_type, data)):
        if data is None:
            await upstream.aclose()
        return failed(f"HTTP {upstream.status_code}: {alien}")
    if data is None:
        attempts.answering()
        return RelayStream(upstream, attempt, attempts, started, chunk_timeout_s, headers,
                           dialect, path, usage_added(path, body))
    media_type = upstream.content_type or "application/json"
    # Ollama fails a legacy embedding input over the context with 500: the input's fault,
    # not the provider's (docs/engine.md, "A prompt that does not fit").
    counted = prompt_too_long(data[:4096].decode(errors="replace")) \
        if upstream.status_code in (400, 500) else None
    message = engine_error(data) if upstream.status_code >= 400 else ""
    # A 500 (501) that is the call's own mistake (a mistyped option, a bad format, an
    # embedding with a model that cannot embed) is relayed as the provider's refusal.
    callers = upstream.status_code in (500, 501) and callers_error(message)
    if upstream.status_code >= 500 and counted is None and not callers:
        # A full queue says nothing of the provider's health: another may take the call.
        return failed(f"HTTP {upstream.status_code}: {message}",
                      healthy=upstream.status_code == 503 and SERVER_BUSY in message,
                      engine=upstream.status_code == 500)
    status = 400 if counted is not None else upstream.status_code
    if status >= 400:  # the provider's own refusal, in the sidecar's shape
        data, media_type = provider_refusal(status, message, sent, dialect, data,
                                            "bad-request" if callers else None), JSON
    if counted is not None:
        # The estimate was short: the call is placed again, sized at what the engine counted
        # (at least the context); the engine's answer is the one to give only if it cannot be.
        at_least = max(counted, attempt.context_length)
        return Unanswered(
            CallOutcome(True, time.perf_counter() - started, at_least,
                        error="prompt longer than the context", prompt_too_long=True),
            Response(data, status_code=400, media_type=media_type, headers=headers))
    if upstream.status_code == 404 and "not found" in message:
        return failed(f"HTTP 404: {message}", healthy=True, missing=True, answer=Response(
            data, status_code=404, media_type=media_type, headers=headers))
    ok = upstream.status_code < 400
    # A 4xx is the caller's problem (bad option, unknown model), not the provider's.
    outcome = outcome_from(final_metrics(data), started, ok, called_tools=answer_calls_tool(
        data, calls_tool(data)) if attempt.watches_tool_calls else None)
    if not ok:
        outcome = CallOutcome(True, outcome.seconds, error=message, began=False)
    elif reshape is not None:
        data, media_type = reshape(data)
    return SettlingResponse(data, attempts, outcome, status_code=upstream.status_code,
                            media_type=media_type, headers=headers)
