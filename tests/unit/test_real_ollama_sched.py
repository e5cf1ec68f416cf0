"""The scheduling check (loadtest/real_ollama_sched.py): how it reads an outcome, and two of
its scenarios against the simulator, with the outcome a real Ollama 0.12.6 and 0.24.0 showed
(CPU only, OLLAMA_MAX_LOADED_MODELS=1, OLLAMA_NUM_PARALLEL=2)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from loadtest.ollama_sim import SimServer, with_derived
from loadtest.real_ollama_sched import (
    Models,
    _ctx_rel,
    diff,
    reloaded,
    s_keep_alive_last_wins,
    s_max_loaded_other_weights,
    s_other_name_own_num_ctx,
    together,
)
from loadtest.sim_model import CATALOG, SimConfig


def test_names_read_as_letters_whatever_the_tag() -> None:
    m = Models("http://x", "tiny", "tinyb", "tinyc", "tinyd")
    assert [m.letter(n) for n in ("tiny:latest", "tinyb:latest", "tinyc", "other")] == [
        "A", "B", "C", "other"]
    assert _ctx_rel(["A@4096", "C@8192"], ["A@4096"]) == ["A@base", "C@other"]


def test_calls_that_ran_together_started_before_the_first_one_ended() -> None:
    two_then_one = {"0.first": 0.1, "1.first": 0.2, "0.end": 1.0, "1.end": 1.1,
                    "2.first": 1.05, "2.end": 2.0}
    assert together(two_then_one) == 2
    assert together({"0.first": 0.1}) == 0  # nothing ended: nothing to say


def test_a_reload_is_a_load_over_ten_ms_and_differences_name_their_key() -> None:
    assert not reloaded({"load_duration": 1_900_000}) and reloaded({"load_duration": 38_000_000})
    assert diff({"a": 1, "b": [1]}, {"a": 1, "b": [2]}) == ["b: real [1], sim [2]"]


@pytest.fixture
def sim() -> Iterator[Models]:
    models = with_derived(CATALOG, ["phib=phi3:mini:0", "phid=phi3:mini:512"])
    server = SimServer(SimConfig(name="gpu", models=models, time_scale=0.01,
                                 max_loaded_models=1, num_parallel=2)).start()
    try:
        yield Models(server.url, "phi3:mini", "phib", "llama3.2:3b", "phid")
    finally:
        server.stop()


def test_the_simulator_swaps_models_as_a_real_ollama_does(sim: Models) -> None:
    with httpx.Client(timeout=30) as cl:
        assert s_max_loaded_other_weights(cl, sim) == {
            "ps after A": ["A"], "C status": 200, "C reloaded": True, "ps after C": ["C"]}
        assert s_other_name_own_num_ctx(cl, sim) == {
            "D reloaded": True, "ps after D": ["D@512"], "A again reloaded": True,
            "copies at end": 1}
        assert s_keep_alive_last_wins(cl, sim) == {  # a call without keep_alive keeps it
            "expiry after -1, none, -1, 10m": ["forever", "forever", "forever", "soon"]}
