"""Bodies read as Ollama's Go decoder reads them, and long lists validated in pieces."""

from __future__ import annotations

import gzip

import orjson
import pytest

from proxy.api import layers, wire
from proxy.api.routes import measure


@pytest.mark.parametrize(("raw", "read"), [
    (b'{"a": "x\\ud83d"} and more', {"a": "x\ufffd"}),
    (b'{"a": "caf\xe9"}', {"a": "caf\ufffd"}),
    (b' \n{"a": 99999999999999999999999} {', {"a": 1e23}),  # orjson's float beyond 64 bits
    (b'{"a": 18446744073709551615}', {"a": 18446744073709551615}),
])
def test_a_body_is_read_as_go_reads_it_and_sent_on_as_read(raw: bytes,
                                                           read: dict[str, object]) -> None:
    body = wire.parse_body(raw)
    assert body == read
    assert orjson.loads(orjson.dumps(body)) == read


@pytest.mark.parametrize("raw", [b'{"a": 1e400} x', b"[" * 5000 + b"]" * 5000])
def test_a_body_go_refuses_is_still_refused(raw: bytes) -> None:
    with pytest.raises(wire.BadRequest, match="not valid JSON"):
        wire.parse_body(raw)


@pytest.mark.parametrize(("raw", "words"), [
    (b"not json", "invalid character 'o' in literal null (expecting 'u')"),
    (b'{"a": NaN}', "invalid character 'N' looking for beginning of value"),
    (b'{"model": "m" "messages": []}',
     "invalid character '\"' after object key:value pair"),
    (b'{"a": 1', "unexpected EOF"),  # Decode's io.ErrUnexpectedEOF, not Unmarshal's words
    (b" \r\n ", "missing request body"),  # blanks: io.EOF, as an empty body
])
def test_a_body_that_is_no_json_is_refused_in_the_words_of_gos_decoder(
        raw: bytes, words: str) -> None:
    """gin's ShouldBindJSON (json.NewDecoder(body).Decode), whose error Ollama answers as
    it is (server/routes.go ChatHandler and the others)."""
    with pytest.raises(wire.BadRequest) as refused:
        wire.parse_body(raw)
    assert str(refused.value) == words


@pytest.mark.parametrize(("raw", "character"), [
    (gzip.compress(b"{}", mtime=0), "'\\x1f'"),  # sent compressed: Ollama reads bodies as they come
    (b"\xef\xbb\xbf{}", "'\u00ef'"),  # a byte-order mark: Go reads the byte as a rune
    (b" \r\n'a'", "'\\''"),
    (b"\xa0{}", "'\\u00a0'"),
])
def test_a_body_that_begins_no_json_value_is_refused_in_gos_words(raw: bytes,
                                                                  character: str) -> None:
    with pytest.raises(wire.BadRequest) as refused:
        wire.parse_body(raw)
    assert str(refused.value) == f"invalid character {character} looking for beginning of value"


@pytest.mark.parametrize("depth", [200, 900, 990])
def test_a_deep_body_read_as_go_reads_it_is_refused_for_its_depth(depth: int) -> None:
    raw = b'{"a": ' + b"[" * depth + b'"\\ud83d"' + b"]" * depth + b"}"
    with pytest.raises(wire.BadRequest, match=r"deeper than 128|not valid JSON"):  # never a crash
        wire.parse_body(raw)


def test_a_long_list_is_checked_whole_and_its_fault_named_where_it_is() -> None:
    messages = [{"role": "user", "content": "hi"}] * (3 * wire.CHUNK)
    parsed = wire.validate(wire.OllamaInference, {"model": "m", "messages": messages})
    assert parsed.messages is not None and len(parsed.messages) == 3 * wire.CHUNK
    wrong = [*messages[:wire.CHUNK + 7], {"role": "user", "content": 5}]
    with pytest.raises(wire.BadRequest, match=rf"messages\.{wire.CHUNK + 7}\.content"):
        wire.validate(wire.OllamaInference, {"model": "m", "messages": wrong})


@pytest.mark.parametrize(("value", "kind", "misfit"), [
    (5, "string", "number"), (1.5, "int", "number 1.5"), (1.0, "int", "number 1.0"),
    (2 ** 63, "int", f"number {2 ** 63}"), (1e39, "float32", "number 1e+39"),
    (True, "int", "bool"), ("x", "bool", "string"), ([], "int", "array"), ({}, "int", "object"),
    (None, "int", None), (3, "float32", None), (True, "bool", None),
])
def test_a_field_is_bound_as_go_binds_it(value: object, kind: str, misfit: str | None) -> None:
    assert layers._misfit(value, kind) == misfit


