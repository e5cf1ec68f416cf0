"""Copies between states (leaving, loading, reloading, expiring): what every view counts and
lets calls join, one row per case. Each is a way the sidecar's view and Ollama's could part."""

from __future__ import annotations

import math
from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.adapters.ollama import OllamaClient
from proxy.api.relay import payload_for
from proxy.core.occupancy import index_providers, ticket_budget_ok
from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY, Policy
from proxy.core.tickets import (
    ABANDONED_GRACE_S,
    LEAVING_MAX_S,
    Residency,
    TicketSet,
    merge_residency,
)
from proxy.core.types import ModelInfo, Placement, ProviderView, Resident, Ticket
from proxy.service.claims import left_loaded, load_state
from proxy.service.codec import decode_ticket_set, encode_ticket_set
from proxy.service.routing import Attempt, CallOutcome
from tests.unit.builders import GIB24, GIB32, NOW, call, gpu, snapshot, ticket


def test_a_copy_marked_leaving_is_not_joined_even_while_its_calls_run() -> None:
    leaving = replace(gpu("a", GIB32, ("qwen3:8b",), parallel=4), residents=(
        Resident("qwen3:8b", 6000, leaving=True),))
    snap = snapshot(leaving, gpu("b", GIB32), tickets=(ticket("a", "qwen3:8b"),))
    decision = place(call("qwen3:8b"), snap)
    assert decision.placement is not None and decision.placement.provider == "b"


def test_a_reload_keeps_its_model_counted_against_ollamas_limit() -> None:
    card = gpu("a", 49140, ("qwen3:8b", "phi3:mini", "llama3.2:3b"), max_loaded=3)
    reload = ticket("a", "qwen3:8b", cold=True, evicts={"qwen3:8b": 6000})
    index = index_providers(snapshot(card, tickets=(reload,)), DEFAULT_POLICY)["a"]
    assert index.models_over_limit("qwen3:14b") == 1  # the 8b comes back: still three
    new = Ticket("n", "a", "qwen3:14b", 12224, NOW, NOW + 60, cold=True)
    ok, why = ticket_budget_ok([reload], new, card, Policy())
    assert not ok and "OLLAMA_MAX_LOADED_MODELS" in why


def test_the_decision_counts_what_calls_sharing_a_copy_claim_as_the_claim_does() -> None:
    card = gpu("a", GIB24, ("qwen3:8b",), parallel=4)
    shared = tuple(ticket("a", "qwen3:8b") for _ in range(4))  # 4 x 512 MiB
    index = index_providers(snapshot(card, tickets=shared), DEFAULT_POLICY)["a"]
    assert index.free_mib() == 21616 - 6000 - 4 * 512


def test_a_load_beside_an_expiring_copy_of_its_model_claims_its_whole_footprint() -> None:
    """An idle copy about to expire is no copy to count on: a load of its model counts in
    full (Ollama may have unloaded the copy by the time the call arrives)."""
    expiring = replace(gpu("a", GIB32), residents=(
        Resident("qwen3:8b", 6000, 4096, expires_at=NOW + 0.5),))
    load = Ticket("n", "a", "qwen3:8b", 6000, NOW, NOW + 60, cold=True, context=4096)
    ok, why = ticket_budget_ok([], load, expiring, Policy())
    assert ok and why.startswith("6000 MiB claimed")


def test_an_expiring_copy_at_another_context_is_reloaded_as_planned() -> None:
    info = {"qwen3:8b": ModelInfo(trained_context=40960, kv_bytes_per_token=144 * 1024)}
    card = ProviderView("a", GIB32, residents=(
        Resident("qwen3:8b", 6000, 4096, expires_at=NOW + 0.5),), context_length=16384,
        models=info, disk_mib={"qwen3:8b": 5200})
    decision = place(call("qwen3:8b"), snapshot(card))
    assert decision.placement is not None and decision.placement.kind == "evict"
    assert dict(decision.placement.evicts) == {"qwen3:8b": 6000}


