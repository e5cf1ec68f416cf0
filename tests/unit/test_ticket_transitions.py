"""The ticket set's transitions (proxy.core.tickets), one row per case: what each adds or
refuses, and when it leaves the set as it was (the ticket book then writes nothing).

A 24 GiB card: 24563 MiB, reserve max(2048, 12 %) = 2947, so a load may use 21616 MiB; a
32 GiB card: 32605 - 3912 = 28693 MiB.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from proxy.core import tickets as transition
from proxy.core.occupancy import copy_sharers
from proxy.core.policy import Policy
from proxy.core.tickets import (
    LOAD_GRACE_S,
    RESIDENCY_MAX_AGE_S,
    Admitted,
    Load,
    Refused,
    Residency,
    TicketSet,
)
from proxy.core.types import ModelInfo, ProviderView, Ticket
from tests.unit.builders import GIB24, GIB32, NOW, SIZES, gpu

TTL = 60.0
POLICY = Policy()


def held(ticket_id: str, model: str, *, cold: bool = False, expires_at: float = NOW + TTL,
         evicts: dict[str, int] | None = None) -> Ticket:
    """A ticket already in the set (started a little before now)."""
    return Ticket(ticket_id, "a", model, SIZES[model] if cold else 512, NOW - 5, expires_at,
                  cold=cold, evicts=evicts or {})


def new(model: str, *, cold: bool = False, evicts: dict[str, int] | None = None,
        context: int = 0) -> Ticket:
    """A ticket as the scheduler makes it, before the claim stamps its times."""
    return Ticket("new", "a", model, SIZES[model] if cold else 512, 0.0, 0.0, cold=cold,
                  evicts=evicts or {}, context=context)


def tickets(*held_tickets: Ticket, residents: dict[str, Residency] | None = None
            ) -> TicketSet:
    return TicketSet({t.ticket_id: t for t in held_tickets}, residents or {})


# -- claim ------------------------------------------------------------------------------------

def test_a_claim_that_fits_is_added_stamped_now_and_held_for_the_ttl() -> None:
    current = tickets(held("t1", "qwen3:8b"), residents={"phi3:mini": Residency(3600, 0, NOW)})
    card = gpu("a", GIB32, ("qwen3:8b",))
    out = transition.claim(current, new("qwen3:14b", cold=True), card, POLICY, TTL, NOW)
    assert isinstance(out, Admitted)
    added = out.tickets.tickets["new"]
    assert (added.started_at, added.expires_at) == (NOW, NOW + TTL)
    assert set(out.tickets.tickets) == {"t1", "new"}
    assert out.tickets.residents == current.residents
    # 14b 12224 + the 8b call's 512 claimed, of usable 32605 - 3912 less 8b 6000 and the
    # recorded phi3 3600:
    assert out.budget == "12736 MiB claimed of 19093 MiB"
    assert out.seen is not None and {r.model for r in out.seen.residents} == {
        "qwen3:8b", "phi3:mini"}  # the recorded copy counts before any probe lists it


def test_a_claim_already_in_the_set_leaves_it_as_it_was() -> None:
    """A write whose answer was lost committed it: retried, nothing more to write."""
    current = tickets(held("new", "qwen3:8b"))
    out = transition.claim(current, new("qwen3:8b"), gpu("a", GIB24, ("qwen3:8b",)), POLICY,
                           TTL, NOW)
    assert isinstance(out, Admitted) and out.tickets is current and out.seen is None


@pytest.mark.parametrize(("residents", "set_", "ticket", "free_slot", "reason"), [
    # 27000 MiB on a card that lets a load use 21616:
    ((), tickets(), new("qwen3:32b", cold=True), False, "27000 MiB would exceed 21616 MiB"),
    # one slot, taken, and the decision counted on a free one:
    (("qwen3:8b",), tickets(held("t1", "qwen3:8b")), new("qwen3:8b"), True,
     "no free slot left for qwen3:8b"),
    (("qwen3:8b",), tickets(held("t1", "qwen3:8b")), new("qwen3:8b"), False, None),
    # a second load of a model already being loaded here:
    ((), tickets(held("t1", "qwen3:8b", cold=True)), new("qwen3:8b", cold=True), False,
     "qwen3:8b is already being loaded here"),
    # joining a load at another num_ctx than the one it was decided on (a load of the
    # joiner's own sidecar, refused since): Ollama would reload the copy for it
    ((), tickets(replace(held("t1", "qwen3:8b", cold=True), context=2048)),
     new("qwen3:8b", context=4096), False,
     "qwen3:8b is being loaded here with num_ctx 2048, not 4096"),
    ((), tickets(replace(held("t1", "qwen3:8b", cold=True), context=2048)),
     new("qwen3:8b", context=2048), False, None),
    ((), tickets(held("t1", "qwen3:8b", cold=True)), new("qwen3:8b", context=4096), False,
     None),  # (a load's context not known: as before)
    # joining a copy that is neither there nor on its way:
    ((), tickets(), new("qwen3:8b"), False, "qwen3:8b is neither loaded nor being loaded here"),
    # joining a copy another claim plans to unload:
    (("qwen3:8b",), tickets(held("t1", "qwen3:14b", cold=True, evicts={"qwen3:8b": 6000})),
     new("qwen3:8b"), False, "qwen3:8b is planned for eviction here"),
    # planning to unload a copy a call is using:
    (("phi3:mini",), tickets(held("t1", "phi3:mini")),
     new("qwen3:14b", cold=True, evicts={"phi3:mini": 3600}), False,
     "planned victim phi3:mini has in-flight work"),
    # a copy a call is on its way to join left (its keep-alive ran out): Ollama loads it
    # again for that call, so no other load is claimed beside it until that is counted
    ((), tickets(held("t1", "phi3:mini")), new("qwen3:8b", cold=True), False,
     "phi3:mini left while a call was on its way to it: Ollama loads it again, unclaimed"),
    ((), tickets(held("t1", "phi3:mini")), new("phi3:mini", cold=True), False, None),
    # ...a load of that model joins the copy Ollama loads, unless at another context: then
    # Ollama reloads that copy for it once the call ends
    ((), tickets(replace(held("t1", "phi3:mini"), context=4096)),
     new("phi3:mini", cold=True, context=2048), False,
     "phi3:mini left while a call was on its way to it: Ollama loads it again, unclaimed"),
    ((), tickets(replace(held("t1", "phi3:mini"), context=4096)),
     new("phi3:mini", cold=True, context=4096), False, None),
    ((), tickets(replace(held("t1", "phi3:mini"), plan=True)), new("qwen3:8b", cold=True),
     False, None),
    (("phi3:mini",), tickets(held("t1", "phi3:mini")), new("qwen3:8b", cold=True), False,
     None),
    # a copy asked to unload (recorded in the set) is not loaded again over it:
    (("qwen3:8b",), tickets(residents={"qwen3:8b": Residency(6000, 0, NOW - 1, leaving=True)}),
     new("qwen3:8b", cold=True), False, "qwen3:8b is being unloaded here"),
])
def test_a_claim_is_refused_with_the_reason_it_does_not_fit(
        residents: tuple[str, ...], set_: TicketSet, ticket: Ticket, free_slot: bool,
        reason: str | None) -> None:
    out = transition.claim(set_, ticket, gpu("a", GIB24, residents), POLICY, TTL, NOW,
                           needs_free_slot=free_slot)
    if reason is None:
        assert isinstance(out, Admitted) and "new" in out.tickets.tickets
    else:
        assert out == Refused(reason)


def test_an_expired_ticket_no_longer_takes_budget() -> None:
    big = held("t1", "qwen3:14b", cold=True, expires_at=NOW)  # ran out this instant
    current = tickets(big)
    card = gpu("a", 16376)  # usable 16376 - 2048 = 14328: the 14b or the 8b, not both
    before = transition.claim(current, new("qwen3:8b", cold=True), card, POLICY, TTL, NOW - 1)
    assert before == Refused("18224 MiB would exceed 14328 MiB")
    after = transition.claim(current, new("qwen3:8b", cold=True), card, POLICY, TTL, NOW)
    assert isinstance(after, Admitted) and after.budget == "6000 MiB claimed of 14328 MiB"


def test_a_copy_a_call_recorded_loaded_after_the_probe_can_be_joined() -> None:
    card = replace(gpu("a", GIB24), probed_at=NOW - 10)  # the probe saw no 8b
    unknown = transition.claim(tickets(), new("qwen3:8b"), card, POLICY, TTL, NOW)
    assert unknown == Refused("qwen3:8b is neither loaded nor being loaded here")
    recorded = tickets(residents={"qwen3:8b": Residency(6000, 8192, NOW - 1)})
    assert isinstance(transition.claim(recorded, new("qwen3:8b"), card, POLICY, TTL, NOW),
                      Admitted)


# -- a cold claim's load, counted once its holder died ----------------------------------------

def test_a_cold_claim_records_its_load_beside_the_ticket_and_a_join_records_none() -> None:
    card = replace(gpu("a", GIB24, ("qwen3:8b",)), probed_at=NOW - 30)
    cold = transition.claim(tickets(), new("qwen3:14b", cold=True), card, POLICY, TTL, NOW)
    assert isinstance(cold, Admitted)
    assert cold.tickets.loads == {"new": Load("qwen3:14b", 12224, 0, NOW)}
    assert cold.tickets.residents == {}  # no resident entry: nothing there to replace
    join = transition.claim(tickets(), new("qwen3:8b"), card, POLICY, TTL, NOW)
    assert isinstance(join, Admitted) and join.tickets.loads == {}


def test_a_live_ticket_counts_its_own_load_once() -> None:
    card = replace(gpu("a", GIB24), probed_at=NOW - 30)
    first = transition.claim(tickets(), new("qwen3:14b", cold=True), card, POLICY, TTL, NOW)
    assert isinstance(first, Admitted)
    second = transition.claim(first.tickets, replace(new("phi3:mini", cold=True),
                                                     ticket_id="next"), card, POLICY, TTL, NOW)
    # 14b 12224 (its ticket) + phi3 3600, of usable 21616: the recorded load not again
    assert isinstance(second, Admitted) and second.budget == "15824 MiB claimed of 21616 MiB"


def test_a_load_whose_holder_died_counts_once_its_ticket_expires() -> None:
    """The holder never released: its ticket expires, its load stays; the probe (before the
    load) does not list the copy. It counts as a copy loading: memory taken, nobody joins."""
    card = replace(gpu("a", 16376), probed_at=NOW - 30)  # usable 16376 - 2048 = 14328
    out = transition.claim(tickets(), new("qwen3:14b", cold=True), card, POLICY, TTL, NOW - 20)
    assert isinstance(out, Admitted)
    expired = out.tickets.live(NOW - 20 + TTL)
    assert expired.tickets == {} and set(expired.loads) == {"new"}
    seen = transition.merge_recorded(card, expired)
    assert [(r.model, r.footprint_mib, r.loading) for r in seen.residents] == [
        ("qwen3:14b", 12224, True)]
    # the 8b's 6000 > 14328 - 14b 12224 = 2104 left: not loaded beside it
    after = transition.claim(expired, replace(new("qwen3:8b", cold=True), ticket_id="next"),
                             card, POLICY, TTL, NOW - 20 + TTL)
    assert after == Refused("6000 MiB would exceed 2104 MiB")


def test_a_dead_load_gives_way_to_a_newer_probe_listing_it_or_to_its_grace() -> None:
    dead = TicketSet(loads={"gone": Load("qwen3:14b", 12224, 0, NOW - 30)})
    listed = replace(gpu("a", GIB24, ("qwen3:14b",), resident_ctx=4096), probed_at=NOW - 10)
    seen = transition.merge_recorded(listed, dead)
    assert [(r.model, r.context_length, r.loading) for r in seen.residents] == [
        ("qwen3:14b", 4096, False)]  # the probe's copy, joinable
    unlisted = replace(gpu("a", GIB24), probed_at=NOW - 10)  # probed before Ollama lists it
    assert [r.model for r in transition.merge_recorded(unlisted, dead).residents] == [
        "qwen3:14b"]
    assert dead.live(NOW - 30 + LOAD_GRACE_S).loads == {}  # 2 minutes after the claim


def test_a_failed_cold_claim_does_not_revive_a_copy_recorded_unloaded() -> None:
    """The probe lists the 8b; a call unloaded it since; a claim loads it again and the load
    fails (its release records nothing). The older probe's copy is no warm copy to join."""
    card = replace(gpu("a", GIB24, ("qwen3:8b",)), probed_at=NOW - 30)
    unloaded = tickets(residents={"qwen3:8b": Residency(0, 0, NOW - 20)})
    out = transition.claim(unloaded, new("qwen3:8b", cold=True), card, POLICY, TTL, NOW - 10)
    assert isinstance(out, Admitted)
    released = transition.without(out.tickets, {"new"})
    assert released.loads == {} and released.residents == unloaded.residents
    assert transition.merge_recorded(card, released).residents == ()
    join = transition.claim(released, replace(new("qwen3:8b"), ticket_id="join"), card,
                            POLICY, TTL, NOW)
    assert join == Refused("qwen3:8b is neither loaded nor being loaded here")


