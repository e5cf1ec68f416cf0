"""Each of a sidecar's waiting calls decides again on every change, each on a snapshot of its
own. What those snapshots share is built once: the cards' views and tickets while nothing of
them changed, and the core's indexes of them while no ticket expires and no idle copy's
keep-alive runs out. A decision on what is kept is the decision worked out afresh."""

from __future__ import annotations

import copy
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.adapters.memory_kv import MemoryStore
from proxy.core.lengths import NO_LENGTHS
from proxy.core.load_times import LoadTimes
from proxy.core.occupancy import indexes_for
from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.sizing import forget_fleets
from proxy.core.tickets import TicketSet
from proxy.core.types import ModelDemand, ProviderView, Resident, Ticket
from proxy.ports import PROVIDER_STATE, PROVIDER_TICKETS
from proxy.service.codec import ProviderState, encode_ticket_set
from proxy.service.snapshot import StateView
from proxy.service.tickets import TicketBook
from proxy.settings import ProviderConfig
from tests.unit.builders import NOW, call, gpu, snapshot, ticket

# A ticket expires at NOW + 55; an idle copy's keep-alive at NOW + 30 (gone from NOW + 29,
# the margin); the other copy's is far off.
EXPIRES = NOW + 55


def fleet() -> tuple[ProviderView, ...]:
    return (gpu("g0", residents=("qwen3:8b",), parallel=2),
            replace(gpu("g1", residents=("qwen3:14b", "phi3:mini"), parallel=1),
                    residents=(Resident("phi3:mini", 3600, expires_at=NOW + 30),
                               Resident("qwen3:14b", 12224))))


def tickets() -> tuple[Ticket, ...]:
    return (ticket("g0", "qwen3:8b", ttl=55), ticket("g0", "qwen3:8b", ttl=55),
            ticket("g1", "qwen3:14b", ttl=55))


def test_a_snapshot_of_the_same_cards_and_tickets_keeps_the_indexes_until_a_moment() -> None:
    first = snapshot(*fleet(), tickets=tickets())
    indexes = indexes_for(first, DEFAULT_POLICY)
    waiter = replace(first, now=NOW + 20, demand={"qwen3:8b": ModelDemand(waiters=3)})
    assert indexes_for(waiter, DEFAULT_POLICY) is indexes
    expired = replace(first, now=NOW + 29.5)  # phi3's keep-alive within the margin
    assert indexes_for(expired, DEFAULT_POLICY) is not indexes
    assert "phi3:mini" not in indexes_for(expired, DEFAULT_POLICY)["g1"].residents
    rebuilt = replace(first, providers=tuple(replace(v) for v in first.providers))
    assert indexes_for(rebuilt, DEFAULT_POLICY) is not indexes_for(expired, DEFAULT_POLICY)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 10.0, 28.9, 29.0, 29.5, 31.0, 54.9, 55.0,
                                           56.0, -1.0]),
                          st.sampled_from(["qwen3:8b", "qwen3:14b", "phi3:mini"]),
                          st.integers(0, 3)), min_size=1, max_size=6))
def test_a_decision_on_kept_indexes_is_the_decision_worked_out_afresh(
        steps: list[tuple[float, str, int]]) -> None:
    first = snapshot(*fleet(), tickets=tickets())
    place(call("qwen3:8b"), first)
    for later, model, waiting in steps:
        waiter = replace(first, now=NOW + later,
                         demand={model: ModelDemand(waiters=waiting,
                                                    turns=(NOW,) * waiting)})
        spec = call(model, "qwen3:8b", tolerance=50)
        kept = place(spec, waiter)
        forget_fleets()
        assert kept == place(spec, copy.deepcopy(waiter))


def config(name: str) -> ProviderConfig:
    return ProviderConfig(name=name, endpoint=f"http://{name}:11434", totalVramMiB=24563,
                          maxParallel=2)


def state(name: str, at: float) -> ProviderState:
    return ProviderState(name, f"http://{name}:11434", True, at, 24563, 8192, 2,
                         loaded_mib={"qwen3:8b": 6000}, loaded_ctx={"qwen3:8b": 16384},
                         available_mib={"qwen3:8b": 5200})


def test_a_view_is_built_again_only_when_its_card_its_tickets_or_the_time_moves() -> None:
    store = MemoryStore()
    book = TicketBook(store, DEFAULT_POLICY)
    configs = [config("g0"), config("g1")]
    view = StateView(store, configs, {}, 15.0, book)
    for c in configs:
        store._write(PROVIDER_STATE, c.name, state(c.name, NOW).encode())
    held = Ticket("t1", "g0", "qwen3:8b", 512, NOW, NOW + 5)
    store._write(PROVIDER_TICKETS, "g0", encode_ticket_set(TicketSet({"t1": held})))

    def snap(now: float, extra: tuple[Ticket, ...] = ()) -> tuple[
            tuple[ProviderView, ...], tuple[Ticket, ...]]:
        s = view.snapshot(now, {}, {}, LoadTimes(), extra, NO_LENGTHS)
        return s.providers, s.tickets

    providers, tickets_then = snap(NOW + 1)
    assert snap(NOW + 2) == (providers, tickets_then)
    assert snap(NOW + 2)[0] is providers and snap(NOW + 2)[1] is tickets_then
    own = Ticket("t2", "g1", "qwen3:8b", 512, NOW, NOW + 60)
    assert snap(NOW + 2, (own,))[1] == (own, held)
    assert snap(NOW + 2, (own,))[0] is providers
    # The ticket expires: the card's view and the tickets are built again, without it
    later, tickets_later = snap(NOW + 6)
    assert tickets_later == () and later is not providers
    assert later[1] is providers[1]  # the other card's view is kept
    # Another sidecar's write to the card's ticket set
    store._write(PROVIDER_TICKETS, "g1", encode_ticket_set(TicketSet({"t3": replace(
        held, ticket_id="t3", provider="g1", expires_at=NOW + 60)})))
    assert [t.ticket_id for t in snap(NOW + 7)[1]] == ["t3"]
    # The card's state goes stale: its view is no longer ready
    assert not snap(NOW + 16)[0][0].ready
    assert snap(NOW + 16)[0] == tuple(view.provider_view(c, NOW + 16) for c in configs)
