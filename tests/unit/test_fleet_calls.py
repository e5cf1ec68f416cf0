"""The fleet's recent calls as a page merges them: each record once, the newest kept within
the ring's bound, a push after unheard records asks for a gather, texts cut on the wire."""

from __future__ import annotations

from proxy.observability.recent import RECENT, CallRecord, RecentCalls
from proxy.service.fleet_calls import MAX_TEXT, Batch, FleetCalls, decode, encode


def ring_of(calls: int) -> RecentCalls:
    recent = RecentCalls()
    for n in range(calls):
        recent.add_call(f"m{n}", "a", "warm", (), 0, 0.1, True, None)
    return recent


def whole(recent: RecentCalls, instance: str = "i1", sidecar: str = "ns/one") -> Batch:
    return Batch(instance, sidecar, None, recent.version, tuple(recent.calls),
                 tuple(recent.refusals))


def test_a_record_heard_twice_is_kept_once() -> None:
    recent = ring_of(2)
    fleet = FleetCalls()
    assert not fleet.merge(whole(recent))
    calls, _ = recent.since(1)
    assert not fleet.merge(Batch("i1", "ns/one", 1, 2, tuple(calls), ()))  # overlaps
    assert sorted(c.model for _, c in fleet.calls.values()) == ["m0", "m1"]
    assert fleet.heard == {"i1": ("ns/one", 2)}


def test_a_push_after_unheard_records_asks_for_a_gather() -> None:
    recent = ring_of(5)
    fleet = FleetCalls()
    calls, _ = recent.since(4)
    assert fleet.merge(Batch("i1", "ns/one", 4, 5, tuple(calls), ()))  # 1-4 never heard
    assert not fleet.merge(Batch("i2", "ns/two", 0, 1, tuple(calls), ()))  # a fresh ring


def test_the_newest_records_across_sidecars_are_kept_within_the_bound() -> None:
    fleet = FleetCalls()
    for instance in ("i1", "i2", "i3"):
        fleet.merge(whole(ring_of(RECENT), instance))
    assert len(fleet.calls) == RECENT
    newest = max(c.at for _, c in fleet.calls.values())
    assert any(c.at == newest for _, c in fleet.calls.values())
    assert {i for i, _ in fleet.calls} <= {"i1", "i2", "i3"} and len(fleet.heard) == 3


def test_sidecars_heard_over_a_long_run_are_remembered_within_a_bound() -> None:
    """Each restart is a new instance: a page open for weeks hears thousands."""
    fleet = FleetCalls()
    ring = ring_of(1)
    for n in range(3000):
        fleet.merge(whole(ring, f"i{n}", f"ns/s{n}"))
        fleet.merge(whole(ring, "i-steady", "ns/steady"))
    assert len(fleet.heard) <= 1024
    assert "i-steady" in fleet.heard and "i2999" in fleet.heard and "i0" not in fleet.heard


def test_the_wire_round_trips_and_cuts_long_texts() -> None:
    recent = RecentCalls()
    recent.add_call("m", "a", "evict", ("old:1b",), 12, 1.5, False, "x" * 5000)
    recent.add_refusal(None, "gpu-busy", "y" * 5000)
    batch = decode(encode(whole(recent)))
    (call,), (refusal,) = batch.calls, batch.refusals
    assert call == CallRecord(call.at, "m", "a", "evict", ("old:1b",), 12, 1.5, False,
                              "x" * MAX_TEXT, 1)
    assert refusal.model is None and refusal.message == "y" * MAX_TEXT and refusal.seq == 2
    assert (batch.after, batch.version, batch.sidecar) == (None, 2, "ns/one")
