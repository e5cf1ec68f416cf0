"""A fleet soak: several real sidecars sharing NATS in front of a simulated 3-GPU fleet, each
serving agents that use the official `ollama` client with mixed models, prompt sizes,
streaming, held plans, clients that leave mid-stream, calls with `keep_alive: 0` and unload
requests (`ollama stop`); with `--dialects`, some calls go through the `openai` client
(/v1/chat/completions) or the `anthropic` client (/v1/messages) instead; with
`--conversations`, some are tool loops offering a tool, whose history grows call by call
(three per agent, interleaved, sharing the agent's system prompt).

It fails on what must never happen, whatever the load: a GPU out of memory, a prompt cut by
the engine, a model Ollama had to unload on its own (with sidecars), a ticket left behind, an
answer that is neither a success nor one of the contract's refusals. `--direct`
runs the same agents against the GPUs themselves (each agent pinned round-robin to one), for
comparison.

    python -m loadtest.fleet_soak [--sidecars 4] [--agents 3] [--seconds 30] [--direct]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai

from loadtest.loadgen import local_client, percentile, wait_http
from loadtest.nats_server import NatsServer
from loadtest.relay_bench import free_port
from loadtest.serving import add_sharing_flags, sharing_args
from loadtest.sim_engine import version_tuple
from loadtest.sim_model import CATALOG
from loadtest.sim_output import ANSWER_TOKENS, answer_options

TOOL_MODELS = frozenset(m.name for m in CATALOG if m.tools and not m.embedding)

ROOT = Path(__file__).resolve().parent.parent
# What the soak reads of the GPUs and sidecars goes through one client (see local_client)
local_http = local_client()


@dataclass(frozen=True)
class Card:
    """One Ollama: its memory (over `gpus` GPUs of equal size) and the OLLAMA_* settings it
    runs with."""

    name: str
    vram_mib: int
    context: int = 0  # OLLAMA_CONTEXT_LENGTH; 0: Ollama's default (by VRAM)
    parallel: int = 1  # OLLAMA_NUM_PARALLEL
    kv_cache_type: str = "f16"
    gpus: int = 1  # several: OLLAMA_SCHED_SPREAD=1, llama.cpp's fit margin on each GPU
    # (docs/engine.md, "Several GPUs": the layout to run one Ollama over several with)

    def sim_args(self) -> list[str]:
        spread = ["--gpus", str(self.gpus), "--sched-spread", "--fit-target", "1024",
                  "--max-loaded", "0"] \
            if self.gpus > 1 else []
        return ["--name", self.name, "--vram", str(self.vram_mib // self.gpus), "--context",
                str(self.context), "--parallel", str(self.parallel), "--kv-cache-type",
                self.kv_cache_type, *spread]

    def provider(self, endpoint: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "endpoint": endpoint,
                                 "totalVramMiB": self.vram_mib, "maxParallel": self.parallel,
                                 "kvCacheType": self.kv_cache_type, "gpus": self.gpus}
        return {**entry, "contextLength": self.context} if self.context else entry


# Mixed contexts and slots, some cards on Ollama's own default context.
FLEETS = {
    # The demo's: 32k x 1 (default) with a q8_0 cache, 8k x 4, 4k (default) x 2.
    "demo": [Card("gpu-5090", 32768, kv_cache_type="q8_0"), Card("gpu-4090", 24564, 8192, 4),
             Card("gpu-4080", 16376, 0, 2)],
    # Less room than the models want: loads, evictions and waits all the time.
    "tight": [Card("gpu-4090", 24564), Card("gpu-4080", 16376, 4096, 2),
              Card("gpu-4070", 12282, 8192)],
    # A card with memory for more models than Ollama keeps loaded (3 per GPU by default).
    "wide": [Card("gpu-a6000", 49140, 16384, 2), Card("gpu-4080", 16376, 4096)],
    # One Ollama over two GPUs and one over four, beside a single card.
    "several": [Card("node-2x4090", 2 * 24564, 8192, 2, gpus=2),
                Card("node-4x4070", 4 * 12282, gpus=4), Card("gpu-4080", 16376, 4096, 2)],
}

# What each sidecar's agents run: (bound model, mulling candidates).
PROFILES: list[tuple[str, list[dict[str, Any]]]] = [
    ("qwen3:32b", [{"model": "qwen3:32b", "score": 70}, {"model": "qwen3:14b", "score": 62},
                   {"model": "qwen3:8b", "score": 30}]),
    ("qwen3:14b", [{"model": "qwen3:14b", "score": 60}, {"model": "qwen3:8b", "score": 52}]),
    ("qwen3:8b", []),
    ("llama3.2:3b", [{"model": "llama3.2:3b", "score": 40}, {"model": "phi3:mini", "score": 35}]),
]
# Allowed answers besides 200: the contract's refusals.
REFUSALS = {413: "prompt-too-large", 503: "gpu-busy", 507: "model-too-large"}
# --churn: every agent moves through these, one every few seconds, each from its own start.
CHURN = ["qwen3:32b", "qwen3:14b", "qwen3:8b", "llama3.2:3b", "phi3:mini"]
# --aliases: every card has these names of these models too (one manifest, as ollama.com
# tags them), and agents ask for a model under either name
ALIASES = {"qwen3:8b": "qwen3", "llama3.2:3b": "llama3.2", "phi3:mini": "phi3"}
CLOUD_MODEL = "gpt-oss:20b-cloud"  # --cloud
# --siblings: every card has these models created FROM these (their weights file, a system
# prompt of their own, and a num_ctx of their own unless 0: Ollama reloads the one copy for
# the other's context, and has calls of both share it at one), and agents ask for either
SIBLINGS = {"qwen3:8b": ("qwen3-16k", 16384), "llama3.2:3b": ("llama3.2-8k", 8192),
            "phi3:mini": ("phi3-helper", 0), "qwen3:14b": ("qwen3-14b-helper", 0)}


LOOPS_PER_AGENT = 3  # an agent's tool loops running at once, interleaved


@dataclass
class Tally:
    outcomes: collections.Counter[str] = field(default_factory=collections.Counter)
    placements: collections.Counter[str] = field(default_factory=collections.Counter)
    seconds: list[float] = field(default_factory=list)
    waited_ms: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    dialects: collections.Counter[str] = field(default_factory=collections.Counter)
    conversation_lengths: list[int] = field(default_factory=list)  # messages, per loop call


def prompt_chars(rng: random.Random) -> int:
    """Mostly short turns, some long contexts, a few too long for any GPU."""
    roll = rng.random()
    if roll < 0.75:
        return rng.randint(100, 4000)
    if roll < 0.95:
        return rng.randint(12000, 28000)  # over 4096 tokens, under 8192
    if roll < 0.98:
        return rng.randint(45000, 60000)  # over 8192 tokens: only a 16k or 32k card
    return rng.randint(140000, 160000)  # over every GPU's context: refused, never cut


LOOP_TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the repository",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                   "required": ["path"]}}}]


def appended(rng: random.Random) -> dict[str, Any]:
    """What a tool loop adds to its conversation: prose, numbers (a token per digit), CJK (a
    token per character) or images (768 tokens each), as a tool result or a user turn."""
    chars = rng.randint(200, 3000)
    kind = rng.choice(("prose", "prose", "numbers", "cjk", "images"))
    role = rng.choice(("tool", "user"))
    if kind == "numbers":
        return {"role": role, "content": "3141592653 " * (chars // 11)}
    if kind == "cjk":
        return {"role": role, "content": "字" * (chars // 3)}
    if kind == "images":
        return {"role": "user", "content": "and these?", "images": [b"i"] * rng.randint(1, 3)}
    return {"role": role, "content": "w " * (chars // 2)}


class Failed(Exception):
    """A call that failed in another dialect's client, told the way `ollama` tells it."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def openai_turn(client: openai.AsyncOpenAI, model: str, text: str, stream: bool,
                      leave: bool, predict: int, headers: dict[str, str]) -> str:
    messages: Any = [{"role": "user", "content": text}]
    try:
        if not stream:
            await client.chat.completions.create(model=model, messages=messages,
                                                 max_tokens=predict, extra_headers=headers,
                                                 extra_body={ANSWER_TOKENS: predict})
            return "200"
        parts = await client.chat.completions.create(
            model=model, messages=messages, max_tokens=predict, stream=True,
            extra_headers=headers, extra_body={ANSWER_TOKENS: predict})
        chunks = 0
        async for _ in parts:
            chunks += 1
            if leave and chunks == 2:
                await parts.close()  # the client goes away mid-stream
                return "left"
        return "200"
    except openai.APIConnectionError as exc:
        raise ConnectionError(str(exc)) from None
    except openai.APIStatusError as exc:
        raise Failed(exc.status_code, exc.message) from None
    except openai.APIError as exc:  # the error event that ends a failed stream: -1, as the
        raise Failed(-1, exc.message) from None  # `ollama` client reports an error line


