"""Reading requests: which ones are Ollama's unload, and what a bad field is called."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest.sim_checks import parse_keep_alive
from proxy.api import wire
from proxy.core import engines
from proxy.core.placement import explain, place
from tests.unit.builders import call, gpu, snapshot


@pytest.mark.parametrize(
    ("body", "unload"),
    [
        ({"model": "m", "keep_alive": 0}, True),
        ({"model": "m", "keep_alive": 0.0, "prompt": ""}, True),
        ({"model": "m", "keep_alive": "0"}, True),
        ({"model": "m", "keep_alive": "0s", "messages": []}, True),
        ({"model": "m", "keep_alive": "0h0m0s"}, True),
        ({"model": "m", "keep_alive": "0.0ms"}, True),
        ({"model": "m", "keep_alive": "5m"}, False),
        ({"model": "m", "keep_alive": -1}, False),  # forever
        ({"model": "m", "keep_alive": "10s"}, False),
        ({"model": "m"}, False),  # a load, not an unload
        ({"model": "m", "keep_alive": 0, "prompt": "hi"}, False),  # runs, then unloads
        ({"model": "m", "keep_alive": 0, "messages": [{"role": "user", "content": "hi"}]},
         False),
    ],
)
def test_an_unload_is_keep_alive_zero_with_nothing_to_run(body: dict[str, Any],
                                                          unload: bool) -> None:
    assert wire.asks_to_unload(wire.validate(wire.OllamaInference, body)) is unload


@pytest.mark.parametrize(("schema", "keep_alive", "seconds"), [
    (wire.OllamaInference, "2s", 2.0), (wire.OllamaInference, "1m30s", 90.0),
    (wire.OllamaEmbed, 45, 45.0), (wire.OllamaInference, -1, -1.0),
    (wire.OllamaInference, None, None), (wire.OpenAIChat, "2s", None),  # not read there
])
def test_the_keep_alive_a_call_sets_is_read_in_seconds(schema: Any, keep_alive: Any,
                                                       seconds: float | None) -> None:
    body = {"model": "m", "messages": []} if schema is wire.OpenAIChat else {"model": "m"}
    parsed = wire.validate(schema, {**body, "keep_alive": keep_alive})
    assert wire.keep_alive_seconds(parsed) == seconds


@pytest.mark.parametrize(("schema", "body"), [
    (wire.OpenAIChat, {"messages": []}),
    (wire.OpenAICompletion, {"prompt": "hi"}),
    (wire.OpenAIResponses, {"input": "hi"}),
    (wire.OpenAIEmbed, {"input": "hi"}),
    (wire.AnthropicMessages, {"messages": []}),
])
def test_keep_alive_is_read_only_on_ollamas_own_api(schema: type[wire.Inference],
                                                    body: dict[str, Any]) -> None:
    """Ollama's OpenAI and Anthropic request structs have no keep_alive: it is ignored
    there, so a call on those paths never unloads its model."""
    parsed = wire.validate(schema, {"model": "m", "keep_alive": 0, **body})
    assert not wire.zero_keep_alive(parsed) and not wire.asks_to_unload(parsed)
    for native in (wire.OllamaInference, wire.OllamaEmbed):
        assert wire.zero_keep_alive(wire.validate(native, {"model": "m", "keep_alive": "0s"}))


def test_a_bad_num_ctx_is_named() -> None:
    with pytest.raises(wire.BadRequest) as caught:
        wire.validate(wire.OllamaInference, {"model": "m", "options": {"num_ctx": "big"}})
    assert caught.value.field == "options.num_ctx"
    assert str(caught.value) == 'option "num_ctx" must be of type integer'  # Ollama's words
    # an option Ollama does not know it ignores: passed as it is
    ok = wire.validate(wire.OllamaInference, {"model": "m", "options": {"num_ctx": 8192,
                                                                        "mirostat": "kept"}})
    assert ok.options == {"num_ctx": 8192, "mirostat": "kept"}


@pytest.mark.parametrize(
    ("schema", "body", "field", "forms"),
    [
        (wire.OllamaInference,
         {"messages": [{"role": "user", "tool_calls": [{"function": {"arguments": 3}}]}]},
         "messages.0.tool_calls.0.function.arguments", "a valid dictionary or a valid string"),
        (wire.OllamaInference, {"shift": "no"}, "shift", "a valid boolean"),  # Go's *bool
    ],
)
def test_a_field_that_takes_several_forms_is_named_with_every_form(
        schema: type[wire.Inference], body: dict[str, Any], field: str, forms: str) -> None:
    with pytest.raises(wire.BadRequest) as caught:
        wire.validate(schema, body)
    assert caught.value.field == field
    assert str(caught.value) == f"field '{field}': Input should be {forms}"


@pytest.mark.parametrize(("keep_alive", "kind"), [
    (True, "bool"), (False, "bool"), ([], "[]interface {}"), ({}, "map[string]interface {}")])
def test_keep_alive_of_another_type_is_refused_in_api_durations_words(keep_alive: Any,
                                                                      kind: str) -> None:
    """api.Duration.UnmarshalJSON: `Unsupported type: '%s'` of reflect.TypeOf(v)."""
    for schema in (wire.OllamaInference, wire.OllamaEmbed):
        with pytest.raises(wire.BadRequest) as caught:
            wire.validate(schema, {"model": "m", "keep_alive": keep_alive})
        assert (str(caught.value), caught.value.field) == (f"Unsupported type: '{kind}'",
                                                           "keep_alive")


@pytest.mark.parametrize(("body", "also_name", "model"), [
    ({"model": "qwen3:8b", "messages": 5}, False, "qwen3:8b"),
    ({"model": 7}, False, None),  # the wrong type: nothing to name
    ({"model": ""}, False, None),
    ({"model": "m" * 257}, False, None),  # over the limit: not echoed back
    ({"name": "qwen3:8b"}, False, None),  # not a field of an inference call
    ({"name": "qwen3:8b"}, True, "qwen3:8b"),  # /api/show's and /api/pull's older key
    ({"model": "a", "name": "b"}, True, "a"),
    (None, False, None),  # no body read
])
def test_a_refusal_names_the_model_the_body_names(body: dict[str, Any] | None,
                                                  also_name: bool, model: str | None) -> None:
    assert wire.named_model(body, also_name) == model


def test_the_answer_cap_is_read_where_ollama_reads_it() -> None:
    from proxy.api.routes import answer_cap
    assert answer_cap("/api/chat", {"options": {"num_predict": 64}}) == 64
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages"):
        assert answer_cap(path, {"max_tokens": 32}) == 32
    assert answer_cap("/v1/responses", {"max_output_tokens": 16}) == 16
    # Ollama's OpenAI layer does not read max_completion_tokens: the answer is not capped
    assert answer_cap("/v1/chat/completions", {"max_completion_tokens": 8}) == 0
    assert answer_cap("/api/chat", {"options": {"num_predict": -1}}) == 0
    # a field the path's layer does not have caps nothing
    assert answer_cap("/api/chat", {"max_tokens": 32}) == 0
    assert answer_cap("/v1/responses", {"max_tokens": 32}) == 0
    assert answer_cap("/v1/chat/completions", {"max_output_tokens": 16,
                                               "options": {"num_predict": 64}}) == 0
    # explain's body names no path: whichever it has
    assert answer_cap(None, {"max_output_tokens": 16}) == 16


NEWEST_FORMS = '"high", "medium", "low", "max", true, or false'
OLD_FORMS = '"high", "medium", "low", true, or false'


@pytest.mark.parametrize(("think", "version", "message"), [
    ("bogus", wire.NEWEST, f'invalid think value: "bogus" (must be {NEWEST_FORMS})'),
    ("max", (0, 21, 9), f'invalid think value: "max" (must be {OLD_FORMS})'),  # from 0.22.0
    ("HIGH", (0, 12, 6), f'invalid think value: "HIGH" (must be {OLD_FORMS})'),
    ('a"\n\x01é', wire.NEWEST, 'invalid think value: "a\\"\\n\\x01é" (must be '
     f"{NEWEST_FORMS})"),  # Go's %q
    (1, wire.NEWEST, f"think must be a boolean or string ({NEWEST_FORMS})"),
    ([True], (0, 12, 6), f"think must be a boolean or string ({OLD_FORMS})"),
])
def test_a_think_value_ollama_refuses_is_its_400_in_its_words(
        think: object, version: wire.Version, message: str) -> None:
    """ThinkValue.UnmarshalJSON (api/types.go:1202-1222; v0.12.6 :936-956)."""
    with pytest.raises(wire.BadRequest) as caught:
        wire.validate(wire.OllamaInference, {"model": "m", "think": think}, version)
    assert (str(caught.value), caught.value.field) == (message, "think")


def test_the_think_values_ollama_takes_pass() -> None:
    for think in (True, False, None, "high", "medium", "low", "max"):
        wire.validate(wire.OllamaInference, {"model": "m", "think": think})
    wire.validate(wire.OllamaInference, {"model": "m", "think": "low"}, (0, 12, 6))


def test_the_first_field_goes_decoder_refuses_is_the_one_named() -> None:
    """Go's decoder stops at the first field whose own decoder fails, in the body's order."""
    for body, field in (({"think": "x", "keep_alive": "300"}, "think"),
                        ({"keep_alive": "300", "think": "x"}, "keep_alive")):
        with pytest.raises(wire.BadRequest) as caught:
            wire.validate(wire.OllamaInference, body)
        assert caught.value.field == field


@pytest.mark.parametrize(("schema", "body", "field"), [
    (wire.OllamaInference, {"top_logprobs": 21}, "top_logprobs"),
    (wire.OllamaInference, {"top_logprobs": -1}, "top_logprobs"),
    (wire.OpenAIChat, {"messages": [], "top_logprobs": 25}, "top_logprobs"),
    (wire.OpenAICompletion, {"logprobs": 21}, "logprobs"),  # its top_logprobs
])
def test_top_logprobs_outside_0_to_20_is_ollamas_400(schema: type[wire.Inference],
                                                     body: dict[str, Any], field: str) -> None:
    """server/routes.go:256-258, 2452-2454 (from 0.12.11); openai/openai.go:719, 830-843."""
    with pytest.raises(wire.BadRequest) as caught:
        wire.validate(schema, {"model": "m", **body})
    assert (str(caught.value), caught.value.field) == (
        "top_logprobs must be between 0 and 20", field)
    wire.validate(schema, {"model": "m", **body}, (0, 12, 10))  # no such field yet: ignored


@pytest.mark.parametrize(("schema", "body"), [
    (wire.OllamaInference, {"top_logprobs": 20}),
    (wire.OllamaInference, {"top_logprobs": 0}),
    (wire.OpenAICompletion, {"logprobs": -5}),  # not positive: no logprobs asked
    (wire.OpenAIChat, {"messages": [], "top_logprobs": 20}),
    (wire.OpenAIResponses, {"top_logprobs": 99}),  # not a field of that API's requests
])
def test_top_logprobs_ollama_takes_pass(schema: type[wire.Inference],
                                        body: dict[str, Any]) -> None:
    wire.validate(schema, {"model": "m", **body})


@pytest.mark.parametrize(("keep_alive", "unloads"), [
    (0, True), (-0.0, True), (5e-10, True), ("0s", True),
    (1e-9, False), (-1, False), (1e300, False), (300, False), ("1ns", False),
])
def test_a_keep_alive_under_a_nanosecond_is_go_s_zero(keep_alive: Any, unloads: bool) -> None:
    # Go keeps whole nanoseconds of a number of seconds (api/types.go UnmarshalJSON)
    parsed = wire.validate(wire.OllamaInference, {"model": "m", "keep_alive": keep_alive})
    assert wire.zero_keep_alive(parsed) is unloads
    assert (parse_keep_alive(keep_alive) == 0) is unloads  # and the simulator, as Ollama


def test_a_union_is_listed_as_ollama_lists_its_own_latest_first() -> None:
    """/api/tags by modified_at and /api/ps by expires_at, latest first by the second, a
    stable sort (server/model_list_cache.go:866-869, server/routes.go:2297-2300), whatever
    zone each provider writes its times in."""
    from proxy.api.routes import latest_first
    listed = [{"name": "a", "modified_at": "2026-05-01T10:00:00.5Z"},
              {"name": "b", "modified_at": "2026-05-01T03:00:00.123456789-08:00"},  # 11:00 UTC
              {"name": "c"},
              {"name": "d", "modified_at": "2026-05-01T10:00:00.9Z"}]  # a's second: after it
    assert [m["name"] for m in latest_first(listed, "modified_at")] == ["b", "a", "d", "c"]


@pytest.mark.parametrize(("raw", "bound"), [
    (b'{"model": "a", "model": "b"}', {"model": "b"}),
    (b'{"model": "a", "Model": "b", "model": "c"}', {"model": "c"}),
    (b'{"MODEL": "b", "model": "a", "stream": true}', {"model": "a", "stream": True}),
    ('{"\u212aeep_alive": 0, "\u017ftream": true}'.encode(), {"keep_alive": 0, "stream": True}),
    ('{"model": "a", "mod\u00e9l": "b"}'.encode(), {"model": "a", "mod\u00e9l": "b"}),
    # an options map is Go's map[string]any: its keys are matched exactly
    (b'{"Options": {"num_ctx": 1, "NUM_CTX": 2, "num_ctx": 3}}',
     {"options": {"num_ctx": 3, "NUM_CTX": 2}}),
    (b'{"model": "a", "Model": "\\ud83d"}', {"model": "\ufffd"}),  # Go's reading of it
])
def test_top_level_keys_are_bound_as_encoding_json_binds_them(raw: bytes,
                                                              bound: dict[str, object]) -> None:
    assert wire.parse_go_body(raw) == bound


def test_a_body_is_checked_against_the_schema_once_in_a_fleet_of_several_versions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema's check of a body is the same for every Ollama version, and takes about a
    second for 200k messages: a fleet of three versions checks it once, not three times; each
    version's own rules still refuse it in their words."""
    calls: list[int] = []
    schema_check = wire._validated

    def counted(model: Any, body: dict[str, Any]) -> Any:
        calls.append(1)
        return schema_check(model, body)

    monkeypatch.setattr(wire, "_validated", counted)
    body = {"model": "qwen3:8b", "think": "max", "messages": [{"role": "user", "content": "hi"}]}
    fleet = [(0, 12, 6), (0, 22, 0), (0, 33, 0)]
    parsed, refused = wire.validate_in_fleet(wire.OllamaInference, body, fleet)
    assert parsed.think == "max" and [v for v, _ in refused] == [(0, 12, 6)]
    with pytest.raises(wire.BadRequest) as old:
        wire.validate(wire.OllamaInference, body, (0, 12, 6))
    assert refused[0][1] == str(old.value)
    assert len(calls) == 1  # (0.12 refuses the think value before the schema is checked)
    calls.clear()
    with pytest.raises(wire.BadRequest) as wrong:
        wire.validate_in_fleet(wire.OllamaInference, {**body, "messages": "hi"}, fleet)
    with pytest.raises(wire.BadRequest) as newest:
        wire.validate(wire.OllamaInference, {**body, "messages": "hi"})
    assert str(wrong.value) == str(newest.value)
    assert len(calls) == 2  # the fleet's, once; the newest's alone, once