@pytest.mark.parametrize(("text", "error"), [
    ("aGk=", None), ("aGk", "illegal base64 data at input byte 0"),
    ("aGVs\nbG8=", None), ("!!", "illegal base64 data at input byte 0"),
    ("aGVsbG8=x", "illegal base64 data at input byte 8"), ("", None),
])
def test_an_image_is_decoded_as_go_decodes_base64(text: str, error: str | None) -> None:
    assert layers.base64_error(text) == error


def _tool_call(arguments: object) -> dict[str, object]:
    return {"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": arguments}}]}]}


@pytest.mark.parametrize(("version", "error"), [
    ((0, 12, 6), "json: cannot unmarshal string into Go struct field "
                 "ChatRequest.messages.tool_calls.function.arguments of type "
                 "api.ToolCallFunctionArguments"),
    ((0, 14, 0), "Value looks like object, but can't find closing '}' symbol"),
])
def test_tool_arguments_that_are_no_object_are_refused_in_the_versions_words(
        version: tuple[int, int, int], error: str) -> None:
    assert layers.native_error("/api/chat", _tool_call("{}"), version) == error
    assert layers.native_error("/api/chat", _tool_call({"a": 1}), version) is None
    assert layers.native_error("/api/chat", _tool_call(None), version) is None


def test_a_messages_error_wins_over_an_earlier_tools_error() -> None:
    """Message.UnmarshalJSON returns its error, which stops Go's decoder; a tool's is saved."""
    body = {"tools": [{"function": {"name": 5}}],
            "messages": [{"role": "user", "content": "", "thinking": 1}]}
    assert "ChatRequest.messages.thinking" in str(layers.native_error("/api/chat", body,
                                                                      (0, 30, 0)))


@pytest.mark.parametrize(("body", "error"), [
    ({"messages": [{"role": "user"}], "format": "yaml"},
     'invalid format: "\\"yaml\\""; expected "json" or a valid JSON Schema object'),
    ({"messages": [{"role": "user"}], "format": [1, 2]},
     'invalid format: "[1,2]"; expected "json" or a valid JSON Schema object'),
    ({"messages": [{"role": "user"}], "format": "json"}, None),
    ({"messages": [{"role": "user"}], "format": {}}, None),
    ({"messages": [{"role": "user"}], "format": ""}, None),
    ({"messages": [], "format": 5}, None),  # a load never reaches the check
])
def test_a_format_is_checked_as_ollamas_completion_checks_it(body: dict[str, object],
                                                             error: str | None) -> None:
    assert layers.format_error("/api/chat", body) == error


