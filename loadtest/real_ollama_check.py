"""A differential check, run by hand: the same requests to a real Ollama and to the simulator.

It prints, per request, where the two differ in status code, error text and JSON shape (keys
and value types, recursively; for a stream, the shape of its first and last chunk). Each
difference is a candidate simulator defect, to be confirmed in Ollama's source. Model names
differ on the two sides (a real Ollama here serves a tiny GGUF, see
loadtest/build_real_ollama.sh), so each side's name is replaced by `<model>` in texts, and
values tied to a model (its trained context) are read from its own `/api/show`.

    python -m loadtest.ollama_sim --port 21501 --version 0.12.6 &
    python -m loadtest.real_ollama_check --real http://127.0.0.1:21434 --real-model tiny \\
        --sim http://127.0.0.1:21501 --sim-model phi3:mini
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

LONG_PROMPT = " ".join(["hello world the a is of and to"] * 60)  # ~500 tokens on either side


@dataclass(frozen=True)
class Side:
    """One server under test and the model it serves."""

    url: str
    model: str
    trained_ctx: int = 0


@dataclass(frozen=True)
class Case:
    """One request; `body` builds it for a side, `after` names a read done right after it."""

    name: str
    path: str
    body: Callable[[Side], Any] | None  # None: a GET
    after: str = ""


@dataclass
class Outcome:
    """What one side answered: status, error text, shape, and values worth printing."""

    status: int
    error: str = ""
    shape: Any = None
    notes: dict[str, Any] = field(default_factory=dict)


def shape(value: Any) -> Any:
    """Keys and value types, recursively; a list by its first item; numbers as one type
    (Go's encoder writes 1.0 as 1)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if value is None:
        return "null"
    return "string"


def _opts(**extra: Any) -> dict[str, Any]:
    return {"num_predict": 3, "temperature": 0, "seed": 1, **extra}


def _gen(**extra: Any) -> Callable[[Side], Any]:
    return lambda s: {"model": s.model, "prompt": "hello", "stream": False,
                      "options": _opts(), **extra}


def _chat(**extra: Any) -> Callable[[Side], Any]:
    return lambda s: {"model": s.model, "messages": [{"role": "user", "content": "hello"}],
                      "stream": False, "options": _opts(), **extra}


CASES: tuple[Case, ...] = (
    Case("generate", "/api/generate", _gen(), after="ps"),
    Case("generate stream", "/api/generate", _gen(stream=True)),
    Case("generate empty prompt (load only)", "/api/generate",
         lambda s: {"model": s.model, "stream": False}),
    Case("chat", "/api/chat", _chat()),
    Case("chat stream", "/api/chat", _chat(stream=True)),
    Case("chat empty messages (load only)", "/api/chat",
         lambda s: {"model": s.model, "messages": [], "stream": False}),
    Case("prompt longer than num_ctx 64", "/api/generate",
         lambda s: {"model": s.model, "prompt": LONG_PROMPT, "stream": False,
                    "options": _opts(num_ctx=64)}, after="ps"),
    Case("chat longer than num_ctx 64", "/api/chat",
         lambda s: {"model": s.model, "stream": False, "options": _opts(num_ctx=64),
                    "messages": [{"role": "user", "content": LONG_PROMPT}]}),
    Case("num_ctx 2 x trained context", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hello", "stream": False,
                    "options": _opts(num_ctx=2 * s.trained_ctx)}, after="ps"),
    Case("prompt over the trained context, num_ctx 2 x it", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hello " * (3 * s.trained_ctx // 2),
                    "stream": False, "options": _opts(num_ctx=2 * s.trained_ctx)}, after="ps"),
    Case("num_ctx 1 (under the floor)", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hello", "stream": False,
                    "options": _opts(num_ctx=1)}, after="ps"),
    Case("keep_alive -1", "/api/generate", _gen(keep_alive=-1), after="ps"),
    Case("keep_alive '-5m'", "/api/generate", _gen(keep_alive="-5m"), after="ps"),
    Case("keep_alive 0", "/api/generate", _gen(keep_alive=0), after="unload"),
    Case("keep_alive 'abc'", "/api/generate", _gen(keep_alive="abc")),
    Case("unknown model generate", "/api/generate",
         lambda s: {"model": "no-such-model", "prompt": "hi", "stream": False}),
    Case("unknown model chat", "/api/chat",
         lambda s: {"model": "no-such-model", "messages": [], "stream": False}),
    Case("unknown model show", "/api/show", lambda s: {"model": "no-such-model"}),
    Case("unknown model openai", "/v1/chat/completions",
         lambda s: {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
    Case("missing model", "/api/generate", lambda s: {"prompt": "hi", "stream": False}),
    Case("body not JSON", "/api/generate", lambda s: "{not json"),
    Case("body cut short", "/api/chat", lambda s: '{"model": "x"'),
    Case("body a JSON array", "/api/generate", lambda s: "[1]"),
    Case("body empty", "/api/chat", lambda s: ""),
    Case("stream as a string", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hi", "stream": "yes"}),
    Case("messages not a list", "/api/chat",
         lambda s: {"model": s.model, "messages": "hi", "stream": False}),
    Case("openai body not JSON", "/v1/chat/completions", lambda s: "{not json"),
    Case("openai without messages", "/v1/chat/completions", lambda s: {"model": s.model}),
    Case("num_ctx as a string", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hi", "stream": False,
                    "options": {"num_ctx": "abc"}}),
    Case("temperature as a string", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hi", "stream": False,
                    "options": {"temperature": "hot"}}),
    Case("num_predict as a float", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hi", "stream": False,
                    "options": {"num_predict": 1.5}}),
    Case("unknown option", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hi", "stream": False,
                    "options": {"num_predict": 2, "no_such_option": 1}}),
    Case("options not an object", "/api/generate",
         lambda s: {"model": s.model, "prompt": "hi", "stream": False, "options": 5}),
    Case("think on a model without thinking", "/api/chat", _chat(think=True)),
    Case("format json", "/api/generate", _gen(format="json")),
    Case("unload request (keep_alive 0, no prompt)", "/api/generate",
         lambda s: {"model": s.model, "keep_alive": 0}, after="unload"),
    Case("keep_alive '5' (no unit)", "/api/generate", _gen(keep_alive="5"), after="ps"),
    Case("raw prompt", "/api/generate", _gen(raw=True)),
    Case("tools on a model without tools", "/api/chat",
         _chat(tools=[{"type": "function", "function": {
             "name": "f", "description": "d", "parameters": {"type": "object",
                                                             "properties": {}}}}])),
    Case("images on a model without vision", "/api/generate",
         _gen(images=["iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4"
                      "z8BQDwAEgAF/QualzQAAAABJRU5ErkJggg=="])),
    Case("format schema", "/api/chat", _chat(format={"type": "object", "properties": {
        "a": {"type": "string"}}})),
    Case("embed on a completion model", "/api/embed",
         lambda s: {"model": s.model, "input": "hello"}),
    Case("openai embeddings on a completion model", "/v1/embeddings",
         lambda s: {"model": s.model, "input": "hello"}),
    Case("show", "/api/show", lambda s: {"model": s.model}),
    Case("show verbose", "/api/show", lambda s: {"model": s.model, "verbose": True}),
    Case("ps", "/api/ps", None),
    Case("tags", "/api/tags", None),
    Case("version", "/api/version", None),
    Case("openai chat", "/v1/chat/completions",
         lambda s: {"model": s.model, "max_tokens": 3, "temperature": 0,
                    "messages": [{"role": "user", "content": "hello"}]}),
    Case("openai chat stream", "/v1/chat/completions",
         lambda s: {"model": s.model, "max_tokens": 3, "stream": True,
                    "messages": [{"role": "user", "content": "hello"}]}),
    Case("openai chat stream usage", "/v1/chat/completions",
         lambda s: {"model": s.model, "max_tokens": 3, "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": [{"role": "user", "content": "hello"}]}),
    Case("openai completions", "/v1/completions",
         lambda s: {"model": s.model, "max_tokens": 3, "prompt": "hello"}),
    Case("openai models", "/v1/models", None),
    Case("openai model", "/v1/models/{model}", None),
    Case("responses", "/v1/responses",
         lambda s: {"model": s.model, "max_output_tokens": 3, "input": "hello"}),
    Case("responses stream", "/v1/responses",
         lambda s: {"model": s.model, "max_output_tokens": 3, "input": "hello",
                    "stream": True}),
    # Go binds nested struct keys case-insensitively (openai/responses.go input items and
    # content parts, openai.ResponseFormat)
    Case("responses capitalised item and parts", "/v1/responses",
         lambda s: {"model": s.model, "max_output_tokens": 3, "input": [
             {"Type": "message", "Role": "user",
              "Content": [{"Type": "input_text", "Text": "hello"}]}]}),
    Case("responses capitalised file part", "/v1/responses",
         lambda s: {"model": s.model, "input": [
             {"Role": "user", "Content": [{"TYPE": "input_file", "file_data": "aGk="}]}]}),
    Case("openai chat capitalised response_format", "/v1/chat/completions",
         lambda s: {"model": s.model, "max_tokens": 3, "response_format": {
             "Type": "json_schema", "JSON_Schema": {"Schema": "object"}},
             "messages": [{"role": "user", "content": "hello"}]}),
)


