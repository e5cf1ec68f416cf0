"""The sidecar in front of real Ollama servers, run by hand: every request through the sidecar
and straight to the Ollama that served it, and where the two differ (status, error text, JSON
shape, stream chunks), as an outside judge sees it (only CONTRACT.md's interface, the official
`ollama`, `openai` and `anthropic` clients as the agents). After each phase it reads the
sidecar's `GET /kubemoot/v1/state` and `/metrics`: no ticket left, nothing in flight or
claimed, and the copies it believes loaded are those each real `/api/ps` lists.

It starts everything itself (two real `ollama serve` built from source, CPU only, with the
tiny GGUF as `tiny` and a second weights file as `tiny2`; the sidecar with embedded state,
or a real nats-server, `init-buckets`, one `publish` and two sidecars) and stops it at the end:

    python -m loadtest.real_ollama_sidecar --old /tmp/rl14/ollama-0.12.6/ollama \\
        --new /tmp/rl14/ollama-v0.24.0/ollama --models /tmp/rl14/model --port 22150 \\
        [--same] [--nats] [--only NAME]

`--same` runs two of the `--old` version instead of one of each. Differences that are the
sidecar's documented additions (the `reason` and `model` of a refusal, 400 for an option of
the wrong type, 413 for a prompt the engine would cut, /v1/messages placed only on a version
that serves it) are counted apart, as `documented`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtest.loadgen import wait_http
from loadtest.real_ollama_check import _error_text, shape, shape_diff

MIB = 1 << 20
OPTS = {"num_predict": 3, "temperature": 0, "seed": 1}
LONG = " ".join(["hello world the a is of and to"] * 600)  # over the tiny model's 2048
# A stream of a second or so on CPU (real_ollama_sched.LONG_STREAM): long enough to stop its
# Ollama in the middle of it.
LONG_STREAM = {"temperature": 2, "top_k": 0, "top_p": 1, "repeat_penalty": 3,
               "repeat_last_n": -1, "seed": 1, "num_predict": 400}
TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {
    "type": "object", "properties": {}}}}


# --- the processes ---------------------------------------------------------------------------

@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env},
                                         stdout=out, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


@dataclass
class Provider:
    name: str
    url: str
    version: str
    proc: Proc

    @property
    def anthropic(self) -> bool:  # /v1/messages from 0.14 (server/routes.go)
        return not self.version.startswith("0.12")


def _wait_http(url: str) -> None:
    wait_http(url, 30.0)


def start_ollama(name: str, binary: str, port: int, work: Path, models: Path) -> Provider:
    home, store = work / name / "home", work / name / "models"
    home.mkdir(parents=True, exist_ok=True)
    store.mkdir(parents=True, exist_ok=True)
    host = f"127.0.0.1:{port}"
    env = {"OLLAMA_HOST": host, "OLLAMA_MODELS": str(store), "HOME": str(home),
           "OLLAMA_NO_CLOUD": "1"}
    proc = Proc(name, [binary, "serve"], env, work / f"{name}.log")
    proc.start()
    url = f"http://{host}"
    _wait_http(url + "/api/version")
    for model, gguf in (("tiny", "tiny.gguf"), ("tiny2", "tiny2.gguf")):
        modelfile = work / f"Modelfile.{model}"
        modelfile.write_text(f"FROM {models / gguf}\n")
        subprocess.run([binary, "create", model, "-f", str(modelfile)], env={**os.environ, **env},
                       check=True, capture_output=True, cwd=models)
    version = httpx.get(url + "/api/version").json()["version"]
    return Provider(name, url, version, proc)


@dataclass
class Fleet:
    providers: list[Provider]
    sidecars: list[str]  # base URLs
    procs: list[Proc] = field(default_factory=list)
    nats: Any = None

    def provider(self, name: str) -> Provider:
        return next(p for p in self.providers if p.name == name)

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        for prov in self.providers:
            prov.proc.stop()
        if self.nats is not None:
            self.nats.cleanup()


def _proxy(args: list[str], env: dict[str, str], log: Path) -> Proc:
    return Proc(args[0], [sys.executable, "-m", "proxy", *args], env, log)


@contextmanager
def fleet(old: str, new: str, models: Path, port: int, same: bool, nats: bool,
          work: Path) -> Iterator[Fleet]:
    provs = [start_ollama("a", old, port, work, models),
             start_ollama("b", old if same else new, port + 1, work, models)]
    config = [{"name": f"{p.name}-{p.version}", "endpoint": p.url, "totalVramMiB": 4096}
              for p in provs]
    for p, c in zip(provs, config, strict=True):
        p.name = str(c["name"])
    env = {"KUBEMOOT_PROVIDERS": json.dumps(config), "KUBEMOOT_MODEL_MODEL": "tiny",
           "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS": "300"}
    # `ollama cp` on the second card only: a name of its tiny's manifest there, where the
    # first card's tiny is another manifest if its version differs (aliases, cases below)
    httpx.post(provs[1].url + "/api/copy", json={"source": "tiny", "destination": "onlyb"},
               timeout=30).raise_for_status()
    f = Fleet(provs, [])
    try:
        if nats:
            from loadtest.nats_server import NatsServer
            f.nats = NatsServer().start()
            env["KUBEMOOT_NATS_URL"] = f.nats.url
            subprocess.run([sys.executable, "-m", "proxy", "init-buckets"],
                           env={**os.environ, **env}, check=True, capture_output=True)
            f.procs.append(_proxy(["publish"], env, work / "publish.log"))
        for i in range(2 if nats else 1):
            listen = f"127.0.0.1:{port + 40 + i}"
            f.procs.append(_proxy(["serve"], {**env, "KUBEMOOT_LISTEN": listen,
                                              "KUBEMOOT_AGENT_NAME": f"agent{i}"},
                                  work / f"sidecar{i}.log"))
            f.sidecars.append(f"http://{listen}")
        for proc in f.procs:
            proc.start()
        for url in f.sidecars:
            _wait_http(url + "/readyz")
        yield f
    finally:
        f.stop()


# --- one call, both ways ---------------------------------------------------------------------

@dataclass
class Seen:
    """What a client saw: status, error text, the body's shape, notes (values compared)."""

    status: int
    error: str = ""
    shape: Any = None
    chunks: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # refusal fields beyond `error`