@pytest.mark.parametrize(("version", "body", "error"), [
    # before 0.20.5 an unknown item type is not quoted and a missing one not named
    ((0, 20, 4), {"input": [{"type": "bogus"}]}, "input[0]: unknown input item type: bogus"),
    ((0, 20, 4), {"input": [{"content": "hi"}]}, "input[0]: unknown input item type: "),
    ((0, 20, 5), {"input": [{"type": "bogus"}]}, 'input[0]: unknown input item type: "bogus"'),
    # web_search_call items from 0.32.10
    ((0, 32, 9), {"input": [{"type": "web_search_call"}]},
     'input[0]: unknown input item type: "web_search_call"'),
    ((0, 32, 10), {"input": [{"type": "web_search_call"}]}, None),
    # a function's output as a list of parts from 0.20.4; input_file parts too
    ((0, 20, 3), {"input": [{"type": "function_call_output", "output": []}]},
     "input[0]: json: cannot unmarshal array into Go struct field "
     "ResponsesFunctionCallOutput.output of type string"),
    ((0, 20, 4), {"input": [{"type": "function_call_output", "output": [
        {"type": "input_text", "text": "x"}]}]}, None),
    # read, then refused as it is converted (convertResponsesContent)
    ((0, 20, 4), {"input": [{"type": "function_call_output", "output": [
        {"type": "input_text", "text": "x"}, {"type": "input_file"}]}]},
     "file inputs are not currently supported"),
    ((0, 20, 3), {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
     "input[0]: content[0]: unknown content type: input_file"),
    # an item that is no object, a type that is no string
    ((0, 30, 0), {"input": ["hi"]}, "input[0]: json: cannot unmarshal string into Go value "
     'of type struct { Type string "json:\\"type\\""; Role string "json:\\"role\\"" }'),
    ((0, 30, 0), {"input": [{"type": 1}]},
     "input[0]: json: cannot unmarshal number into Go struct field .type of type string"),
    # the input's error wins over a mistyped field before it (its decoder's error stops Go's)
    ((0, 30, 0), {"instructions": 1, "input": [{"type": "bogus"}]},
     'input[0]: unknown input item type: "bogus"'),
    ((0, 30, 0), {"reasoning": "high", "input": "hi"},
     "json: cannot unmarshal string into Go struct field ResponsesRequest.reasoning of type "
     "openai.ResponsesReasoning"),
    # the effort: none read before 0.22, then each version's words
    ((0, 21, 2), {"input": "hi", "reasoning": {"effort": "bogus"}}, None),
    ((0, 30, 0), {"input": "hi", "reasoning": {"effort": "minimal"}},
     'invalid reasoning value: "minimal" (must be "high", "medium", "low", "max", or "none")'),
    ((0, 32, 11), {"input": "hi", "reasoning": {"effort": "minimal"}}, None),
    # a function call's arguments: Go's syntax check, then a plain map (null taken) before
    # 0.14, an ordered map (jsonparser's words) from 0.14
    ((0, 13, 3), {"input": [{"type": "function_call", "arguments": "{bad"}]},
     "failed to parse function call arguments: invalid character 'b' looking for beginning "
     "of object key string"),
    ((0, 30, 0), {"input": [{"type": "function_call", "arguments": '{"a": tru}'}]},
     "failed to parse function call arguments: invalid character '}' in literal true "
     "(expecting 'e')"),
    ((0, 30, 0), {"input": [{"type": "function_call", "arguments": '{"a": 1'}]},
     "failed to parse function call arguments: unexpected end of JSON input"),
    ((0, 13, 3), {"input": [{"type": "function_call", "arguments": "[1]"}]},
     "failed to parse function call arguments: json: cannot unmarshal array into Go value "
     "of type api.ToolCallFunctionArguments"),
    ((0, 13, 3), {"input": [{"type": "function_call", "arguments": "null"}]}, None),
    ((0, 14, 0), {"input": [{"type": "function_call", "arguments": "null"}]},
     "failed to parse function call arguments: Value looks like object, but can't find "
     "closing '}' symbol"),
    ((0, 14, 0), {"input": [{"type": "function_call", "arguments": ""}]}, None),
    ((0, 30, 0), {"input": [None, {"role": "user", "content": None},
                            {"type": "reasoning", "encrypted_content": "x"}]},
     "input[0]: input item missing required 'type' field"),
])
def test_a_responses_body_is_read_as_the_versions_layer_reads_it(
        version: tuple[int, int, int], body: dict[str, object], error: str | None) -> None:
    assert layers.layer_error("/v1/responses", body, version) == error


@pytest.mark.parametrize(("version", "effort", "error"), [
    ((0, 21, 2), "max",
     "invalid reasoning value: 'max' (must be \"high\", \"medium\", \"low\", or \"none\")"),
    ((0, 22, 0), "max", None),
    ((0, 30, 0), "xhigh", "invalid reasoning value: 'xhigh' (must be \"high\", \"medium\", "
     "\"low\", \"max\", or \"none\")"),
    ((0, 32, 11), "xhigh", None),
    ((0, 32, 11), "huge", 'invalid reasoning value: "huge" (must be "minimal", "low", '
     '"medium", "high", "xhigh", "ultra", "max", or "none")'),
    ((0, 12, 6), "none", None),
])
def test_a_chats_reasoning_effort_is_checked_as_the_version_checks_it(
        version: tuple[int, int, int], effort: str, error: str | None) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": effort}
    assert layers.layer_error("/v1/chat/completions", body, version) == error


@pytest.mark.parametrize(("version", "content", "calls", "error"), [
    # before 0.14.2 an image's URL is no data URI, and bad base64 a message format error
    ((0, 14, 1), [{"type": "image_url", "image_url": "https://x/y.png"}], None,
     "invalid image input"),
    ((0, 14, 2), [{"type": "image_url", "image_url": "https://x/y.png"}], None,
     "image URLs are not currently supported, please use base64 encoded data instead"),
    ((0, 14, 1), [{"type": "image_url", "image_url": "data:image/png;base64,!"}], None,
     "invalid message format"),
    ((0, 14, 2), [{"type": "image_url", "image_url": "data:;base64,iVBORw0KGgo="}], None,
     None),
    # input_audio parts from 0.20.0, their data base64
    ((0, 19, 0), [{"type": "input_audio", "input_audio": {"data": "AAAA"}}], None,
     "invalid message format"),
    ((0, 20, 0), [{"type": "input_audio", "input_audio": {"data": "AA!A"}}], None,
     "invalid input_audio base64 data: illegal base64 data at input byte 2"),
    # no content is fine with tool calls (an empty list of them too), not without
    ((0, 30, 0), None, [], None),
    ((0, 30, 0), {"a": 1}, None, "invalid message content type: map[string]interface {}"),
    # arguments: a JSON object as text; null into the plain map before 0.14 only
    ((0, 13, 5), "", [{"function": {"name": "f", "arguments": "null"}}], None),
    ((0, 14, 0), "", [{"function": {"name": "f", "arguments": "null"}}],
     "invalid tool call arguments"),
    ((0, 30, 0), "", [{"function": {"name": "f", "arguments": "[1]"}}],
     "invalid tool call arguments"),
])
def test_a_chat_message_is_converted_as_the_versions_layer_converts_it(
        version: tuple[int, int, int], content: object, calls: object,
        error: str | None) -> None:
    message: dict[str, object] = {"role": "user", "content": content}
    if calls is not None:
        message["tool_calls"] = calls
    assert layers.layer_error("/v1/chat/completions", {"messages": [message]}, version) == \
        error


@pytest.mark.parametrize(("version", "block", "error"), [
    ((0, 23, 3), {"type": "tool_result", "content": [{"type": "image", "source": "x"}]}, None),
    ((0, 23, 4), {"type": "tool_result", "content": [{"type": "image", "source": "x"}]},
     "invalid tool_result image source"),
    ((0, 14, 0), {"type": "image"}, "invalid image source"),
    ((0, 14, 0), {"type": "image", "source": {"type": "base64", "data": "iVBORw0KGgo="}},
     None),
    ((0, 14, 0), {"type": "tool_use", "id": "t1", "input": {}},
     "tool_use block missing required 'name' field"),
    ((0, 14, 0), {"type": "document", "source": {"type": "url"}}, None),  # ignored there
])
def test_an_anthropic_block_is_converted_as_the_versions_layer_converts_it(
        version: tuple[int, int, int], block: dict[str, object], error: str | None) -> None:
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}
    assert layers.layer_error("/v1/messages", body, version) == error


