"""Random sweeps, not in the suite: random cards (Ollama version, memory, OLLAMA_* settings),
random calls from concurrent agents over Ollama's API, OpenAI's and /api/embed, through one
sidecar or two sharing NATS. Whatever happens, Ollama never reloads a copy, unloads one on
its own, spills one to the CPU or cuts a prompt, and every answer is a success or a contract
refusal. Rough agents also stream, leave mid-call and ask for their own keep-alive, while a
card's Ollama fails calls, restarts or comes up late, or the sidecars' nats-server goes
away, or through three or four sidecars on NATS. A crew's agents, bound with candidates,
hold and drop plans, call in triage or without waiting, and load and unload models
themselves. Once they are done no plan, ticket or wait is left. Each seed draws its own
case, so a failure reruns by its seed.

    KUBEMOOT_SWEEP=0:240 pytest -n 3 tests/sweeps           # seeds 0-239 of each sweep
    KUBEMOOT_SWEEP=96:97 pytest tests/sweeps -k two_cards   # one case again

(docs/development.md, "Random sweeps")"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from loadtest.nats_server import NatsServer
from loadtest.ollama_sim import SimServer, with_derived
from loadtest.sim_engine import parse_error_holds_slot
from loadtest.sim_model import CATALOG
from loadtest.sim_sched import Fault
from tests.conftest import eventually
from tests.e2e.test_engine_fidelity import NOTHING, SMALL_LLAMAS, quiet
from tests.e2e.test_scheduling import SCALE, Sidecars, Sims

_RANGE = os.environ.get("KUBEMOOT_SWEEP", "")
pytestmark = pytest.mark.skipif(not _RANGE, reason="a sweep: set KUBEMOOT_SWEEP=START:STOP")
_START, _, _STOP = _RANGE.partition(":")
SEEDS = range(int(_START or 0), int(_STOP or 0))

VERSIONS = ["0.12.6", "0.12.11", "0.13.4", "0.15.5", "0.24.0", "0.33.0"]
# Two models created FROM others with a num_ctx of their own, one without: one copy per
# weights file in Ollama, reloaded for the other's context
MODELS = (*with_derived(CATALOG, ["qwen3-16k=qwen3:8b:16384", "phi3-helper=phi3:mini:0",
                                  "llama-8k=llama3.2:3b:8192"]), *SMALL_LLAMAS[:3])
CHAT = [m.name for m in MODELS if not m.embedding]
ANSWERS = (200, 413, 503, 507)  # a success or the contract's refusals


def card(rng: random.Random, name: str, version: str, sims: Sims, **fixed: Any) -> SimServer:
    config: dict[str, Any] = dict(
        total_vram_mib=rng.randrange(8000, 50000, 50), version=version,
        kv_cache_type=rng.choice(["f16", "f16", "q8_0", "q4_0"]),
        flash_attention=rng.choice([None, None, True, False]),
        num_parallel=rng.choice([1, 1, 2, 4]), context_length=rng.choice([0, 0, 2048, 8192]),
        gpu_overhead_mib=rng.choice([0, 0, 512, 1536]),
        max_loaded_models=rng.choice([0, 3, 12]))
    if rng.random() < 0.2:  # one Ollama over two GPUs, as docs/engine.md says to run it:
        # spread from 0.30 (Ollama issue 18349), before either way
        spread = tuple(map(int, version.split("."))) >= (0, 30) or rng.random() < 0.5
        config.update(gpu_count=2, sched_spread=spread, fit_target_mib=1024,
                      total_vram_mib=2 * rng.randrange(8000, 25000, 50))
    return sims(name, time_scale=SCALE, models=MODELS, **config, **fixed)


def agent(url: str, rng: random.Random, calls: int, seen: list[Any],
          answers: tuple[int, ...] = ANSWERS) -> None:
    for _ in range(calls):
        roll = rng.random()
        words = "word " * rng.choice([1, 50, 500, 2000, 9000])
        body: dict[str, Any]
        if roll < 0.15:
            body = {"model": "nomic-embed-text", "input": words[:15000]}
            path = "/api/embed"
        elif roll < 0.35:
            body = {"model": rng.choice(CHAT), "messages": [{"role": "user", "content": words}]}
            path = "/v1/chat/completions"
        else:
            body = {"model": rng.choice(CHAT), "stream": False, "keep_alive": "1h",
                    "messages": [{"role": "user", "content": words}]}
            path = "/api/chat"
        if path != "/v1/chat/completions" and rng.random() < 0.5:
            body["options"] = {"num_ctx": rng.choice([2048, 4096, 8192, 16384, 32768])}
        r = httpx.post(f"{url}{path}", json=body, timeout=120)
        seen.append((path, body["model"], body.get("options"), r.status_code,
                     r.headers.get("x-kubemoot-provider"),
                     r.headers.get("x-kubemoot-placement")))
        assert r.status_code in answers, (seen, r.text)


KEEP_ALIVES = [None, None, 0, "0", "5m", -1, "2s", "1h"]


def rough_agent(url: str, rng: random.Random, calls: int, seen: list[Any],
                answers: tuple[int, ...] = ANSWERS, leaves: bool = True) -> None:
    """Streams, leaves mid-call (while its call waits, loads or answers; unless not
    `leaves`) and asks for its own keep-alive, on Ollama's API (/api/chat, /api/generate,
    /api/embed) and OpenAI's."""
    for _ in range(calls):
        if rng.random() < 0.2:
            agent(url, rng, 1, seen, answers)
            continue
        words = "word " * rng.choice([1, 50, 500, 2000, 9000])
        model = rng.choice(CHAT)
        body: dict[str, Any] = {"model": model}
        roll = rng.random()
        if roll < 0.1:
            model = body["model"] = "nomic-embed-text"
            path, body["input"] = "/api/embed", words[:15000]
        elif roll < 0.4:
            path, body["prompt"] = "/api/generate", words
        elif roll < 0.6:  # (OpenAI's API: no keep_alive or options read)
            path, body["messages"] = "/v1/chat/completions", [
                {"role": "user", "content": words}]
        else:
            path, body["messages"] = "/api/chat", [{"role": "user", "content": words}]
        stream = path != "/api/embed" and rng.random() < 0.6
        if path != "/api/embed":
            body["stream"] = stream
        keep_alive = rng.choice(KEEP_ALIVES)
        if keep_alive is not None:
            body["keep_alive"] = keep_alive
        options: dict[str, Any] = {}
        if rng.random() < 0.5:
            options["num_ctx"] = rng.choice([2048, 4096, 8192, 16384, 32768])
        if rng.random() < 0.3:
            options["num_predict"] = rng.choice([1, 16, 200])
        if path == "/v1/chat/completions":
            if "num_predict" in options:
                body["max_tokens"] = options["num_predict"]
        elif options:
            body["options"] = options
        leave_after = rng.choice([None, None, None, 0.05, 0.5, 2.0])
        leave_at_line = rng.choice([None, None, 1, 3]) if stream else None
        if not leaves:
            leave_after = leave_at_line = None
        status: int | str = "left"
        try:
            with httpx.stream("POST", f"{url}{path}", json=body,
                              timeout=leave_after or 120) as r:
                status = r.status_code
                for n, _line in enumerate(r.iter_lines(), 1):
                    if n == leave_at_line:
                        status = "left"
                        break
        except httpx.TimeoutException:
            status = "left"
        seen.append((path, model, options, keep_alive, status))
        assert status in (*answers, "left"), seen


