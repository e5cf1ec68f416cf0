"""The HTTP adapter and relay against a mocked transport (respx): the edge cases."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import orjson
import pytest
import respx
from starlette.responses import Response, StreamingResponse
from starlette.types import Message

from proxy.adapters.ollama import OllamaClient
from proxy.api.errors import Dialect, responses_failed_event, stream_error_line
from proxy.api.relay import (
    MAX_HELD_ERROR_BYTES,
    ClientGone,
    answer_calls_tool,
    answer_tokens,
    calls_tool,
    client_watch,
    engine_error,
    final_metrics,
    forward,
    outcome_from,
    prompt_tokens,
)
from proxy.ports import Timeouts
from proxy.service.routing import Attempt, CallOutcome
from tests.unit.raw_server import Handler, answering, read_request, serve

BASE = "http://ollama.test:11434"


@pytest.fixture
def upstream() -> respx.Router:
    """The mocked provider, plugged in as the client's transport."""
    return respx.Router(base_url=BASE)


class OneAttempt:
    """The service's side of a call as the relay sees it: one attempt and no other; each
    settled outcome is appended to `outcomes`."""

    def __init__(self, attempt: Attempt, outcomes: list[CallOutcome]) -> None:
        self.attempt = attempt
        self.outcomes = outcomes
        self.settled = False
        self.answering_told = 0

    async def first(self) -> Attempt:
        return self.attempt

    async def again(self, outcome: CallOutcome) -> None:
        await self.settle(outcome)

    async def settle(self, outcome: CallOutcome) -> None:
        if not self.settled:
            self.settled = True
            self.outcomes.append(outcome)

    def answering(self) -> None:
        self.answering_told += 1


def _attempts(outcomes: list[CallOutcome], upstream: respx.Router, watch: bool = False
              ) -> OneAttempt:
    client = OllamaClient(BASE, Timeouts(1, 1, 1), httpx.MockTransport(upstream.async_handler))
    return OneAttempt(Attempt("p", client, "m", "warm", watches_tool_calls=watch), outcomes)


async def _deliver(response: Response, fail_send: bool = False,
                   on_send: Callable[[Message], None] | None = None,
                   slow_send_s: float = 0.0) -> list[Message]:
    """Run the response as the server would, for a client that stays; what it sent."""
    sent: list[Message] = []

    async def receive() -> Message:
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def send(message: Message) -> None:
        if fail_send:
            raise OSError("client socket gone")
        if on_send is not None:
            on_send(message)
        if slow_send_s and message["type"] == "http.response.body":
            await asyncio.sleep(slow_send_s)
        sent.append(message)

    await response({"type": "http", "method": "POST", "path": "/"}, receive, send)
    return sent


@pytest.mark.parametrize(("status", "message"), [
    (400, '"m" does not support thinking'),
    (404, "model 'm' not found"),  # with no other provider to hand it to
])
async def test_upstream_4xx_is_relayed_and_is_not_a_provider_failure(
        upstream: respx.Router, status: int, message: str) -> None:
    upstream.post(f"{BASE}/api/chat").mock(return_value=httpx.Response(
        status, json={"error": message}))
    outcomes: list[CallOutcome] = []
    response = await forward(_attempts(outcomes, upstream), "/api/chat", {"model": "m"}, True, 1)
    assert response.status_code == status
    assert orjson.loads(response.body)["error"] == message
    await _deliver(response)
    assert outcomes[0].healthy  # the provider is healthy; the circuit must not count it
    assert outcomes[0].error is not None and message in outcomes[0].error


async def test_upstream_5xx_is_a_provider_failure_answered_as_upstream_failed(
        upstream: respx.Router) -> None:
    upstream.post(f"{BASE}/api/chat").mock(return_value=httpx.Response(
        500, json={"error": "model requires more system memory (9.1 GiB) than is available"}))
    outcomes: list[CallOutcome] = []
    response = await forward(_attempts(outcomes, upstream), "/api/chat", {"model": "m"}, True, 1)
    body = orjson.loads(response.body)
    assert response.status_code == 502 and body["reason"] == "upstream-failed"
    assert "HTTP 500: model requires more system memory" in body["error"]
    assert not outcomes[0].healthy  # counted by the circuit breaker


@pytest.mark.parametrize(("answer", "message"), [
    (b'{"error": "server busy, please try again."}', "server busy, please try again."),
    (b'{"error": {"message": "overloaded", "type": "server_error"}}', "overloaded"),
    (b'{"type": "error", "error": {"type": "api_error", "message": "boom"}}', "boom"),
    (b"<html>Bad Gateway</html>", "<html>Bad Gateway</html>"),
    (b"", "no message"),
])
def test_an_engines_error_message_is_read_in_every_dialect(answer: bytes, message: str
                                                          ) -> None:
    assert engine_error(answer) == message


async def test_connect_error_is_502_upstream_failed(upstream: respx.Router) -> None:
    upstream.post(f"{BASE}/api/chat").mock(side_effect=httpx.ConnectError("refused"))
    outcomes: list[CallOutcome] = []
    response = await forward(_attempts(outcomes, upstream), "/api/chat", {"model": "m"}, True, 1)
    assert response.status_code == 502
    assert orjson.loads(response.body)["reason"] == "upstream-failed"
    assert not outcomes[0].healthy


