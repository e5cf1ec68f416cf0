"""A copy Ollama lists before it has read its weights (docs/engine.md, "Loads, one at a time on
every version"): from 0.11.5 to 0.24 its own engine's copy (qwen3 from 0.12.0) is in
`/api/ps` once its memory is committed, while its runner still reads the weights. A call
joining it waits for the read, and so does the next load on the card: the copy is a load for
time until its expected end, and a resident for memory."""

from __future__ import annotations

import pytest

from proxy.core.occupancy import index_providers
from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelInfo, Snapshot, Verdict
from tests.unit.builders import GIB32, SIZES, call, gpu, snapshot, ticket

QWEN3, LLAMA, PHI3 = ModelInfo(family="qwen3"), ModelInfo(family="llama"), ModelInfo(family="phi3")
# qwen3:14b's load as the sidecar expects it: no file size, no start-up known here
LOAD_14B_S = SIZES["qwen3:14b"] / DEFAULT_POLICY.load_mib_per_s  # 11.9 s
LOAD_PHI3_S = SIZES["phi3:mini"] / DEFAULT_POLICY.load_mib_per_s  # 3.5 s


def listed_while_loading(version: str = "0.12.6", model: str = "qwen3:14b",
                         info: ModelInfo = QWEN3, elapsed: float = 4.0) -> Snapshot:
    """`model` listed on a two-slot card, its cold ticket `elapsed` seconds old."""
    card = gpu("a", GIB32, (model,), parallel=2, version=version, models={model: info})
    return snapshot(card, tickets=(ticket("a", model, cold=True, elapsed=elapsed),))


def verdict(model: str, snap: Snapshot) -> Verdict:
    return explain(call(model), snap)[1][0]


def test_a_warm_join_of_a_copy_still_reading_its_weights_waits_for_the_read() -> None:
    snap = listed_while_loading()
    join = place(call("qwen3:14b"), snap).placement
    assert join is not None and join.kind == "warm"  # a free slot of the listed copy
    assert verdict("qwen3:14b", snap).terms["load"] == pytest.approx(LOAD_14B_S - 4.0)
    assert join.cost_s == pytest.approx(verdict("qwen3:14b", snap).cost_s)


def test_the_next_load_on_the_card_waits_for_the_read() -> None:
    snap = listed_while_loading()
    assert verdict("phi3:mini", snap).terms["loads_ahead"] == pytest.approx(LOAD_14B_S - 4.0)
    load = place(call("phi3:mini"), snap).placement
    assert load is not None and (load.kind, load.loads_ahead) == ("cold", 1)


def test_a_load_queued_behind_the_read_starts_when_the_read_ends() -> None:
    card = gpu("a", GIB32, ("qwen3:14b",), parallel=2, version="0.12.6",
               models={"qwen3:14b": QWEN3})
    snap = snapshot(card, tickets=(ticket("a", "qwen3:14b", cold=True, elapsed=4.0),
                                   ticket("a", "phi3:mini", cold=True, elapsed=2.0)))
    assert verdict("phi3:mini", snap).terms["load"] == pytest.approx(
        LOAD_14B_S - 4.0 + LOAD_PHI3_S)


def test_a_wait_for_the_slot_of_a_copy_still_reading_includes_the_read() -> None:
    """One slot, held by the loading call: the wait is that call's (the default 30 s, 4 s
    gone) after the read's 7.9 s left."""
    card = gpu("a", GIB32, ("qwen3:14b",), version="0.12.6", models={"qwen3:14b": QWEN3})
    snap = snapshot(card, tickets=(ticket("a", "qwen3:14b", cold=True, elapsed=4.0),))
    decision = place(call("qwen3:14b"), snap)
    assert decision.outcome == "wait"
    assert decision.queue_option_s == pytest.approx(
        DEFAULT_POLICY.default_call_s - 4.0 + LOAD_14B_S - 4.0)


def test_the_copy_still_counts_as_resident_memory_not_as_a_load() -> None:
    reading = index_providers(listed_while_loading(), DEFAULT_POLICY)["a"]
    newest = index_providers(listed_while_loading(version=""), DEFAULT_POLICY)["a"]
    assert reading.free_mib() == newest.free_mib()
    assert reading.is_warm("qwen3:14b") and not reading.is_loading("qwen3:14b")
    assert not reading.loading and reading.loading_mib == 0


@pytest.mark.parametrize(("version", "model", "info"), [
    ("", "qwen3:14b", QWEN3),  # unknown: the newest rules, listed once it runs
    ("0.33.0", "qwen3:14b", QWEN3),  # llama-server
    ("0.12.5", "qwen3:14b", QWEN3),  # qwen3 on the llama engine in that release
    ("0.12.6", "llama3.2:3b", LLAMA),  # the llama engine (without OLLAMA_NEW_ENGINE)
    ("0.12.6", "phi3:mini", PHI3),  # not in the engine's registry
])
def test_a_copy_listed_once_it_runs_is_warm_at_once(version: str, model: str,
                                                     info: ModelInfo) -> None:
    snap = listed_while_loading(version, model, info)
    assert "load" not in verdict(model, snap).terms
    other = "qwen3:8b"
    assert "loads_ahead" not in verdict(other, snap).terms
    load = place(call(other), snap).placement
    assert load is not None and (load.kind, load.loads_ahead) == ("cold", 0)


def test_the_read_counts_only_until_its_expected_end() -> None:
    snap = listed_while_loading(elapsed=LOAD_14B_S + 1.0)
    assert "load" not in verdict("qwen3:14b", snap).terms
    assert "loads_ahead" not in verdict("phi3:mini", snap).terms
    load = place(call("phi3:mini"), snap).placement
    assert load is not None and load.loads_ahead == 0
