"""place() keeps facts between calls: each fleet's sizing (footprints, resolved contexts) while
its cards' sizing inputs stay equal, and the last snapshot's indexes. A decision made with
them kept must be the decision worked out afresh, however the fleet changed in between."""

from __future__ import annotations

import copy
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.placement import explain, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.sizing import _FIGURES_KEPT, Sizer, forget_fleets
from proxy.core.types import (
    CallSpec,
    Candidate,
    Decision,
    ModelDemand,
    ModelInfo,
    Placement,
    ProviderHealth,
    ProviderView,
    Resident,
    Snapshot,
    Ticket,
    Verdict,
)

MODELS = ["a:7b", "b:8b", "c:14b", "d:32b", "e:3b"]
DISK = {"a:7b": 4500, "b:8b": 5200, "c:14b": 9300, "d:32b": 19800, "e:3b": 2000}
INFOS = [ModelInfo(trained_context=32768, kv_bytes_per_token=64 * 1024,
                   estimate_kv_bytes_per_token=96 * 1024, family="llama"),
         ModelInfo(trained_context=8192, kv_bytes_per_token=160 * 1024,
                   estimate_kv_bytes_per_token=160 * 1024, family="qwen3",
                   modelfile_num_ctx=4096),
         ModelInfo(trained_context=16384, kv_bytes_per_token=96 * 1024,
                   estimate_kv_bytes_per_token=96 * 1024, family="qwen35"),  # 1 slot from 0.30
         ModelInfo(trained_context=4096)]  # no architecture: no KV arithmetic
NOW = 1000.0


@st.composite
def cards(draw: st.DrawFn, name: str) -> ProviderView:
    """A card with its own sizing inputs: what it has on disk, what /api/show said, the
    copies seen on it and its Ollama settings."""
    pulled = draw(st.lists(st.sampled_from(MODELS), unique=True, min_size=1))
    shown = draw(st.lists(st.sampled_from(pulled), unique=True))
    seen = draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=2))
    total = draw(st.sampled_from([None, 8192, 16376, 24563]))
    residents = []
    for model in draw(st.lists(st.sampled_from(pulled), unique=True, max_size=2)):
        residents.append(Resident(model, DISK[model] + draw(st.sampled_from([300, 1500])),
                                  draw(st.sampled_from([0, 4096, 8192])),
                                  expires_at=draw(st.sampled_from([NOW + 0.5, NOW + 300])),
                                  leaving=draw(st.booleans()) and draw(st.booleans())))
    return ProviderView(
        name, total, ready=draw(st.booleans()) or draw(st.booleans()),
        residents=tuple(residents), context_length=draw(st.sampled_from([0, 4096, 8192])),
        max_parallel=draw(st.integers(1, 4)), max_loaded=draw(st.sampled_from([0, 0, 2])),
        disk_mib={m: DISK[m] for m in pulled},
        models={m: draw(st.sampled_from(INFOS)) for m in shown},
        observed={m: {draw(st.sampled_from([0, 4096, 8192])): DISK[m] + 900} for m in seen},
        kv_cache_type=draw(st.sampled_from(["f16", "q8_0"])),
        version=draw(st.sampled_from(["", "0.29.0", "0.33.0"])))


@st.composite
def fleets(draw: st.DrawFn) -> Snapshot:
    names = draw(st.permutations(["g0", "g1", "g2", "g3"]))[:draw(st.integers(1, 4))]
    views = tuple(draw(cards(name)) for name in names)
    tickets = tuple(Ticket(f"t{i}", view.name, resident.model, 512, NOW - 5, NOW + 55)
                    for i, view in enumerate(views) for resident in view.residents[:1]
                    if draw(st.booleans()))
    demand = {m: ModelDemand(waiters=draw(st.integers(0, 1)), recent_use=1.0)
              for m in draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=2))}
    health = {v.name: ProviderHealth(latency_ema_s=draw(st.sampled_from([None, 8.0])))
              for v in views}
    return Snapshot(NOW, views, tickets, demand, health)


@st.composite
def calls(draw: st.DrawFn) -> CallSpec:
    models = draw(st.lists(st.sampled_from(MODELS), unique=True, min_size=1, max_size=3))
    return CallSpec(tuple(Candidate(m, 100 - 5 * k, draw(st.sampled_from([None, 7000])))
                          for k, m in enumerate(models)),
                    prompt_tokens=draw(st.sampled_from([100, 3000, 9000])),
                    num_ctx=draw(st.sampled_from([0, 0, 8192])),
                    pins_context=draw(st.booleans()), tolerance=10)