async def test_an_attempt_is_settled_when_the_relay_itself_fails(
        upstream: respx.Router) -> None:
    upstream.post(f"{BASE}/api/chat").mock(side_effect=RuntimeError("a fault of our own"))
    outcomes: list[CallOutcome] = []
    with pytest.raises(RuntimeError):
        await forward(_attempts(outcomes, upstream), "/api/chat", {"model": "m"}, True, 1)
    assert len(outcomes) == 1 and outcomes[0].client_left  # released, not held to shutdown


async def test_non_streaming_reports_engine_metrics(upstream: respx.Router) -> None:
    final = {"model": "m", "done": True, "prompt_eval_count": 42, "load_duration": 2_000_000_000}
    upstream.post(f"{BASE}/api/chat").mock(return_value=httpx.Response(200, json=final))
    outcomes: list[CallOutcome] = []
    response = await forward(_attempts(outcomes, upstream), "/api/chat", {"model": "m"}, False, 1)
    assert response.status_code == 200
    assert outcomes == []  # the answer goes out first; the route settles after it
    sent = await _deliver(response)
    assert orjson.loads(sent[-1]["body"])["prompt_eval_count"] == 42
    assert outcomes[0].prompt_eval_count == 42 and outcomes[0].load_seconds == 2.0


async def test_a_complete_answer_settles_its_route_even_when_sending_fails(
        upstream: respx.Router) -> None:
    upstream.post(f"{BASE}/api/chat").mock(return_value=httpx.Response(200, json={"done": True}))
    outcomes: list[CallOutcome] = []
    response = await forward(_attempts(outcomes, upstream), "/api/chat", {"model": "m"}, False, 1)
    with pytest.raises(OSError):
        await _deliver(response, fail_send=True)
    assert len(outcomes) == 1 and outcomes[0].healthy


async def test_streaming_returns_a_stream_with_attempt_headers(upstream: respx.Router) -> None:
    upstream.post(f"{BASE}/api/chat").mock(return_value=httpx.Response(
        200, content=b'{"done":false}\n{"done":true,"prompt_eval_count":3}\n'))
    outcomes: list[CallOutcome] = []
    attempts = _attempts(outcomes, upstream)
    response = await forward(attempts, "/api/chat", {"model": "m"}, True, 1)
    assert isinstance(response, StreamingResponse)
    assert response.headers["x-kubemoot-provider"] == "p"
    assert response.headers["x-kubemoot-placement"] == "warm"
    assert attempts.answering_told == 1  # the stream began: its card serves (a trial's proof)


def _chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)


NDJSON_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\n"
               b"transfer-encoding: chunked\r\n\r\n")


async def _stream_through(server: Handler, limit_s: float, outcomes: list[CallOutcome],
                          on_send: Callable[[Message], None] | None = None,
                          slow_client_s: float = 0.0, watch: bool = False
                          ) -> tuple[list[Message], float]:
    """Stream one call from `server` through `forward` to a client; what the client was sent
    and how long it took. Each settled outcome is appended to `outcomes`."""

    async for url in serve(server):
        client = OllamaClient(url, Timeouts(1, 1, limit_s))
        attempt = Attempt("p", client, "m", "warm", watches_tool_calls=watch)
        response = await forward(OneAttempt(attempt, outcomes),
                                 "/api/chat", {"model": "m"}, True, limit_s)
        started = time.monotonic()
        sent = await _deliver(response, on_send=on_send, slow_send_s=slow_client_s)
        took = time.monotonic() - started
        await client.close()
    return sent, took


