"""Invariants of place() over random fleets (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.context import fits
from proxy.core.occupancy import index_providers
from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import (
    CallSpec,
    Candidate,
    Circuit,
    ProviderHealth,
    ProviderView,
    Resident,
    Snapshot,
    Ticket,
)
from tests.unit.builders import SIZES

MODELS = sorted(SIZES)
NOW = 1000.0


@st.composite
def providers(draw: st.DrawFn) -> tuple[ProviderView, ...]:
    count = draw(st.integers(1, 5))
    out = []
    for i in range(count):
        total = draw(st.sampled_from([None, 8192, 16376, 24563, 32605, 49152]))
        residents: list[Resident] = []
        used = 0
        for model in draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=3)):
            if total is None or used + SIZES[model] <= total:
                residents.append(Resident(model, SIZES[model],
                                          draw(st.sampled_from([0, 4096, 32768]))))
                used += SIZES[model]
        out.append(ProviderView(
            name=f"p{i}", total_vram_mib=total, ready=draw(st.booleans()) or i == 0,
            residents=tuple(residents), context_length=draw(st.sampled_from([0, 2048, 8192])),
            max_parallel=draw(st.integers(1, 3)),
            observed={m: {0: mib} for m, mib in SIZES.items()}))
    return tuple(out)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    views = draw(providers())
    tickets = []
    for n in range(draw(st.integers(0, 6))):
        view = draw(st.sampled_from(views))
        model = draw(st.sampled_from(MODELS))
        resident = [r.model for r in view.residents if r.model != model]
        evicts = {m: SIZES[m] for m in draw(st.lists(st.sampled_from(resident), unique=True,
                                                      max_size=1))} if resident else {}
        cold = draw(st.booleans())
        tickets.append(Ticket(f"t{n}", view.name, model, SIZES[model] if cold else 512,
                              NOW - draw(st.floats(0, 50)), NOW + 60, cold=cold,
                              evicts=evicts if cold else {}))
    health = {v.name: ProviderHealth(draw(st.sampled_from(list(Circuit))),
                                     draw(st.sampled_from([None, 5.0, 30.0])))
              for v in views}
    return Snapshot(NOW, views, tuple(tickets), {}, health)


@st.composite
def calls(draw: st.DrawFn) -> CallSpec:
    models = draw(st.lists(st.sampled_from(MODELS), unique=True, min_size=1, max_size=3))
    scores = sorted(draw(st.lists(st.integers(0, 100), min_size=len(models),
                                  max_size=len(models))), reverse=True)
    return CallSpec(tuple(Candidate(m, s) for m, s in zip(models, scores, strict=True)),
                    prompt_tokens=draw(st.integers(0, 10000)),
                    tolerance=draw(st.sampled_from([0, 10, 30])))


@settings(max_examples=400, deadline=None)
@given(snapshots(), calls())
def test_placement_invariants(snap: Snapshot, call: CallSpec) -> None:
    decision = place(call, snap)
    assert decision == place(call, snap)  # deterministic
    placement = decision.placement
    if placement is None:
        assert decision.outcome != "placed"
        return
    index = index_providers(snap, DEFAULT_POLICY)[placement.provider]
    view = index.view
    # never an infeasible provider
    assert view.ready
    assert snap.health[view.name].circuit is not Circuit.OPEN
    # never a provider whose context cannot hold the prompt
    assert fits(call.prompt_tokens, placement.context_length)
    assert placement.model in {c.model for c in call.candidates}
    if placement.kind == "warm":
        assert index.is_warm(placement.model)
    if placement.kind == "cold" and index.usable_mib is not None:
        free = index.free_mib()
        assert free is not None and SIZES[placement.model] <= free  # never overcommit
    if placement.kind == "evict":
        busy = set(index.calls_by_model)
        freed = 0
        for victim, mib in placement.evicts.items():
            assert victim in index.residents
            assert victim not in busy  # never a victim with in-flight work
            assert victim not in index.planned_victims  # nor one another ticket planned
            freed += mib
        free = index.free_mib()
        assert free is not None and SIZES[placement.model] <= free + freed