def test_a_copy_still_loading_is_not_unloaded_to_reload_it_at_another_context() -> None:
    """A load whose call has gone (a plan dropped, its agent left) may still be running in
    Ollama, which neither lists nor expires a copy before it is loaded: an unload asked now
    is lost, and the call sent after it would have Ollama reload the copy itself. The call
    waits for the load to be seen through (then the copy is one to join, or to unload)."""
    info = {"qwen3:8b": ModelInfo(trained_context=40960, kv_bytes_per_token=144 * 1024)}
    card = ProviderView("a", GIB32, residents=(
        Resident("qwen3:8b", 6000, 4096, NOW - 0.2, loading=True),), context_length=16384,
        models=info, disk_mib={"qwen3:8b": 5200})
    decision = place(call("qwen3:8b"), snapshot(card))
    assert decision.placement is None and decision.outcome == "wait", decision
    loaded = replace(card, residents=(Resident("qwen3:8b", 6000, 4096, NOW - 0.2),))
    decision = place(call("qwen3:8b"), snapshot(loaded))
    assert decision.placement is not None and decision.placement.kind == "warm"


def test_a_copy_still_loading_is_no_victim_for_another_model() -> None:
    loading = replace(gpu("a", GIB32), residents=(
        Resident("qwen3:14b", 12224, 4096, NOW - 0.2, loading=True),))
    decision = place(call("qwen3:32b"), snapshot(loading))
    assert decision.placement is None and decision.outcome == "wait", decision
    loaded = replace(loading, residents=(Resident("qwen3:14b", 12224, 4096, NOW - 0.2),))
    decision = place(call("qwen3:32b"), snapshot(loaded))
    assert decision.placement is not None and "qwen3:14b" in decision.placement.evicts


def test_a_card_without_a_vram_total_still_checks_slots_and_victims() -> None:
    card = gpu("a", None, ("qwen3:8b",))
    busy = ticket("a", "qwen3:8b")
    ok, why = ticket_budget_ok([busy], ticket("a", "qwen3:8b"), card, Policy(),
                               needs_free_slot=True)
    assert not ok and "slot" in why


PLACED = Placement("a", "qwen3:8b", "cold", 4, 6000, num_ctx=8192, context_length=8192)


@pytest.mark.parametrize(("outcome", "recorded"), [
    (CallOutcome(True, 1.0), "loaded"),
    (CallOutcome(True, 1.0, 9000, prompt_too_long=True), "loaded"),  # it was loaded to refuse
    (CallOutcome(False, 1.0, error="client disconnected", client_left=True, began=False),
     "abandoned"),  # the agent left during the load: Ollama aborts it, unless it just ended
    # its answer began, so the model was loaded; whether the copy outlived the failure (a
    # runner or an Ollama that died with the answer) is the next probe's to say
    (CallOutcome(False, 1.0, error="failed mid-stream"), "loaded"),
    (CallOutcome(False, 1.0, error="client disconnected", client_left=True), "loaded"),
    (CallOutcome(False, 1.0, error="HTTP 500: out of memory", began=False), "failed"),
    (CallOutcome(True, 1.0, error="HTTP 404: not found", began=False), "failed"),
])
def test_what_a_load_leaves_depends_on_how_its_call_ended(outcome: CallOutcome,
                                                          recorded: str) -> None:
    assert load_state(outcome) == recorded
    left = left_loaded(PLACED, NOW, load_state(outcome))
    assert (left is None) == (recorded == "failed")
    assert left is None or left.loading == (recorded == "abandoned")
    assert left is None or left.abandoned == (recorded == "abandoned")


ABANDONED = {"qwen3:8b": Residency(6000, 8192, NOW, loading=True, abandoned=True)}