def _normalize(text: str, side: Side) -> str:
    full = side.model if ":" in side.model else side.model + ":latest"
    return text.replace(full, "<model>").replace(side.model, "<model>")


def _chunks(resp: httpx.Response) -> list[Any]:
    """The JSON objects of a body: one, NDJSON lines or SSE `data:` lines."""
    out: list[Any] = []
    for line in resp.text.splitlines():
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        if not line or line == "[DONE]":
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out


def _error_text(obj: Any) -> str:
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict):  # OpenAI's {"error": {"message": ...}}
        return str(err.get("message", ""))
    return str(err or "")


def _body_shape(chunks: list[Any], side: Side) -> Any:
    if len(chunks) <= 1:
        return shape(chunks[0]) if chunks else None
    return {"first": shape(chunks[0]), "last": shape(chunks[-1])}


def _generic_model_info(body: Any) -> Any:
    """`model_info` keys by `<arch>.` rather than each model's architecture."""
    if isinstance(body, dict) and isinstance(body.get("model_info"), dict):
        info = body["model_info"]
        arch = str(info.get("general.architecture", ""))
        body = {**body, "model_info": {
            (k.replace(arch + ".", "<arch>.", 1) if arch else k): v for k, v in info.items()}}
    return body


def _notes(chunks: list[Any]) -> dict[str, Any]:
    """Values worth seeing side by side (not compared: the models differ)."""
    last = chunks[-1] if chunks else None
    if not isinstance(last, dict):
        return {}
    keys = ("done_reason", "prompt_eval_count", "eval_count")
    notes = {k: last[k] for k in keys if k in last}
    if isinstance(last.get("usage"), dict):
        notes["usage"] = last["usage"]
    return notes


