"""The simulator's GPU is shared as Ollama's runners share one: a runner decodes all its busy
slots in one batch a step, a step costing `batch_cost` more for each more sequence, and the
runners decoding at once on a card time-slice it (docs/engine.md). Timings are measured
against the known length of an answer decoded alone, never as a ratio of two short ones:
a busy machine can only make a call late, so the lower bounds are tight and the upper ones
generous. Calls sent together may start a little apart; the time from the first call sent to
the last answered does not depend on that while the card is kept busy, so the tight lower
bound is on it, the upper ones on each call's own decoding."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from loadtest.ollama_sim import SimServer, configs_from
from loadtest.serving import sharing_args
from loadtest.sim_output import ANSWER_TOKENS
from tests.conftest import eventually

pytestmark = pytest.mark.serial  # decoding paces in wall-clock time
Sims = Callable[..., SimServer]
TOKENS = 40  # an answer's length: 0.8 s alone at Ollama's 50 tokens/s
LATE = 0.5  # what a busy machine may add to a call (less than a shared token's worth)
TURN = 0.03  # a token's pace is set as it starts: one may go at the pace before a change


def card(sim_factory: Sims, **config: Any) -> SimServer:
    """A card at real time whose loads and prompts take next to nothing, so that a call's
    time is its decoding."""
    return sim_factory("gpu", total_vram_mib=24564, context_length=4096, time_scale=1.0,
                       startup_s=0.0, load_mib_per_s=1e6, prompt_tokens_per_s=1e6, **config)


def generate(sim: SimServer, model: str, tokens: int = TOKENS) -> float:
    """The seconds the simulator spent decoding the answer (its eval_duration)."""
    r = httpx.post(f"{sim.url}/api/generate", timeout=30, json={
        "model": model, "prompt": "hi", "stream": False, "options": {ANSWER_TOKENS: tokens}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["eval_count"] == tokens
    return float(body["eval_duration"]) / 1e9


def at_once(sim: SimServer, *models: str) -> tuple[float, list[float]]:
    """The seconds from sending the calls to the last answer, and each call's decoding."""
    for model in set(models):  # loaded first, so the calls decode together
        assert httpx.post(f"{sim.url}/api/generate", json={"model": model}).status_code == 200
    with ThreadPoolExecutor(len(models)) as pool:
        sent = time.perf_counter()
        took = list(pool.map(lambda model: generate(sim, model), models))
        return time.perf_counter() - sent, took


def alone(sim: SimServer) -> float:
    """How long an answer of TOKENS takes decoded alone on `sim`."""
    return TOKENS / sim.config.tokens_per_s * sim.config.time_scale


def test_a_call_alone_decodes_at_full_speed(sim_factory: Sims) -> None:
    sim = card(sim_factory, num_parallel=2)
    took = generate(sim, "llama3.2:3b")
    assert alone(sim) - 0.01 <= took <= alone(sim) + LATE
    assert sim.sim.stats.peak_decoding == 1


def test_two_calls_on_one_runner_share_its_batch_at_the_batch_cost(sim_factory: Sims) -> None:
    sim = card(sim_factory, num_parallel=2, batch_cost=0.5)
    expected = alone(sim) * 1.5
    both, took = at_once(sim, "llama3.2:3b", "llama3.2:3b")
    assert both >= expected - TURN, (both, took)
    for each in took:  # each slowed, whichever started first
        assert alone(sim) * 1.25 < each <= expected + LATE
    assert sim.sim.stats.peak_decoding == 2


def test_a_free_batch_decodes_two_calls_as_fast_as_one(sim_factory: Sims) -> None:
    sim = card(sim_factory, num_parallel=2, batch_cost=0.0)
    _, took = at_once(sim, "llama3.2:3b", "llama3.2:3b")
    for each in took:
        assert alone(sim) - 0.01 <= each <= alone(sim) + LATE
    assert sim.sim.stats.peak_decoding == 2


def test_without_sharing_every_slot_decodes_at_full_speed(sim_factory: Sims) -> None:
    sim = card(sim_factory, share_gpu=False)
    _, took = at_once(sim, "llama3.2:3b", "phi3:mini")
    for each in took:
        assert alone(sim) - 0.01 <= each <= alone(sim) + LATE
    assert sim.sim.stats.peak_decoding == 2


def test_two_models_decoding_on_one_card_each_wait_for_the_others_step(
        sim_factory: Sims) -> None:
    sim = card(sim_factory)
    expected = alone(sim) * 2  # both copies fit, so each step is 1 / tokens_per_s
    both, took = at_once(sim, "llama3.2:3b", "phi3:mini")
    assert both >= expected - TURN, (both, took)
    for each in took:
        assert alone(sim) * 1.5 < each <= expected + LATE
    assert sim.sim.stats.peak_decoding == 2


def test_a_client_that_leaves_mid_stream_gives_its_share_back(sim_factory: Sims) -> None:
    sim = card(sim_factory)
    for model in ("llama3.2:3b", "phi3:mini"):
        assert httpx.post(f"{sim.url}/api/generate", json={"model": model}).status_code == 200
    read = 10  # tokens the leaving client reads, each taking two steps while both decode
    with ThreadPoolExecutor(1) as pool:
        staying = pool.submit(generate, sim, "llama3.2:3b")
        assert eventually(lambda: sim.sim.decoding == 1, timeout_s=2, step_s=0.001)
        with httpx.stream("POST", f"{sim.url}/api/generate", timeout=30, json={
                "model": "phi3:mini", "prompt": "hi",
                "options": {ANSWER_TOKENS: TOKENS}}) as leaving:
            for n, _ in enumerate(leaving.iter_lines(), 1):
                if n == read:
                    break
        assert eventually(lambda: sim.sim.decoding == 1, timeout_s=2, step_s=0.005)
        took = staying.result()
    # the staying call's first tokens at two steps each, the rest at one
    step = sim.config.time_scale / sim.config.tokens_per_s
    expected = (TOKENS + read) * step
    assert expected - 2 * TURN <= took <= expected + LATE
    assert sim.sim.decoding == 0
    assert httpx.get(f"{sim.url}/_sim/stats").json()["decoding"] == 0


def test_an_operator_turns_sharing_off_on_the_command_line() -> None:
    assert {(c.batch_cost, c.share_gpu) for c in configs_from([])} == {(0.1, True)}
    off = ["--fleet", "demo", "--batch-cost", "0", "--no-share-gpu"]
    demo = configs_from(off)
    assert len(demo) == 3
    assert {(c.batch_cost, c.share_gpu) for c in demo} == {(0.0, False)}
    # what the fleet soak passes on to each simulated GPU
    fleet = configs_from(sharing_args(argparse.Namespace(batch_cost=0.25, share_gpu=False)))
    assert [(c.batch_cost, c.share_gpu) for c in fleet] == [(0.25, False)]