def _chunks(resp: httpx.Response) -> list[Any]:
    out: list[Any] = []
    for line in resp.text.splitlines():
        line = line.strip()
        if line.startswith("data:"):
            line = line[5:].strip()
        if not line or line == "[DONE]" or line.startswith("event:"):
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out


def _seen(resp: httpx.Response) -> Seen:
    chunks = _chunks(resp)
    error = next((_error_text(c) for c in chunks if _error_text(c)), "")
    extra: dict[str, Any] = {}
    if len(chunks) == 1 and isinstance(chunks[0], dict) and error:
        extra = {k: v for k, v in chunks[0].items() if k != "error"}
        chunks = [{"error": chunks[0]["error"]}]  # reason/model: compared apart
    body = (shape(chunks[0]) if len(chunks) == 1 else
            {"first": shape(chunks[0]), "last": shape(chunks[-1])} if chunks else None)
    last = chunks[-1] if chunks and isinstance(chunks[-1], dict) else {}
    notes = {k: last[k] for k in ("done_reason", "stop_reason", "object", "type") if k in last}
    if isinstance(last.get("model"), str):
        notes["model"] = last["model"]
    hdrs = {k.lower()[len("x-kubemoot-"):]: v for k, v in resp.headers.items()
            if k.lower().startswith("x-kubemoot-")}
    return Seen(resp.status_code, error, body, len(chunks), notes, hdrs, extra)


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: dict[str, Any] | str | None  # None: a GET
    anthropic: bool = False  # served only where the version has /v1/messages


def _gen(model: str = "tiny", **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hello", "stream": False, "options": OPTS, **extra}


def _chat(model: str = "tiny", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}],
            "stream": False, "options": OPTS, **extra}