def _ps_notes(client: httpx.Client, side: Side) -> dict[str, Any]:
    models = client.get(f"{side.url}/api/ps").json().get("models") or []
    mine = [m for m in models if m.get("name", "").split(":")[0] == side.model.split(":")[0]]
    if not mine:
        return {"ps": "not loaded"}
    m = mine[0]
    year = str(m.get("expires_at", ""))[:4]
    return {"ps.context_length": m.get("context_length"), "ps.expires_year": year,
            "ps.size_vram=size": m.get("size_vram") == m.get("size")}


def _after(client: httpx.Client, side: Side, what: str) -> dict[str, Any]:
    """`/api/ps` right after the call; for "unload", once the copy is gone (keep_alive 0
    unloads after the answer, in a moment that a busy machine stretches), at most 10 s."""
    notes = _ps_notes(client, side) if what else {}
    deadline = time.monotonic() + 10
    while what == "unload" and notes.get("ps") != "not loaded" and time.monotonic() < deadline:
        time.sleep(0.1)
        notes = _ps_notes(client, side)
    return notes


def run_case(client: httpx.Client, side: Side, case: Case) -> Outcome:
    path = case.path.replace("{model}", side.model)
    body: Any = None
    if case.body is None:
        resp = client.get(side.url + path)
    else:
        body = case.body(side)
        content = body if isinstance(body, str) else json.dumps(body)
        resp = client.post(side.url + path, content=content,
                           headers={"Content-Type": "application/json"})
    chunks = _chunks(resp)
    if case.name.startswith("show"):
        chunks = [_generic_model_info(c) for c in chunks]
    error = next((_error_text(c) for c in chunks if _error_text(c)), "")
    out = Outcome(resp.status_code, _normalize(error, side), _body_shape(chunks, side),
                  _notes(chunks))
    out.notes.update(_after(client, side, case.after))
    out.notes.update(_trained_notes(body, out.notes, side))
    return out


