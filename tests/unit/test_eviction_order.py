"""Victims in Ollama's order: a copy kept forever (keep_alive -1) goes last, a shorter
keep-alive first (server/sched.go ByDurationAndName, findRunnerToUnload)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.core.eviction import choose_victims
from proxy.core.occupancy import index_providers
from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand, Resident, WaitNeed
from tests.unit.builders import GIB24, NOW, SIZES, call, gpu, snapshot, ticket

# What /api/ps says of a copy loaded with keep_alive -1: now + 292 years (math.MaxInt64 ns)
FOREVER = NOW + 292 * 365 * 86400.0


def _card(expiries: dict[str, float]):  # type: ignore[no-untyped-def]
    """A 24 GiB card at context 8192 with these idle copies, loaded in this order."""
    residents = tuple(Resident(m, SIZES[m], 8192, last_used_at=NOW - 100 + i, expires_at=at)
                      for i, (m, at) in enumerate(expiries.items()))
    return replace(gpu("g24", GIB24, ctx=8192), residents=residents)


def test_a_copy_kept_forever_is_not_evicted_while_an_idle_one_with_a_keep_alive_makes_room(
) -> None:
    # free 21616 - 12224 - 6000 = 3392 MiB: phi3 (3600) needs either copy gone
    card = _card({"qwen3:14b": FOREVER, "qwen3:8b": NOW + 300})
    decision = place(call("phi3:mini"), snapshot(card))
    assert decision.placement is not None and decision.placement.kind == "evict"
    assert dict(decision.placement.evicts) == {"qwen3:8b": 6000}
    # kept forever outranks what the demand board says of the other
    wanted = place(call("phi3:mini"), snapshot(card, demand={
        "qwen3:8b": ModelDemand(intents=2, recent_use=5, last_used_at=NOW)}))
    assert wanted.placement is not None and set(wanted.placement.evicts) == {"qwen3:8b"}


def test_a_copy_whose_expiry_is_not_known_yet_is_not_kept_forever() -> None:
    """A copy loaded since the last probe (expiry unknown, inf) ranks by the board, as
    Ollama ranks it by its ordinary keep-alive: the decision does not hang on probe timing."""
    unknown = _card({"qwen3:14b": float("inf"), "qwen3:8b": NOW + 300})
    board = {"qwen3:8b": ModelDemand(intents=2, recent_use=5, last_used_at=NOW)}
    decision = place(call("phi3:mini"), snapshot(unknown, demand=board))
    assert decision.placement is not None and set(decision.placement.evicts) == {"qwen3:14b"}


def test_a_copy_kept_forever_goes_when_nothing_else_makes_room() -> None:
    # free 21616 - 12224 - 3600 = 5792 MiB: the 8b (6000) needs a copy gone, phi3 has a call
    card = _card({"qwen3:14b": FOREVER, "phi3:mini": NOW + 300})
    decision = place(call("qwen3:8b"), snapshot(card, tickets=(ticket("g24", "phi3:mini"),)))
    assert decision.placement is not None and decision.placement.kind == "evict"
    assert set(decision.placement.evicts) == {"qwen3:14b"}  # phi3 has a call


@pytest.mark.parametrize(
    ("expiries", "demand", "victim"),
    [
        # the shorter keep-alive left goes first, whatever the order of loading
        ({"phi3:mini": NOW + 3600, "llama3.2:3b": NOW + 60}, {}, "llama3.2:3b"),
        ({"phi3:mini": NOW + 60, "llama3.2:3b": NOW + 3600}, {}, "phi3:mini"),
        # forever is last even for a model nobody uses and a short keep-alive in demand
        ({"phi3:mini": FOREVER, "llama3.2:3b": NOW + 60},
         {"llama3.2:3b": ModelDemand(intents=1, recent_use=3)}, "llama3.2:3b"),
        # among copies with a keep-alive, one an agent announced it needs goes later
        ({"phi3:mini": NOW + 60, "llama3.2:3b": NOW + 3600},
         {"phi3:mini": ModelDemand(intents=1)}, "llama3.2:3b"),
        # a model calls wait for goes only when nothing else makes room, kept forever or not
        ({"phi3:mini": FOREVER, "llama3.2:3b": NOW + 60},
         {"llama3.2:3b": ModelDemand(waiters=1)}, "phi3:mini"),
    ],
)
def test_victim_order(expiries: dict[str, float], demand: dict[str, ModelDemand],
                      victim: str) -> None:
    index = index_providers(snapshot(_card(expiries)), DEFAULT_POLICY)["g24"]
    chosen = choose_victims(index, lambda victims: sum(v.footprint_mib for v in victims) >= 3000,
                            demand, now=NOW)
    assert chosen is not None and [r.model for r in chosen] == [victim]


def test_a_copy_a_call_waiting_for_another_model_could_run_on_goes_after_an_unwanted_one(
) -> None:
    """The 8b is the less used copy, but a call waiting for the 32b (which fits no card) has
    the 8b as a candidate (`backing`): the 14b goes, as if that call waited for the 8b."""
    card = _card({"qwen3:14b": NOW + 300, "qwen3:8b": NOW + 300})
    used = {"qwen3:14b": ModelDemand(recent_use=3, last_used_at=NOW)}
    plain = place(call("phi3:mini"), snapshot(card, demand=used))
    assert plain.placement is not None and set(plain.placement.evicts) == {"qwen3:8b"}
    backed = {**used, "qwen3:8b": ModelDemand(backing=(WaitNeed(),))}
    decision = place(call("phi3:mini"), snapshot(card, demand=backed))
    assert decision.placement is not None and set(decision.placement.evicts) == {"qwen3:14b"}


@pytest.mark.parametrize("need", [
    WaitNeed(num_ctx=16384),  # the 8b's copy holds 8192: the call would reload it
    WaitNeed(prompt_tokens=9000),  # its prompt does not fit the copy
    WaitNeed(excludes=frozenset({"g24"})),  # a retry kept off this card
])
def test_a_copy_a_backing_call_could_not_run_on_is_not_kept_for_it(need: WaitNeed) -> None:
    """A call waiting for the 32b has the 8b as a candidate, but could not run on this copy
    of it: it keeps nothing here, and the less used 8b goes, as with no such call."""
    card = _card({"qwen3:14b": NOW + 300, "qwen3:8b": NOW + 300})
    backed = {"qwen3:14b": ModelDemand(recent_use=3, last_used_at=NOW),
              "qwen3:8b": ModelDemand(backing=(need,))}
    decision = place(call("phi3:mini"), snapshot(card, demand=backed))
    assert decision.placement is not None and set(decision.placement.evicts) == {"qwen3:8b"}