async def test_a_stream_settles_before_its_end_reaches_the_client() -> None:
    body = b'{"done":false}\n{"done":true,"prompt_eval_count":3}\n'
    outcomes: list[CallOutcome] = []
    settled_at_end: list[bool] = []

    def check(message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            settled_at_end.append(len(outcomes) == 1)

    await _stream_through(answering(NDJSON_HEAD + _chunked(body, b"")), 1, outcomes,
                          on_send=check)
    # The client's next call may come as soon as the stream ends: the ticket must be gone.
    assert settled_at_end == [True] and outcomes[0].prompt_eval_count == 3


class SlowSettle(OneAttempt):
    async def settle(self, outcome: CallOutcome) -> None:
        await asyncio.sleep(0.05)  # the ticket's release written to the store
        await super().settle(outcome)


@pytest.mark.parametrize("last", [b'{"done":true,"prompt_eval_count":3}\n',
                                  b'{"error":"CUDA error: out of memory"}\n'])
async def test_a_client_that_leaves_once_it_has_the_last_event_lets_the_call_settle(
        last: bytes) -> None:
    """An agent may close the connection as soon as it has read the answer's last event (the
    openai client at `[DONE]`), or an error line, while the call settles: what the call
    taught, or what its failure says of the card, must not be lost with it."""
    body = b'{"done":false}\n' + last
    outcomes: list[CallOutcome] = []
    last_sent = asyncio.Event()

    async def receive() -> Message:
        await last_sent.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if last[:8] in message.get("body", b""):
            last_sent.set()
            await asyncio.sleep(0.01)  # the client reads it and leaves

    async for url in serve(answering(NDJSON_HEAD + _chunked(body, b""))):
        client = OllamaClient(url, Timeouts(1, 1, 1))
        response = await forward(SlowSettle(Attempt("p", client, "m", "warm"), outcomes),
                                 "/api/chat", {"model": "m"}, True, 1)
        await response({"type": "http", "method": "POST", "path": "/"}, receive, send)
        await client.close()
    assert len(outcomes) == 1
    if b"error" in last:
        assert not outcomes[0].healthy and "out of memory" in (outcomes[0].error or "")
    else:
        assert outcomes[0].healthy and outcomes[0].prompt_eval_count == 3


CONTENT = b'{"message":{"role":"assistant","content":"the "},"done":false}\n'
NESTED = (b'{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":'
          b'"f","arguments":{"error":"x"}}}]},"done":false}\n')
INSIDE = NESTED.index(b'{"error"')  # a chunk may begin there: not a line of its own
DIED = b'{"error":"an error was encountered while running the model: unexpected EOF"}\n'


@pytest.mark.parametrize("parts", [
    (CONTENT, DIED),  # each line a chunk, as Ollama flushes them
    (CONTENT + DIED,),  # both in one chunk
    (CONTENT, DIED[:20], DIED[20:]),  # the error line cut in two
    (CONTENT[:30], CONTENT[30:] + DIED[:5], DIED[5:]),
    (NESTED[:INSIDE], NESTED[INSIDE:], DIED),
])
async def test_ollamas_own_error_line_ends_the_stream_with_the_reason(
        parts: tuple[bytes, ...]) -> None:
    """Ollama ends a stream whose runner died with a line of its own (server/routes.go:
    2116-2124): the agent gets its message with the `reason` of any failure after the
    stream began (CONTRACT.md), and nothing else of the stream is changed."""
    outcomes: list[CallOutcome] = []
    sent, _ = await _stream_through(answering(NDJSON_HEAD + _chunked(*parts, b"")), 1,
                                    outcomes)
    body = b"".join(m.get("body", b"") for m in sent)
    upstream = b"".join(parts)
    assert body == upstream.removesuffix(DIED) + (
        b'{"error":"an error was encountered while running the model: unexpected EOF",'
        b'"reason":"upstream-failed"}\n')
    assert not outcomes[0].healthy and "unexpected EOF" in str(outcomes[0].error)


async def test_a_long_stream_that_begins_like_the_error_line_reaches_the_agent_as_it_came(
        ) -> None:
    """An upstream that starts a line with `{"error":` and streams on past
    MAX_HELD_ERROR_BYTES is not ending: what was held goes out unchanged, no reason added."""
    pieces = [DIED] + [CONTENT] * (MAX_HELD_ERROR_BYTES // len(CONTENT) + 2) + [
        b'{"message":{"role":"assistant","content":""},"done":true}\n']
    sent, _ = await _stream_through(answering(NDJSON_HEAD + _chunked(*pieces, b"")), 1, [])
    assert b"".join(m.get("body", b"") for m in sent) == b"".join(pieces)


@pytest.mark.parametrize(("answer", "called"), [
    (b'{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"ls",'
     b'"arguments":{}}}]},"done":false}', True),  # Ollama
    (b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":'
     b'[{"id":"c1","index":0,"type":"function"}]}}]}', True),  # OpenAI chat
    (b'data: {"type":"content_block_start","index":1,"content_block":{"type":"tool_use",'
     b'"id":"t1","name":"ls","input":{}}}', True),  # Anthropic
    (b'data: {"type":"response.output_item.added","item":{"type":"function_call",'
     b'"name":"ls"}}', True),  # the Responses API
    (b'{"message":{"role":"assistant","content":"Done."},"done":true}', False),
    # the model writing the words: escaped inside the text
    (b'{"message":{"role":"assistant","content":"no \\"tool_calls\\" needed"},"done":true}',
     False),
    (b'data: {"type":"response.function_call_arguments.delta","delta":"{}"}', False),
    # the Responses API's events echo the request's tools, whatever their names
    (b'data: {"type":"response.completed","response":{"tools":[{"type":"function",'
     b'"name":"function_call"}],"output":[{"type":"message"}]}}', False),
])
def test_an_answer_calling_a_tool_is_recognised_in_every_dialect(answer: bytes, called: bool
                                                                 ) -> None:
    assert calls_tool(answer) is called


async def test_a_streamed_answer_says_whether_it_called_a_tool_though_a_chunk_cuts_the_mark(
) -> None:
    line = b'{"message":{"content":"","tool_calls":[{"function":{"name":"ls"}}]}}\n'
    cut = line.index(b"tool_calls") + 4
    end = b'{"done":true,"done_reason":"stop","prompt_eval_count":3}\n'
    outcomes: list[CallOutcome] = []

    async def stream(*chunks: bytes, watch: bool = True) -> None:
        await _stream_through(answering(NDJSON_HEAD + _chunked(*chunks, b"")), 1, outcomes,
                              watch=watch)

    await stream(line[:cut], line[cut:], end)
    plain = b'{"message":{"content":"Done."}}\n'
    await stream(plain, end)
    # a tool call whole in one chunk longer than the tail kept for the closing figures
    await stream(line.replace(b'"ls"', b'"write","arguments":{"text":"%s"}' % (b"x" * 20000)),
                 end)
    # cut at its token cap: a tool call may have been cut off, so nothing is said
    await stream(plain, end.replace(b'"stop"', b'"length"'))
    await stream(plain, end, watch=False)  # not a loop's step: not read
    assert [o.called_tools for o in outcomes] == [True, False, True, None, None]


async def test_a_complete_answer_says_whether_it_called_a_tool(upstream: respx.Router) -> None:
    outcomes: list[CallOutcome] = []
    for message, reason in (({"content": "", "tool_calls": [{"function": {"name": "ls"}}]},
                             "stop"), ({"content": "Done."}, "stop"),
                            ({"content": "Don"}, "length")):
        upstream.post(f"{BASE}/api/chat").mock(return_value=httpx.Response(
            200, json={"message": message, "done": True, "done_reason": reason}))
        await _deliver(await forward(_attempts(outcomes, upstream, watch=True), "/api/chat",
                                     {"model": "m"}, False, 1))
    assert [o.called_tools for o in outcomes] == [True, False, None]


@pytest.mark.parametrize("closing", [
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}',  # OpenAI
    b'data: {"type":"message_delta","delta":{"stop_reason":"max_tokens"}}',  # Anthropic
    b'data: {"type":"response.incomplete","response":{"status":"incomplete"}}',  # Responses
])
def test_an_answer_cut_at_its_token_cap_says_nothing_of_tool_calls(closing: bytes) -> None:
    assert answer_calls_tool(closing, called=False) is None
    assert answer_calls_tool(closing, called=True) is True