async def anthropic_turn(client: anthropic.AsyncAnthropic, model: str, text: str,
                         stream: bool, leave: bool, predict: int, headers: dict[str, str]
                         ) -> str:
    messages: Any = [{"role": "user", "content": text}]
    try:
        if not stream:
            await client.messages.create(model=model, messages=messages, max_tokens=predict,
                                         extra_headers=headers,
                                         extra_body={ANSWER_TOKENS: predict})
            return "200"
        chunks = 0
        async with client.messages.stream(model=model, messages=messages, max_tokens=predict,
                                          extra_headers=headers,
                                          extra_body={ANSWER_TOKENS: predict}) as parts:
            async for _ in parts.text_stream:
                chunks += 1
                if leave and chunks == 2:
                    return "left"  # leaving the block closes the stream mid-way
        return "200"
    except anthropic.APIConnectionError as exc:
        raise ConnectionError(str(exc)) from None
    except anthropic.APIStatusError as exc:  # a stream's error event: the stream's own 200
        status = -1 if exc.status_code == 200 else exc.status_code
        raise Failed(status, exc.message) from None
    except anthropic.APIError as exc:
        raise Failed(-1, exc.message) from None


async def agent(name: str, url: str, model: str, deadline: float, seed: int,
                tally: Tally, churn_s: float = 0.0, tolerated: frozenset[int] = frozenset(),
                dialects: tuple[str, ...] = ("ollama",), conversations: float = 0.0,
                aliases: bool = False, siblings: bool = False, cloud: float = 0.0) -> None:
    rng = random.Random(seed)
    talk = random.Random(seed + 7)  # its own draws: the default run's sequence stays as it was
    naming = random.Random(seed + 11)  # (likewise, for --aliases)
    kin = random.Random(seed + 13)  # (and for --siblings)
    sky = random.Random(seed + 17)  # (and for --cloud)
    # Its tool loops: several conversations, interleaved, all opening with its system prompt
    # (the prefix a copy's prompt cache can share among them).
    histories: list[list[Any]] = [[] for _ in range(LOOPS_PER_AGENT)]
    system = {"role": "system", "content": f"You are {name}, a careful agent. " * 60}
    first = rng.randrange(len(CHURN))
    plain = ollama.AsyncClient(host=url, timeout=120)
    http = httpx.AsyncClient(base_url=url, timeout=120)
    oai = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="-", timeout=120, max_retries=0)
    claude = anthropic.AsyncAnthropic(base_url=url, api_key="-", timeout=120, max_retries=0)
    turn = 0
    while time.monotonic() < deadline:
        turn += 1
        if churn_s:
            model = CHURN[(first + int((deadline - time.monotonic()) / churn_s)) % len(CHURN)]
        asked = ALIASES.get(model, model) if aliases and naming.random() < 0.5 else model
        if siblings and model in SIBLINGS and kin.random() < 0.5:
            asked = SIBLINGS[model][0]
        if cloud and sky.random() < cloud:
            asked = CLOUD_MODEL
        chars = prompt_chars(rng)
        messages = [{"role": "user", "content": "w " * (chars // 2)}]
        stream, leave = rng.random() < 0.6, rng.random() < 0.05
        keep_alive = 0 if rng.random() < 0.03 else None  # unload as it ends
        stop = rng.random() < 0.01  # what `ollama stop` sends, instead of a call
        # Drawn only when asked for, so the default run's random sequence stays as it was.
        dialect = rng.choice(dialects) if len(dialects) > 1 and not stop else "ollama"
        client, headers = plain, {}
        plan = not stop and rng.random() < 0.1 and "direct" not in name  # at selection
        converse = (conversations > 0 and dialect == "ollama" and not stop and not plan
                    and talk.random() < conversations)
        loop = talk.randrange(LOOPS_PER_AGENT) if converse else 0
        # A loop offers its tools: answering a tool's result without a call ends it
        # (never to a model without the "tools" capability: Ollama refuses the call)
        tools = LOOP_TOOLS if converse and model in TOOL_MODELS else None
        if converse:  # the tool loop goes on (or starts): the history, then what it adds
            messages = [*(histories[loop] or [system]), appended(talk)]
            tally.conversation_lengths.append(len(messages))
            histories[loop] = []
        answer = ""
        started = time.monotonic()
        try:
            if plan:
                thread = f"{name}-{turn}"
                await http.post("/kubemoot/v1/plans",
                                json={"thread": thread, "promptChars": chars})
                headers = {"X-Kubemoot-Thread": thread}
                client = ollama.AsyncClient(host=url, timeout=120, headers=headers)
            if dialect == "openai":
                outcome = await openai_turn(oai, asked, messages[0]["content"], stream, leave,
                                            rng.randint(4, 40), headers)
            elif dialect == "anthropic":
                outcome = await anthropic_turn(claude, asked, messages[0]["content"], stream,
                                               leave, rng.randint(4, 40), headers)
            elif stop:
                await client.generate(model=asked, keep_alive=0)
                outcome = "unload"
            elif stream:
                parts = await client.chat(model=asked, messages=messages, stream=True,
                                          keep_alive=keep_alive, tools=tools,
                                          options=answer_options(rng.randint(4, 40)))
                chunks = 0
                async for part in parts:
                    chunks += 1
                    if part.get("error"):
                        raise ollama.ResponseError(part["error"], 200)
                    answer += part["message"]["content"] or ""
                    if leave and chunks == 2:
                        break  # the client goes away mid-stream
                outcome = "left" if leave and chunks == 2 else "200"
            else:
                reply = await client.chat(model=asked, messages=messages, keep_alive=keep_alive,
                                          tools=tools,
                                          options=answer_options(rng.randint(4, 40)))
                answer = reply["message"]["content"] or ""
                outcome = "200"
            if converse and outcome == "200":
                histories[loop] = [*messages, {"role": "assistant", "content": answer}]
            if outcome != "unload":
                tally.seconds.append(time.monotonic() - started)
        except (ollama.ResponseError, Failed) as exc:
            status, error = (exc.status_code, exc.error) if isinstance(
                exc, ollama.ResponseError) else (exc.status, str(exc))
            outcome = f"{status}"
            if REFUSALS.get(status) is None and status not in tolerated:
                tally.unexpected.append(f"{name}: {dialect} {status} {error}")
        except (httpx.HTTPError, ConnectionError) as exc:
            outcome = "connection"
            tally.unexpected.append(f"{name}: {type(exc).__name__} {exc}")
        except Exception as exc:  # reported with the rest, not a dead soak
            outcome = "crash"
            tally.unexpected.append(f"{name}: {dialect} {type(exc).__name__}: {exc!r}")
        tally.outcomes[outcome] += 1
        tally.dialects[dialect] += 1
        await asyncio.sleep(rng.uniform(0.0, 0.05))
    await http.aclose()
    await oai.close()
    await claude.close()


def start(args: list[str], env: dict[str, str], log: Path, append: bool = False
          ) -> subprocess.Popen[bytes]:
    with log.open("ab" if append else "wb") as out:
        return subprocess.Popen([sys.executable, *args], env={**os.environ, **env}, cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)


def start_gpus(fleet: list[Card], time_scale: float, logs: Path,
               procs: list[subprocess.Popen[bytes]], sim_flags: tuple[str, ...] = ()
               ) -> tuple[list[str], list[list[str]]]:
    """One simulator per card, each added to `procs` as it starts (the caller stops them,
    whatever happens next); their URLs and commands once all of them answer."""
    gpus: list[str] = []
    commands: list[list[str]] = []
    for card in fleet:
        port = free_port()
        commands.append(["-m", "loadtest.ollama_sim", "--port", str(port), *card.sim_args(),
                         "--time-scale", str(time_scale), *sim_flags])
        procs.append(start(commands[-1], {}, logs / f"{card.name}.log"))
        gpus.append(f"http://127.0.0.1:{port}")
    for gpu in gpus:
        wait_http(gpu)
    if any(proc.poll() is not None for proc in procs):  # another answered in its place
        raise RuntimeError(f"a simulated GPU exited at start; logs in {logs}")
    return gpus, commands


def sidecar_env(fleet: list[Card], gpus: list[str], log_level: str) -> dict[str, str]:
    """What every sidecar of the soak runs with: the GPUs as providers, a 20 s wait limit."""
    providers = [card.provider(gpu) for card, gpu in zip(fleet, gpus, strict=True)]
    return {"KUBEMOOT_PROVIDERS": json.dumps(providers),
            "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS": "20", "KUBEMOOT_LOG_LEVEL": log_level}


def start_init_buckets(nats_url: str) -> subprocess.Popen[bytes]:
    """`init-buckets`, as the Job does, started: it needs NATS alone, so it runs while the
    GPUs, the publisher and the sidecars come up (as the Job runs beside the Deployments: a
    sidecar or publisher there first creates the buckets it misses, alike)."""
    return subprocess.Popen([sys.executable, "-m", "proxy", "init-buckets"], cwd=ROOT,
                            env={**os.environ, "KUBEMOOT_NATS_URL": nats_url},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def buckets_made(init: subprocess.Popen[bytes]) -> None:
    """Once `init-buckets` ended; raises what it said if it failed."""
    said, _ = init.communicate()
    if init.returncode:
        raise subprocess.CalledProcessError(init.returncode, init.args, said)


def start_publisher(common: dict[str, str], logs: Path,
                    procs: list[subprocess.Popen[bytes]],
                    buckets: subprocess.Popen[bytes] | None = None) -> subprocess.Popen[bytes]:
    """One `publish` probing every GPU: beside `buckets`, an `init-buckets` already started
    (the caller waits for it), else once an `init-buckets` run made the buckets."""
    if buckets is None:
        buckets_made(start_init_buckets(common["KUBEMOOT_NATS_URL"]))
    procs.append(start(["-m", "proxy", "publish"], common, logs / "publish.log"))
    return procs[-1]


def start_sidecars(count: int, common: dict[str, str], logs: Path,
                   procs: list[subprocess.Popen[bytes]], ready_s: float = 60.0
                   ) -> list[tuple[str, str]]:
    """`count` sidecars, sidecar i on PROFILES[i % 4], each added to `procs` as it starts;
    their (URL, bound model) once every one answers /healthz (within `ready_s` of the last
    one's start: many starting at once share the CPU, with the publisher and `init-buckets`,
    on a machine that may have other work: over 20 s on 2 cores with a load of 10)."""
    sidecars: list[tuple[str, str]] = []
    for i in range(count):
        model, candidates = PROFILES[i % len(PROFILES)]
        port = free_port()
        env = {**common, "KUBEMOOT_LISTEN": f"127.0.0.1:{port}",
               "KUBEMOOT_AGENT_NAME": f"agent-{i}", "KUBEMOOT_MODEL_MODEL": model,
               "KUBEMOOT_MODEL_CANDIDATES_MULLING": json.dumps(candidates)}
        procs.append(start(["-m", "proxy", "serve"], env, logs / f"sidecar-{i}.log"))
        sidecars.append((f"http://127.0.0.1:{port}", model))
    for url, _ in sidecars:
        wait_http(url + "/healthz", ready_s)
    return sidecars


def gpu_totals(gpus: list[str]) -> collections.Counter[str]:
    """The simulators' own counters (`/_sim/stats`), summed over the GPUs."""
    totals: collections.Counter[str] = collections.Counter()
    for gpu in gpus:
        stats = local_http.get(gpu + "/_sim/stats").json()
        for key in ("requests", "cloud_requests", "loads", "unloads", "reloads",
                    "self_evictions", "spills",
                    "oom_events", "truncations", "too_long_refusals", "busy_refusals"):
            totals[key] += int(stats.get(key, 0))
    return totals


def stop_all(procs: list[subprocess.Popen[bytes]], nats: NatsServer | None) -> None:
    """Every process started, then nats-server and its store: a process that ignores the
    request to stop is killed after 10 s."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if nats is not None:
        nats.cleanup()


# How long the last calls' releases may take to empty the ticket books (they ride along
# within 50 ms); the report then finds any ticket still there
SETTLE_S = 1.0


def settle(sidecars: list[str]) -> None:
    """Until every sidecar's ticket book is empty, or SETTLE_S has passed."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        try:
            if not any(local_http.get(url + "/kubemoot/v1/state").json()["tickets"]
                       for url in sidecars):
                return
        except httpx.HTTPError:
            pass  # the report tells
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fleet", choices=sorted(FLEETS), default="demo")
    parser.add_argument("--sidecars", type=int, default=4)
    parser.add_argument("--agents", type=int, default=3, help="agents per sidecar")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--time-scale", type=float, default=0.05,
                        help="simulated durations x this (0.05: 20 times faster than real)")
    parser.add_argument("--embedded", action="store_true",
                        help="embedded state: no NATS, every sidecar probes the GPUs itself "
                             "and keeps its own tickets (one sidecar is the supported use)")
    parser.add_argument("--direct", action="store_true",
                        help="no sidecars: each agent calls one GPU directly, round-robin")
    parser.add_argument("--churn", type=float, default=0.0, metavar="SECONDS",
                        help="every agent switches model every SECONDS (loads and evictions)")
    parser.add_argument("--outage", type=float, nargs=2, metavar=("AT", "FOR"),
                        help="kill the first GPU's Ollama AT seconds in and start it again FOR "
                             "seconds later, as a node reboot does (its calls then may fail: "
                             "502 before the first byte, an error line after it)")
    parser.add_argument("--nats-outage", type=float, nargs=2, metavar=("AT", "FOR"),
                        help="stop nats-server AT seconds in and start it again FOR seconds "
                             "later (same port and store)")
    parser.add_argument("--log-level", default="info", help="the sidecars' log level")
    parser.add_argument("--logs", type=Path, help="where the processes' logs go "
                                                  "(default: a new temporary directory)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--conversations", type=float, default=0.0, metavar="P",
                        help="the share of `ollama` calls that go on a tool loop: the history "
                             "so far plus prose, numbers, CJK or images (refused when it "
                             "outgrows every context, then the loop starts over)")
    parser.add_argument("--dialects", default="ollama",
                        help="comma-separated, drawn per call: ollama (the `ollama` client on "
                             "/api/chat), openai (/v1/chat/completions), anthropic (/v1/messages; "
                             "not before Ollama 0.14, which has no such path)")
    parser.add_argument("--ollama-version", metavar="VERSION",
                        help="the Ollama version every simulated GPU behaves as (default: "
                             "the simulator's; 0.12.6: driver free memory, no 80 %% rule)")
    parser.add_argument("--aliases", action="store_true",
                        help="every card has qwen3, llama3.2 and phi3 as other names of "
                             "qwen3:8b, llama3.2:3b and phi3:mini, and agents ask for either")
    parser.add_argument("--siblings", action="store_true",
                        help="every card has qwen3-16k and llama3.2-8k, created FROM qwen3:8b "
                             "and llama3.2:3b with their own num_ctx, and phi3-helper and "
                             "qwen3-14b-helper, FROM phi3:mini and qwen3:14b with only a "
                             "system prompt of their own; agents ask for either")
    parser.add_argument("--cloud", type=float, default=0.0, metavar="P",
                        help=f"an agent's call asks for {CLOUD_MODEL}, a model Ollama's "
                             "cloud runs (a stub on every card, for versions before 0.18), "
                             "with this probability")
    add_sharing_flags(parser)
    args = parser.parse_args(argv)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="fleet-soak-"))
    logs.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    nats: NatsServer | None = None
    buckets: subprocess.Popen[bytes] | None = None
    try:
        fleet = FLEETS[args.fleet]
        if not args.direct and not args.embedded:  # the buckets are made as the rest starts
            nats = NatsServer().start()
            buckets = start_init_buckets(nats.url)
        version = ["--version", args.ollama_version] if args.ollama_version else []
        aliases = [f"--alias={alias}={model}" for model, alias in ALIASES.items()] \
            if args.aliases else []
        aliases += [f"--derived={name}={model}:{ctx}" for model, (name, ctx) in SIBLINGS.items()
                    ] if args.siblings else []
        aliases += [f"--cloud-stub={CLOUD_MODEL}={CLOUD_MODEL.removesuffix('-cloud')}"
                    ] if args.cloud else []
        gpus, commands = start_gpus(fleet, args.time_scale, logs, procs,
                                    (*sharing_args(args), *version, *aliases))
        sidecars: list[tuple[str, str]] = []  # (url, model)
        if not args.direct:
            common = sidecar_env(fleet, gpus, args.log_level)
            if nats is not None:
                common["KUBEMOOT_NATS_URL"] = nats.url
                start_publisher(common, logs, procs, buckets)
            sidecars = start_sidecars(args.sidecars, common, logs, procs)
            if buckets is not None:
                buckets_made(buckets)
            if args.nats_outage and nats is not None:
                def nats_outage(server: NatsServer, at: float, lasting: float) -> None:
                    time.sleep(at)
                    server.stop()
                    time.sleep(lasting)
                    server.start()

                threading.Thread(target=nats_outage, args=(nats, *args.nats_outage),
                                 daemon=True).start()
        else:
            sidecars = [(gpus[i % len(gpus)], PROFILES[i % len(PROFILES)][0])
                        for i in range(args.sidecars)]
        if args.outage:  # timed from the agents' start, as --nats-outage is
            def reboot(at: float, lasting: float) -> None:
                time.sleep(at)
                procs[0].kill()  # sims are started first: procs[0] is the first GPU
                procs[0].wait()
                time.sleep(lasting)
                procs[0] = start(commands[0], {}, logs / f"{fleet[0].name}.log", append=True)

            threading.Thread(target=reboot, args=tuple(args.outage), daemon=True).start()
        tally = asyncio.run(soak(sidecars, args))
        if not args.direct:
            settle([u for u, _ in sidecars])
        return report(tally, gpus, [] if args.direct else [u for u, _ in sidecars], logs, args)
    finally:
        if buckets is not None and buckets.poll() is None:  # the GPUs failed to start
            buckets.kill()
            buckets.wait()
        stop_all(procs, nats)


# Ollama serves Anthropic's /v1/messages from 0.14.0: an older fleet's agents do not use it
MESSAGES_SINCE = (0, 14, 0)


def served_dialects(asked: str, version: str | None) -> tuple[str, ...]:
    """The dialects asked for that the fleet's Ollama serves."""
    dialects = tuple(asked.split(","))
    if version and version_tuple(version) < MESSAGES_SINCE:
        dialects = tuple(d for d in dialects if d != "anthropic") or ("ollama",)
    return dialects


async def soak(sidecars: list[tuple[str, str]], args: argparse.Namespace) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + args.seconds
    kind = "direct" if args.direct else "agent"
    tolerated = frozenset({502, -1}) if args.outage else frozenset()
    await asyncio.gather(*(
        agent(f"{kind}-{i}-{j}", url, model, deadline, args.seed * 1000 + i * 10 + j, tally,
              args.churn, tolerated, served_dialects(args.dialects, args.ollama_version),
              args.conversations,
              args.aliases, args.siblings, args.cloud)
        for i, (url, model) in enumerate(sidecars) for j in range(args.agents)))
    return tally


def report(tally: Tally, gpus: list[str], sidecars: list[str], logs: Path,
           args: argparse.Namespace) -> int:
    state = "embedded" if args.embedded else "NATS"
    mode = "direct (round-robin pinning)" if args.direct else f"{len(sidecars)} sidecars, {state}"
    calls = sum(tally.outcomes.values())
    churn = f", model churn every {args.churn:.0f} s" if args.churn else ""
    version = f", Ollama {args.ollama_version}" if args.ollama_version else ""
    print(f"# fleet soak: {args.fleet} fleet, {mode}, {args.agents} agents each, "
          f"{args.seconds:.0f} s{churn}, time scale {args.time_scale}{version}; logs in {logs}")
    print(f"calls {calls}  outcomes {dict(sorted(tally.outcomes.items()))}")
    if len(tally.dialects) > 1:
        print(f"dialects {dict(sorted(tally.dialects.items()))}")
    if tally.conversation_lengths:
        lengths = tally.conversation_lengths
        print(f"tool-loop calls {len(lengths)}  messages p50 {percentile(lengths, 0.5):.0f}  "
              f"max {max(lengths)}")
    if tally.seconds:
        print(f"call seconds p50 {percentile(tally.seconds, 0.5):.3f}  "
              f"p95 {percentile(tally.seconds, 0.95):.3f}  max {max(tally.seconds):.3f}")
    problems = list(tally.unexpected[:10])
    totals = gpu_totals(gpus)
    print("gpus", dict(totals))
    if args.outage:
        back = local_http.get(gpus[0] + "/_sim/stats").json()
        print(f"first GPU after its outage: {back.get('requests', 0)} requests")
        if not back.get("requests"):
            problems.append("the first GPU got no calls after it came back")
    # Ollama unloading a model on its own (for memory, or past its model count), reloading
    # one for other load options, loading one partly into CPU memory or refusing a prompt
    # as too long is what the sidecar plans around; without sidecars (--direct) it is the
    # baseline's to show.
    planned = ("self_evictions", "reloads", "spills", "too_long_refusals")
    for key in ("oom_events", "truncations", *(planned if sidecars else ())):
        if totals[key]:
            problems.append(f"{key}: {totals[key]}")
    for url in sidecars:
        state = local_http.get(url + "/kubemoot/v1/state").json()
        if state["tickets"]:
            problems.append(f"{url}: tickets left after the soak: {state['tickets'][:3]}")
        metrics = local_http.get(url + "/metrics").text
        for line in metrics.splitlines():
            if line.startswith("kubemoot_placements_total{") and "waiting" not in line:
                label = line.split('placement="')[1].split('"')[0]
                tally.placements[label] += int(float(line.rsplit(" ", 1)[1]))
    if sidecars:
        print("placements", dict(tally.placements))
        if tally.placements["cloud"] != totals["cloud_requests"]:  # each sent on, unplaced
            problems.append(f"{tally.placements['cloud']} calls placed cloud, "
                            f"{totals['cloud_requests']} sent on to the cloud")
    for p in problems:
        print("PROBLEM", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