@pytest.mark.parametrize(("version", "body", "error"), [
    ((0, 12, 10), {"logprobs": True}, None),  # no such field yet
    ((0, 12, 11), {"logprobs": True},
     "json: cannot unmarshal bool into Go struct field CompletionRequest.logprobs of type int"),
    ((0, 30, 0), {"stop": ["\n", 1]}, "invalid type for 'stop' field: float64"),
    ((0, 30, 0), {"stop": [["x"]]}, "invalid type for 'stop' field: []interface {}"),
    ((0, 30, 0), {"stop": 5}, None),  # neither text nor a list: ignored
])
def test_a_completion_is_read_as_the_versions_layer_reads_it(
        version: tuple[int, int, int], body: dict[str, object], error: str | None) -> None:
    assert layers.layer_error("/v1/completions", {"prompt": "hi", **body}, version) == error


@pytest.mark.parametrize(("version", "config", "error"), [
    ((0, 23, 3), "high", None),  # no such field yet: ignored
    ((0, 23, 4), "high", "json: cannot unmarshal string into Go struct field "
     "MessagesRequest.output_config of type anthropic.OutputConfig"),
    ((0, 23, 4), {"effort": 2}, "json: cannot unmarshal number into Go struct field "
     "OutputConfig.output_config.effort of type string"),
    ((0, 23, 4), {"effort": "xhigh"}, None),
])
def test_anthropic_output_config_is_bound_as_the_version_binds_it(
        version: tuple[int, int, int], config: object, error: str | None) -> None:
    body = {"max_tokens": 5, "output_config": config,
            "messages": [{"role": "user", "content": "hi"}]}
    assert layers.layer_error("/v1/messages", body, version) == error


@pytest.mark.parametrize("version", [(0, 14, 0), (0, 18, 3)])
def test_an_empty_tool_use_id_or_name_is_taken_before_0_19(
        version: tuple[int, int, int]) -> None:
    body = {"max_tokens": 5, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "", "name": "", "input": {}}]}]}
    assert layers.layer_error("/v1/messages", body, version) is None
    # from 0.19.0 the bound block's empty id is refused; absent, on every version
    assert layers.layer_error("/v1/messages", body, (0, 19, 0)) == \
        "tool_use block missing required 'id' field"
    del body["messages"][0]["content"][0]["id"]  # type: ignore[attr-defined]
    assert layers.layer_error("/v1/messages", body, version) == \
        "tool_use block missing required 'id' field"