def test_a_reload_whose_holder_dies_stays_counted() -> None:
    """The probe lists the 14b at 4096; a claim reloads it at 16384 (unloading the old copy
    first, recorded unloaded), and its holder dies: the reload still counts."""
    card = replace(gpu("a", GIB24, ("qwen3:14b",), resident_ctx=4096), probed_at=NOW - 30)
    reload = replace(new("qwen3:14b", cold=True, evicts={"qwen3:14b": 12224}), context=16384)
    out = transition.claim(tickets(), reload, card, POLICY, TTL, NOW - 20)
    assert isinstance(out, Admitted)
    made_room = transition.mark_unloaded(out.tickets, {"qwen3:14b": NOW - 19}, NOW - 19)
    assert made_room.loads == out.tickets.loads
    seen = transition.merge_recorded(card, made_room.live(NOW - 20 + TTL))
    assert [(r.model, r.footprint_mib, r.context_length, r.loading)
            for r in seen.residents] == [("qwen3:14b", 12224, 16384, True)]
    # a probe after the claim still listing the old copy (not gone yet) is no sign of it
    old_listed = replace(card, probed_at=NOW - 15)
    seen = transition.merge_recorded(old_listed, made_room.live(NOW - 20 + TTL))
    assert [(r.context_length, r.loading) for r in seen.residents] == [(16384, True)]