def test_a_failed_answer_says_nothing_of_tool_calls() -> None:
    # (a stream that broke off, timed out or lost its client: no loop is taken as ended)
    assert outcome_from({}, time.perf_counter(), False, "mid-stream", False).called_tools is None


async def test_a_stalled_stream_ends_with_an_error_line_after_the_chunk_timeout() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(NDJSON_HEAD + _chunked(b'{"done":false}\n'))
        await writer.drain()
        with contextlib.suppress(TimeoutError):  # the GPU hangs mid-answer
            await asyncio.wait_for(reader.read(), 5)  # until the sidecar hangs up
        writer.close()

    outcomes: list[CallOutcome] = []
    sent, took = await _stream_through(stalls, 0.2, outcomes)
    body = b"".join(m.get("body", b"") for m in sent)
    assert body.startswith(b'{"done":false}\n') and b"no data for 0.2 s" in body
    assert 0.15 < took < 1.5
    assert len(outcomes) == 1 and not outcomes[0].healthy


async def test_a_slow_client_is_not_taken_for_a_stalled_provider() -> None:
    parts = [b'{"done":false}\n'] * 3 + [b'{"done":true,"prompt_eval_count":3}\n']

    async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(NDJSON_HEAD)
        for part in [*parts, b""]:
            writer.write(_chunked(part))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.close()

    outcomes: list[CallOutcome] = []
    sent, took = await _stream_through(answers, 0.1, outcomes, slow_client_s=0.15)
    assert took > 0.25  # the client took longer than the limit to take each chunk
    assert b"".join(m.get("body", b"") for m in sent) == b"".join(parts)
    assert outcomes[0].healthy and outcomes[0].prompt_eval_count == 3


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        (b'{"a":1}\n{"done":true,"prompt_eval_count":5}\n', 5),
        (b'{"done":true,"prompt_eval_count":9}', 9),
        (b'garbage\n', None),
        (b'data: {"x":1}\n\ndata: {"prompt_eval_count":4}\n\ndata: [DONE]\n\n', 4),
    ],
)
def test_final_metrics_reads_the_last_line(tail: bytes, expected: int | None) -> None:
    assert final_metrics(tail).get("prompt_eval_count") == expected


def test_the_counts_of_a_closing_line_cut_at_its_start_are_read_from_what_is_left() -> None:
    """A streamed /api/generate's last line carries its `context` before the metrics; a long
    one reaches final_metrics without its start. A count named inside a string is not one."""
    cut = (b'9,151000,7],"total_duration":9,"prompt_eval_count":3755,"eval_count":5,'
           b'"eval_duration":2}\n')
    metrics = final_metrics(cut)
    assert (prompt_tokens(metrics), answer_tokens(metrics)) == (3755, 5)
    assert outcome_from(metrics, 0.0, True).answer_seconds == 2e-09
    responses = b'ext \\"input_tokens\\":7","usage":{"input_tokens":30,"output_tokens":2}}}\n\n'
    assert (prompt_tokens(final_metrics(responses)), answer_tokens(final_metrics(responses))) \
        == (30, 2)
    assert final_metrics(b'3,4,5,6') == {}
    assert final_metrics(b'ords \\"eval_count\\":99 and"}],"done":false}\n') == {}


def test_a_cut_closing_line_counts_only_its_own_figures_not_a_tool_calls() -> None:
    """A streamed /api/generate's done line carries the tool calls a built-in parser found
    after its metrics (api/types.go GenerateResponse: Metrics, then ToolCalls; server/
    routes.go GenerateHandler sets them on the done chunk), their arguments a JSON object."""
    cut = (b'9,151000,7],"total_duration":9,"prompt_eval_count":3755,"eval_count":5,'
           b'"eval_duration":2,"tool_calls":[{"function":{"name":"report","arguments":'
           b'{"eval_count":3,"prompt_eval_count":1,"usage":{"input_tokens":8}}}}]}\n')
    metrics = final_metrics(cut)
    assert (prompt_tokens(metrics), answer_tokens(metrics)) == (3755, 5)
    assert "usage" not in metrics
    # the usage block of a Responses stream's closing event, nested in its `response`
    responses = (b'ls":[]}],"usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens"'
                 b':0},"output_tokens":2},"tools":[{"parameters":{"output_tokens":1}}]}}\n\n')
    assert (prompt_tokens(final_metrics(responses)), answer_tokens(final_metrics(responses))) \
        == (30, 2)