CASES: tuple[Case, ...] = (
    Case("generate", "/api/generate", _gen()),
    Case("generate stream", "/api/generate", _gen(stream=True)),
    Case("generate tiny2", "/api/generate", _gen("tiny2")),
    Case("alias on one card (ollama cp)", "/api/generate", _gen("onlyb")),
    Case("chat", "/api/chat", _chat()),
    Case("chat stream", "/api/chat", _chat(stream=True)),
    Case("chat tiny2 stream", "/api/chat", _chat("tiny2", stream=True)),
    Case("embed", "/api/embed", {"model": "tiny", "input": "hello"}),
    Case("embed two inputs", "/api/embed", {"model": "tiny", "input": ["a", "b"]}),
    Case("embeddings (legacy)", "/api/embeddings", {"model": "tiny", "prompt": "hello"}),
    Case("embed over the context", "/api/embed", {"model": "tiny", "input": LONG}),
    Case("embed over the context, truncate", "/api/embed",
         {"model": "tiny", "input": LONG, "truncate": True}),
    Case("openai chat", "/v1/chat/completions", {
        "model": "tiny", "max_tokens": 3, "temperature": 0,
        "messages": [{"role": "user", "content": "hello"}]}),
    Case("openai chat stream usage", "/v1/chat/completions", {
        "model": "tiny", "max_tokens": 3, "stream": True, "temperature": 0, "seed": 1,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "hello"}]}),
    # (temperature 0 and a seed: an answer that ends early at random changes the chunks)
    Case("openai completions", "/v1/completions",
         {"model": "tiny", "max_tokens": 3, "prompt": "hello", "temperature": 0, "seed": 1}),
    Case("openai completions stream", "/v1/completions",
         {"model": "tiny", "max_tokens": 3, "prompt": "hello", "stream": True,
          "temperature": 0, "seed": 1}),
    Case("openai embeddings", "/v1/embeddings", {"model": "tiny", "input": "hello"}),
    Case("openai models", "/v1/models", None),
    Case("openai model", "/v1/models/tiny", None),
    Case("anthropic messages", "/v1/messages", {
        "model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]},
         anthropic=True),
    Case("anthropic messages stream", "/v1/messages", {
        "model": "tiny", "max_tokens": 3, "stream": True, "temperature": 0,
        "messages": [{"role": "user", "content": "hi"}]}, anthropic=True),
    Case("keep_alive -1", "/api/generate", _gen(keep_alive=-1)),
    Case("keep_alive '5m'", "/api/generate", _gen(keep_alive="5m")),
    Case("keep_alive 0", "/api/generate", _gen(keep_alive=0)),
    Case("load only (empty prompt)", "/api/generate", {"model": "tiny"}),
    Case("unload (empty prompt, keep_alive 0)", "/api/generate",
         {"model": "tiny", "keep_alive": 0}),
    Case("chat unload (no messages, keep_alive 0)", "/api/chat",
         {"model": "tiny2", "messages": [], "keep_alive": 0}),
    Case("num_ctx 512", "/api/generate", _gen(options={**OPTS, "num_ctx": 512})),
    Case("num_ctx 1024 chat", "/api/chat", _chat(options={**OPTS, "num_ctx": 1024})),
    Case("num_ctx 64, prompt of 500 tokens", "/api/generate",
         {"model": "tiny", "prompt": LONG[:500], "stream": False,
          "options": {**OPTS, "num_ctx": 64}}),
    Case("prompt over the trained context", "/api/generate",
         {"model": "tiny", "prompt": LONG, "stream": False, "options": OPTS}),
    Case("prompt over the context, stream", "/api/chat",
         {"model": "tiny", "messages": [{"role": "user", "content": LONG}], "options": OPTS}),
    Case("unknown model", "/api/chat", _chat("no-such-model")),
    Case("unknown model generate stream", "/api/generate", _gen("no-such-model", stream=True)),
    Case("unknown model openai", "/v1/chat/completions",
         {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
    Case("unknown model embed", "/api/embed", {"model": "no-such-model", "input": "hi"}),
    Case("num_ctx as a string", "/api/generate", _gen(options={"num_ctx": "abc"})),
    Case("temperature as a string", "/api/generate", _gen(options={"temperature": "hot"})),
    Case("unknown option", "/api/generate", _gen(options={**OPTS, "no_such_option": 1})),
    Case("tools", "/api/chat", _chat(tools=[TOOL])),
    Case("format json", "/api/generate", _gen(format="json")),
    Case("format schema", "/api/chat", _chat(format={
        "type": "object", "properties": {"a": {"type": "string"}}})),
    Case("think", "/api/chat", _chat(think=True)),
    Case("think false", "/api/chat", _chat(think=False)),
    Case("show", "/api/show", {"model": "tiny"}),
    Case("ps", "/api/ps", None),
    Case("tags", "/api/tags", None),
    Case("version", "/api/version", None),
    Case("body not JSON", "/api/generate", "{not json"),
)

# Documented additions: a refusal's `reason` and `model`; these statuses for these cases.
DOCUMENTED_STATUS = {
    ("num_ctx as a string", 400), ("temperature as a string", 400),  # CONTRACT: bad-request
    ("prompt over the trained context", 413), ("prompt over the context, stream", 413),
    ("num_ctx 64, prompt of 500 tokens", 413), ("embed over the context", 413),
    # 413 where the engine itself refuses the input (both versions, even with truncate)
    ("embed over the context, truncate", 413),
    # no provider's version serves /v1/messages: 404 as Ollama, in Anthropic's error shape
    ("anthropic messages", 404), ("anthropic messages stream", 404),
}
# Shape differences that are documented additions: /api/ps may say which provider.
DOCUMENTED_SHAPE = {"ps": {"shape models[].provider: only sidecar (\"string\")"}}


def _send(client: httpx.Client, url: str, case: Case) -> httpx.Response:
    if case.body is None:
        return client.get(url + case.path)
    content = case.body if isinstance(case.body, str) else json.dumps(case.body)
    return client.post(url + case.path, content=content,
                       headers={"Content-Type": "application/json"})


def compare(via: Seen, direct: Seen) -> list[str]:
    lines = []
    if via.status != direct.status:
        lines.append(f"status: sidecar {via.status}, direct {direct.status}")
    if via.error != direct.error:
        lines.append(f"error: sidecar {via.error[:140]!r}, direct {direct.error[:140]!r}")
    lines += [f"shape {d}".replace("real", "sidecar").replace("sim", "direct")
              for d in shape_diff(via.shape, direct.shape)]
    for k in sorted(set(via.notes) | set(direct.notes)):
        if via.notes.get(k) != direct.notes.get(k):
            lines.append(f"{k}: sidecar {via.notes.get(k)!r}, direct {direct.notes.get(k)!r}")
    if via.chunks != direct.chunks and min(via.chunks, direct.chunks) > 1:
        lines.append(f"stream chunks: sidecar {via.chunks}, direct {direct.chunks}")
    return lines


def _direct_target(f: Fleet, case: Case, via: Seen) -> Provider:
    named = via.headers.get("provider", "")
    if any(p.name == named for p in f.providers):
        return f.provider(named)
    if case.anthropic:
        return next((p for p in f.providers if p.anthropic), f.providers[0])
    return f.providers[0]


@dataclass
class Report:
    differing: int = 0
    documented: int = 0
    same: int = 0
    problems: list[str] = field(default_factory=list)

    def case(self, name: str, lines: list[str], documented: bool = False) -> None:
        if not lines:
            self.same += 1
            print(f"same  {name}")
            return
        if documented:
            self.documented += 1
        else:
            self.differing += 1
        print(f"{'DOC ' if documented else 'DIFF'}  {name}")
        for line in lines:
            print(f"      {line}")

    def problem(self, phase: str, what: str) -> None:
        self.problems.append(f"{phase}: {what}")
        print(f"PROBLEM  {phase}: {what}")


def run_cases(client: httpx.Client, f: Fleet, report: Report, only: str) -> None:
    for i, case in enumerate(c for c in CASES if only in c.name):
        sidecar = f.sidecars[i % len(f.sidecars)]
        via = _seen(_send(client, sidecar, case))
        target = _direct_target(f, case, via)
        direct = _seen(_send(client, target.url, case))
        lines = [x for x in compare(via, direct)
                 if x not in DOCUMENTED_SHAPE.get(case.name, set())]
        documented = (case.name, via.status) in DOCUMENTED_STATUS
        if via.extra and not documented and \
                set(via.extra) - {"reason", "model"}:
            lines.append(f"refusal fields: {sorted(via.extra)}")
        where = via.headers.get("provider", "-") + "/" + via.headers.get("placement", "-")
        report.case(f"{case.name}  [{case.path}] via {where} vs {target.name}", lines,
                    documented)
        if case.anthropic and via.status == 200 and not f.provider(
                via.headers.get("provider", f.providers[0].name)).anthropic:
            report.problem("cases", f"{case.name} placed on a version without /v1/messages")


# --- the official clients --------------------------------------------------------------------

def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """(`ok` or the exception's class and status, the result's shape)."""
    try:
        result = call()
    except Exception as exc:  # what the client raised is the outcome
        status = getattr(exc, "status_code", None) or getattr(
            getattr(exc, "response", None), "status_code", None)
        return f"{type(exc).__name__} {status}", str(exc)[:120]
    if isinstance(result, Iterator) or (hasattr(result, "__iter__") and not isinstance(
            result, dict | list | str) and not hasattr(result, "model_dump")):
        items = [getattr(x, "model_dump", lambda x=x: x)() for x in result]
        return "ok", {"first": shape(items[0]), "last": shape(items[-1])} if items else []
    dumped = result.model_dump() if hasattr(result, "model_dump") else result
    return "ok", shape(dumped)


def _client_calls() -> dict[str, Callable[[str], Callable[[], Any]]]:
    import anthropic
    import ollama
    import openai

    msgs = [{"role": "user", "content": "hello"}]

    def oll(url: str) -> ollama.Client:
        return ollama.Client(host=url, timeout=120)

    def oai(url: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)

    def ant(url: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)

    return {
        "ollama chat": lambda u: lambda: oll(u).chat("tiny", msgs, options=OPTS),
        "ollama chat stream": lambda u: lambda: oll(u).chat("tiny", msgs, options=OPTS,
                                                            stream=True),
        "ollama generate": lambda u: lambda: oll(u).generate("tiny2", "hello", options=OPTS),
        "ollama generate stream": lambda u: lambda: oll(u).generate(
            "tiny", "hello", options=OPTS, stream=True),
        "ollama embed": lambda u: lambda: oll(u).embed("tiny", ["a", "b"]),
        "ollama embeddings": lambda u: lambda: oll(u).embeddings("tiny", "a"),
        "ollama unknown model": lambda u: lambda: oll(u).chat("no-such-model", msgs),
        "ollama over the context": lambda u: lambda: oll(u).generate("tiny", LONG,
                                                                     options=OPTS),
        "ollama ps": lambda u: lambda: oll(u).ps(),
        "ollama list": lambda u: lambda: oll(u).list(),
        "ollama show": lambda u: lambda: oll(u).show("tiny"),
        "openai chat": lambda u: lambda: oai(u).chat.completions.create(
            model="tiny", messages=msgs, max_tokens=3),  # type: ignore[arg-type]
        "openai chat stream": lambda u: lambda: oai(u).chat.completions.create(
            model="tiny", messages=msgs, max_tokens=3, stream=True),  # type: ignore[arg-type]
        "openai completions": lambda u: lambda: oai(u).completions.create(
            model="tiny", prompt="hello", max_tokens=3),
        "openai embeddings": lambda u: lambda: oai(u).embeddings.create(
            model="tiny", input="hello"),
        "openai models": lambda u: lambda: oai(u).models.list(),
        "openai unknown model": lambda u: lambda: oai(u).chat.completions.create(
            model="no-such-model", messages=msgs),  # type: ignore[arg-type]
        "anthropic messages": lambda u: lambda: ant(u).messages.create(
            model="tiny", max_tokens=3, messages=msgs),  # type: ignore[arg-type]
        "anthropic messages stream": lambda u: lambda: list(ant(u).messages.create(
            model="tiny", max_tokens=3, messages=msgs, stream=True)),  # type: ignore[arg-type]
    }


def run_clients(f: Fleet, report: Report, only: str) -> None:
    calls = _client_calls()
    for i, (name, make) in enumerate(c for c in calls.items() if only in c[0]):
        sidecar = f.sidecars[i % len(f.sidecars)]
        target = next((p for p in f.providers if p.anthropic), f.providers[0]) \
            if name.startswith("anthropic") else f.providers[0]
        via, direct = _outcome(make(sidecar)), _outcome(make(target.url))
        lines = []
        if via[0] != direct[0]:
            lines.append(f"outcome: sidecar {via[0]} {via[1]!r}, direct {direct[0]} "
                         f"{direct[1]!r}")
        elif via[0] == "ok":
            lines += shape_diff(via[1], direct[1])
        documented = name == "ollama over the context" and via[0].endswith("413")
        report.case(f"client {name} vs {target.name}", lines, documented)


# --- what the sidecar believes ---------------------------------------------------------------

def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _real_loads(client: httpx.Client, f: Fleet) -> dict[str, set[tuple[str, int]]]:
    """Each reachable provider's copies, by manifest digest (names of one manifest are one
    copy, which the sidecar shows under the name it places them as) and context."""
    out: dict[str, set[tuple[str, int]]] = {}
    for p in f.providers:
        try:
            ps = client.get(p.url + "/api/ps").json().get("models") or []
        except httpx.HTTPError:
            continue
        out[p.name] = {(m.get("digest", m["name"]), int(m.get("context_length") or 0))
                       for m in ps}
    return out


def _digests(client: httpx.Client, p: Provider) -> dict[str, str]:
    try:
        tags = client.get(p.url + "/api/tags").json().get("models") or []
    except httpx.HTTPError:
        return {}
    return {m["name"]: m.get("digest", m["name"]) for m in tags}


def _believed(client: httpx.Client, f: Fleet, state: dict[str, Any]
              ) -> dict[str, set[tuple[str, int]]]:
    out = {}
    for prov in state.get("providers", []):
        if not prov.get("ready") or not any(p.name == prov["name"] for p in f.providers):
            continue
        digests = _digests(client, f.provider(prov["name"]))
        out[prov["name"]] = {(digests.get(r["model"], r["model"]),
                              int(r.get("contextLength") or 0))
                             for r in prov.get("residents", [])}
    return out


_TRAINED: dict[tuple[str, str], int] = {}


def _capped(client: httpx.Client, f: Fleet, prov: str, loads: set[tuple[str, int]]
            ) -> set[tuple[str, int]]:
    """The believed copies with their context as the provider's /api/ps lists it: from
    0.15.5 capped at the trained context (server/routes.go:1914 at v0.15.5), where the
    sidecar keeps the num_ctx asked for (what a call joining it must send, core/tickets.py
    `_asked_as_loaded`)."""
    p = f.provider(prov)
    if tuple(int(x) for x in p.version.split(".")[:3]) < (0, 15, 5):
        return loads
    out = set()
    names = {digest: name for name, digest in _digests(client, p).items()}
    for model, ctx in loads:
        if (p.url, model) not in _TRAINED:
            info = client.post(p.url + "/api/show", json={"model": names.get(model, model)}
                               ).json()
            info = info.get("model_info") or {}
            arch = info.get("general.architecture", "")
            _TRAINED[(p.url, model)] = int(info.get(f"{arch}.context_length") or 0)
        trained = _TRAINED[(p.url, model)]
        out.add((model, min(ctx, trained) if trained else ctx))
    return out


def check_state(client: httpx.Client, f: Fleet, report: Report, phase: str,
                settle_s: float = 15) -> None:
    """No ticket, nothing in flight or claimed; the believed loads match /api/ps (within
    `settle_s`: the sidecar learns of an expiry or an unload from its next probe)."""
    deadline = time.monotonic() + settle_s
    while True:
        faults: list[str] = []
        for url in f.sidecars:
            state = client.get(url + "/kubemoot/v1/state").json()
            metrics = client.get(url + "/metrics").text
            if state.get("tickets"):
                faults.append(f"{url}: tickets left {state['tickets']}")
            for name in ("kubemoot_in_flight", "kubemoot_provider_memory_claimed_bytes"):
                if _metric(metrics, name):
                    faults.append(f"{url}: {name} {_metric(metrics, name)}")
            real, believed = _real_loads(client, f), _believed(client, f, state)
            for prov, loads in real.items():
                if _capped(client, f, prov, believed.get(prov, set())) != loads:
                    faults.append(f"{url}: {prov} believed {sorted(believed.get(prov, []))}"
                                  f", /api/ps {sorted(loads)}")
        if not faults or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for fault in faults:
        report.problem(phase, fault)
    print(f"----  state after {phase}: {'clean' if not faults else f'{len(faults)} problems'}")


# --- phases ----------------------------------------------------------------------------------

def run_concurrency(client: httpx.Client, f: Fleet, report: Report, calls: int = 16) -> None:
    """`calls` at once over both models, alternate streams, through every sidecar."""
    results: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        model = ("tiny", "tiny2")[i % 2]
        body = _chat(model, stream=bool(i % 3 == 0),
                     options={**OPTS, "num_predict": 20})
        try:
            with httpx.Client(timeout=360) as c:  # (the sidecar may hold it its 300 s wait limit)
                r = c.post(f.sidecars[i % len(f.sidecars)] + "/api/chat", json=body)
                seen = _seen(r)
                out = (r.status_code, seen.error, seen.headers.get("placement", ""))
        except httpx.HTTPError as exc:
            out = (0, repr(exc), "")
        with lock:
            results.append(out)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in results if r[0] != 200 or r[1]]
    placements = sorted(r[2] for r in results)
    print(f"----  {calls} calls at once: {calls - len(bad)} answered, placements {placements}")
    for r in bad:
        report.problem("concurrency", f"status {r[0]} {r[1][:140]!r}")


def run_provider_faults(client: httpx.Client, f: Fleet, report: Report) -> None:
    """A provider stopped in the middle of a stream (the stream's end), calls while it is
    down (served by the other), then restarted (placed on again)."""
    body = {"model": "tiny", "prompt": "hello", "options": LONG_STREAM}
    # Through the sidecar: nothing loaded, so the stream goes where the sidecar loads it.
    for p in f.providers:
        client.post(p.url + "/api/generate", json={"model": "tiny", "keep_alive": 0})
        client.post(p.url + "/api/generate", json={"model": "tiny2", "keep_alive": 0})
    check_state(client, f, report, "unloaded before the cut")
    with client.stream("POST", f.sidecars[0] + "/api/generate", json=body) as r:
        name = r.headers.get("x-kubemoot-provider", "")
        lines = r.iter_lines()
        first = next(lines, "")
        victim = f.provider(name) if any(p.name == name for p in f.providers) else None
        if victim is not None:
            victim.proc.stop()
        rest = [x for x in lines if x.strip()]
    last = json.loads(rest[-1]) if rest else json.loads(first or "{}")
    print(f"----  stream through the sidecar on {name}, provider stopped: {len(rest) + 1} "
          f"chunks, last {json.dumps(last)[:160]}")
    if not (isinstance(last, dict) and (last.get("done") or last.get("error"))):
        report.problem("provider stopped", f"the stream ended without a done or error line: "
                                           f"{json.dumps(last)[:160]}")
    elif last.get("error") and last.get("reason") != "upstream-failed":
        report.problem("provider stopped", f"final error line without reason upstream-failed:"
                                           f" {last}")
    if victim is None:
        return
    answered = []
    for i in range(4):
        r = client.post(f.sidecars[i % len(f.sidecars)] + "/api/generate",
                        json=_gen(("tiny", "tiny2")[i % 2]))
        answered.append((r.status_code, r.headers.get("x-kubemoot-provider")))
    print(f"----  with {victim.name} down: {answered}")
    for status, prov in answered:
        if status != 200 or prov == victim.name:
            report.problem("provider down", f"status {status} on {prov}")
    check_state(client, f, report, f"{victim.name} down")
    victim.proc.start()
    _wait_http(victim.url + "/api/version")
    time.sleep(3)  # the next probe sees it back
    for i in range(6):
        r = client.post(f.sidecars[i % len(f.sidecars)] + "/api/generate",
                        json=_gen(("tiny", "tiny2")[i % 2], keep_alive="5m"))
        if r.status_code != 200:
            report.problem("provider restarted", f"status {r.status_code} {r.text[:140]}")
    check_state(client, f, report, f"{victim.name} restarted")


def run_answer_cut(client: httpx.Client, f: Fleet, report: Report) -> None:
    """A whole (not streamed) answer whose Ollama is stopped before it is ready: nothing
    was sent to the agent yet, so the sidecar may try once elsewhere (200) or say 502
    upstream-failed; never a 200 with a broken body, never a hang."""
    body = {"model": "tiny", "prompt": "hello", "stream": False, "options": LONG_STREAM}
    result: list[httpx.Response] = []
    call = threading.Thread(target=lambda: result.append(
        client.post(f.sidecars[0] + "/api/generate", json=body)))
    call.start()
    busy = None
    deadline = time.monotonic() + 20
    while busy is None and time.monotonic() < deadline and call.is_alive():
        state = client.get(f.sidecars[0] + "/kubemoot/v1/state").json()
        busy = next((t["provider"] for t in state.get("tickets", [])), None)
        time.sleep(0.05)
    if busy is None:
        print("----  the whole answer ended before its provider could be stopped; skipped")
        call.join()
        return
    victim = f.provider(busy)
    victim.proc.stop()
    call.join(120)
    r = result[0] if result else None
    said = (r.status_code, r.headers.get("x-kubemoot-provider"), r.text[:140]) if r else None
    print(f"----  whole answer, {victim.name} stopped under it: {said}")
    if r is None or (r.status_code, r.status_code == 502 and r.json().get("reason")) not in (
            (200, False), (502, "upstream-failed")):
        report.problem("answer cut", f"{said}")
    victim.proc.start()
    _wait_http(victim.url + "/api/version")
    check_state(client, f, report, f"{victim.name} back after the cut")


def run_dialect_down(client: httpx.Client, f: Fleet, report: Report) -> None:
    """The only provider whose version serves /v1/messages stopped: a call that cannot wait
    is the 503 of a card that is down, not a 404 saying no provider serves the path."""
    serving = [p for p in f.providers if p.anthropic]
    if len(serving) != 1 or len(f.providers) < 2:
        return
    body = {"model": "tiny", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    serving[0].proc.stop()
    time.sleep(3)  # a probe finds it gone
    r = client.post(f.sidecars[0] + "/v1/messages", json=body,
                    headers={"X-Kubemoot-Wait": "false"})
    print(f"----  /v1/messages with {serving[0].name} down: {r.status_code} {r.text[:140]}")
    if r.status_code == 404:
        report.problem("dialect down", f"404 while {serving[0].name} is down: {r.text[:140]}")
    serving[0].proc.start()
    _wait_http(serving[0].url + "/api/version")
    time.sleep(3)
    r = client.post(f.sidecars[-1] + "/v1/messages", json=body)
    if r.status_code != 200:
        report.problem("dialect back", f"{r.status_code} {r.text[:140]}")
    check_state(client, f, report, "dialect's provider back")


def run_keep_alive(client: httpx.Client, f: Fleet, report: Report) -> None:
    """keep_alive "1s": the copy goes by itself; the sidecar must notice (not believe it
    loaded) and place the next call cold."""
    r = client.post(f.sidecars[0] + "/api/generate", json=_gen(keep_alive="1s"))
    name = r.headers.get("x-kubemoot-provider", "")
    time.sleep(3)
    check_state(client, f, report, "keep_alive 1s expired")
    r = client.post(f.sidecars[-1] + "/api/generate", json=_gen())
    print(f"----  after keep_alive 1s on {name}: next call {r.status_code} "
          f"{r.headers.get('x-kubemoot-placement')} on {r.headers.get('x-kubemoot-provider')}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.real_ollama_sidecar",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", default="/tmp/rl14/ollama-0.12.6/ollama")
    p.add_argument("--new", default="/tmp/rl14/ollama-v0.24.0/ollama")
    p.add_argument("--models", default="/tmp/rl14/model", help="tiny.gguf and tiny2.gguf")
    p.add_argument("--port", type=int, default=22150,
                   help="the Ollamas on PORT and PORT+1, the sidecars on PORT+40 and +41")
    p.add_argument("--same", action="store_true", help="two Ollamas of the --old version")
    p.add_argument("--nats", action="store_true", help="a nats-server, publish, 2 sidecars")
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    p.add_argument("--phases", default="cases,clients,keepalive,concurrency,faults")
    args = p.parse_args(argv)
    for binary in (args.old, args.new):
        if not Path(binary).exists():
            print(f"no Ollama binary at {binary} (loadtest/build_real_ollama.sh)")
            return 2
    work = Path(tempfile.mkdtemp(prefix="real-ollama-sidecar-"))
    report = Report()
    phases = args.phases.split(",")
    try:
        with fleet(args.old, args.new, Path(args.models), args.port, args.same, args.nats,
                   work) as f, httpx.Client(timeout=180) as client:
            print(f"providers {[(x.name, x.url) for x in f.providers]}, sidecars {f.sidecars}")
            check_state(client, f, report, "start")
            if "cases" in phases:
                run_cases(client, f, report, args.only)
                check_state(client, f, report, "cases")
            if "clients" in phases:
                run_clients(f, report, args.only)
                check_state(client, f, report, "clients")
            if "keepalive" in phases:
                run_keep_alive(client, f, report)
            if "concurrency" in phases:
                run_concurrency(client, f, report)
                check_state(client, f, report, "concurrency")
            if "faults" in phases:
                run_provider_faults(client, f, report)
                run_answer_cut(client, f, report)
                run_dialect_down(client, f, report)
    finally:
        print(f"{report.same} same, {report.differing} differ, {report.documented} documented "
              f"additions; {len(report.problems)} state problems (logs in {work})")
        if not report.problems and not report.differing:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if report.problems or report.differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