@st.composite
def changes(draw: st.DrawFn, views: tuple[ProviderView, ...]) -> dict[str, ProviderView]:
    """A probe of one card: what it has seen, what /api/show said, what it has pulled, or
    one of its settings changed (in new mappings, as a probe decodes them); or nothing."""
    view = draw(st.sampled_from(views))
    model = draw(st.sampled_from(MODELS))
    kind = draw(st.sampled_from(["none", "seen", "shown", "pulled", "cache", "slots",
                                 "context", "memory", "version"]))
    if kind == "seen":
        view = replace(view, observed={**view.observed, model: {
            draw(st.sampled_from([0, 4096, 8192])): DISK[model] + 1700}})
    elif kind == "shown":
        view = replace(view, models={**view.models, model: draw(st.sampled_from(INFOS))})
    elif kind == "pulled":
        view = replace(view, disk_mib={**view.disk_mib, model: DISK[model] + 100})
    elif kind == "cache":
        view = replace(view, kv_cache_type="q4_0")
    elif kind == "slots":
        view = replace(view, max_parallel=view.max_parallel + 1)
    elif kind == "context":
        view = replace(view, context_length=16384)
    elif kind == "memory":
        view = replace(view, total_vram_mib=49140)
    elif kind == "version":
        view = replace(view, version="0.5.0")
    return {view.name: view}


def claimed(snap: Snapshot, placement: Placement | None, step: int) -> Snapshot:
    """The snapshot after the decision's claim: its ticket held, a second on."""
    if placement is None:
        return replace(snap, now=snap.now + 1)
    ticket = Ticket(f"c{step}", placement.provider, placement.model, placement.footprint_mib,
                    snap.now, snap.now + 60, cold=placement.loads, evicts=placement.evicts,
                    context=placement.num_ctx, estimate_mib=placement.estimate_mib)
    return replace(snap, now=snap.now + 1, tickets=(*snap.tickets, ticket))


def afresh(spec: CallSpec, snap: Snapshot
           ) -> tuple[Decision, tuple[Decision, tuple[Verdict, ...]]]:
    """place() and explain() with nothing kept: no fleet's sizing, a snapshot never seen."""
    forget_fleets()
    decision = place(spec, copy.deepcopy(snap))
    forget_fleets()
    explained = explain(spec, copy.deepcopy(snap))
    forget_fleets()
    return decision, explained


@settings(max_examples=300, deadline=None)
@given(fleets(), st.lists(st.tuples(calls(), st.data()), min_size=1, max_size=5))
def test_a_decision_with_facts_kept_is_the_decision_worked_out_afresh(
        snap: Snapshot, steps: list[tuple[CallSpec, st.DataObject]]) -> None:
    place(steps[0][0], snap)  # the facts of the first fleet kept before any change
    for number, (spec, data) in enumerate(steps):
        changed = data.draw(changes(snap.providers))
        snap = replace(snap, providers=tuple(changed.get(v.name, v) for v in snap.providers))
        kept = place(spec, snap)
        assert place(spec, snap) == kept  # the same snapshot again: its indexes kept
        explained = explain(spec, snap)
        assert afresh(spec, snap) == (kept, explained)
        snap = claimed(snap, kept.placement, number)


def test_a_fleet_rebuilt_from_the_same_mappings_keeps_its_sizer() -> None:
    """The sidecar builds new views for every call from the mappings decoded once."""
    view = ProviderView("g0", 24563, disk_mib={"a:7b": 4500}, models={"a:7b": INFOS[0]})
    first = Sizer.for_fleet((view,), DEFAULT_POLICY.disk_to_vram_factor)
    assert Sizer.for_fleet((replace(view),), DEFAULT_POLICY.disk_to_vram_factor) is first
    probed = replace(view, observed={"a:7b": {4096: 5000}})
    assert Sizer.for_fleet((probed,), DEFAULT_POLICY.disk_to_vram_factor) is not first


def test_a_sizer_keeps_a_bounded_number_of_figures() -> None:
    """Calls name contexts (and models) at will; a fleet that stays the same for long must
    not gather their figures without end, and a figure worked out again is the same."""
    view = ProviderView("g0", 24563, disk_mib={"a:7b": 4500}, models={"a:7b": INFOS[0]})
    sizer = Sizer((view,), DEFAULT_POLICY.disk_to_vram_factor)
    first = sizer.load("a:7b", view, 2048, None)
    for requested in range(4096, 4096 + 3 * _FIGURES_KEPT):
        sizer.load("a:7b", view, requested, None)
    assert len(sizer._loads) <= _FIGURES_KEPT
    assert sizer.load("a:7b", view, 2048, None) == first
