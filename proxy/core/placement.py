"""CallPlanner.place: the five steps of "Candidate models per call", then refusal or wait.

1. a warm copy of the preferred model with a free slot;
2. a warm copy with a free slot of an in-tolerance candidate, highest score first;
3. a copy another call is loading right now, of any in-tolerance candidate, while it has a
   slot no call is bound to yet;
4. the full weighted cost for the preferred model: wait for a slot of a busy copy, or
   cold-load onto free room (only when a cold load is possible at all);
5. otherwise classify: model-not-found, unsupported (Ollama would refuse the call on the
   model: it lacks a capability the call needs), model-too-large, prompt-too-large, or busy
   (each of the first four falls back to the best in-tolerance candidate that escapes it, and is
   refused only when none does); when busy, wait for a slot or unload (an unload wins only
   when cheaper than waiting).

A call that carries a conversation goes back to the copy holding it when that is sooner
(core/affinity.py); when the copy of steps 1-3 would push another live history out, a load
onto free room and a busy copy with a cache slot to spare are weighed against it.

Late binding: a call is only ever placed on a slot free now or on a load. When waiting for a
slot of a busy copy wins, the decision is "wait": the call stays with the sidecar and is
placed again on the next change, so it takes the first slot that frees on any card, or a load
once that has become the cheaper option, instead of queueing inside one engine. A wait loses
to any load, cheaper or not, when the call cannot wait (`can_wait`) or the wait is expected to
outlast what is left of its wait limit (`wait_left_s`): a load places the call at once. A call
that cannot wait and has nothing but waits gets "wait", which the scheduler turns into the
static endpoint or a 503.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from itertools import islice

from proxy.core import affinity, context, fit_before_030
from proxy.core.cost import (
    Backlog,
    backlog,
    call_length,
    cold_floor_s,
    cold_terms,
    load_estimate,
    loads_in_flight,
    queued_in_engines,
    waiting_line,
    warm_terms,
)
from proxy.core.feasibility import UNREACHABLE, Fit, Fitting, check, health_reason
from proxy.core.models import not_found, not_listed
from proxy.core.occupancy import ProviderIndex, held_beside, indexes_for
from proxy.core.policy import DEFAULT_POLICY, Policy
from proxy.core.queueing import (
    QueueOption,
    UnloadOption,
    queue_option,
    queue_wins,
    unload_option,
)
from proxy.core.shared_copies import as_own_caches, as_own_copy, joined_copies, on_copy
from proxy.core.sizing import Sizer
from proxy.core.types import (
    CallSpec,
    Candidate,
    Decision,
    Lack,
    Placement,
    PlacementKind,
    Snapshot,
    Verdict,
)

# A wait's reason when every card that could run the model is down or its circuit open
NO_PROVIDER_REACHABLE = "no provider that could run the model is reachable"


def in_tolerance(call: CallSpec) -> list[Candidate]:
    """Other candidates within the tolerance of the preferred score, highest score first."""
    floor = call.preferred.score - max(0.0, call.tolerance)
    others = [c for c in call.candidates[1:]
              if c.score >= floor and c.model != call.preferred.model]
    return sorted(others, key=lambda c: -c.score)


class _Planner:
    """One placement's working state: indexes, contexts and footprints computed once."""

    def __init__(self, call: CallSpec, snapshot: Snapshot, policy: Policy,
                 detailed: bool = False) -> None:
        self.detailed = detailed  # verdicts say what the call would get (for explain)
        self.call = call
        self.snapshot = snapshot
        self.policy = policy
        self.alternatives = in_tolerance(call)
        self.acceptable = [call.preferred, *self.alternatives]
        self.fitting = Fitting(call, Sizer.for_fleet(snapshot.providers,
                                                      policy.disk_to_vram_factor),
                               {c.model: c.vram_mib for c in call.candidates},
                               unknown_mib=policy.warm_scratch_mib)
        self.indexes = indexes_for(snapshot, policy)
        # Cards where the call would join another model's copy of its weights file: planned
        # as its own copy there, and the placement put back in the card's names
        self.joined = joined_copies(self.indexes, [c.model for c in self.acceptable],
                                    self.fitting, {c.model for c in self.acceptable})
        if self.joined:
            self.fitting.loaded_as = {(name, model): copy
                                      for name, (model, copy) in self.joined.items()}
            self.indexes = {name: as_own_copy(index, *self.joined[name], snapshot.now, policy)
                            if name in self.joined else index
                            for name, index in self.indexes.items()}
            self.snapshot = as_own_caches(snapshot, self.joined)
        self.backlogs: dict[str, Backlog] = {}
        self.lines: dict[str, Backlog] = {}  # see line
        self.wanted_models: list[str] | None = None
        self.fits: dict[tuple[str, str], Fit] = {}
        self.blocked: dict[tuple[str, str], list[str]] = {}
        self.roomy: dict[str, bool] = {}  # per model: a card takes a load of it shutting none out

    def fit(self, index: ProviderIndex, model: str) -> Fit:
        key = (index.name, model)
        found = self.fits.get(key)
        if found is None:
            found = self.fits[key] = check(index, model, self.fitting, self.snapshot.health)
        return found

    def verdict(self, index: ProviderIndex, model: str, room: bool = True) -> Verdict:
        """`room=False` leaves a cold load's `takes_room` out (unless detailed: explain shows
        every term), for `weigh_room` to add where it can decide."""
        fit = self.fit(index, model)
        sizing = self.sizing(index, model, fit) if self.detailed else {}
        if not fit.ok:
            return Verdict(index.name, model, False, fit.reason, sizing=sizing)
        if fit.warm or fit.loading:
            terms = warm_terms(index, model, self.fitting, self.snapshot, self.policy,
                               self.call.phase, self.backlog(model))
        else:
            shut = self.shuts_out(index, model) if room or self.detailed else ()
            terms = cold_terms(index, model, self.fitting, self.snapshot, self.policy,
                               self.call.phase, shut)
        length = call_length(index.name, model, self.call, self.snapshot, self.policy) \
            if self.detailed else None
        return Verdict(index.name, model, True, fit.reason, terms, sizing, length)

    def weighed(self, model: str) -> list[Verdict]:
        """Step 4's verdicts (`takes_room` left for `weigh_room`), in the cards' order. Once
        a load that fits is found, the cheapest such load or copy (`takes_room` weighed) is a
        bar: a card where the model has no copy is passed over, unchecked, when what a load
        there costs at least (`cold_floor_s`) is above the bar, so it could neither win nor
        tie. Loads are tried cheapest floor first, so the bar is found early. explain's
        planner weighs every card."""
        indexes = list(self.indexes.values())
        if self.detailed:
            return [self.verdict(i, model, room=False) for i in indexes]
        found: dict[str, Verdict] = {}
        bar: Verdict | None = None  # the cheapest complete verdict a load that fits allows
        copies: list[Verdict] = []
        loads: list[tuple[float, str, ProviderIndex]] = []
        for index in indexes:
            if index.is_warm(model) or index.is_loading(model):
                verdict = found[index.name] = self.verdict(index, model, room=False)
                if verdict.feasible and not self.wait_loses(verdict):
                    copies.append(verdict)
            else:
                loads.append((cold_floor_s(index, model, self.fitting, self.snapshot,
                                           self.policy, self.call.phase), index.name, index))
        loads.sort(key=lambda load: load[:2])
        for floor, name, index in loads:
            if bar is not None and floor > bar.cost_s + _FLOOR_MARGIN * max(1.0, abs(bar.cost_s)):
                break  # and every load after it
            verdict = found[name] = self.verdict(index, model, room=False)
            if not verdict.feasible:
                continue
            complete = self.verdict(index, model) if self.shuts_out(index, model) else verdict
            if bar is None:  # a load fits: every copy is in the running (`weighted`)
                bar = min(copies, key=_rank, default=complete)
            bar = min(bar, complete, key=_rank)
        return [found[i.name] for i in indexes if i.name in found]

    def weigh_room(self, verdicts: list[Verdict]) -> list[Verdict]:
        """Verdicts made with `room=False`, `takes_room` added wherever it can change which
        is cheapest (sizing every model in demand on the card for it is most of a cold
        verdict's work). The term only adds to a cold verdict's cost, so going up from the
        lowest cost, once a verdict costs more than the cheapest complete one so far, neither
        it nor any after it can win or tie: those stay without it."""
        out = list(verdicts)
        cheapest = float("inf")
        for i in sorted((i for i, v in enumerate(out) if v.feasible), key=lambda i: out[i].cost_s):
            if out[i].cost_s > cheapest:
                break
            if self.wait_loses(out[i]):
                continue  # every load beats it: no bar for them
            index, model = self.indexes[out[i].provider], out[i].model
            fit = self.fit(index, model)
            if not (fit.warm or fit.loading) and self.shuts_out(index, model):
                out[i] = self.verdict(index, model)
            cheapest = min(cheapest, out[i].cost_s)
        return out

    def backlog(self, model: str) -> Backlog:
        found = self.backlogs.get(model)
        if found is None:
            found = self.backlogs[model] = backlog(self.indexes.values(), model, self.snapshot)
        return found

    def sizing(self, index: ProviderIndex, model: str, fit: Fit) -> dict[str, int | str]:
        """The context this call would get on the card and what a copy there takes."""
        if fit.warm or fit.loading:
            recorded = self.fitting.copy_context(index, model)
            return {"contextLength": context.effective(recorded, self.fitting.trained(
                index, model)), "contextSource": "the loaded copy" if fit.warm else
                "the copy being loaded", "slots": index.slots(model)}
        resolved, footprint = self.fitting.load(index, model)
        mib = footprint.total_mib if footprint else None
        out: dict[str, int | str] = {"contextLength": resolved.context,
                                     "contextSource": resolved.source,
                                     "slots": index.slots(model),
                                     "loadSource": load_estimate(index.view, model, mib,
                                                                 self.snapshot,
                                                                 self.policy).source}
        if footprint is not None:
            out.update({f"footprint{k[0].upper()}{k[1:]}": v
                        for k, v in footprint.parts().items()})
        return out

    def placement(self, verdict: Verdict, kind: PlacementKind, step: int,
                  evicts: dict[str, int] | None = None, cost_s: float | None = None
                  ) -> Placement:
        model = verdict.model
        index = self.indexes[verdict.provider]
        if kind in ("cold", "evict"):
            resolved, footprint = self.fitting.load(index, model)
            listed = fit_before_030.taken_mib(footprint.total_mib, footprint.estimate_mib) \
                if footprint and fit_before_030.applies(index.view) else 0
            return Placement(
                verdict.provider, model, kind, step,
                footprint.total_mib if footprint else self.policy.warm_scratch_mib,
                verdict.cost_s if cost_s is None else cost_s, evicts or {},
                resolved.requested, self.fitting.window(index, model, resolved.context),
                footprint.estimate_mib if footprint else 0, listed,
                loads_in_flight(index, self.snapshot, self.policy),
                held_beside(model, evicts or {}, index.view.residents, index.loading.values()))
        recorded = self.fitting.copy_context(index, model)
        return Placement(verdict.provider, model, kind, step, self.policy.warm_scratch_mib,
                         verdict.cost_s, num_ctx=recorded,
                         context_length=self.fitting.window(index, model, context.effective(
                             recorded, self.fitting.trained(index, model))))

    def copy_with_room(self, model: str, step: int, loading_only: bool = False
                       ) -> Placement | None:
        """Steps 1-2: a warm (or loading) copy with a free slot; step 3: a loading copy with a
        slot no call is bound to (its slots minus its tickets). A copy partly in CPU memory is
        no free reuse: step 4 weighs it. Copies equal in cost go to the card where the call
        is expected to end soonest (core/lengths.py), then by name."""
        best: Verdict | None = None
        tied: list[Verdict] = []
        for index in self.indexes.values():
            if model not in index.residents and model not in index.loading:
                continue  # no copy here (most cards, for most models)
            if loading_only:
                eligible = index.is_loading(model) and index.free_slots(model) > 0
            else:
                resident = index.residents.get(model)
                eligible = (index.is_warm(model) or index.is_loading(model)) and \
                    index.free_slots(model) > 0 and not (resident and resident.spilled)
            if not eligible:
                continue
            verdict = self.verdict(index, model)
            if not verdict.feasible:
                continue
            if best is None or verdict.cost_s < best.cost_s:
                best, tied = verdict, [verdict]
            elif verdict.cost_s == best.cost_s:
                tied.append(verdict)
        if best is None:
            return None
        if len(tied) > 1:
            best = min(tied, key=lambda v: (call_length(v.provider, model, self.call,
                                                        self.snapshot, self.policy).seconds,
                                            v.provider))
        kind: PlacementKind = "warm" if self.indexes[best.provider].is_warm(model) else "loading"
        return self.placement(best, kind, step)

    def weighted(self, verdicts: Iterable[Verdict]) -> Placement | None:
        """Step 4: when a cold load onto free room is possible at all, the cheapest of it and
        the copies (a full copy: "queued", which place() turns into a wait for a slot; not one
        whose wait loses to any load, `wait_loses`); else a copy with a free slot that steps
        1-3 passed over (one partly in CPU memory). A full copy is then step 5's to weigh
        against unloading."""
        feasible = [v for v in verdicts if v.feasible]
        if not any(v.reason.startswith(("fits", "fit unknown")) for v in feasible):
            feasible = [v for v in feasible if self.indexes[v.provider].free_slots(v.model) > 0]
            if not feasible:
                return None
        else:  # (the load that fits stays)
            doomed = [v for v in feasible if self.wait_loses(v)]
            kept = [v for v in feasible if v not in doomed]
            best = min(kept, key=_rank)
            if doomed and not self.load_beats_wait(
                    best.cost_s, min(doomed, key=self.own_wait_s)):
                kept = feasible  # the loads are slower than the wait plus the time left
            feasible = kept
        best = min(feasible, key=_rank)
        index = self.indexes[best.provider]
        if index.is_warm(best.model) or index.is_loading(best.model):
            kind: PlacementKind = "queued" if index.free_slots(best.model) <= 0 else (
                "warm" if index.is_warm(best.model) else "loading")
        else:
            kind = "cold"
        return self.placement(best, kind, 4)

    def cache_holder_instead(self, hit: Placement) -> Placement | None:
        """The copy expected to hold the call's prompt, busy or passed over, when waiting
        there costs less than reading the whole prompt again on `hit` (core/affinity.py)."""
        found = affinity.holder(self.indexes.values(), [c.model for c in self.acceptable],
                                self.call, self.snapshot)
        if found is None or (found[0].name, found[1]) == (hit.provider, hit.model):
            return None
        index, model = found
        verdict = self.verdict(index, model)
        if not verdict.feasible or verdict.cost_s >= hit.cost_s or self.wait_loses(verdict):
            return None
        return self.placement(verdict, "queued" if index.free_slots(model) <= 0 else "warm", 4)

    def instead_of_displacing(self, hit: Placement) -> Placement | None:
        """A free call slot is not a free cache slot: when `hit` would push another live
        conversation's history out (`cache_eviction`), the cheapest of a load of an acceptable
        model onto free room and a busy copy with a cache slot to spare, when it costs less.
        No load takes the room a model in demand with no copy can have nowhere else."""
        if hit.kind != "warm" or not self.verdict(self.indexes[hit.provider],
                                                  hit.model).terms.get("cache_eviction"):
            return None
        alternatives = [verdict for candidate in self.acceptable
                        for index in self.indexes.values()
                        if (verdict := self.alternative_to_displacing(index, candidate.model))
                        is not None]
        if not alternatives:
            return None
        best = min(self.weigh_room(alternatives), key=_rank)
        if best.cost_s >= hit.cost_s:
            return None
        index = self.indexes[best.provider]
        copy = index.is_warm(best.model) or index.is_loading(best.model)
        return self.placement(best, "queued" if copy else "cold", 4)

    def alternative_to_displacing(self, index: ProviderIndex, model: str) -> Verdict | None:
        """A busy copy that pushes no history out, or a load onto free room that takes no
        room needed elsewhere (a copy with a free call slot is steps 1-3's); `takes_room` is
        `weigh_room`'s to add."""
        copy = index.is_warm(model) or index.is_loading(model)
        if copy and index.free_slots(model) > 0:
            return None
        verdict = self.verdict(index, model, room=False)
        if not verdict.feasible or verdict.terms.get("cache_eviction") or \
                self.wait_loses(verdict):
            return None
        if not copy and (not verdict.reason.startswith(("fits", "fit unknown")) or
                         self.takes_needed_room(index, model)):
            return None
        return verdict

    def wanted(self) -> list[str]:
        """The models in demand: on the demand board (waiting, announced, recently used or
        predicted) or acceptable to this call."""
        if self.wanted_models is None:
            board = [m for m, d in self.snapshot.demand.items() if d.expected_reloads > 0]
            self.wanted_models = sorted({*board, *(c.model for c in self.acceptable)})
        return self.wanted_models

    def blocked_by(self, index: ProviderIndex, model: str) -> list[str]:
        """The models in demand, with no copy here, that fit this card's free room now and
        would not fit beside a load of `model`."""
        found = self.blocked.get((index.name, model))
        if found is not None:
            return found
        free = index.free_mib()
        need = self.fitting.footprint_mib(index, model)
        found = self.blocked[index.name, model] = [] if free is None or need is None else [
            other for other in self.wanted() if other != model and not index.serves(other)
            and self.fits_free_room(index, other, free)
            and not self.fits_free_room(index, other, free - need)]
        return found

    def shuts_out(self, index: ProviderIndex, model: str) -> tuple[str, ...]:
        """The models in demand a load of `model` here shuts out of this card, when another
        card could take the load onto free room and still have room for every model in
        demand; else ()."""
        blocked = self.blocked_by(index, model)
        if not blocked:
            return ()
        roomy = self.roomy.get(model)
        if roomy is None:  # (not `index`: it shuts `blocked` out)
            roomy = self.roomy[model] = any(
                self.fit(other, model).reason.startswith("fits:")
                and not self.blocked_by(other, model) for other in self.indexes.values())
        return tuple(blocked) if roomy else ()

    def takes_needed_room(self, index: ProviderIndex, model: str) -> bool:
        """Loading `model` here leaves too little room for another model the demand board
        wants (waiting, recently used or predicted) that has no copy anywhere and whose
        only free room is here."""
        free = index.free_mib()
        need = self.fitting.footprint_mib(index, model)
        if free is None or need is None:
            return False
        for other, demand in self.snapshot.demand.items():
            if other == model or not (demand.waiters or demand.recent_use or
                                      demand.predicted):
                continue
            if any(i.serves(other) for i in self.indexes.values()):
                continue
            fits_here = self.fits_free_room(index, other, free)
            if fits_here and not self.fits_free_room(index, other, free - need) and not any(
                    self.fits_free_room(i, other, i.free_mib())
                    for i in self.indexes.values() if i is not index):
                return True
        return False

    def fits_free_room(self, index: ProviderIndex, model: str, free: int | None) -> bool:
        if not_listed(index.view, model):
            return False  # not pulled there
        need = self.fitting.footprint_mib(index, model)
        return free is not None and need is not None and need <= free

    def pulled_anywhere(self, model: str) -> bool:
        """False only when every provider's catalog is known and none has the model."""
        return any(_pulled_on(i, model) for i in self.indexes.values())

    def classify(self, verdicts: list[Verdict]) -> tuple[str, str] | None:
        """model-not-found, unsupported, model-too-large, prompt-too-large, or None
        (busy)."""
        preferred = self.call.preferred.model
        if not self.pulled_anywhere(preferred):
            return "model-not-found", not_found(preferred, embedding=not self.call.generates)
        refused = self.unsupported(preferred)
        if refused is not None:
            return "unsupported", refused.message
        if self.too_large_everywhere(preferred):
            sizes = {i.name: (self.fitting.footprint_mib(i, preferred),
                              self.fitting.load(i, preferred)[0].context, i.usable_mib or 0)
                     for i in self.indexes.values()}
            best = min(sizes, key=lambda n: (sizes[n][0] or 0) - sizes[n][2])
            need, ctx, usable = sizes[best]
            return "model-too-large", (
                f"No GPU can hold {preferred}: at a context of {ctx} tokens it needs {need} MiB "
                f"and {best} has {usable} MiB usable; add a smaller model to the candidates, "
                "a larger GPU, or a smaller context (OLLAMA_CONTEXT_LENGTH on a provider).")
        holds = [self.holds_prompt(c.model) for c in self.acceptable]
        if any(holds) or all(h is None for h in holds):
            return None
        largest_ctx = max(self.largest_context(i, c.model) for i in self.indexes.values()
                          for c in self.acceptable)
        trained = [max(self.fitting.trained(i, c.model) for i in self.indexes.values())
                   for c in self.acceptable]
        if any(self.largest_context(i, c.model) == largest_ctx <
               self.largest_context(i, c.model, whole=True)
               for i in self.indexes.values() for c in self.acceptable):  # an embedding batch
            advice = ("Ollama's llama-server takes an embedding input whole in one batch of "
                      "that size (num_batch, at most 2048 tokens by default; the sidecar does "
                      "not send an agent's, which would reload the copy): shorten the input, "
                      "or send `truncate: true` to have Ollama cut it.")
        elif all(trained) and largest_ctx >= max(trained):  # the models, not the GPUs, stop it
            advice = ("no acceptable model was trained for a longer context; use one that "
                      "was, or shorten the prompt.")
        elif self.call.pins_context and self.call.num_ctx and \
                (own := self.own_context()) >= largest_ctx:
            raised = f", which Ollama raises to {own}," if own > self.call.num_ctx else ""
            advice = (f"the call's options.num_ctx ({self.call.num_ctx}){raised} sets that "
                      "context; raise it or shorten the prompt.")
        elif lowered := max((r.lowered_from for r in (
                self.fitting.load(i, c.model)[0] for i in self.indexes.values()
                for c in self.acceptable) if r.context == largest_ctx), default=0):
            advice = (f"Ollama's default context, {lowered}, does not fit the GPUs' memory "
                      "and the sidecar loads it at the next step that does; set "
                      "options.num_ctx to the context the prompt needs if a GPU can hold "
                      "that, use a larger GPU or a smaller model, or shorten the prompt.")
        else:
            advice = "raise OLLAMA_CONTEXT_LENGTH on a provider or shorten the prompt."
        spare = context.reserve(largest_ctx, self.call.answer_tokens, self.call.generates,
                                self.call.answer_capped, self.call.prompt_tokens)
        return "prompt-too-large", (
            f"The prompt needs about {self.call.prompt_tokens} tokens (and "
            f"{context.kept(spare, self.call.generates)}) but the largest context any GPU "
            f"gives an acceptable model is "
            f"{largest_ctx} tokens; {advice}")

    def unsupported(self, model: str) -> Lack | None:
        """Ollama's refusal of this call on `model` when every card says the model lacks a
        capability the call needs (it refuses before loading anything), or cannot embed
        there (Ollama loads it first); None when one does not, or cannot tell."""
        lacks = [self.fitting.lacking(i, model) for i in self.indexes.values()]
        return lacks[0] if lacks and all(lacks) else None

    def too_large_everywhere(self, model: str) -> bool:
        """Every card's usable memory is known, no card has a copy this call could join, and
        a load at the context this call gets is larger than every card. A copy loaded with a
        context this call cannot use (a smaller num_ctx, or one over the OpenAI API that
        gets Ollama's default) proves nothing: waiting for it never serves the call."""
        if not self.indexes or any(i.usable_mib is None or self.joinable(i, model)
                                   for i in self.indexes.values()):
            return False
        sizes = [(self.fitting.footprint_mib(i, model), i.usable_mib)
                 for i in self.indexes.values()]
        return all(need is not None and usable is not None and need > usable
                   for need, usable in sizes)

    def joinable(self, index: ProviderIndex, model: str) -> bool:
        """A copy (warm or loading) is on the card and its context holds this call."""
        return (index.is_warm(model) or index.is_loading(model)) and \
            self.fitting.copy_problem(index, model,
                                      self.fitting.copy_context(index, model)) is None

    def could_hold(self, index: ProviderIndex, model: str) -> bool:
        """The model is on the card (or its catalog is unknown) and a copy loaded for this
        call is no larger than the card (or either size is unknown), busy or not."""
        need = self.fitting.footprint_mib(index, model)
        if index.usable_mib is not None and need is not None and need > index.usable_mib:
            return False
        return _pulled_on(index, model)

    def unreachable_holders(self, model: str) -> list[tuple[str, str]]:
        """The cards that could hold a copy of `model` for this call, each with why it is
        unreachable, when all of them are; else [] (a reachable one is merely busy). A card
        whose Ollama refuses the call (a path its version lacks), or whose context cannot
        hold its prompt, is none of them: up, it still could not serve it."""
        down: list[tuple[str, str]] = []
        for index in self.indexes.values():
            if not self.could_hold(index, model) or self.fitting.lacking(index, model) or \
                    not self.gives_prompt_room(index, model):
                continue
            why = health_reason(index, self.snapshot.health)
            if why is None:
                return []
            down.append((index.name, why))
        return down

    def own_context(self) -> int:
        """The context the call's own num_ctx gives an acceptable model, as Ollama floors it
        (4; vision models 2048) before any trained cap."""
        return max(context.for_card(i.view, self.fitting.sizer.info(c.model, i.view),
                                    self.call.num_ctx, as_sent=False).requested
                   for i in self.indexes.values() for c in self.acceptable)

    def largest_context(self, index: ProviderIndex, model: str, whole: bool = False) -> int:
        """The largest context a copy of `model` has or gets here; unless `whole`, an
        embedding input's window in it (docs/engine.md, "A prompt that does not fit")."""
        copy = index.residents.get(model)
        recorded = copy.context_length if copy else 0
        trained = self.fitting.trained(index, model)
        largest = max(context.effective(recorded, trained),
                      self.fitting.load(index, model)[0].context)
        return largest if whole else self.fitting.window(index, model, largest)

    def holds_prompt(self, model: str) -> bool | None:
        """Whether a card that could hold the model gives it a context that holds the prompt
        (an unknown context does); None when no card could hold the model at all."""
        could_hold = False
        for index in self.indexes.values():
            if not self.could_hold(index, model):
                continue
            could_hold = True
            if self.gives_prompt_room(index, model):
                return True
        return False if could_hold else None

    def gives_prompt_room(self, index: ProviderIndex, model: str) -> bool:
        """The copy of `model` here, or one loaded for this call, has a context that holds
        the prompt (an unknown context does)."""
        copy = index.residents.get(model)
        if copy is not None and not self.fitting.copy_problem(index, model,
                                                              copy.context_length):
            return True
        resolved = self.fitting.load(index, model)[0]
        return not self.fitting.context_problem(index, model, resolved.context)

    def place(self) -> Decision:
        decision = self.decide()
        if decision.placement is None or not self.joined:
            return decision
        placement = on_copy(decision.placement, self.joined)
        reason = decision.reason
        if placement.copy and not decision.placement.copy:
            reason += f", on the copy of {placement.copy} (one weights file)"
        return replace(decision, placement=placement, reason=reason)

    def decide(self) -> Decision:
        preferred = self.call.preferred.model
        if not self.indexes:
            return Decision("wait", None, "no provider is known")
        # Steps 1-3: copies that cost no load.
        hit = self.copy_with_room(preferred, 1)
        for candidate in self.alternatives:
            if hit is not None:
                break
            hit = self.copy_with_room(candidate.model, 2)
        for candidate in self.acceptable:
            if hit is not None:
                break
            hit = self.copy_with_room(candidate.model, 3, loading_only=True)
        if hit is not None and self.call.conversation is not None:
            holder = self.cache_holder_instead(hit)
            if holder is not None and holder.kind == "queued":
                return Decision("wait", None, f"wait for a slot of {holder.model} on "
                                f"{holder.provider}, which holds the conversation "
                                f"({holder.cost_s:.1f} s), cheaper than reading it again on "
                                f"{hit.provider} ({hit.cost_s:.1f} s)", (), holder.cost_s)
            hit = holder or hit
            instead = self.instead_of_displacing(hit)
            if instead is not None and instead.kind == "queued":
                return Decision("wait", None, f"wait for a slot of {instead.model} on "
                                f"{instead.provider}, which has a free cache slot "
                                f"({instead.cost_s:.1f} s), cheaper than pushing a live "
                                f"history out of {hit.provider} ({hit.cost_s:.1f} s)",
                                (), instead.cost_s)
            if instead is not None:
                return Decision("placed", instead, f"step 4: {instead.kind} on "
                                f"{instead.provider} ({instead.cost_s:.1f} s), cheaper than "
                                f"pushing a live history out of {hit.provider} "
                                f"({hit.cost_s:.1f} s)")
        if hit is not None:  # (every card's verdict is explain's to give)
            return Decision("placed", hit, f"step {hit.step}: {hit.kind} copy on {hit.provider}")
        verdicts = self.weigh_room(self.weighed(preferred))
        # Step 4: the weighted cost for the preferred model.
        hit = self.weighted(verdicts)
        if hit is not None and hit.kind == "queued" and self.line_ahead(preferred):
            instead = self.alternative_load(hit.cost_s)
            if instead is not None:
                return self.loading_alternative(instead, f"waiting for a slot of {preferred} "
                                                f"({hit.cost_s:.1f} s)", verdicts)
        # Late binding: a full copy worth waiting for is waited for in the sidecar (weighted
        # offers none the call may not wait for)
        if hit is not None and hit.kind == "queued":
            slot = next(v for v in verdicts
                        if (v.provider, v.model) == (hit.provider, hit.model))
            return Decision("wait", None, f"step 4: wait for a slot of {hit.model} on "
                            f"{hit.provider} ({hit.cost_s:.1f} s), cheaper than a load",
                            tuple(verdicts), self.own_wait_s(slot))
        if hit is not None:
            return Decision("placed", hit, f"step 4: {hit.kind} on {hit.provider}"
                            f"{self.over_a_wait(verdicts, hit)}", tuple(verdicts))
        refusal = self.classify(verdicts)
        why = None
        if refusal is not None and refusal[0] == "model-not-found":
            why = f"{preferred} is on no provider's disk"
        elif refusal is not None and refusal[0] == "unsupported":
            why = f"Ollama refuses the call on {preferred} ({refusal[1]})"
        elif refusal is not None and refusal[0] == "model-too-large":
            why = f"{preferred} fits no GPU"
        elif self.holds_prompt(preferred) is False:
            why = f"no GPU gives {preferred} the context for this prompt"
        fallback = self.fall_back(why) if why is not None else None
        if fallback is not None:
            return fallback
        if refusal is not None:
            outcome, sentence = refusal
            lack = self.unsupported(preferred) if outcome == "unsupported" else None
            return Decision(outcome, None, sentence, tuple(verdicts),  # type: ignore[arg-type]
                            status=lack.status if lack is not None else 0)
        queue = queue_option(self.indexes.values(), [c.model for c in self.acceptable],
                             self.fitting, self.snapshot, self.policy)
        unload = unload_option(self.indexes.values(), preferred, self.fitting, self.snapshot,
                               self.policy)
        doomed = queue is not None and self.wait_loses(queue)
        if self.alternatives and (queue is None or doomed or self.line_ahead(preferred)):
            waited = math.inf if queue is None or not self.call.can_wait else \
                queue.wait_s + ((self.call.wait_left_s or 0.0) if doomed else 0.0)
            bar = min(waited, unload.cost_s if unload else math.inf)
            instead = self.alternative_load(bar)
            if instead is not None:
                return self.loading_alternative(
                    instead, f"step 5 for {preferred} "
                    f"({f'{bar:.1f} s' if bar < math.inf else 'only a wait'})", verdicts)
        return self.queue_or_unload(verdicts, queue, unload)

    def line_ahead(self, model: str) -> bool:
        """Calls of `model` are ahead of this one for its copies' slots: queued in an engine
        beyond them, or waiting in a sidecar with a sooner turn. Without them a load would
        serve this call alone (rules.md, "Waiting for a slot counts the calls behind it")."""
        return queued_in_engines(self.indexes.values(), model).calls + \
            self.line(model).calls > 0

    def line(self, model: str) -> Backlog:
        """`waiting_line` for the call, worked out once per model: each full copy weighed
        asks it of the whole fleet."""
        found = self.lines.get(model)
        if found is None:
            found = self.lines[model] = waiting_line(self.indexes.values(), model,
                                                     self.snapshot, self.call.turn)
        return found

    def own_wait_s(self, option: Verdict | QueueOption) -> float:
        """The call's own wait at a full copy: for its slot behind the calls running and
        queued there and the calls waiting with sooner turns, and for a copy still loading;
        not what its run would cost once started, nor what it adds to the calls behind it."""
        if isinstance(option, QueueOption):
            return option.wait_s
        ahead = self.line(option.model)
        line_s = ahead.delay_s(call_length(option.provider, option.model, self.call,
                                           self.snapshot, self.policy).seconds)
        return option.terms.get("queue", 0.0) + option.terms.get("load", 0.0) + line_s

    def wait_loses(self, option: Verdict | QueueOption) -> bool:
        """Waiting for a slot at this option (a full copy's verdict, or step 5's queue) loses
        to a load, even a dearer one: the call cannot wait for a slot at all, or the wait is
        expected to outlast what is left of its wait limit (it would end in gpu-busy; a load
        places the call at once). For the limit, only a load that starts the call at most
        the time left later than the wait would (`load_beats_wait`)."""
        if isinstance(option, Verdict):
            index = self.indexes[option.provider]
            if not (index.is_warm(option.model) or index.is_loading(option.model)) or \
                    index.free_slots(option.model) > 0:
                return False  # a load, or a free slot: no wait
        left = self.call.wait_left_s
        return not self.call.can_wait or (left is not None and self.own_wait_s(option) > left)

    def load_beats_wait(self, load_s: float, wait: Verdict | QueueOption) -> bool:
        """A load of `load_s` is taken over a wait that loses (`wait_loses`): always for a call
        that cannot wait; for one whose wait outlasts its limit, when the load starts it no
        more than the time left after the wait would have (a copy that takes minutes to
        load for a call whose slot is seconds away is no better than the refusal)."""
        return not self.call.can_wait or \
            load_s <= self.own_wait_s(wait) + (self.call.wait_left_s or 0.0)

    def unloads_nothing_needed(self, unload: UnloadOption) -> bool:
        """Its victims are expected back by no one: their unload is all it costs beside the
        load (a call whose wait outlasts its limit unloads no model in demand for it)."""
        victims_s = unload.cost_s - unload.load_s
        return victims_s <= unload.unload_s + 1e-9

    def why_not_wait(self) -> str:
        if not self.call.can_wait:
            return "is not for this call, which cannot wait"
        return f"would outlast the {self.call.wait_left_s or 0.0:.1f} s left of its wait limit"

    def over_a_wait(self, verdicts: Iterable[Verdict], hit: Placement) -> str:
        """Why step 4 placed `hit` over a cheaper wait for a slot, or ""."""
        waits = [v for v in verdicts if v.feasible and v.cost_s < hit.cost_s and
                 self.wait_loses(v)]
        if not waits:
            return ""
        wait = min(waits, key=_rank)
        return (f" ({hit.cost_s:.1f} s): waiting for a slot of {wait.model} on "
                f"{wait.provider} ({self.own_wait_s(wait):.1f} s) {self.why_not_wait()}")

    def alternative_load(self, bar_s: float) -> Placement | None:
        """An in-tolerance candidate loaded onto free room, when the preferred model can only
        be waited for behind other calls (its copies full and no room for another, or step
        5) and the load costs less than that wait (`bar_s`): the agent accepts the candidate,
        and room left free serves no one. No other model is unloaded for it."""
        best: Placement | None = None
        for alternative in self.alternatives:
            found = self.weighted(self.weigh_room(self.weighed(alternative.model)))
            if found is not None and found.kind == "cold" and found.cost_s < bar_s:
                best, bar_s = found, found.cost_s
        return best

    @staticmethod
    def loading_alternative(instead: Placement, than: str, verdicts: list[Verdict]
                            ) -> Decision:
        return Decision("placed", instead, f"step 4: a cold load of "
                        f"{instead.model}, in tolerance, on {instead.provider} "
                        f"({instead.cost_s:.1f} s), sooner than {than}", tuple(verdicts))

    def fall_back(self, why: str) -> Decision | None:
        """The preferred model is on no provider's disk, fits no card, or no card gives it
        the prompt's context: plan the best in-tolerance candidate that could, as if it were
        preferred (the tolerance floor stays where it was). Steps 1-3 take a warm copy of
        any such candidate already, so without this a call's answer would depend on whether
        someone else had loaded one."""
        preferred = self.call.preferred
        for alternative in self.alternatives:
            if not self.pulled_anywhere(alternative.model) or \
                    self.unsupported(alternative.model) is not None or \
                    self.too_large_everywhere(alternative.model):
                continue
            rest = tuple(c for c in self.call.candidates
                         if c.model not in (preferred.model, alternative.model))
            narrowed = replace(self.call, candidates=(alternative, *rest),
                               tolerance=max(0.0, self.call.tolerance)
                               - (preferred.score - alternative.score))
            decision = _Planner(narrowed, self.snapshot, self.policy).place()
            if decision.outcome not in ("model-too-large", "prompt-too-large",
                                        "model-not-found", "unsupported"):
                return replace(decision, reason=f"{why}; {decision.reason}")
        return None

    def queue_or_unload(self, verdicts: list[Verdict], queue: QueueOption | None,
                        unload: UnloadOption | None) -> Decision:
        """Step 5: wait for a slot or unload, the cheaper; a wait that loses to any load
        (`wait_loses`) loses to the unload. With neither, or only a wait this call cannot
        make, the decision is "wait" (the scheduler sends a call that cannot wait to the
        static endpoint, or refuses it gpu-busy)."""
        preferred = self.call.preferred.model
        loses = queue is not None and self.wait_loses(queue)
        takes_unload = loses and unload is not None and queue is not None and \
            self.load_beats_wait(unload.cost_s, queue) and \
            (not self.call.can_wait or self.unloads_nothing_needed(unload))
        choice = queue_wins(None if takes_unload else queue, unload)
        loses = loses and (takes_unload or unload is None)
        queue_s = queue.wait_s if queue else None
        unload_s = unload.cost_s if unload else None
        if choice is False and unload is not None:
            verdict = next(v for v in verdicts if v.provider == unload.provider)
            placement = self.placement(verdict, "evict", 5,
                                       {v.model: v.footprint_mib for v in unload.victims},
                                       unload.cost_s)
            victims = ", ".join(v.model for v in unload.victims)
            than = "none" if queue is None else f"{queue.wait_s:.1f} s"
            beats = f"though waiting for a slot ({than}) {self.why_not_wait()}" if loses \
                else f"beats queueing ({than})"
            return Decision("placed", placement,
                            f"step 5: unloading {victims} on {unload.provider} "
                            f"({unload.cost_s:.1f} s), {beats}",
                            tuple(verdicts), queue_s, unload_s)
        if choice is True and queue is not None:
            slot = f"a slot of {queue.model} on {queue.provider} ({queue.wait_s:.1f} s)"
            if not self.call.can_wait:
                reason = f"busy: the only option is waiting for {slot}, and this call cannot wait"
            elif loses:
                reason = (f"busy: wait for {slot}, though it {self.why_not_wait()}: nothing "
                          "can be loaded or unloaded")
            else:
                reason = (f"busy: wait for {slot} is no worse than unloading "
                          f"({'impossible' if unload is None else f'{unload.cost_s:.1f} s'})")
        elif (down := self.unreachable_holders(preferred)) or (
                verdicts and all(v.reason in UNREACHABLE for v in verdicts)):
            named = down or [(v.provider, v.reason) for v in verdicts]
            listed = ", ".join(f"{name}: {why}" for name, why in named)
            reason = f"{NO_PROVIDER_REACHABLE} ({listed}); waiting for one to come back"
        else:
            reason = ("busy: every card that could hold the model is full of work; "
                      "waiting for memory")
        return Decision("wait", None, reason, tuple(verdicts), queue_s, unload_s)