def test_an_abandoned_load_counts_until_a_probe_past_its_grace() -> None:
    """Its memory counts (not joined) until a probe started ABANDONED_GRACE_S after it."""
    for probed_at in (NOW - 5, NOW + ABANDONED_GRACE_S / 2):
        merged = merge_residency(gpu("a", GIB32, probed_at=probed_at), ABANDONED)
        assert [(r.model, r.loading) for r in merged.residents] == [("qwen3:8b", True)]


def test_an_abandoned_load_a_later_probe_does_not_list_is_gone() -> None:
    """Ollama aborted it (llm/llama_server.go:1299-1301): no phantom for LOAD_GRACE_S."""
    later = gpu("a", GIB32, probed_at=NOW + ABANDONED_GRACE_S + 0.1)
    assert merge_residency(later, ABANDONED).residents == ()
    still_loading = {"qwen3:8b": replace(ABANDONED["qwen3:8b"], abandoned=False)}
    assert merge_residency(later, still_loading).residents  # a load not abandoned stays


def test_an_abandoned_load_that_finished_first_counts_as_the_probe_lists_it() -> None:
    """The load ended just before the agent left: Ollama keeps the copy, the probe lists it."""
    later = gpu("a", GIB32, ("qwen3:8b",), probed_at=NOW + ABANDONED_GRACE_S + 0.1)
    merged = merge_residency(later, ABANDONED)
    assert [(r.model, r.loading) for r in merged.residents] == [("qwen3:8b", False)]
    index = index_providers(snapshot(merged), DEFAULT_POLICY)["a"]
    assert index.is_warm("qwen3:8b") and index.resident_mib > 0


def test_a_load_again_of_a_model_whose_load_was_abandoned_counts_toward_the_model_limit(
        ) -> None:
    """Three models loaded and the 8b's load abandoned (not yet known to have ended): a load
    of the 8b again would be the fourth Ollama loads, and it would unload one itself
    (restart sweep seed 46, phi3:mini; OLLAMA_MAX_LOADED_MODELS 3). Counted loaded, the
    abandoned model let the claim and the decision skip the count."""
    card = merge_residency(gpu("a", 49152, ("qwen3:14b", "phi3:mini", "llama3.2:3b"),
                               max_loaded=3, probed_at=NOW - 1), ABANDONED)
    again = Ticket("t", "a", "qwen3:8b", 6000, NOW, NOW + 60, cold=True)
    assert ticket_budget_ok([], again, card, DEFAULT_POLICY) == (
        False, "qwen3:8b would be model 4 loaded here (OLLAMA_MAX_LOADED_MODELS 3)")
    index = index_providers(snapshot(card), DEFAULT_POLICY)["a"]
    assert index.models_over_limit("qwen3:8b") == 1
    evicting = replace(again, evicts={"phi3:mini": 3600})
    assert ticket_budget_ok([], evicting, card, DEFAULT_POLICY)[0]


def test_an_abandoned_load_is_stored_as_abandoned() -> None:
    tickets = TicketSet(residents=ABANDONED)
    assert decode_ticket_set("a", encode_ticket_set(tickets)).residents == ABANDONED


def test_a_load_not_seen_finished_counts_its_memory_but_is_not_joined() -> None:
    view = gpu("a", GIB32, probed_at=NOW)
    merged = merge_residency(view, {"qwen3:8b": Residency(6000, 8192, NOW - 5, loading=True)})
    assert [(r.model, r.loading) for r in merged.residents] == [("qwen3:8b", True)]
    index = index_providers(snapshot(merged), DEFAULT_POLICY)["a"]
    assert not index.is_warm("qwen3:8b") and index.resident_mib == 6000


def test_a_copy_asked_to_unload_stays_leaving_while_probes_list_it() -> None:
    view = gpu("a", GIB32, ("qwen3:8b",), probed_at=NOW)
    old = {"qwen3:8b": Residency(6000, 0, NOW - 30, leaving=True)}  # older than the probe
    merged = merge_residency(view, old)
    assert merged.residents[0].leaving
    assert not merge_residency(gpu("a", GIB32, probed_at=NOW), old).residents  # seen gone


