"""What Ollama refuses before it schedules a call, with its exact words: a `keep_alive` that
Go's time.ParseDuration does not read (api/types.go:1243-1270, 400 at binding), an option of
the wrong JSON type (Options.FromMap, api/types.go:991-1090, answered 500 by
handleScheduleError, server/routes.go:3107-3119), and a capability the model lacks
(server/routes.go:453-469 generate, 2600-2637 chat; CheckCapabilities,
server/images.go:543-580).
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any

from . import sim_cloud
from .sim_engine import version_tuple
from .sim_model import SimModel, valid_name

DEFAULT_HOST = "registry.ollama.ai/library/"  # how Model.Name spells a local model
MAX_DURATION_NS = (1 << 63) - 1
# time.Duration(t * 1e9) of a number past int64: Go leaves the conversion to the machine, and
# amd64's CVTTSD2SQ gives math.MinInt64 (arm64 saturates; Ollama's builds are mostly amd64)
OVERFLOWED_S = -(1 << 63) / 1e9
UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
           "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
# api.Options and api.Runner (api/types.go:568-597): each option's Go kind
INT_OPTIONS = frozenset(("num_keep", "seed", "num_predict", "top_k", "repeat_last_n", "num_ctx",
                         "num_batch", "num_gpu", "num_thread", "draft_num_predict", "main_gpu"))
FLOAT_OPTIONS = frozenset(("top_p", "min_p", "typical_p", "temperature", "repeat_penalty",
                           "presence_penalty", "frequency_penalty"))
BOOL_OPTIONS = frozenset(("use_mmap",))
LIST_OPTIONS = frozenset(("stop",))


def go_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_go_duration(text: str) -> float:
    """Seconds, as time.ParseDuration reads `text` (a sign, then number-unit pairs; only "0"
    may go without a unit); ValueError with Go's message otherwise."""
    rest, negative = text, False
    if rest[:1] in ("-", "+"):
        negative, rest = rest[0] == "-", rest[1:]
    if rest == "0":
        return 0.0
    invalid = ValueError(f"time: invalid duration {go_quote(text)}")
    if not rest:
        raise invalid
    total = 0.0
    while rest:
        i = 0
        while i < len(rest) and rest[i].isascii() and rest[i].isdigit():
            i += 1
        whole, rest = rest[:i], rest[i:]
        fraction = ""
        if rest[:1] == ".":
            j = 1
            while j < len(rest) and rest[j].isascii() and rest[j].isdigit():
                j += 1
            fraction, rest = rest[1:j], rest[j:]
        if not whole and not fraction:
            raise invalid
        j = 0
        while j < len(rest) and rest[j] != "." and not (rest[j].isascii() and rest[j].isdigit()):
            j += 1
        if j == 0:
            raise ValueError(f"time: missing unit in duration {go_quote(text)}")
        unit, rest = rest[:j], rest[j:]
        if unit not in UNIT_NS:
            raise ValueError(f"time: unknown unit {go_quote(unit)} in duration {go_quote(text)}")
        total += float(f"{whole or 0}.{fraction or 0}") * UNIT_NS[unit]
        if total > MAX_DURATION_NS:
            raise invalid
    return -total / 1e9 if negative else total / 1e9