# A floor this close above the bar (relatively) is not passed over: sums of the same terms
# in another order may differ in their last bits
_FLOOR_MARGIN = 1e-9


def _pulled_on(index: ProviderIndex, model: str) -> bool:
    """The model is on the card's disk, or loaded there, or its catalog is unknown: a card
    without a listing now goes by the one it gave last (an empty one too: it had none), and
    only a card never listed may have any model (a mistyped name is not waited for while a
    card that lacked it is down)."""
    return model in index.residents or not not_listed(index.view, model)


def _rank(verdict: Verdict) -> tuple[float, str]:
    """Cheapest first; a tie goes to the provider whose name sorts first."""
    return verdict.cost_s, verdict.provider


def place(call: CallSpec, snapshot: Snapshot, policy: Policy = DEFAULT_POLICY) -> Decision:
    """Pure and deterministic: the same inputs always give the same decision (the fleet's
    sizing and the last snapshot's indexes are kept between calls, core/sizing.py and
    core/occupancy.py, as figures of those inputs alone). Its verdicts are the cards it
    weighed, with `takes_room` where it could decide; a card whose load could not win is
    passed over (`weighed`). explain's are every card's, with every term."""
    return _Planner(call, snapshot, policy).place()


# The most models one wait entry keeps from eviction, in the call's order of preference: the
# entry is rewritten on every refresh, and a long candidate list would grow every one of them
MAX_BACKED = 16


def runnable_alternatives(call: CallSpec, snapshot: Snapshot, policy: Policy = DEFAULT_POLICY
                          ) -> tuple[str, ...]:
    """The call's in-tolerance candidates besides its preferred model that some card could
    hold (on its disk, no larger than it, busy or not) and that Ollama would not refuse it
    on: the models a waiting call could run on (steps 2-3 take their copies), whose copies
    its wait entry keeps from eviction (service/demand.py `also`). Asked once per wait, not
    per decision."""
    planner = _Planner(call, snapshot, policy)
    runnable = (c.model for c in planner.alternatives
                if planner.unsupported(c.model) is None and
                any(planner.could_hold(i, c.model) for i in planner.indexes.values()))
    return tuple(islice(runnable, MAX_BACKED))


def explain(call: CallSpec, snapshot: Snapshot, policy: Policy = DEFAULT_POLICY
            ) -> tuple[Decision, tuple[Verdict, ...]]:
    """The decision plus every provider's verdict for every acceptable model."""
    planner = _Planner(call, snapshot, policy, detailed=True)
    verdicts = tuple(planner.verdict(i, c.model) for c in planner.acceptable
                     for i in planner.indexes.values())
    return planner.place(), verdicts