def test_the_counts_are_found_before_anthropics_closing_event() -> None:
    tail = (b'event: message_delta\ndata: {"type":"message_delta","usage":{"input_tokens":12,'
            b'"output_tokens":5}}\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert prompt_tokens(final_metrics(tail)) == 12
    completed = (b'event: response.completed\ndata: {"type":"response.completed","response":'
                 b'{"status":"completed","usage":{"input_tokens":30,"output_tokens":2}}}\n\n')
    assert prompt_tokens(final_metrics(completed)) == 30
    assert (answer_tokens(final_metrics(tail)), answer_tokens(final_metrics(completed))) == (5, 2)


def test_the_outcome_carries_the_engine_s_counts_and_durations() -> None:
    final = {"done": True, "prompt_eval_count": 800, "prompt_eval_duration": 400_000_000,
             "eval_count": 120, "eval_duration": 3_000_000_000, "load_duration": 2_000_000}
    outcome = outcome_from(final, 0.0, True)
    assert (outcome.prompt_eval_count, outcome.prompt_seconds, outcome.answer_tokens,
            outcome.answer_seconds, outcome.load_seconds) == (800, 0.4, 120, 3.0, 0.002)
    openai = {"usage": {"prompt_tokens": 10, "completion_tokens": 7}}
    assert outcome_from(openai, 0.0, True).answer_tokens == 7
    assert outcome_from(final, 0.0, False).answer_tokens is None  # a failure tells nothing


@pytest.mark.parametrize(
    ("dialect", "expected"),
    [
        ("ollama", b'{"error":"gone","reason":"upstream-failed"}\n'),
        ("openai", b'data: {"error":{"message":"gone","type":"api_error","param":null,'
                   b'"code":null},"reason":"upstream-failed"}\n\n'),
        ("anthropic", b'event: error\ndata: {"type":"error","error":{"type":"api_error",'
                      b'"message":"gone"},"reason":"upstream-failed"}\n\n'),
    ],
)
def test_a_stream_ends_with_an_error_its_client_reads(dialect: Dialect, expected: bytes
                                                      ) -> None:
    assert stream_error_line("gone", dialect) == expected


@pytest.mark.parametrize(
    ("final", "expected"),
    [
        ({"done": True, "prompt_eval_count": 7}, 7),
        ({"object": "chat.completion", "usage": {"prompt_tokens": 11, "total_tokens": 15}}, 11),
        ({"object": "chat.completion.chunk", "choices": []}, None),  # no include_usage
    ],
)
def test_the_prompt_count_is_read_from_ollamas_and_openais_answers(
        final: dict[str, Any], expected: int | None) -> None:
    assert outcome_from(final, 0.0, ok=True).prompt_eval_count == expected


async def test_client_watch_turns_the_agent_leaving_into_client_gone_and_nothing_else(
        ) -> None:
    left = asyncio.Event()

    async def disconnected() -> None:
        await left.wait()

    async with client_watch(disconnected):  # work done first: no stray cancellation after
        await asyncio.sleep(0)
    left.set()
    await asyncio.sleep(0.01)  # would raise CancelledError here if one had leaked

    stopped = asyncio.Event()

    async def long_call() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            stopped.set()  # what closes the connection to Ollama

    with pytest.raises(ClientGone):
        async with client_watch(disconnected):
            await long_call()
    assert stopped.is_set()

    async def shut_down() -> None:
        async with client_watch(asyncio.Event().wait):
            await asyncio.sleep(10)

    task = asyncio.ensure_future(shut_down())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):  # cancelled from outside stays a cancellation
        await task


def test_a_placed_call_carries_the_copys_num_ctx_and_no_option_that_reloads() -> None:
    from proxy.api.relay import payload_for

    route = Attempt("p", OllamaClient(BASE), "qwen3:8b", "warm", num_ctx=16384)
    body = {"model": "x", "messages": [], "shift": False,
            "options": {"num_ctx": 4096, "num_batch": 1024, "num_gpu": 20, "main_gpu": 1,
                        "use_mmap": False, "num_thread": 8, "temperature": 0.2}}
    sent = orjson.loads(payload_for(route, body))
    assert sent["model"] == "qwen3:8b" and "shift" not in sent
    assert sent["options"] == {"num_ctx": 16384, "temperature": 0.2}
    no_options = orjson.loads(payload_for(route, {"model": "x", "messages": []}))
    assert no_options["options"] == {"num_ctx": 16384}
    untouched = Attempt("p", OllamaClient(BASE), "qwen3:8b", "static")
    assert orjson.loads(payload_for(untouched, body))["options"] == body["options"]


def test_the_usage_event_asked_for_leaves_no_spelling_of_it_that_go_would_bind_last() -> None:
    from proxy.api.relay import payload_for

    route = Attempt("p", OllamaClient(BASE), "qwen3:8b", "warm")
    body = {"model": "x", "messages": [], "stream": True,
            "stream_options": {"include_usage": False, "Include_Usage": False, "x": 1}}
    sent = orjson.loads(payload_for(route, body, "/v1/chat/completions"))
    assert sent["stream_options"] == {"x": 1, "include_usage": True}