def parse_keep_alive(value: Any) -> float | None:
    """api.Duration.UnmarshalJSON: seconds, math.inf for any negative (forever), None when
    the call does not set it (JSON null leaves the pointer nil); ValueError with Ollama's
    text for what it refuses (400). A number of seconds past Go's Duration (about 292 years)
    is not forever but negative (HEAD api/types.go:1252-1257; v0.12.6 :986-991)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        kind = {bool: "bool", list: "[]interface {}", dict: "map[string]interface {}"}
        raise ValueError(f"Unsupported type: '{kind.get(type(value), type(value).__name__)}'")
    if isinstance(value, str):
        seconds = parse_go_duration(value)
    elif value * 1e9 >= 1 << 63:
        return OVERFLOWED_S
    else:  # time.Duration(t * 1e9): whole nanoseconds, truncated
        seconds = 0.0 if 0 <= value * 1e9 < 1 else float(value)
    return math.inf if seconds < 0 else seconds


def option_type_error(options: dict[str, Any]) -> str | None:
    """Options.FromMap's refusal of the first option whose JSON type does not fit its field
    (numbers are float64 to Go, so any number fits an integer; null is skipped; unknown keys
    are ignored)."""
    for key, value in options.items():
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key in INT_OPTIONS and not number:
            return f'option "{key}" must be of type integer'
        if key in FLOAT_OPTIONS and not number:
            return f'option "{key}" must be of type float32'
        if key in BOOL_OPTIONS and not isinstance(value, bool):
            return f'option "{key}" must be of type boolean'
        if key in LIST_OPTIONS:
            if not isinstance(value, list):
                return f'option "{key}" must be of type array'
            if not all(isinstance(item, str) for item in value):
                return f'option "{key}" must be of an array of strings'
    return None


def thinks(think: Any, model: SimModel) -> bool:
    """Whether the model thinks for this call: `think` unset is true on a model with the
    "thinking" capability (server/routes.go:457 generate, 2619 chat); a bool or a level
    (api.ThinkValue.Bool, api/types.go:1166-1180) otherwise."""
    if think is None:
        return model.thinks
    return think is True or think in ("low", "medium", "high", "max")


# Before 0.17.7 a think level is refused on any model but a harmony one (gpt-oss), before
# the capabilities (v0.12.6 server/routes.go:323-327 generate, chat alike).
THINK_LEVEL_ANY_MODEL_SINCE = (0, 17, 7)
HARMONY_FAMILIES = ("gptoss", "gpt-oss")


def capability_refusal(model: SimModel, body: dict[str, Any], chat: bool, relax: bool,
                       version: str = "") -> str | None:
    """The 400 Ollama answers, before any load, for what the model cannot do: before 0.17.7
    a think level on a model without harmony, then thinking asked of a model without it
    (dropped instead behind the Anthropic layer: `relax`), chat or generate on a model
    without "completion", tools on one without "tools", a generate `suffix` on one without
    "insert" (server/routes.go:448-451)."""
    asked = str(body.get("model"))
    think = body.get("think")
    if isinstance(think, str) and version_tuple(version) < THINK_LEVEL_ANY_MODEL_SINCE and \
            model.model_family not in HARMONY_FAMILIES:
        return f"think value {go_quote(think)} is not supported for this model"
    if not model.thinks and thinks(body.get("think"), model) and not relax:
        return f"{go_quote(asked)} does not support thinking"
    if model.embedding:
        return f"{go_quote(asked)} does not support {'chat' if chat else 'generate'}"
    if chat and body.get("tools") and not model.tools:
        return f"{DEFAULT_HOST}{model.name} does not support tools"
    suffix = body.get("suffix")
    if not chat and isinstance(suffix, str) and suffix and not model.insert:
        return f"{DEFAULT_HOST}{model.name} does not support insert"
    return None


def pull_ref(raw: str, version: str) -> sim_cloud.Refused | str:
    """The store name a delete (and pull) looks up, or its 400: from 0.18
    parseNormalizePullModelRef (server/model_resolver.go; modelref.go ParseRef and
    NormalizePullName: `:cloud` becomes the legacy `-cloud` tag), before it ParseName alone
    (v0.17.7 server/routes.go DeleteHandler)."""
    name = raw
    if version_tuple(version) >= sim_cloud.SOURCE_SUFFIXES_SINCE:
        trimmed = raw.strip()
        if not trimmed:
            return sim_cloud.Refused(400, "model is required")
        base, source = sim_cloud.source_suffix(trimmed)
        if source and sim_cloud.source_suffix(base)[1]:
            return sim_cloud.Refused(
                400, f"use either :local or :cloud, not both: {go_quote(trimmed)}")
        name = base
        if source == "cloud":
            name = base + ("-cloud" if ":" in base.rsplit("/", 1)[-1] else ":cloud")
    return name if valid_name(name) else sim_cloud.Refused(400, f"name {go_quote(raw)} is invalid")


# Go's netip IsPrivate: RFC 1918 and RFC 4193 only
GO_PRIVATE = tuple(ipaddress.ip_network(n) for n in
                   ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))


def host_allowed(host_header: str, hostname: str) -> bool:
    """Ollama's allowedHost on a loopback listener (server/routes.go allowedHostsMiddleware,
    the same in 0.12.6 and 0.24.0): the Host's host (Go's net.SplitHostPort, else the Host
    as it came) is an IP that is loopback, private or unspecified, or empty, `localhost`,
    the machine's name, or a name under .localhost, .local or .internal. (Ollama also takes
    its interfaces' own public addresses; the simulator listens on loopback only.)"""
    return host_kind(host_header, hostname) is not None


def host_kind(host_header: str, hostname: str) -> str | None:
    """"ip" for a Host the middleware passes on as a local IP, "name" for one it passes as a
    local name (there an OPTIONS is its 204), None for one it refuses."""
    host = host_header
    colon = host_header.rfind(":")
    if colon >= 0:
        if host_header.startswith("["):
            end = host_header.find("]")
            if end >= 0 and end + 1 == colon and "[" not in host_header[1:] and \
                    "]" not in host_header[end + 1:]:
                host = host_header[1:end]
        elif ":" not in host_header[:colon] and "[" not in host_header and \
                "]" not in host_header:
            host = host_header[:colon]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        plain = ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip
        if plain.is_loopback or ip.is_unspecified or any(plain in n for n in GO_PRIVATE):
            return "ip"
    host = host.lower()
    if host in ("", "localhost", hostname.lower()) or \
            any(host.endswith(f".{tld}") for tld in ("localhost", "local", "internal")):
        return "name"
    return None
