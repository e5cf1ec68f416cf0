"""The differential check's comparison (loadtest/real_ollama_check.py): what it calls a
difference between a real Ollama's answer and the simulator's."""

from __future__ import annotations

import httpx

from loadtest.real_ollama_check import (
    Outcome,
    Side,
    _chunks,
    _trained_notes,
    compare,
    shape,
    shape_diff,
)


def test_shapes_keep_keys_and_types_not_values() -> None:
    assert shape({"b": 1.5, "a": [{"x": "s"}, {"y": 1}], "c": None, "d": True}) == {
        "a": [{"x": "string"}], "b": "number", "c": "null", "d": "bool"}
    assert shape({"n": 1}) == shape({"n": 2.0})  # Go writes 2.0 as 2


def test_a_key_on_one_side_only_is_a_difference_an_empty_list_is_not() -> None:
    real = shape({"delta": {"role": "assistant", "content": ""}, "tools": []})
    sim = shape({"delta": {}, "tools": [{"name": "f"}]})
    assert shape_diff(real, sim) == ['delta.content: only real ("string")',
                                     'delta.role: only real ("string")']


def test_status_and_error_text_are_compared() -> None:
    real = Outcome(404, "model '' not found", shape({"error": "x"}))
    sim = Outcome(400, "model is required", shape({"error": "y"}))
    assert compare(real, sim) == ["status: real 404, sim 400",
                                  "error: real \"model '' not found\", sim 'model is required'"]
    assert compare(real, Outcome(404, "model '' not found", shape({"error": "z"}))) == []


def test_streams_are_read_as_ndjson_or_sse() -> None:
    sse = httpx.Response(200, text='data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n')
    ndjson = httpx.Response(200, text='{"a":1}\n{"b":2}\n')
    assert _chunks(sse) == _chunks(ndjson) == [{"a": 1}, {"b": 2}]
    assert Side("http://x", "tiny").model == "tiny"


def test_a_context_over_the_trained_one_is_compared_as_a_share_of_it() -> None:
    """Real v0.24.0 (tiny, trained 2048) lists 2048 for num_ctx 4096; a simulator at 0.24.0
    that listed phi3:mini's 8192 (trained 4096) differs, one that lists 4096 does not."""
    body = {"options": {"num_ctx": 4096}}
    real = Outcome(200, "", {}, {"ps.context_length": 2048, "prompt_eval_count": 2048})
    real.notes.update(_trained_notes(body, real.notes, Side("r", "tiny", 2048)))
    for listed, differs in ((8192, True), (4096, False)):
        sim = Outcome(200, "", {}, {"ps.context_length": listed, "prompt_eval_count": 4096})
        sim.notes.update(_trained_notes({"options": {"num_ctx": 8192}}, sim.notes,
                                        Side("s", "phi3:mini", 4096)))
        assert bool(compare(real, sim)) is differs
    assert _trained_notes({"options": {"num_ctx": 64}}, real.notes, Side("r", "tiny", 2048)) == {}