def test_a_listed_models_openai_id_is_the_tags_field_the_version_reads() -> None:
    """openai/openai.go ToListCompletion: `name` before 0.30.7; `model`, else `name`, from
    0.30.7 (commit e09b3f9fb)."""
    from proxy.api.routes import listed_id
    entry = {"name": "legacy-name:latest", "model": "namespace/exposed-model:latest"}
    assert listed_id(entry, (0, 30, 6)) == "legacy-name:latest"
    assert listed_id(entry, (0, 30, 7)) == "namespace/exposed-model:latest"
    assert listed_id({"name": "fallback-name:latest"}, (0, 30, 7)) == "fallback-name:latest"


def test_nested_struct_keys_are_read_as_go_binds_them() -> None:
    """A message's `Content`, `Images`, a tool call's `Function` and a tool's parameter
    schema (api.ToolFunctionParameters) are read as Ollama binds them; maps (arguments,
    options, a schema's properties) keep their keys; what is sent is kept."""
    sent = {"model": "m", "options": {"Num_ctx": 1}, "messages": [
        {"Role": "user", "CONTENT": "hello", "Images": ["aGk="], "content": "hi"},
        {"role": "assistant", "tool_calls": [{"Function": {"Name": "f", "arguments": {"A": 1}}}]}],
        "tools": [{"TYPE": "function", "Function": {"NAME": "t", "parameters": {
            "Type": "x", "Properties": {"Q": {"type": "string"}}}}}]}
    before = orjson.dumps(sent)
    read = wire.nested_as_go_binds(sent)
    assert read["messages"] == [
        {"role": "user", "content": "hi", "images": ["aGk="]},  # the last key wins
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {"A": 1}}}]}]
    assert read["tools"] == [{"type": "function", "function": {"name": "t", "parameters": {
        "type": "x", "properties": {"Q": {"type": "string"}}}}}]
    assert read["options"] == {"Num_ctx": 1} and orjson.dumps(sent) == before
    assert (measure(sent)[0].images, measure(read)[0].images) == (0, 1)  # the vision check's


def test_anthropic_blocks_are_structs_openai_parts_are_maps() -> None:
    blocks = {"messages": [{"Role": "user", "Content": [{"Type": "text", "TEXT": "hello"}]}]}
    assert wire.nested_as_go_binds(blocks, wire.ANTHROPIC_NESTED_STRUCTS)["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    parts = wire.nested_as_go_binds(blocks)["messages"][0]["content"]
    assert parts == [{"Type": "text", "TEXT": "hello"}]  # openai.Message.Content is `any`


def test_a_usual_body_is_read_as_it_came_uncopied() -> None:
    body = {"Model": "m", "messages": [{"role": "user", "content": "hi", "tool_calls": [
        {"function": {"name": "f"}}]}], "tools": [{"type": "function", "function": {}}]}
    assert wire.nested_as_go_binds(body) is body


def test_responses_items_parts_and_tools_are_structs() -> None:
    """Ollama reads a Responses input item, its content parts, a function's output parts, a
    tool (its parameters too), `text.format` and `reasoning` into Go structs: their keys
    are folded for the sidecar's sizing and checks (openai/responses.go)."""
    body = {"model": "m", "input": [
        {"Role": "user", "Content": [{"Type": "input_text", "TEXT": "hello"}]},
        {"TYPE": "function_call_output", "Call_ID": "c", "Output": [{"Type": "input_text"}]},
        "text"],
        "tools": [{"Type": "function", "Name": "f", "Parameters": {"Type": "object"}},
                  {"type": "namespace", "tools": [{"Name": "g"}]}],
        "text": {"Format": {"Type": "json_schema", "schema": {"Q": 1}}},
        "reasoning": {"Effort": "high"}}
    read = wire.nested_as_go_binds(body, wire.RESPONSES_NESTED_STRUCTS)
    assert read["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text"}]},
        "text"]
    assert read["tools"] == [
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
        {"type": "namespace", "tools": [{"name": "g"}]}]
    assert read["text"] == {"format": {"type": "json_schema", "schema": {"Q": 1}}}
    assert read["reasoning"] == {"effort": "high"}
    read = {**read, "input": read["input"][:2]}  # (an item that is text Ollama refuses)
    assert layers.layer_error("/v1/responses", read, (0, 30, 0)) is None
    assert layers.layer_error("/v1/responses", {**read, "reasoning": {"effort": "x"}},
                              (0, 30, 0))
    lower = {"model": "m", "input": [{"role": "user", "content": "hello " * 50}]}
    capital = {"model": "m", "input": [{"Role": "user", "CONTENT": "hello " * 50}]}
    assert measure(wire.nested_as_go_binds(capital, wire.RESPONSES_NESTED_STRUCTS))[0] == \
        measure(lower)[0]