def _trained_notes(body: Any, notes: dict[str, Any], side: Side) -> dict[str, Any]:
    """For a call asking more than the trained context: what the copy runs at and lists,
    as a share of the trained context (the same on both sides whatever the model)."""
    options = body.get("options") if isinstance(body, dict) else None
    asked = options.get("num_ctx") if isinstance(options, dict) else None
    if not isinstance(asked, int) or not side.trained_ctx or asked <= side.trained_ctx:
        return {}
    out: dict[str, Any] = {}
    listed = notes.get("ps.context_length")
    if isinstance(listed, int):
        out["ps.context_length/trained"] = round(listed / side.trained_ctx, 2)
    counted = notes.get("prompt_eval_count")
    if isinstance(counted, int):
        out["prompt_eval_count<=trained"] = counted <= side.trained_ctx
    return out


def shape_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two shapes differ, as `path: real X, sim Y` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        lines: list[str] = []
        for k in sorted(set(a) | set(b)):
            where = f"{path}.{k}" if path else k
            if k not in b:
                lines.append(f"{where}: only real ({json.dumps(a[k])[:60]})")
            elif k not in a:
                lines.append(f"{where}: only sim ({json.dumps(b[k])[:60]})")
            else:
                lines.extend(shape_diff(a[k], b[k], where))
        return lines
    if isinstance(a, list) and isinstance(b, list):
        if a and b:
            return shape_diff(a[0], b[0], path + "[]")
        return []  # an empty list says nothing about its items
    if a != b:
        return [f"{path or '.'}: real {json.dumps(a)[:60]}, sim {json.dumps(b)[:60]}"]
    return []


# Notes that do not depend on the model: compared too.
COMPARED_NOTES = ("done_reason", "ps", "ps.expires_year", "ps.context_length/trained",
                  "prompt_eval_count<=trained")


def compare(real: Outcome, sim: Outcome) -> list[str]:
    lines = [f"{k}: real {real.notes.get(k)!r}, sim {sim.notes.get(k)!r}"
             for k in COMPARED_NOTES if real.notes.get(k) != sim.notes.get(k)]
    if real.status != sim.status:
        lines.append(f"status: real {real.status}, sim {sim.status}")
    if real.error != sim.error:
        lines.append(f"error: real {real.error!r}, sim {sim.error!r}")
    lines.extend(shape_diff(real.shape, sim.shape))
    return lines


def trained_context(client: httpx.Client, side: Side) -> int:
    info = client.post(f"{side.url}/api/show", json={"model": side.model}).json()["model_info"]
    arch = info["general.architecture"]
    return int(info[f"{arch}.context_length"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.real_ollama_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", required=True, help="a real Ollama's base URL")
    p.add_argument("--sim", required=True, help="the simulator's base URL")
    p.add_argument("--real-model", default="tiny")
    p.add_argument("--sim-model", default="phi3:mini")
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    with httpx.Client(timeout=args.timeout) as client:
        sides = [Side(url.rstrip("/"), model) for url, model in
                 ((args.real, args.real_model), (args.sim, args.sim_model))]
        real, sim = (Side(s.url, s.model, trained_context(client, s)) for s in sides)
        differing = 0
        cases = [c for c in CASES if args.only in c.name]
        for case in cases:
            a, b = run_case(client, real, case), run_case(client, sim, case)
            diffs = compare(a, b)
            differing += bool(diffs)
            print(f"{'DIFF' if diffs else 'same'}  {case.name}  [{case.path}]")
            for line in diffs:
                print(f"      {line}")
            if a.notes or b.notes:
                print(f"      notes: real {a.notes}\n             sim  {b.notes}")
        print(f"{differing} of {len(cases)} requests differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