def test_a_release_written_after_its_ticket_expired_deletes_its_load() -> None:
    out = transition.claim(tickets(), new("qwen3:14b", cold=True), gpu("a"), POLICY, TTL, NOW)
    assert isinstance(out, Admitted)
    expired = out.tickets.live(NOW + TTL)
    assert transition.without(expired, {"new"}).loads == {}


# -- extend (renew) ---------------------------------------------------------------------------

def test_extend_holds_the_ticket_the_ttl_from_now_and_changes_nothing_else() -> None:
    current = tickets(held("t1", "qwen3:8b", expires_at=NOW + 5), held("t2", "phi3:mini"),
                      residents={"qwen3:8b": Residency(6000, 0, NOW)})
    out = transition.extend(current, "t1", TTL, NOW)
    assert isinstance(out, TicketSet)
    assert out.tickets["t1"] == replace(current.tickets["t1"], expires_at=NOW + TTL)
    assert out.tickets["t2"] is current.tickets["t2"]
    assert out.residents == current.residents


def test_extend_refuses_a_ticket_that_expired_first() -> None:
    """The book applies transitions to the live set: an expired ticket is not there."""
    current = tickets(held("t1", "qwen3:8b", expires_at=NOW - 0.1))
    assert transition.extend(current.live(NOW), "t1", TTL, NOW) == Refused(
        "ticket expired before it was renewed")
    assert transition.extend(tickets(), "t1", TTL, NOW) == Refused(
        "ticket expired before it was renewed")