@pytest.mark.parametrize("placement", ["warm", "static"])
def test_ollama_is_told_not_to_cut_a_prompt_unless_the_agent_asked(placement: str) -> None:
    from proxy.api.relay import payload_for

    route = Attempt("p", OllamaClient(BASE), "qwen3:8b", placement)
    body = {"model": "x", "messages": []}
    for path in ("/api/chat", "/api/generate", "/api/embed"):
        assert orjson.loads(payload_for(route, body, path))["truncate"] is False
        asked = orjson.loads(payload_for(route, {**body, "truncate": True}, path))
        assert asked["truncate"] is True
    # (Ollama's OpenAI API has no such field, nor its legacy embeddings path: it never cuts)
    for path in ("/v1/chat/completions", "/v1/embeddings", "/api/embeddings"):
        assert "truncate" not in orjson.loads(payload_for(route, body, path))


@pytest.mark.parametrize(("message", "count"), [
    ("the prompt is longer than the context length currently available to the model; "
     "shorten the prompt, adjust the context length in settings, or use a model with a "
     "longer context length", 0),
    ('{"error":{"code":400,"message":"request (5012 tokens) exceeds the available context '
     'size (4096 tokens), try increasing it","type":"exceed_context_size_error",'
     '"n_prompt_tokens":5012,"n_ctx":4096}}', 5012),
    ("the input length exceeds the context length", 0),
    ("model 'x' not found", None),
])
def test_an_engines_refusal_of_an_over_long_prompt_is_recognised(message: str,
                                                                 count: int | None) -> None:
    from proxy.core.engine_errors import prompt_too_long

    assert prompt_too_long(message) == count


def _answering_after(delay_s: float, raw: bytes) -> Handler:
    """A server that reads one request and answers it `delay_s` later, as Ollama answers a
    complete (non-streamed) call only once it is done (or a stream once the model is loaded)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        with contextlib.suppress(TimeoutError):  # until the answer is due or the caller hangs up
            await asyncio.wait_for(reader.read(), delay_s)
        with contextlib.suppress(ConnectionError):
            writer.write(raw)
            await writer.drain()
        writer.close()

    return answer


COMPLETE = (b'{"model":"m","done":true,"prompt_eval_count":7,"eval_count":2,'
            b'"message":{"role":"assistant","content":"ok"}}')
COMPLETE_ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                   b"content-length: %d\r\n\r\n%s" % (len(COMPLETE), COMPLETE))


class NoRetry(OneAttempt):
    """One attempt whose failures must not be handed back for another."""

    async def again(self, outcome: CallOutcome) -> None:
        raise AssertionError(f"a timed-out call was handed back for a retry: {outcome}")


async def _call(server: Handler, stream: bool, timeouts: Timeouts,
                outcomes: list[CallOutcome], retry: bool = False) -> tuple[Response, float]:
    async for url in serve(server):
        attempt = Attempt("p", OllamaClient(url, timeouts), "m", "warm")
        attempts = OneAttempt(attempt, outcomes) if retry else NoRetry(attempt, outcomes)
        started = time.monotonic()
        response = await forward(attempts, "/api/chat", {"model": "m"}, stream,
                                 timeouts.chunk_s)
        took = time.monotonic() - started
        await _deliver(response)
        return response, took
    raise AssertionError("unreachable")


async def test_a_complete_answer_longer_than_the_first_byte_limit_is_relayed() -> None:
    """Ollama writes a non-streamed answer only when it is done: the first-byte limit (0.2 s)
    does not cut it; the answer limit (3 s) bounds it."""
    outcomes: list[CallOutcome] = []
    response, _ = await _call(_answering_after(0.6, COMPLETE_ANSWER), False,
                              Timeouts(1, 0.2, 1, answer_s=3), outcomes)
    assert response.status_code == 200 and response.body == COMPLETE
    assert outcomes[0].healthy and outcomes[0].prompt_eval_count == 7


async def test_a_complete_answer_unanswered_within_its_limit_is_a_504_not_retried() -> None:
    """Its ticket is released (settled once), it is not handed back for a retry elsewhere
    (the agent has waited long), and it is the card's failure: a hung model behind a web
    server that still answers its probes."""
    outcomes: list[CallOutcome] = []
    response, took = await _call(_answering_after(5, COMPLETE_ANSWER), False,
                                 Timeouts(1, 0.2, 1, answer_s=0.4), outcomes)
    body = orjson.loads(response.body)
    assert (response.status_code, body["reason"], body["model"]) == (504, "upstream-timeout",
                                                                     "m")
    assert "no answer within 0.4 s (KUBEMOOT_ANSWER_TIMEOUT_SECONDS)" in body["error"]
    assert 0.4 <= took < 0.9
    assert len(outcomes) == 1 and not outcomes[0].healthy and not outcomes[0].client_left


async def test_a_stream_without_its_first_chunk_in_time_fails_before_answering() -> None:
    """A stream's first chunk comes once the model is loaded: past the limit the attempt is
    handed back as the card's failure, for another card to take (502 when none does)."""
    outcomes: list[CallOutcome] = []
    response, took = await _call(_answering_after(5, COMPLETE_ANSWER), True,
                                 Timeouts(1, 0.2, 1, answer_s=0.4), outcomes, retry=True)
    body = orjson.loads(response.body)
    assert (response.status_code, body["reason"]) == (502, "upstream-failed")
    assert "no answer within 0.2 s (KUBEMOOT_FIRST_BYTE_TIMEOUT_SECONDS)" in body["error"]
    assert 0.2 <= took < 0.7
    assert len(outcomes) == 1 and not outcomes[0].healthy and not outcomes[0].began