def test_a_copy_recorded_at_its_requested_context_is_the_probed_one() -> None:
    """0.30+ lists phi3 (trained for 4096) at 4096 where the call asked for 8192."""
    view = gpu("a", GIB32, ("phi3:mini",), resident_ctx=4096, probed_at=NOW,
               models={"phi3:mini": ModelInfo(trained_context=4096)})
    merged = merge_residency(view, {"phi3:mini": Residency(9999, 8192, NOW + 1)})
    assert merged.residents[0].footprint_mib == 3600  # the probe's measured figure stays
    assert merged.residents[0].expires_at == math.inf


@pytest.mark.parametrize(("version", "context"), [
    ("0.12.6", 4096), ("0.15.4", 4096), ("0.15.5", 16384), ("0.33.0", 16384)])
def test_a_copy_reloaded_since_the_probe_at_another_ask_is_the_recorded_one(
        version: str, context: int) -> None:
    """phi3:mini (trained 4096) listed asked 16384, then reloaded for an OpenAI call asking
    4096: before 0.15.5 Ollama lists and compares the asks, so the copy is the recorded one
    and a call sent with 16384 would reload it again; from 0.15.5 the listing is capped, and
    both asks are the one copy as listed."""
    view = gpu("a", GIB32, ("phi3:mini",), resident_ctx=16384, probed_at=NOW, version=version,
               models={"phi3:mini": ModelInfo(trained_context=4096)})
    merged = merge_residency(view, {"phi3:mini": Residency(3916, 4096, NOW + 1)})
    assert merged.residents[0].context_length == context


def test_every_placed_call_is_sent_without_the_options_that_reload() -> None:
    route = Attempt("p", OllamaClient("http://x"), "qwen3:8b", "cold")  # no num_ctx known
    body = {"model": "x", "prompt": "hi", "shift": False,
            "options": {"num_batch": 1024, "num_ctx": 4096, "seed": 1}}
    assert orjson.loads(payload_for(route, body))["options"] == {"num_ctx": 4096, "seed": 1}


FILE = ModelInfo(weights="sha256-" + "ab" * 32)  # phi3:mini, and phi3-helper FROM it


def _one_file(*listed: str) -> ProviderView:
    """A card whose probe at NOW lists `listed`, phi3:mini and phi3-helper one weights file."""
    return replace(gpu("a", GIB24), probed_at=NOW, residents=tuple(
        Resident(m, 3600, 4096) for m in listed), models={
            "phi3:mini": FILE, "phi3-helper:latest": FILE, "qwen3:8b": ModelInfo()})


@pytest.mark.parametrize(("records", "expected"), [
    # unloaded under the other name since the probe: the one copy is gone
    ({"phi3-helper:latest": Residency(0, 0, NOW + 1)}, []),
    # asked to unload under the other name: the one copy is leaving
    ({"phi3-helper:latest": Residency(3600, 4096, NOW - 1, leaving=True)},
     [("phi3:mini", True)]),
    # unloaded before the probe, which lists it again: loaded since
    ({"phi3-helper:latest": Residency(0, 0, NOW - 1)}, [("phi3:mini", False)]),
    # asked to unload before a load of it was recorded: that load is the copy listed
    ({"phi3-helper:latest": Residency(3600, 4096, NOW - 2, leaving=True),
      "phi3:mini": Residency(3600, 4096, NOW - 1)}, [("phi3:mini", False)]),
])
def test_a_copy_leaves_under_every_name_of_its_weights_file(
        records: dict[str, Residency], expected: list[tuple[str, bool]]) -> None:
    """Two calls of models of one file raced to load it: Ollama lists it under the first's
    name, the other recorded it under its own; an unload by either name takes the copy."""
    merged = merge_residency(_one_file("phi3:mini"), records)
    assert [(r.model, r.leaving) for r in merged.residents] == expected


