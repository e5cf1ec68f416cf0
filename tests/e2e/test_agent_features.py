"""What agents use, through a sidecar on the demo's simulator, with the clients agents use:
tool calls (a call, its result, then an answer), structured output (`format` "json" or a
JSON schema; OpenAI's `response_format`) and thinking, streaming and not: the `ollama`
client, the `openai` SDK and langchain-ollama."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import jsonschema
import ollama
import openai
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_ollama import ChatOllama
from pydantic import BaseModel

from loadtest.ollama_sim import SimServer
from loadtest.serving import ThreadedServer

Sims = Callable[..., SimServer]
Sidecars = Callable[..., ThreadedServer]
SCALE = 0.01
WEATHER = {"type": "object", "required": ["city", "unit"], "properties": {
    "city": {"type": "string", "description": "the city"},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "description": "how many days ahead"}}}
TOOLS: Any = [
    {"type": "function", "function": {"name": "add", "description": "add two numbers",
                                      "parameters": {"type": "object", "properties": {
                                          "a": {"type": "number"}, "b": {"type": "number"}}}}},
    {"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                      "parameters": WEATHER}}]
ASK: Any = {"role": "user", "content": "what is the weather in Paris? use get_weather"}


class Forecast(BaseModel):
    city: str
    temperature: float
    rain: bool
    days: list[int]


@pytest.fixture
def sidecar(sim_factory: Sims, sidecar_factory: Sidecars) -> str:
    return sidecar_factory([sim_factory("gpu", time_scale=SCALE)]).url


def test_ollama_client_calls_a_tool_then_answers(sidecar: str) -> None:
    client = ollama.Client(host=sidecar)
    first = client.chat(model="qwen3:8b", messages=[ASK], tools=TOOLS)
    (call,) = first.message.tool_calls or []
    assert call.function.name == "get_weather" and first.done_reason == "stop"
    jsonschema.validate(dict(call.function.arguments), WEATHER)

    result = {"role": "tool", "tool_name": "get_weather", "content": "sunny, 21 degrees"}
    answer = client.chat(model="qwen3:8b", tools=TOOLS,
                         messages=[ASK, first.message, result])
    assert answer.message.content and not answer.message.tool_calls

    parts = list(client.chat(model="qwen3:8b", messages=[ASK], tools=TOOLS, stream=True))
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_weather"] and parts[-1].done


def test_ollama_wire_shapes_of_a_tool_call_and_thinking(sidecar: str) -> None:
    body = {"model": "qwen3:8b", "messages": [ASK], "tools": TOOLS, "think": True,
            "stream": False}
    done = httpx.post(f"{sidecar}/api/chat", json=body).json()
    call = done["message"]["tool_calls"][0]
    assert call["id"].startswith("call_") and call["function"]["index"] == 0
    assert isinstance(call["function"]["arguments"], dict)
    assert done["message"]["thinking"] and done["done_reason"] == "stop"

    with httpx.stream("POST", f"{sidecar}/api/chat", json={**body, "stream": True}) as reply:
        chunks = [json.loads(line) for line in reply.iter_lines() if line]
    kinds = [next(k for k in ("thinking", "tool_calls", "content") if c["message"].get(k))
             for c in chunks[:-1]]
    assert kinds == sorted(kinds, key=["thinking", "tool_calls"].index) and chunks[-1]["done"]

    refused = httpx.post(f"{sidecar}/api/chat", json={**body, "model": "llama3.2:3b"})
    assert refused.status_code == 400 and "does not support thinking" in refused.text


def test_ollama_client_structured_output_and_thinking(sidecar: str) -> None:
    client = ollama.Client(host=sidecar)
    schema = Forecast.model_json_schema()
    reply = client.chat(model="qwen3:8b", format=schema, think=True,
                        messages=[{"role": "user", "content": "forecast for Paris"}])
    content = reply.message.content or ""
    Forecast.model_validate_json(content)
    jsonschema.validate(json.loads(content), schema)
    assert reply.message.thinking

    streamed = "".join(p.message.content or "" for p in client.chat(
        model="qwen3:8b", format="json", stream=True,
        messages=[{"role": "user", "content": "any JSON"}]))
    assert isinstance(json.loads(streamed), dict)

    generated = client.generate(model="qwen3:8b", prompt="forecast", format=schema, think=True)
    jsonschema.validate(json.loads(generated.response or ""), schema)
    assert generated.thinking


def test_openai_sdk_tools_and_json_schema(sidecar: str) -> None:
    client = openai.OpenAI(base_url=f"{sidecar}/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(model="qwen3:8b", messages=[ASK], tools=TOOLS,
                                           tool_choice="auto")
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    called: Any = choice.message.model_dump(exclude_none=True)
    answer = client.chat.completions.create(model="qwen3:8b", tools=TOOLS, messages=[
        ASK, called, {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
    assert answer.choices[0].finish_reason == "stop" and answer.choices[0].message.content

    parts = list(client.chat.completions.create(model="qwen3:8b", messages=[ASK],
                                                tools=TOOLS, stream=True))
    deltas = [c for p in parts for c in p.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function and d.function.name) for d in deltas] == [(0, "get_weather")]
    assert parts[-1].choices[0].finish_reason == "tool_calls"

    schema = Forecast.model_json_schema()
    shaped = client.chat.completions.create(
        model="qwen3:8b", messages=[{"role": "user", "content": "forecast"}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "forecast", "schema": schema}})
    jsonschema.validate(json.loads(shaped.choices[0].message.content or ""), schema)
    parsed = client.chat.completions.parse(
        model="qwen3:8b", messages=[{"role": "user", "content": "forecast"}],
        response_format=Forecast)
    assert isinstance(parsed.choices[0].message.parsed, Forecast)


def test_langchain_ollama_bind_tools_and_structured_output(sidecar: str) -> None:
    model = ChatOllama(model="qwen3:8b", base_url=sidecar)

    def get_weather(city: str, unit: str = "celsius") -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    with_tools = model.bind_tools([get_weather])
    first = with_tools.invoke([HumanMessage("weather in Paris?")])
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    answer = with_tools.invoke([HumanMessage("weather in Paris?"), first,
                                ToolMessage(get_weather(**call["args"]),
                                            tool_call_id=call["id"])])
    assert answer.content and not answer.tool_calls

    forecast = model.with_structured_output(Forecast).invoke("forecast for Paris")
    assert isinstance(forecast, Forecast)
    as_tool = model.with_structured_output(Forecast, method="function_calling").invoke("go")
    assert isinstance(as_tool, Forecast)


RESPONSES_TOOLS: Any = [{"type": "function", "name": t["function"]["name"],
                         "description": t["function"]["description"],
                         "parameters": t["function"]["parameters"]} for t in TOOLS]
ANTHROPIC_TOOLS: Any = [{"name": t["function"]["name"],
                         "description": t["function"]["description"],
                         "input_schema": t["function"]["parameters"]} for t in TOOLS]


def test_openai_responses_api_tools_reasoning_and_json_schema(sidecar: str) -> None:
    client = openai.OpenAI(base_url=f"{sidecar}/v1", api_key="unused", max_retries=0)
    ask: Any = [{"role": "user", "content": ASK["content"]}]
    first = client.responses.create(model="qwen3:8b", input=ask, tools=RESPONSES_TOOLS,
                                    reasoning={"effort": "low"})
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "function_call"] and not first.output_text
    call = first.output[1]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.summary[0].text

    answer = client.responses.create(model="qwen3:8b", tools=RESPONSES_TOOLS, input=[
        *ask, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    # qwen3 thinks unless told not to (server/routes.go:2615-2619), on every dialect
    assert [item.type for item in answer.output] == ["reasoning", "message"]
    assert answer.output_text

    with client.responses.stream(model="qwen3:8b", input=ask, tools=RESPONSES_TOOLS,
                                 reasoning={"effort": "high"}) as stream:
        events = [event.type for event in stream]
        streamed = stream.get_final_response()
    assert events[:2] == ["response.created", "response.in_progress"]
    assert "response.reasoning_summary_text.delta" in events
    assert "response.function_call_arguments.done" in events
    assert "response.output_text.delta" not in events and events[-1] == "response.completed"
    assert [(i.type, getattr(i, "name", None)) for i in streamed.output] == [
        ("reasoning", None), ("function_call", "get_weather")]

    parsed = client.responses.parse(model="qwen3:8b", input="forecast for Paris",
                                    text_format=Forecast)
    assert isinstance(parsed.output_parsed, Forecast)
    schema = Forecast.model_json_schema()
    parts = list(client.responses.create(
        model="qwen3:8b", input="forecast", stream=True,
        text={"format": {"type": "json_schema", "name": "forecast", "schema": schema}}))
    text = "".join(p.delta for p in parts if p.type == "response.output_text.delta")
    jsonschema.validate(json.loads(text), schema)


def test_anthropic_sdk_tools_and_thinking(sidecar: str) -> None:
    client = anthropic.Anthropic(base_url=sidecar, api_key="unused", max_retries=0)
    ask: Any = [{"role": "user", "content": ASK["content"]}]
    first = client.messages.create(model="qwen3:8b", max_tokens=256, messages=ask,
                                   tools=ANTHROPIC_TOOLS,
                                   thinking={"type": "enabled", "budget_tokens": 1024})
    assert first.stop_reason == "tool_use"
    assert [block.type for block in first.content] == ["thinking", "tool_use"]
    use = first.content[1]
    assert use.type == "tool_use" and use.name == "get_weather" and use.id
    jsonschema.validate(use.input, WEATHER)

    answer = client.messages.create(model="qwen3:8b", max_tokens=256, tools=ANTHROPIC_TOOLS,
                                    messages=[*ask, {"role": "assistant",
                                                     "content": first.content},
                                              {"role": "user", "content": [{
                                                  "type": "tool_result", "tool_use_id": use.id,
                                                  "content": "sunny"}]}])
    assert answer.stop_reason == "end_turn"
    assert [block.type for block in answer.content] == ["thinking", "text"]  # by default

    with client.messages.stream(model="qwen3:8b", max_tokens=256, messages=ask,
                                tools=ANTHROPIC_TOOLS,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in deltas and "input_json_delta" in deltas
    assert final.stop_reason == "tool_use"
    assert [block.type for block in final.content] == ["thinking", "tool_use"]
    streamed_use = final.content[1]
    assert streamed_use.type == "tool_use" and streamed_use.input == use.input

    # A model without the capability is not refused behind this layer, as on Ollama.
    relaxed = client.messages.create(model="llama3.2:3b", max_tokens=64, messages=[
        {"role": "user", "content": "hi"}], thinking={"type": "enabled", "budget_tokens": 1024})
    assert [block.type for block in relaxed.content] == ["text"]