def run(urls: list[str], agents: int, calls: int, seed: int, rough: bool = False,
        answers: tuple[int, ...] = ANSWERS, leaves: bool = True) -> list[Any]:
    seen: list[Any] = []

    def one(k: int) -> None:
        url, rng = urls[k % len(urls)], random.Random(seed * 10 + k)
        if rough:
            rough_agent(url, rng, calls, seen, answers, leaves)
        else:
            agent(url, rng, calls, seen, answers)

    with ThreadPoolExecutor(agents) as pool:
        list(pool.map(one, range(agents)))
    return seen


def settled(url: str) -> bool:
    """No ticket or plan held and no call waiting: every call that left gave its place
    back."""
    state = httpx.get(f"{url}/kubemoot/v1/state", timeout=10).json()
    return not state["tickets"] and not state["plans"] and \
        not any(d["waiters"] for d in state["demand"].values())


@pytest.mark.parametrize("seed", SEEDS)
def test_one_card(seed: int, sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    rng = random.Random(seed)
    gpu = card(rng, "gpu", rng.choice(VERSIONS), sim_factory)
    seen = run([sidecar_factory([gpu]).url], 3, 8, seed)
    assert quiet(gpu) == NOTHING, (gpu.sim.config, seen)


def two_cards(seed: int, sims: Sims, rough: bool = False
              ) -> tuple[random.Random, list[SimServer]]:
    """The seed's draw, and its two cards: one Ollama version, or (`rough`) at times two,
    with keep-alives in real time (a sidecar counts the ones calls set so; scaled, a "2s"
    would be gone in 40 ms, before any view could know)."""
    rng = random.Random(seed)
    version = rng.choice(VERSIONS)
    other = rng.choice(VERSIONS) if rough and rng.random() < 0.3 else version
    fixed = {"keep_alive_scale": 1.0} if rough else {}
    return rng, [card(rng, "a", version, sims, **fixed), card(rng, "b", other, sims, **fixed)]


def assert_quiet(gpus: list[SimServer], seen: list[Any]) -> None:
    for gpu in gpus:
        assert quiet(gpu) == NOTHING, (gpu.sim.config, seen)


@pytest.mark.parametrize("seed", SEEDS)
def test_two_cards(seed: int, sim_factory: Sims, sidecar_factory: Sidecars) -> None:
    _, gpus = two_cards(seed, sim_factory)
    assert_quiet(gpus, run([sidecar_factory(gpus).url], 3, 8, seed))


@pytest.mark.parametrize("seed", SEEDS)
def test_two_sidecars_on_nats(seed: int, sim_factory: Sims, sidecar_factory: Sidecars,
                              nats_server: NatsServer) -> None:
    _, gpus = two_cards(seed, sim_factory)
    urls = [sidecar_factory(gpus, nats_url=nats_server.url, agent_name=f"agent-{i}").url
            for i in range(2)]
    assert_quiet(gpus, run(urls, 4, 8, seed))


def rough_sidecars(rng: random.Random, gpus: list[SimServer], sidecar_factory: Sidecars,
                   nats_server: NatsServer, **settings: Any) -> list[str]:
    """One sidecar, or (half the time) two sharing NATS."""
    shared = rng.random() < 0.5
    return [sidecar_factory(gpus, agent_name=f"agent-{i}", **settings,
                            **({"nats_url": nats_server.url} if shared else {})).url
            for i in range(2 if shared else 1)]


def assert_settled(urls: list[str], seen: list[Any]) -> None:
    if not eventually(lambda: all(map(settled, urls)), timeout_s=15):
        print("calls:", seen)  # (in full: pytest cuts an assertion's message short)
        raise AssertionError(left_over(urls))


def left_over(urls: list[str]) -> str:
    """What each sidecar still holds, short enough to survive pytest's truncation."""
    lines = []
    for url in urls:
        state = httpx.get(f"{url}/kubemoot/v1/state", timeout=10).json()
        tickets = [(t["provider"], t["model"], t["holder"], t["cold"], t["expiresIn_s"])
                   for t in state["tickets"]]
        waiting = {m: d["waiters"] for m, d in state["demand"].items() if d["waiters"]}
        lines.append(f"{url}: tickets {tickets} waiters {waiting} plans {state['plans']} "
                     f"connected {state['sharedStateConnected']}")
    return "\n".join(lines)


@pytest.mark.parametrize("seed", SEEDS)
def test_rough_agents(seed: int, sim_factory: Sims, sidecar_factory: Sidecars,
                      nats_server: NatsServer) -> None:
    rng, gpus = two_cards(seed, sim_factory, rough=True)
    urls = rough_sidecars(rng, gpus, sidecar_factory, nats_server)
    seen = run(urls, 6, 8, seed, rough=True)
    assert_settled(urls, seen)
    assert_quiet(gpus, seen)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_card_restarting_under_rough_agents(seed: int, sim_factory: Sims,
                                             sidecar_factory: Sidecars,
                                             nats_server: NatsServer) -> None:
    """Card b's Ollama restarts (back empty on its port) at a random moment: calls it was
    running fail (502 before their first byte), nothing is left held, and neither card
    does anything on its own (b's counts start again with it)."""
    rng, gpus = two_cards(seed, sim_factory, rough=True)
    urls = rough_sidecars(rng, gpus, sidecar_factory, nats_server)
    restart_after = rng.uniform(0.1, 1.2)  # (a run takes 1.5-3 s)

    def restart() -> None:
        time.sleep(restart_after)
        gpus[1].stop()
        gpus[1].sim.reset()
        gpus[1].start()

    restarter = threading.Thread(target=restart, daemon=True)
    restarter.start()
    seen = run(urls, 6, 8, seed, rough=True, answers=(*ANSWERS, 502))
    restarter.join(30)
    assert_settled(urls, seen)
    assert_quiet(gpus, seen)


@pytest.mark.parametrize("seed", SEEDS)
def test_nats_going_away_under_rough_agents(seed: int, sim_factory: Sims,
                                           sidecar_factory: Sidecars) -> None:
    """The nats-server two sidecars share stops at a random moment and starts again on its
    store: meanwhile each places on what it last saw and loads nothing, so calls may wait
    (503 at their limit); once it is back every ticket claimed meanwhile is released and
    neither card does anything on its own."""
    rng, gpus = two_cards(seed, sim_factory, rough=True)
    nats = NatsServer().start()
    try:
        urls = [sidecar_factory(gpus, nats_url=nats.url, agent_name=f"agent-{i}").url
                for i in range(2)]
        down_after, down_for = rng.uniform(0.1, 1.2), rng.uniform(0.2, 1.5)

        def outage() -> None:
            time.sleep(down_after)
            nats.stop()
            time.sleep(down_for)
            nats.start()

        outages = threading.Thread(target=outage, daemon=True)
        outages.start()
        seen = run(urls, 6, 8, seed, rough=True)
        outages.join(30)
        assert_settled(urls, seen)
        assert_quiet(gpus, seen)
    finally:
        nats.cleanup()


FAULTS = ["error", "midstream", "parser", "stall", "slow_first_byte", "oom"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_faulty_card_under_rough_agents(seed: int, sim_factory: Sims,
                                          sidecar_factory: Sidecars,
                                          nats_server: NatsServer) -> None:
    """Card b's Ollama fails its next calls one way: a 500 at once, its llama-server dying
    or its parser failing mid-answer, a stall, a slow first byte, or running out of memory
    (from 0.30 every copy there unloaded). The calls it fails end in an error (500, 502, or
    an error line in a stream), nothing is left held, and neither card does anything else on
    its own. Three failures open b's circuit for a minute (real time), in which a call that
    only b can serve waits; a wait limit of 15 s (503) keeps an agent's eight calls within
    the test's time."""
    rng, gpus = two_cards(seed, sim_factory, rough=True)
    urls = rough_sidecars(rng, gpus, sidecar_factory, nats_server,
                          discuss_gpu_wait_limit_seconds=15)
    fault = gpus[1].sim.fault = Fault(rng.choice(FAULTS), count=rng.randint(1, 4),
                                      after_chunks=rng.randint(0, 3),
                                      delay_s=rng.uniform(0.1, 1.0))
    # Before 0.32.15 a client that leaves a stream as the parser fails may leave its slot
    # taken for good, the error unseen by the sidecar (which stops reading as the client
    # goes): Ollama's fault, fixed there. Its agents stay to the end of their calls.
    leaves = not (fault.mode == "parser" and parse_error_holds_slot(gpus[1].sim.config.version))
    seen = run(urls, 6, 8, seed, rough=True, answers=(*ANSWERS, 500, 502), leaves=leaves)
    assert_settled(urls, seen)
    assert_quiet(gpus, seen)


def crew_settings(rng: random.Random, sims: Sims) -> dict[str, Any]:
    """An agent as the operator binds it: a candidate list with scores and a tolerance, at
    times a static endpoint (an Ollama of its own: sent to a placed card, a call no GPU has
    room for would have that Ollama unload or reload copies itself), at times the
    coordinator's role (its calls never wait)."""
    chosen = rng.sample(CHAT, rng.randint(1, 4))
    scores = sorted((rng.randint(10, 90) for _ in chosen), reverse=True)
    candidates = [{"model": m, "score": s} for m, s in zip(chosen, scores, strict=True)]
    settings: dict[str, Any] = dict(
        model_model=chosen[0], discuss_gpu_wait_limit_seconds=15,
        model_candidates_mulling=candidates,
        model_candidate_tolerance=rng.choice([0, 10, 10, 40]),
        role="coordinator" if rng.random() < 0.2 else "specialist")
    if rng.random() < 0.3:
        settings["model_endpoint"] = sims("static", time_scale=SCALE, models=MODELS).url
    return settings


def crew_agent(url: str, rng: random.Random, calls: int, seen: list[Any]) -> None:
    """An agent of a crew: held plans taken by its thread's first call or dropped, calls
    with no model (its preferred one), in triage, that cannot wait, over Anthropic's and
    OpenAI's completions APIs, and its own loads and unloads (`ollama run` with no prompt,
    `ollama stop`)."""
    for n in range(calls):
        words = "word " * rng.choice([1, 50, 500, 2000, 9000])
        model = rng.choice([*CHAT, None])
        headers: dict[str, str] = {}
        roll = rng.random()
        thread = f"t-{rng.random():.6f}-{n}"
        if roll < 0.25:
            plan: dict[str, Any] = {"thread": thread, "promptChars": len(words)}
            if model is not None:
                plan["model"] = model
            planned = httpx.post(f"{url}/kubemoot/v1/plans", json=plan, timeout=30)
            seen.append(("plan", model, planned.status_code, planned.json().get("planned")))
            # 201: planned; 429: over the agent's plans or the fleet's share for them
            assert planned.status_code in (200, 201, 429), (seen, planned.text)
            if planned.status_code != 429 and rng.random() < 0.3:  # the agent stood aside
                dropped = httpx.delete(f"{url}/kubemoot/v1/plans/{thread}", timeout=30)
                assert dropped.status_code == 200, (seen, dropped.text)
                continue
            headers["X-Kubemoot-Thread"] = thread
        elif roll < 0.35:
            headers["X-Kubemoot-Phase"] = "triage"
        elif roll < 0.45:
            headers["X-Kubemoot-Wait"] = "false"
        answers: tuple[int, ...] = ANSWERS
        body: dict[str, Any] = {} if model is None else {"model": model}
        kind = rng.random()
        if kind < 0.1:  # `ollama stop`, or a load with nothing to answer
            path = "/api/generate"
            if rng.random() < 0.5:
                body["keep_alive"] = 0
        elif kind < 0.25:
            path = "/v1/messages"
            body.update(max_tokens=rng.choice([1, 16, 200]),
                        messages=[{"role": "user", "content": words}])
            answers = (*ANSWERS, 404)  # (before 0.14 Ollama has no /v1/messages)
        elif kind < 0.4:
            path, body["prompt"] = "/v1/completions", words
        elif kind < 0.7:
            path, body["prompt"] = "/api/generate", words
        else:
            path, body["messages"] = "/api/chat", [{"role": "user", "content": words}]
        if path in ("/api/generate", "/api/chat"):
            body["stream"] = rng.random() < 0.5
            if rng.random() < 0.4:
                body["options"] = {"num_ctx": rng.choice([2048, 8192, 32768])}
        if model is None and path.startswith("/v1/"):
            body["model"] = rng.choice(CHAT)  # (those APIs need one)
        r = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=120)
        seen.append((path, body.get("model"), headers, r.status_code,
                     r.headers.get("x-kubemoot-placement")))
        assert r.status_code in answers, (seen, r.text)
        if "X-Kubemoot-Thread" in headers:  # the thread ends: a plan its call did not take
            # (refused before placement, or a load or unload) is the agent's to release
            httpx.delete(f"{url}/kubemoot/v1/plans/{thread}", timeout=30)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", SEEDS)
def test_crews_with_candidates_plans_and_unloads(seed: int, sim_factory: Sims,
                                                sidecar_factory: Sidecars,
                                                nats_server: NatsServer) -> None:
    """Agents bound as the operator binds them (candidates, tolerance, a static endpoint,
    the coordinator's role), each of one sidecar or two sharing NATS: every answer is a
    success or a contract refusal, no plan or ticket is left once they are done, and
    neither card does anything on its own."""
    rng, gpus = two_cards(seed, sim_factory, rough=True)
    urls = rough_sidecars(rng, gpus, sidecar_factory, nats_server,
                          **crew_settings(rng, sim_factory))
    seen: list[Any] = []

    def one(k: int) -> None:
        crew_agent(urls[k % len(urls)], random.Random(seed * 10 + k), 8, seen)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(one, range(6)))
    assert_settled(urls, seen)
    assert_quiet(gpus, seen)