# `_by_weights`: what a sibling's record may and may not do to the copy listed.
@pytest.mark.parametrize(("records", "expected"), [
    # loaded again under the listed name after the other name's unload: that load counts
    ({"phi3-helper:latest": Residency(0, 0, NOW + 1),
      "phi3:mini": Residency(3600, 4096, NOW + 2)}, [("phi3:mini", False)]),
    # reloaded at another context under the listed name after the other's leave was asked
    ({"phi3-helper:latest": Residency(3600, 4096, NOW - 5, leaving=True),
      "phi3:mini": Residency(5000, 8192, NOW - 1)}, [("phi3:mini", False)]),
    # asked to leave under the other name too long ago: loaded again (LEAVING_MAX_S)
    ({"phi3-helper:latest": Residency(3600, 4096, NOW - LEAVING_MAX_S - 1, leaving=True)},
     [("phi3:mini", False)]),
    # unloaded under the other name before the probe, which lists an outside client's load
    ({"phi3-helper:latest": Residency(0, 0, NOW - 0.001)}, [("phi3:mini", False)]),
    # loaded under a third name after the other's unload: that one is the copy now
    ({"phi3-helper:latest": Residency(0, 0, NOW + 1),
      "phi3-chat:latest": Residency(3600, 4096, NOW + 2)}, [("phi3-chat:latest", False)]),
    # loaded under the other name since the probe (at other options: a reload): the copy
    ({"phi3-helper:latest": Residency(3600, 8192, NOW + 1)}, [("phi3-helper:latest", False)]),
    ({"phi3-helper:latest": Residency(3600, 8192, NOW + 1),
      "phi3:mini": Residency(3600, 4096, NOW + 2)}, [("phi3:mini", False)]),
    ({"phi3-helper:latest": Residency(3600, 8192, NOW + 2),
      "phi3-chat:latest": Residency(3600, 4096, NOW + 1)}, [("phi3-helper:latest", False)]),
    # loaded under the other name before the probe, which lists the copy under this one
    ({"phi3-helper:latest": Residency(3600, 8192, NOW - 1)}, [("phi3:mini", False)]),
    # another file's unload, or one whose file is unknown here, is no sign of this copy
    ({"qwen3:8b": Residency(0, 0, NOW + 1), "phi3-x:latest": Residency(0, 0, NOW + 1)},
     [("phi3:mini", False)]),
])
def test_a_sibling_record_marks_only_the_copy_it_took(
        records: dict[str, Residency], expected: list[tuple[str, bool]]) -> None:
    view = _one_file("phi3:mini")
    view = replace(view, models={**view.models, "phi3-chat:latest": FILE})
    merged = merge_residency(view, records)
    assert [(r.model, r.leaving) for r in merged.residents] == expected


_NAMES = ("phi3:mini", "phi3-helper:latest", "phi3-chat:latest")


@given(st.dictionaries(st.sampled_from(_NAMES), st.tuples(
    st.floats(-2 * LEAVING_MAX_S, 10), st.sampled_from(("loaded", "leaving", "gone"))),
    max_size=3), st.floats(0.001, 10))
def test_a_load_recorded_under_the_listed_name_last_is_never_taken_away(
        others: dict[str, tuple[float, str]], after: float) -> None:
    """Whatever the other names of its file recorded, a load of the listed copy recorded
    after all of them leaves it counted, not leaving."""
    def record(at: float, kind: str) -> Residency:
        return Residency(0, 0, NOW + at) if kind == "gone" else \
            Residency(3600, 4096, NOW + at, leaving=kind == "leaving")
    records = {m: record(*v) for m, v in others.items() if m != "phi3:mini"}
    last = max((r.at for r in records.values()), default=NOW - 1)
    records["phi3:mini"] = Residency(3600, 4096, last + after)
    view = _one_file("phi3:mini")
    view = replace(view, models={**view.models, "phi3-chat:latest": FILE})
    merged = merge_residency(view, records)
    assert ("phi3:mini", False) in [(r.model, r.leaving) for r in merged.residents]