# -- restore and renew: a held ticket back in a set that lacks it ------------------------------

def test_restore_puts_a_held_ticket_back_without_a_budget_check() -> None:
    """Claimed in-process while the store was away: its call runs, so the set takes it even
    where a claim would not fit any more."""
    full = tickets(held("t1", "qwen3:32b", cold=True))
    back = held("mine", "qwen3:14b", cold=True, expires_at=NOW - 1)
    out = transition.restore(full, back, TTL, NOW)
    assert out.tickets["mine"] == replace(back, expires_at=NOW + TTL)
    assert out.tickets["t1"] is full.tickets["t1"]
    assert out.loads == {"mine": Load("qwen3:14b", SIZES["qwen3:14b"], 0, NOW - 5)}
    assert transition.restore(out, back, TTL, NOW + 1) is out  # there already: nothing


def test_a_restored_load_counts_once_where_its_claim_recorded_it_already() -> None:
    """Not renewed while the store was away, the ticket expired and its load stood in for
    it; put back, the ticket carries the load again, counted once: a second load is held
    to the memory the first leaves, not refused as if the first counted twice."""
    card = gpu("a", GIB24)  # 21616 MiB usable
    out = transition.claim(tickets(), new("qwen3:14b", cold=True), card, POLICY, TTL, NOW - 80)
    assert isinstance(out, Admitted)
    claimed = out.tickets.tickets["new"]
    expired = out.tickets.live(NOW)
    assert set(expired.tickets) == set() and set(expired.orphaned_loads()) == {"new"}
    restored = transition.restore(expired, claimed, TTL, NOW)
    assert restored.loads == out.tickets.loads and restored.orphaned_loads() == {}
    assert transition.merge_recorded(card, restored).residents == ()
    # 12224 of 21616 held: a load of the 9392 MiB left fits (counted twice, 12224 more
    # would be held and it would not), a MiB more does not
    fits = replace(new("qwen3:32b", cold=True), ticket_id="other", footprint_mib=9392)
    admitted = transition.claim(restored, fits, card, POLICY, TTL, NOW)
    assert isinstance(admitted, Admitted) and admitted.budget == "21616 MiB claimed of 21616 MiB"
    over = replace(fits, footprint_mib=9393)
    assert transition.claim(restored, over, card, POLICY, TTL, NOW) == Refused(
        "21617 MiB would exceed 21616 MiB")