async def test_a_stream_that_falls_silent_is_a_failed_call() -> None:
    async def stalls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(NDJSON_HEAD + _chunked(b'{"done":false}\n'))
        await writer.drain()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader.read(), 5)
        writer.close()

    outcomes: list[CallOutcome] = []
    await _stream_through(stalls, 0.2, outcomes)
    assert not outcomes[0].healthy and not outcomes[0].client_left
    assert "no data for 0.2 s" in str(outcomes[0].error)


@pytest.mark.parametrize("message", [
    'option "stop" must be of type array',
    'invalid format: "yaml"; expected "json" or a valid JSON Schema object',
    "invalid JSON schema in format",
    'template: :3:8: executing "" at <.Foo>: can\'t evaluate field Foo in type *api.Message',
])
async def test_an_engines_500_that_is_the_callers_mistake_is_relayed_not_a_failure(
        upstream: respx.Router, message: str) -> None:
    """Ollama answers these 500 (server/routes.go:3107-3119's default; llm/llama_server.go:
    1594; server/routes.go:2701-2704): relayed with its status and message, not handed back
    for a retry elsewhere, and not counted against the provider."""
    upstream.post(f"{BASE}/api/chat").mock(return_value=httpx.Response(
        500, json={"error": message}))
    outcomes: list[CallOutcome] = []
    client = OllamaClient(BASE, Timeouts(1, 1, 1), httpx.MockTransport(upstream.async_handler))
    response = await forward(NoRetry(Attempt("p", client, "m", "warm"), outcomes),
                             "/api/chat", {"model": "m"}, False, 1)
    body = orjson.loads(response.body)
    assert (response.status_code, body["error"], body["reason"]) == (500, message,
                                                                     "bad-request")
    await _deliver(response)
    assert len(outcomes) == 1 and outcomes[0].healthy and not outcomes[0].began


SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"the"}}]}\n\n'
EMPTY = b'data: {"choices":[{"index":0,"delta":{"content":""}}]}\n\n'  # the error, as sent
FINISH = (b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":4,"completion_tokens":1}}\n\n')


ANTHROPIC_TEXT = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
                  b'"delta":{"type":"text_delta","text":"the"}}\n\n')
ANTHROPIC_STOP = (b'event: message_delta\ndata: {"type":"message_delta","usage":'
                  b'{"input_tokens":4,"output_tokens":1}}\n\nevent: message_stop\n'
                  b'data: {"type":"message_stop"}\n\n')
RESPONSES_TEXT = (b'event: response.output_text.delta\ndata: {"type":'
                  b'"response.output_text.delta","delta":"the"}\n\n')
RESPONSES_DONE = (b'event: response.completed\ndata: {"type":"response.completed","response":'
                  b'{"usage":{"input_tokens":4,"output_tokens":1}}}\n\n')


@pytest.mark.parametrize(("path", "dialect", "parts", "ok"), [
    ("/v1/chat/completions", "openai", (CHUNK, FINISH, b"data: [DONE]\n\n"), True),
    # Ollama's error mid-stream through its OpenAI layer: an empty chunk, no [DONE]
    ("/v1/chat/completions", "openai", (CHUNK, EMPTY), False),
    ("/v1/completions", "openai", (CHUNK, EMPTY), False),
    # its end event split between two chunks is still its end
    ("/v1/messages", "anthropic", (ANTHROPIC_TEXT, ANTHROPIC_STOP[:70], ANTHROPIC_STOP[70:]),
     True),
    ("/v1/messages", "anthropic", (ANTHROPIC_TEXT,), False),
    ("/v1/responses", "openai", (RESPONSES_TEXT, RESPONSES_DONE), True),
    ("/v1/responses", "openai", (RESPONSES_TEXT,), False),
])
async def test_an_sdk_stream_that_ends_without_its_end_event_is_a_failed_call(
        path: str, dialect: Dialect, parts: tuple[bytes, ...], ok: bool) -> None:
    outcomes: list[CallOutcome] = []
    async for url in serve(answering(SSE_HEAD + _chunked(*parts, b""))):
        attempt = Attempt("p", OllamaClient(url, Timeouts(1, 1, 1)), "m", "warm")
        response = await forward(OneAttempt(attempt, outcomes), path,
                                 {"model": "m", "stream": True}, True, 1, dialect=dialect)
        body = b"".join(m.get("body", b"") for m in await _deliver(response))
    assert body.startswith(b"".join(parts))
    assert outcomes[0].healthy is ok
    if not ok:  # the agent's SDK hears of it as an error event (the Responses API's own)
        sent = b"".join(parts)
        ending = responses_failed_event(str(outcomes[0].error), sent, sent) \
            if path == "/v1/responses" else stream_error_line(str(outcomes[0].error), dialect)
        assert body.endswith(ending)
        assert "ended the stream without" in str(outcomes[0].error)


RESPONSES_OPEN = (b'event: response.created\ndata: {"response":{"id":"resp_7","model":"m",'
                  b'"status":"in_progress"},"sequence_number":0,"type":"response.created"}\n\n')
