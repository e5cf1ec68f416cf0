"""The placement core's invariants (docs/rules.md) over generated fleets, with hypothesis.

Fleets of cards of varied memory, slots, GPUs and versions, with loaded, loading, leaving,
spilled and expiring copies, live and expired tickets (joins, loads, loads that evict) and
waiting calls; calls with odd but legal options (num_ctx <= 0, num_predict -1/-2, huge
prompts). Every decision must hold: no crash, the same decision twice and as explain makes it, never
a card that is down, never a model outside the candidates, never a load past the card's
usable memory, never a busy victim, never a context too small for the prompt, the claim's
own budget check admits what the decision chose, warm reuse first, and a refusal only when
its reason holds; a run of calls placed and claimed in turn never overcommits a card.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core import context
from proxy.core.conversations import Conversation, PromptCaches
from proxy.core.durations import parse_duration
from proxy.core.eviction import choose_victims, idle_residents
from proxy.core.lengths import CallLength, CallLengths, CallSample
from proxy.core.load_times import LoadTimes
from proxy.core.occupancy import index_providers, ticket_budget_ok
from proxy.core.placement import explain, in_tolerance, place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.tickets import Refused, TicketSet, claim, without
from proxy.core.types import (
    CallSpec,
    Candidate,
    Circuit,
    Decision,
    ModelDemand,
    ModelInfo,
    Placement,
    ProviderHealth,
    ProviderView,
    Resident,
    Snapshot,
    Ticket,
)
from proxy.core.waitline import MAX_SLACK_S, slack_s, yields_to_sooner

NOW = 1_000_000.0
# Sizes seen on every card at any context (no architecture known); "mystery:1b" has none
SIZES = {"qwen3:32b": 27000, "qwen3:14b": 12224, "qwen3:8b": 6000, "phi3:mini": 3600,
         "llama3.2:3b": 3100, "qwen3-helper": 6000, "qwen3-16k": 6500}
MODELS = [*sorted(SIZES), "mystery:1b"]
FOREVER = NOW + 292 * 365 * 86400.0
# What /api/show says of some models on some cards (architecture known: sized per context)
QWEN3_8B = ModelInfo(trained_context=40960, kv_bytes_per_token=147456,
                     estimate_kv_bytes_per_token=147456, family="qwen3", architecture="qwen3",
                     capabilities=("completion", "tools"), weights="sha256-" + "8b" * 32)
INFOS = {
    "qwen3:8b": QWEN3_8B,
    # created FROM qwen3:8b: a template without tools (Ollama joins the 8b's copy), and a
    # num_ctx of its own (Ollama reloads the copy for it)
    "qwen3-helper": replace(QWEN3_8B, capabilities=("completion",)),
    "qwen3-16k": replace(QWEN3_8B, modelfile_num_ctx=16384),
    "qwen3:14b": ModelInfo(trained_context=40960, kv_bytes_per_token=163840,
                           estimate_kv_bytes_per_token=163840, family="qwen3",
                           architecture="qwen3", capabilities=("completion", "tools"),
                           modelfile_num_ctx=0),
    "mystery:1b": ModelInfo(trained_context=8192, kv_bytes_per_token=0, family="bert",
                            architecture="bert", embedding=True, pooling_type=1,
                            capabilities=("embedding",)),
    "phi3:mini": ModelInfo(trained_context=4096, family="phi3", vision=True),
}

PROPERTY = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


def size_of(model: str) -> int:
    return SIZES.get(model, 1500)


@st.composite
def residents(draw: st.DrawFn, total: int | None, likely: str = "") -> tuple[Resident, ...]:
    """`likely`: a model listed first on half the cards."""
    out: list[Resident] = []
    used = 0
    models = draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=3))
    if likely and likely not in models and draw(st.booleans()):
        models.insert(0, likely)
    for model in models:
        mib = size_of(model)
        if total is not None and used + mib > total:
            continue
        used += mib
        out.append(Resident(
            model, mib, draw(st.sampled_from([0, 2048, 4096, 32768])),
            last_used_at=NOW - draw(st.integers(0, 600)),
            expires_at=draw(st.sampled_from([math.inf, NOW + 0.5, NOW + 300, FOREVER])),
            leaving=draw(st.booleans()) and draw(st.booleans()),
            spilled=draw(st.booleans()) and draw(st.booleans()),
            loading=draw(st.booleans()) and draw(st.booleans())))
    return tuple(out)


@st.composite
def cards(draw: st.DrawFn, described: bool = False) -> tuple[ProviderView, ...]:
    """`described`: every card has the models' /api/show (their weights files known)."""
    out = []
    for i in range(draw(st.integers(1, 4))):
        total = draw(st.sampled_from([None, 4096, 8192, 16376, 24563, 32605, 49152, 98304]))
        pulled = draw(st.sampled_from(["all", "unknown", "some"]))
        disk = {} if pulled == "unknown" else {
            m: size_of(m) * 5 // 6 for m in MODELS
            if pulled == "all" or draw(st.booleans())}
        loaded = draw(residents(total, "qwen3:8b" if described else ""))
        if disk:  # what is loaded is on its disk
            disk.update({r.model: size_of(r.model) * 5 // 6 for r in loaded})
        out.append(ProviderView(
            name=f"g{i}", total_vram_mib=total, ready=draw(st.booleans()) or i == 0,
            residents=loaded,
            context_length=draw(st.sampled_from([0, 2048, 8192, 131072])),
            max_parallel=draw(st.integers(0, 4)), max_loaded=draw(st.integers(0, 3)),
            gpus=draw(st.integers(1, 2)), disk_mib=disk,
            version=draw(st.sampled_from(["", "0.12.6", "0.30.0"])),
            models=INFOS if described else draw(st.sampled_from([{}, {}, INFOS])),
            observed=draw(st.sampled_from([{m: {0: mib} for m, mib in SIZES.items()},
                                           {m: {0: mib} for m, mib in SIZES.items()}, {}]))))
    return tuple(out)


@st.composite
def snapshots(draw: st.DrawFn, described: bool = False) -> Snapshot:
    views = draw(cards(described))
    tickets: list[Ticket] = []
    for n in range(draw(st.integers(0, 8))):
        view = draw(st.sampled_from(views))
        listed = [r.model for r in view.residents]
        model = draw(st.sampled_from(listed + MODELS if listed else MODELS))
        cold = draw(st.booleans())
        others = [m for m in listed if m != model]
        evicts = {m: size_of(m) for m in draw(st.lists(st.sampled_from(others), unique=True,
                                                        max_size=1))} if others and cold else {}
        started = NOW - draw(st.floats(0, 120))
        made = Ticket(f"t{n}", view.name, model, size_of(model) if cold else 512,
                      started, started + draw(st.sampled_from([1.0, 60.0, 180.0])),
                      cold=cold, evicts=evicts, context=draw(st.sampled_from([0, 4096])),
                      plan=draw(st.booleans()) and draw(st.booleans()))
        # a ticket is in the set only when its claim was admitted (expired ones stay)
        if made.expires_at <= NOW or ticket_budget_ok(
                [t for t in tickets if t.provider == view.name], made, view, DEFAULT_POLICY)[0]:
            tickets.append(made)
    health = {v.name: ProviderHealth(draw(st.sampled_from(list(Circuit))),
                                     draw(st.sampled_from([None, 0.0, 5.0, 1e6])),
                                     draw(st.sampled_from([None, 0.0, 1.0])))
              for v in views}
    demand = {m: ModelDemand(waiters=len(turns), recent_use=draw(st.sampled_from([0.0, 3.0])),
                             turns=tuple(sorted(turns)))
              for m in draw(st.lists(st.sampled_from(MODELS), unique=True, max_size=2))
              for turns in [draw(st.lists(st.floats(NOW - 60, NOW + 60), max_size=3))]}
    learned = CallLengths()
    loads = LoadTimes()
    caches = PromptCaches()
    for _ in range(draw(st.integers(0, 4))):
        name, model = draw(st.sampled_from(views)).name, draw(st.sampled_from(MODELS))
        learned = learned.observe(name, model, CallSample(
            draw(st.sampled_from([0.0, 0.001, 2.0, 1e6])),
            draw(st.sampled_from([None, 0, 1, 500])), draw(st.sampled_from([None, 0.0, 1.0])),
            draw(st.sampled_from([None, 0, 3000])), draw(st.sampled_from([None, 0.0, 0.5]))))
        loads = loads.observe_load(name, model, size_of(model),
                                   draw(st.sampled_from([None, 0.0, 0.5, 30.0])), 1.0)
        caches = caches.sent(name, model, draw(conversations()), NOW - draw(st.floats(0, 60)))
    return Snapshot(NOW, views, tuple(tickets), demand, health, loads, learned, caches)


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    digests = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    return Conversation(digests, draw(st.sampled_from([0, 100, 5000, 10**8])),
                        draw(st.sampled_from([0, 50])))


@st.composite
def calls(draw: st.DrawFn) -> CallSpec:
    models = draw(st.lists(st.sampled_from(MODELS), unique=True, min_size=1, max_size=3))
    scores = sorted(draw(st.lists(st.integers(0, 100), min_size=len(models),
                                  max_size=len(models))), reverse=True)
    generates = draw(st.booleans()) or draw(st.booleans())
    return CallSpec(
        tuple(Candidate(m, s, draw(st.sampled_from([None, None, 0, 5000])))
              for m, s in zip(models, scores, strict=True)),
        prompt_tokens=draw(st.sampled_from([0, 1, 100, 3000, 30000, 200000, 10**9])),
        num_ctx=draw(st.sampled_from([0, 0, -1, 4, 4096, 40000, 10**7])),
        num_predict=draw(st.sampled_from([0, 0, -1, -2, 128, 10**6])),
        expected_answer=draw(st.sampled_from([0, 500])),
        turn=draw(st.sampled_from([None, NOW - 30, NOW, NOW + 30])),
        pins_context=draw(st.booleans()) or draw(st.booleans()),
        generates=generates, embeds="" if generates else "/api/embed",
        tolerance=draw(st.sampled_from([-5, 0, 10, 100])),
        can_wait=draw(st.booleans()) or draw(st.booleans()),
        wait_left_s=draw(st.sampled_from([None, 0.0, 3.0, 1e9])),
        conversation=draw(st.one_of(st.none(), conversations())),
        needs=draw(st.sampled_from([(), (), (("tools", "does not support tools"),)])))


def live(snap: Snapshot, provider: str) -> list[Ticket]:
    return [t for t in snap.tickets if t.provider == provider and t.expires_at > snap.now]


def new_ticket(placement: Placement, now: float, ticket_id: str = "new") -> Ticket:
    return Ticket(ticket_id, placement.provider, placement.copy_model, placement.footprint_mib,
                  now, now + 60, cold=placement.loads, evicts=dict(placement.evicts),
                  context=placement.num_ctx, estimate_mib=placement.estimate_mib,
                  beside_mib=placement.beside_mib)


def check_placed(snap: Snapshot, call: CallSpec, decision: Decision) -> None:
    placement = decision.placement
    assert placement is not None and decision.outcome == "placed"
    view = next(v for v in snap.providers if v.name == placement.provider)
    index = index_providers(snap, DEFAULT_POLICY)[view.name]
    assert view.ready, decision.reason
    assert snap.health[view.name].circuit is not Circuit.OPEN, decision.reason
    assert placement.model in {c.model for c in call.candidates}
    if placement.copy:  # another model's copy of its weights file, listed or being loaded
        info, other = view.models.get(placement.model), view.models.get(placement.copy)
        assert info is not None and other is not None and info.weights == other.weights
        assert placement.copy not in {c.model for c in (call.preferred, *in_tolerance(call))}
        assert not placement.loads and placement.copy in index.loaded_models
    assert placement.kind in ("warm", "loading", "cold", "evict"), decision.reason
    assert math.isfinite(placement.cost_s), decision.reason
    # a prompt is never placed where its context would cut it
    assert context.fits(call.prompt_tokens, placement.context_length, call.answer_tokens,
                        call.generates, call.answer_capped), decision.reason
    busy = {t.model for t in live(snap, view.name)}
    assert not busy.intersection(placement.evicts), decision.reason  # no live eviction
    if placement.loads and view.total_vram_mib is not None and \
            placement.footprint_mib != DEFAULT_POLICY.warm_scratch_mib:
        usable = DEFAULT_POLICY.usable_mib(view.total_vram_mib, view.gpus)
        kept = sum(r.footprint_mib for r in view.residents if r.model not in placement.evicts)
        loading = sum(t.footprint_mib for t in live(snap, view.name)
                      if t.cold and t.model not in index.residents)
        # never overcommit: what stays, the loads in flight and this load, within usable
        assert kept + loading + placement.footprint_mib <= usable, decision.reason
    # the claim's own budget check admits what the decision chose
    ok, why = ticket_budget_ok([t for t in snap.tickets if t.provider == view.name],
                               new_ticket(placement, snap.now), view, DEFAULT_POLICY,
                               placement.needs_free_slot)
    assert ok, (why, decision.reason)


def idle_warm_copy(snap: Snapshot, call: CallSpec) -> str | None:
    """A card with a copy of the preferred model a call can join at once, by the rules
    alone: listed, lasting, not leaving, spilled or planned away, a slot free, its context
    known to hold the call (no /api/show to cap it), the card up. None if there is none."""
    model = call.preferred.model
    if not call.pins_context or call.needs or call.embeds or call.conversation is not None:
        return None
    if any(view.models for view in snap.providers):
        return None  # a trained context (any card's /api/show) caps the copy's
    indexes = index_providers(snap, DEFAULT_POLICY)
    for view in snap.providers:
        if not view.ready or snap.health[view.name].circuit is Circuit.OPEN:
            continue
        index = indexes[view.name]
        copy = index.residents.get(model)
        if copy is None or copy.spilled or not index.is_warm(model) or \
                index.free_slots(model) <= 0:
            continue
        held = copy.context_length
        if held and (call.num_ctx > held or not context.fits(
                call.prompt_tokens, held, call.answer_tokens, call.generates,
                call.answer_capped)):
            continue
        return view.name
    return None


def check_decision(snap: Snapshot, call: CallSpec, decision: Decision) -> None:
    if decision.outcome == "placed":
        check_placed(snap, call, decision)
    else:
        assert decision.placement is None
    warm = idle_warm_copy(snap, call)
    if warm is not None:  # warm reuse first
        placement = decision.placement
        assert placement is not None and placement.step == 1, (warm, decision.reason)
    model = call.preferred.model
    if decision.outcome == "model-not-found":
        assert all(v.disk_mib and model not in v.disk_mib and
                   all(r.model != model for r in v.residents) for v in snap.providers)
    if decision.outcome == "model-too-large" and model in SIZES and \
            not any(v.models for v in snap.providers):
        assert all(v.total_vram_mib is not None for v in snap.providers)
        assert all(not v.observed or SIZES[model] >
                   DEFAULT_POLICY.usable_mib(v.total_vram_mib or 0, v.gpus)
                   for v in snap.providers), decision.reason


@PROPERTY
@given(snapshots(), calls())
def test_place_holds_the_rules(snap: Snapshot, call: CallSpec) -> None:
    decision = place(call, snap)
    assert decision == place(call, snap)  # deterministic
    shown = explain(call, snap)[0]  # explain weighs every card, and decides the same
    assert (shown.outcome, shown.placement) == (decision.outcome, decision.placement)
    check_decision(snap, call, decision)


def for_a_sibling(call: CallSpec) -> CallSpec:
    """The call, preferring qwen3-helper (made FROM qwen3:8b), a chat that needs no tools."""
    rest = tuple(c for c in call.candidates if c.model != "qwen3-helper")
    return replace(call, candidates=(Candidate("qwen3-helper", 100), *rest), needs=(),
                   generates=True, embeds="")


SIBLING_CALLS = calls().map(for_a_sibling)


@PROPERTY
@given(snapshots(described=True), SIBLING_CALLS)
def test_a_call_of_a_shared_weights_file_holds_the_rules(snap: Snapshot, call: CallSpec
                                                         ) -> None:
    test_place_holds_the_rules.hypothesis.inner_test(snap, call)  # type: ignore[attr-defined]


@settings(PROPERTY, max_examples=60)
@given(snapshots(), st.lists(calls(), min_size=2, max_size=6))
def test_calls_placed_and_claimed_in_turn_never_overcommit(snap: Snapshot,
                                                           made: list[CallSpec]) -> None:
    """Each call is placed on the tickets the calls before it claimed (tickets.claim, as
    the ticket book applies it to the live set); after each load admitted, what stays on
    the card and every load in flight fit its usable memory."""
    placed_and_claimed_in_turn(snap, made)


@settings(PROPERTY, max_examples=60)
@given(snapshots(described=True),
       st.lists(st.one_of(SIBLING_CALLS, calls()), min_size=2, max_size=6))
def test_calls_of_a_shared_weights_file_placed_in_turn_never_overcommit(
        snap: Snapshot, made: list[CallSpec]) -> None:
    placed_and_claimed_in_turn(snap, made)


def placed_and_claimed_in_turn(snap: Snapshot, made: list[CallSpec]) -> None:
    views = {v.name: v for v in snap.providers}
    sets = {name: TicketSet({t.ticket_id: t for t in snap.tickets if t.provider == name})
            for name in views}
    for n, call in enumerate(made):
        now = replace(snap, tickets=tuple(t for s in sets.values() for t in s.tickets.values()))
        decision = place(call, now)
        check_decision(now, call, decision)
        placement = decision.placement
        if placement is None:
            continue
        view = views[placement.provider]
        outcome = claim(sets[view.name].live(NOW), new_ticket(placement, NOW, f"c{n}"), view,
                        DEFAULT_POLICY, 60.0, NOW, placement.needs_free_slot)
        assert not isinstance(outcome, Refused), (outcome.reason, decision.reason)
        sets[view.name] = outcome.tickets
        if not placement.loads or view.total_vram_mib is None:
            continue
        tickets = [t for t in outcome.tickets.tickets.values() if t.expires_at > NOW]
        victims = {v for t in tickets for v in t.evicts}
        listed = {r.model for r in view.residents}
        kept = sum(r.footprint_mib for r in view.residents if r.model not in victims)
        loading = sum(t.footprint_mib for t in tickets
                      if t.cold and (t.model not in listed or t.reloads))
        usable = DEFAULT_POLICY.usable_mib(view.total_vram_mib, view.gpus)
        assert kept + loading <= usable or kept > usable, decision.reason
        # a release takes the ticket and the load it recorded, and nothing else
        gone = without(outcome.tickets, [f"c{n}"])
        assert f"c{n}" not in gone.tickets and f"c{n}" not in gone.loads
        assert set(gone.tickets) == set(outcome.tickets.tickets) - {f"c{n}"}


@PROPERTY
@given(snapshots(), st.sampled_from(MODELS), st.floats(NOW - 120, NOW + 120))
def test_the_soonest_turn_never_yields(snap: Snapshot, model: str, arrival: float) -> None:
    """No deadlock: a call due no later than every waiting call takes a free slot."""
    turns = snap.demand.get(model, ModelDemand()).turns
    due = min((arrival, *turns))
    slot = Placement("g0", model, "warm", 1, 512)
    assert yields_to_sooner(slot, snap, DEFAULT_POLICY, due) == 0
    # a load never yields: it makes slots rather than take one
    load = Placement("g0", model, "cold", 4, size_of(model))
    assert yields_to_sooner(load, snap, DEFAULT_POLICY, NOW + 1e6) == 0


@st.composite
def lengths(draw: st.DrawFn) -> CallLength | None:
    seconds = draw(st.one_of(st.none(), st.floats(-10, 1e12, allow_nan=False)))
    return None if seconds is None else CallLength(seconds, "test")


@PROPERTY
@given(lengths())
def test_a_turn_comes_within_the_slack_bound(length: CallLength | None) -> None:
    """No starvation: a call is passed only by calls that arrive within its slack."""
    assert 0.0 <= slack_s(length) <= MAX_SLACK_S


@PROPERTY
@given(snapshots(), st.integers(0, 60000))
def test_victims_are_idle_and_fewest(snap: Snapshot, need: int) -> None:
    """Victims are idle copies (no ticket, not planned away, not loading), and no fewer of
    the idle ones would make the room."""
    index = next(iter(index_providers(snap, DEFAULT_POLICY).values()))

    def enough(victims: tuple[Resident, ...]) -> bool:
        return sum(v.footprint_mib for v in victims) >= need

    chosen = choose_victims(index, enough, snap.demand, now=snap.now)
    idle = idle_residents(index)
    if chosen is None:
        assert not enough(tuple(idle))
        return
    assert enough(chosen) and all(v in idle for v in chosen)
    assert not any(index.calls_by_model.get(v.model) for v in chosen)
    if any(snap.demand.get(v.model, ModelDemand()).waiters or v.expires_at > NOW + 10**9
           for v in idle):
        return  # those go last, even where fewer of them would do
    biggest = sorted((v.footprint_mib for v in idle), reverse=True)
    assert sum(biggest[:len(chosen) - 1]) < need or not chosen


UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9,
         "h": 3600 * 10**9}


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(sorted(UNITS))),
                min_size=1, max_size=4), st.booleans())
def test_a_go_duration_reads_back(parts: list[tuple[int, str]], negative: bool) -> None:
    text = ("-" if negative else "") + "".join(f"{n}{unit}" for n, unit in parts)
    value = sum(n * UNITS[unit] for n, unit in parts)
    assert parse_duration(text) == (-value if negative else value)