def test_a_restored_load_past_its_grace_is_not_recorded_again() -> None:
    old = held("mine", "qwen3:14b", cold=True)
    out = transition.restore(tickets(), replace(old, started_at=NOW - LOAD_GRACE_S), TTL, NOW)
    assert set(out.tickets) == {"mine"} and out.loads == {}


def test_renew_extends_a_ticket_in_the_set_and_puts_back_one_it_lacks() -> None:
    current = tickets(held("t1", "qwen3:8b", expires_at=NOW + 5))
    assert transition.renew(current, current.tickets["t1"], TTL, NOW) == \
        transition.extend(current, "t1", TTL, NOW)
    lost = held("t2", "qwen3:8b", expires_at=NOW - 0.1)
    out = transition.renew(current.live(NOW), lost, TTL, NOW)
    assert out.tickets["t2"] == replace(lost, expires_at=NOW + TTL)
    assert out.loads == {}  # (a warm ticket records no load)


# -- release: the ticket leaves, what it left loaded is recorded -------------------------------

def test_without_drops_the_named_tickets_and_keeps_the_set_when_none_is_there() -> None:
    current = tickets(held("t1", "qwen3:8b"), held("t2", "phi3:mini"),
                      residents={"qwen3:8b": Residency(6000, 0, NOW)})
    out = transition.without(current, {"t1", "gone-already"})
    assert set(out.tickets) == {"t2"} and out.residents == current.residents
    assert transition.without(current, {"gone-already"}) is current
    assert transition.without(current, ()) is current


@pytest.mark.parametrize(("before", "recorded", "changes"), [
    ({}, Residency(6000, 8192, NOW), True),  # a copy left loaded
    ({}, Residency(0, 0, NOW), True),  # a copy unloaded
    ({"qwen3:8b": Residency(6000, 8192, NOW)}, Residency(6000, 8192, NOW), False),  # as known
    ({"qwen3:8b": Residency(6000, 8192, NOW - 1)}, Residency(6000, 8192, NOW), True),  # newer
    ({}, None, False),  # nothing to record
])
def test_record_residency_writes_only_what_is_new(
        before: dict[str, Residency], recorded: Residency | None, changes: bool) -> None:
    current = tickets(held("t1", "phi3:mini"), residents=before)
    out = transition.record_residency(current, "qwen3:8b", recorded)
    if not changes:
        assert out is current
    else:
        assert out.residents["qwen3:8b"] == recorded and out.tickets == current.tickets


