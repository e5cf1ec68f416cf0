"""Go's time.ParseDuration, which Ollama reads a string `keep_alive` with (api/types.go:
1243-1271 Duration.UnmarshalJSON): the value, or the error text Go gives, which Ollama answers
400 with. Only "0" may leave out its unit: "300" and "-1" are errors, not seconds."""

from __future__ import annotations

NANOSECONDS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
               "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
LIMIT = 1 << 63  # Go's Duration is an int64 of nanoseconds
DIGITS = "0123456789"


class DurationError(ValueError):
    """Go's error for a string that is no duration, in Go's words."""


def quote(text: str) -> str:
    """Go's time.quote: in double quotes, `"` and `\\` escaped, and every byte of a control
    or non-ASCII character written \\xNN."""
    out: list[str] = []
    for char in text:
        if char < " " or ord(char) >= 0x80:
            out.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
        else:
            out.append("\\" + char if char in '"\\' else char)
    return '"' + "".join(out) + '"'


def parse_duration(text: str) -> int:
    """The duration in nanoseconds (negative for a negative one), or DurationError."""
    invalid = DurationError(f"time: invalid duration {quote(text)}")
    s, negative = text, False
    if s[:1] in ("-", "+"):
        negative, s = s[0] == "-", s[1:]
    if s == "0":
        return 0
    if not s:
        raise invalid
    total, i, n = 0, 0, len(s)
    while i < n:
        if s[i] != "." and s[i] not in DIGITS:
            raise invalid
        start = i
        while i < n and s[i] in DIGITS:
            i += 1
        significant = s[start:i].lstrip("0")
        if len(significant) > 19:  # past int64 (and never a long int() in Python)
            raise invalid
        whole = int(significant or "0")
        if whole > LIMIT:
            raise invalid
        digits_before, fraction, scale, digits_after = i > start, 0, 1, False
        if i < n and s[i] == ".":
            i += 1
            begin, full = i, False
            while i < n and s[i] in DIGITS:
                if not full:  # Go keeps the digits that fit and skips the rest
                    more = fraction * 10 + int(s[i])
                    full = fraction > (LIMIT - 1) // 10 or more > LIMIT
                    if not full:
                        fraction, scale = more, scale * 10
                i += 1
            digits_after = i > begin
        if not digits_before and not digits_after:
            raise invalid
        begin = i
        while i < n and s[i] != "." and s[i] not in DIGITS:
            i += 1
        if i == begin:
            raise DurationError(f"time: missing unit in duration {quote(text)}")
        unit = NANOSECONDS.get(s[begin:i])
        if unit is None:
            raise DurationError(f"time: unknown unit {quote(s[begin:i])} in duration "
                                f"{quote(text)}")
        if whole > LIMIT // unit:
            raise invalid
        value = whole * unit + (int(fraction * (unit / scale)) if fraction else 0)
        total += value
        if value > LIMIT or total > LIMIT:
            raise invalid
    if not negative and total > LIMIT - 1:
        raise invalid
    return -total if negative else total
