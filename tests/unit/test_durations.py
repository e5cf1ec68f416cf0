"""Go's time.ParseDuration as Ollama reads a string keep_alive (api/types.go:1243-1271):
values, and the errors in Go's words that Ollama answers 400 with."""

from __future__ import annotations

import pytest

from proxy.api import wire
from proxy.core.durations import DurationError, parse_duration

S = 1_000_000_000


@pytest.mark.parametrize(("text", "nanoseconds"), [
    ("0", 0), ("-0", 0), ("+0", 0), ("0s", 0), ("0h0m0s", 0), ("0.0ms", 0),
    ("5m", 300 * S), ("1h30m", 5400 * S), ("1.5h", 5400 * S), (".5s", S // 2),
    ("5.s", 5 * S), ("-5m", -300 * S), ("1µs", 1000), ("1μs", 1000), ("1us", 1000),
    ("9223372036854775807ns", (1 << 63) - 1), ("-9223372036854775808ns", -(1 << 63)),
    ("0000000000000000000000001s", S),
])
def test_a_go_duration_is_read_as_go_reads_it(text: str, nanoseconds: int) -> None:
    assert parse_duration(text) == nanoseconds


@pytest.mark.parametrize(("text", "error"), [
    ("300", 'time: missing unit in duration "300"'),
    ("-1", 'time: missing unit in duration "-1"'),
    ("00", 'time: missing unit in duration "00"'),
    ("1m5", 'time: missing unit in duration "1m5"'),
    ("", 'time: invalid duration ""'),
    ("-", 'time: invalid duration "-"'),
    ("forever", 'time: invalid duration "forever"'),
    (".s", 'time: invalid duration ".s"'),
    ("5x", 'time: unknown unit "x" in duration "5x"'),
    ("5é", 'time: unknown unit "\\xc3\\xa9" in duration "5\\xc3\\xa9"'),
    ('5"', 'time: unknown unit "\\"" in duration "5\\""'),
    ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
    ("2562048h", 'time: invalid duration "2562048h"'),
])
def test_what_go_refuses_is_refused_in_its_words(text: str, error: str) -> None:
    with pytest.raises(DurationError) as caught:
        parse_duration(text)
    assert str(caught.value) == error


@pytest.mark.parametrize("schema", [wire.OllamaInference, wire.OllamaEmbed])
def test_a_keep_alive_string_without_its_unit_is_a_400_naming_it(
        schema: type[wire.Inference]) -> None:
    with pytest.raises(wire.BadRequest) as caught:
        wire.validate(schema, {"model": "m", "keep_alive": "300"})
    assert (str(caught.value), caught.value.field) == (
        'time: missing unit in duration "300"', "keep_alive")
    assert wire.validate(schema, {"model": "m", "keep_alive": 300}).keep_alive == 300