# -- leaving: asked to unload, unless a call still uses the copy -------------------------------

def test_in_use_counts_live_tickets_only() -> None:
    current = tickets(held("t1", "qwen3:8b", expires_at=NOW), held("t2", "phi3:mini"))
    assert not transition.in_use(current, "qwen3:8b", NOW)  # expired this instant
    assert transition.in_use(current, "qwen3:8b", NOW - 1)
    assert transition.in_use(current, "phi3:mini", NOW)
    assert not transition.in_use(current, "qwen3:14b", NOW)


@pytest.mark.parametrize(("recorded", "mib", "counted"), [
    (None, 6000, Residency(6000, 0, NOW, leaving=True)),  # the caller's size
    (None, 0, Residency(1, 0, NOW, leaving=True)),  # never counted as gone
    (Residency(6200, 8192, NOW - 3), 6000, Residency(6200, 8192, NOW, leaving=True)),  # known
    (Residency(0, 0, NOW - 3), 6000, Residency(6000, 0, NOW, leaving=True)),  # was unloaded
])
def test_an_unused_copy_is_marked_leaving_at_its_known_size(
        recorded: Residency | None, mib: int, counted: Residency) -> None:
    current = tickets(held("t1", "phi3:mini"),
                      residents={"qwen3:8b": recorded} if recorded else {})
    out = transition.leave_unless_used(current, "qwen3:8b", mib, None, NOW)
    assert out.residents["qwen3:8b"] == counted and out.tickets == current.tickets


def test_a_copy_a_live_ticket_names_stays_and_what_the_caller_loaded_is_recorded() -> None:
    current = tickets(held("t1", "qwen3:8b"))
    assert transition.leave_unless_used(current, "qwen3:8b", 6000, None, NOW) is current
    loaded = Residency(6000, 8192, NOW)
    out = transition.leave_unless_used(current, "qwen3:8b", 6000, loaded, NOW)
    assert out.residents == {"qwen3:8b": loaded}
    # its only ticket expired: unused, so marked leaving
    expired = tickets(held("t1", "qwen3:8b", expires_at=NOW))
    left = transition.leave_unless_used(expired, "qwen3:8b", 6000, loaded, NOW)
    assert left.residents["qwen3:8b"].leaving


def test_an_unload_of_a_shared_copy_is_held_by_and_marks_every_name_on_it() -> None:
    """qwen3-plain's call ran on qwen3:8b's copy (one weights file, one runner): Ollama's
    unload by either name unloads that copy, so a ticket for either keeps it, and both are
    marked leaving with it. (A soak saw Ollama unload the copy for a keep_alive 0 while
    every view still counted qwen3:8b loaded, then evict it itself for the next load.)"""
    busy = tickets(held("t1", "qwen3:8b"))
    assert transition.leave_unless_used(busy, "qwen3-plain", 6000, None, NOW,
                                        ("qwen3:8b",)) is busy
    idle = tickets(held("t1", "phi3:mini"))
    out = transition.leave_unless_used(idle, "qwen3-plain", 6000, None, NOW, ("qwen3:8b",))
    assert out.residents["qwen3-plain"].leaving and out.residents["qwen3:8b"].leaving


def test_the_names_sharing_a_copy_are_those_of_its_file_runner_and_context() -> None:
    file = ModelInfo(weights="sha256-" + "ab" * 32)
    card = gpu("a", GIB24, ("qwen3:8b",), resident_ctx=4096,
               models={"qwen3:8b": file, "qwen3-plain": file,
                       "qwen3-lora": replace(file, runner="adapter=sha256-" + "cd" * 32)})
    assert copy_sharers(card, "qwen3-plain") == ("qwen3:8b",)
    assert copy_sharers(card, "qwen3-lora") == ()  # its own runner: a reload, not a join
    assert copy_sharers(card, "phi3:mini") == ()