RESPONSES_FAILED = (b'event: response.failed\ndata: {"response":{"error":{"code":'
                    b'"authentication_error","message":"unauthorized"},"id":"resp_7",'
                    b'"status":"failed"},"sequence_number":3,"type":"response.failed"}\n\n')


async def test_a_responses_stream_cut_mid_answer_ends_with_its_apis_failed_event() -> None:
    """The Responses API's own end of a failed stream (openai/responses.go ResponseFailed):
    `response.failed`, numbered after the last event, naming the response `response.created`
    opened; OpenAI's `error` beside it, which the openai clients raise on."""
    outcomes: list[CallOutcome] = []
    text = RESPONSES_TEXT.replace(b'"delta":"the"', b'"delta":"the","sequence_number":2')
    async for url in serve(answering(SSE_HEAD + _chunked(RESPONSES_OPEN, text, b""))):
        attempt = Attempt("p", OllamaClient(url, Timeouts(1, 1, 1)), "m", "warm")
        response = await forward(OneAttempt(attempt, outcomes), "/v1/responses",
                                 {"model": "m", "stream": True}, True, 1, dialect="openai")
        body = b"".join(m.get("body", b"") for m in await _deliver(response))
    event, data = body.removeprefix(RESPONSES_OPEN + text).split(b"\n", 1)
    failed = orjson.loads(data.removeprefix(b"data: "))
    assert event == b"event: response.failed" and failed["sequence_number"] == 3
    assert failed["response"]["id"] == "resp_7" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["message"] == failed["error"]["message"] == str(
        outcomes[0].error)
    assert failed["reason"] == "upstream-failed" and outcomes[0].healthy is False


@pytest.mark.parametrize("code, gpu_failed", [
    ("authentication_error", False), ("rate_limit_exceeded", False), ("api_error", True)])
async def test_ollamas_own_failed_responses_stream_is_passed_on_as_its_end(
        code: str, gpu_failed: bool) -> None:
    """Ollama ends a Responses stream with `response.failed` itself when its web search
    fails (middleware/openai.go writeWebSearchError): that is the stream's end, not cut
    short, and no second failure follows it. Its search service's sign-in or rate limit
    says nothing of the GPU (counted a failure, three such calls opened its circuit: no
    agent's call went to that GPU for a minute); another failure does."""
    outcomes: list[CallOutcome] = []
    parts = (RESPONSES_OPEN, RESPONSES_FAILED.replace(b"authentication_error", code.encode()))
    async for url in serve(answering(SSE_HEAD + _chunked(*parts, b""))):
        attempt = Attempt("p", OllamaClient(url, Timeouts(1, 1, 1)), "m", "warm")
        response = await forward(OneAttempt(attempt, outcomes), "/v1/responses",
                                 {"model": "m", "stream": True}, True, 1, dialect="openai")
        body = b"".join(m.get("body", b"") for m in await _deliver(response))
    assert body == b"".join(parts)
    assert outcomes[0].healthy is not gpu_failed and "unauthorized" in str(outcomes[0].error)


def test_shift_false_is_kept_without_a_reload_on_every_version() -> None:
    """0.12 takes `shift` per call (runner/ollamarunner/runner.go:526-537): sent as it is.
    From 0.30 it is a load option of the copy (server/sched.go:1413-1419): left out, and an
    answer that must not shift is capped before the end of the context (the engine's token
    and an eighth of the prompt's estimate kept free), so it stops there with "length"."""
    from proxy.api.relay import payload_for

    chat = {"model": "x", "messages": []}
    old = Attempt("p", OllamaClient(BASE), "qwen3:8b", "warm", num_ctx=8192,
                  context_length=8192, estimated_tokens=1000)
    for shift in (False, True):
        for path in ("/api/chat", "/api/generate"):
            sent = orjson.loads(payload_for(old, {**chat, "shift": shift}, path))
            assert sent["shift"] is shift and sent["options"] == {"num_ctx": 8192}
    new = replace(old, shift_at_load=True)
    capped = orjson.loads(payload_for(new, {**chat, "shift": False}, "/api/chat"))
    assert "shift" not in capped
    assert capped["options"] == {"num_ctx": 8192, "num_predict": 8192 - 1 - 1000 - 125}
    for asked, sent_cap in ((500, 500), (10000, 7066), (-1, 7066)):
        body = {**chat, "shift": False, "options": {"num_predict": asked}}
        assert orjson.loads(payload_for(new, body, "/api/chat"))["options"][
            "num_predict"] == sent_cap
    # a short prompt keeps room for the chat template the estimate may not know yet
    short = replace(new, context_length=2048, num_ctx=2048, estimated_tokens=4)
    assert orjson.loads(payload_for(short, {**chat, "shift": False}, "/api/chat"))[
        "options"]["num_predict"] == 2048 - 1 - 4 - 16
    default = orjson.loads(payload_for(new, {**chat, "shift": True}, "/api/chat"))
    assert "shift" not in default and "num_predict" not in default["options"]
    # a copy whose context is not known cannot be capped: Ollama is asked (it reloads)
    unknown = replace(new, context_length=0, num_ctx=0)
    assert orjson.loads(payload_for(unknown, {**chat, "shift": False}, "/api/chat"))[
        "shift"] is False
    # Ollama's OpenAI and Anthropic layers have no shift: left out there
    assert "shift" not in orjson.loads(payload_for(old, {**chat, "shift": False},
                                                   "/v1/chat/completions"))