def test_a_card_whose_version_is_heard_after_the_check_is_left_out_if_it_refuses_the_body(
        ) -> None:
    """The body was checked against the fleet's one version then heard (0.33); a card then
    heard to run 0.12.6, which refuses `think: "max"`, holding the model warm, is left out
    with its refusal's words: the call goes to the card that takes it, not to the 400."""
    body = {"model": "qwen3:8b", "think": "max", "messages": [{"role": "user", "content": "hi"}]}
    check = wire.BodyCheck(wire.OllamaInference, body)
    _, refused = wire.validate_in_fleet(wire.OllamaInference, body, [(0, 33, 0)], check)
    assert refused == ()
    spec = call("qwen3:8b", path="/api/chat", refused_by=refused, body_check=check)
    fleet = snapshot(gpu("old", residents=("qwen3:8b",), version="0.12.6"),
                     gpu("new", version="0.33.0"), gpu("unknown", version=""))
    decision = place(spec, fleet)
    assert decision.placement is not None and decision.placement.provider == "new"
    verdicts = {v.provider: v for v in explain(spec, fleet)[1]}
    with pytest.raises(wire.BadRequest) as old:
        wire.validate(wire.OllamaInference, body, (0, 12, 6))
    assert str(old.value) in str(verdicts["old"].reason)
    assert check((0, 12, 6)) == str(old.value) and check((0, 33, 0)) is None
    # a card of an unknown version is not left out: nothing says it refuses the body
    assert engines.body_refusal(refused, "", check) is None