def test_mark_leaving_marks_every_model_whatever_tickets_name_them() -> None:
    current = tickets(held("t1", "qwen3:8b"),
                      residents={"phi3:mini": Residency(3600, 4096, NOW - 2)})
    out = transition.mark_leaving(current, ("qwen3:8b", "phi3:mini"), NOW)
    assert out.residents == {"qwen3:8b": Residency(1, 0, NOW, leaving=True),
                             "phi3:mini": Residency(3600, 4096, NOW, leaving=True)}
    assert out.tickets == current.tickets



def test_a_copy_marked_leaving_keeps_what_its_runner_counts_beside_it() -> None:
    """Sweep seed 4071: phi3's runner loaded beside a 14b since gone; asked to unload, it is
    listed until its calls end, and Ollama may read the card's free memory through it
    meanwhile: a load beside it is planned for that reading, as before the mark."""
    current = tickets(residents={"phi3:mini": Residency(6220, 4096, NOW - 2, beside=11695)})
    out = transition.mark_leaving(current, ("phi3:mini",), NOW)
    assert out.residents["phi3:mini"] == Residency(6220, 4096, NOW, leaving=True, beside=11695)


def test_unmark_leaving_puts_back_what_the_mark_replaced_unless_marked_or_planned_since(
        ) -> None:
    loaded = Residency(3600, 4096, NOW - 20)
    current = tickets(held("mine", "qwen3:14b", cold=True, evicts={"phi3:mini": 3600,
                                                                   "qwen3:8b": 6000}),
                      residents={"phi3:mini": loaded})
    marked = transition.mark_leaving(current, ("phi3:mini", "qwen3:8b"), NOW)
    marks = {m: (marked.residents[m], current.residents.get(m))
             for m in ("phi3:mini", "qwen3:8b")}
    out = transition.unmark_leaving(marked, marks, NOW + 1, keeping="mine")
    assert out.residents == {"phi3:mini": loaded}  # (the 8b had no record: the probe's)
    # Another call plans to unload the 8b; phi3 was marked again since: both stay leaving.
    other = held("other", "llama3.2:3b", cold=True, evicts={"qwen3:8b": 6000})
    again = transition.mark_leaving(replace(marked, tickets={**marked.tickets, "other": other}),
                                    ("phi3:mini",), NOW + 0.5)
    assert transition.unmark_leaving(again, marks, NOW + 1, keeping="mine") is again

# -- gone: seen unloaded ----------------------------------------------------------------------

def test_mark_unloaded_records_each_model_gone_when_it_was_seen_gone() -> None:
    current = tickets(held("t1", "phi3:mini"),
                      residents={"qwen3:8b": Residency(6000, 0, NOW - 2, leaving=True)})
    out = transition.mark_unloaded(current, {"qwen3:8b": NOW - 1, "qwen3:14b": NOW + 5}, NOW)
    assert out.residents == {"qwen3:8b": Residency(0, 0, NOW - 1),
                             "qwen3:14b": Residency(0, 0, NOW)}  # (never later than written)
    assert all(r.gone for r in out.residents.values()) and out.tickets == current.tickets
    card = replace(gpu("a", GIB24, ("qwen3:8b",)), probed_at=NOW - 1.5)
    assert not transition.merge_residency(card, out.residents).residents  # before any probe


# -- the live set -----------------------------------------------------------------------------

def test_the_live_set_drops_expired_tickets_and_residency_a_probe_has_long_replaced() -> None:
    current = tickets(held("t1", "qwen3:8b", expires_at=NOW), held("t2", "phi3:mini"),
                      residents={"old": Residency(1, 0, NOW - RESIDENCY_MAX_AGE_S),
                                 "young": Residency(1, 0, NOW - RESIDENCY_MAX_AGE_S + 1)})
    live = current.live(NOW)
    assert set(live.tickets) == {"t2"} and set(live.residents) == {"young"}


def test_views_are_left_alone_when_nothing_was_recorded_after_the_probe() -> None:
    card: ProviderView = replace(gpu("a", GIB24, ("qwen3:8b",)), probed_at=NOW)
    assert transition.merge_residency(card, {}) is card
    assert transition.merge_residency(card, {"qwen3:8b": Residency(0, 0, NOW - 1)}) is card