@pytest.mark.parametrize("seed", SEEDS)
def test_many_sidecars_on_nats_under_rough_agents(seed: int, sim_factory: Sims,
                                                 sidecar_factory: Sidecars) -> None:
    """Three or four sidecars on a NATS of their own, two rough agents each, at times bound
    as a crew's: their claims race for the same room more often than two sidecars' do."""
    rng, gpus = two_cards(seed, sim_factory, rough=True)
    nats = NatsServer().start()
    try:
        settings = crew_settings(rng, sim_factory) if rng.random() < 0.5 else {}
        urls = [sidecar_factory(gpus, nats_url=nats.url, agent_name=f"agent-{i}",
                                **settings).url
                for i in range(rng.choice([3, 4]))]
        seen = run(urls, 2 * len(urls), 6, seed, rough=True)
        assert_settled(urls, seen)
        assert_quiet(gpus, seen)
    finally:
        nats.cleanup()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_fleet_as_found_under_rough_agents(seed: int, sim_factory: Sims,
                                            sidecar_factory: Sidecars,
                                            nats_server: NatsServer) -> None:
    """The sidecars start on the fleet as they find it: copies someone loaded on card a
    before them (none to three, each at its own context, for an hour), and card b's Ollama
    not up yet, up 0.1-1.5 s later. From then on neither card does anything on its own
    (what a did for those loads is not counted). A copy asked for more than its trained
    context is not among them: from 0.15.5 to 0.24 Ollama lists it at the trained one and
    compares the ask, which the sidecar cannot see (docs/engine.md)."""
    rng, gpus = two_cards(seed, sim_factory, rough=True)
    for model in rng.sample(CHAT, rng.randint(0, 3)):
        options = {"num_ctx": 2048} if rng.random() < 0.5 else {}
        httpx.post(f"{gpus[0].url}/api/generate", timeout=60,
                   json={"model": model, "keep_alive": "1h", "options": options})
    before = quiet(gpus[0])
    gpus[1].stop()
    urls = rough_sidecars(rng, gpus, sidecar_factory, nats_server)
    late = rng.uniform(0.1, 1.5)
    starter = threading.Timer(late, gpus[1].start)
    starter.start()
    seen = run(urls, 6, 8, seed, rough=True)
    starter.join(30)
    assert_settled(urls, seen)
    assert {k: v - before[k] for k, v in quiet(gpus[0]).items()} == NOTHING, (
        gpus[0].sim.config, seen)
    assert quiet(gpus[1]) == NOTHING, (gpus[1].sim.config, seen)
