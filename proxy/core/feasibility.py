"""The hard filters, each rejection with a reason: health, context window, VRAM fit.

`Fitting` is one call's view of the cards: the context a copy loaded for it would get (as
Ollama resolves it), whether a loaded copy's context holds it, and what a load takes.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, replace

from proxy.core import context, engines
from proxy.core.context import Resolved, parse_version
from proxy.core.models import not_listed
from proxy.core.occupancy import (
    Load,
    ProviderIndex,
    loaded_limit,
    same_runner,
    sibling_loading,
)
from proxy.core.sizing import Footprint, Sizer, admission_rule
from proxy.core.types import CallSpec, Circuit, Lack, ProviderHealth, Resident

HEALTHY = ProviderHealth()


@dataclass(frozen=True, slots=True)
class Fit:
    ok: bool
    reason: str
    warm: bool = False
    loading: bool = False


class Fitting:
    """One call against every card; footprints and contexts worked out once per card."""

    def __init__(self, call: CallSpec, sizer: Sizer, declared: Mapping[str, int | None],
                 unknown_mib: int) -> None:
        self.call = call
        self.unknown_mib = unknown_mib  # what the claim counts of a load of unknown size
        self.sizer = sizer
        self.declared = declared
        self.requested = call.num_ctx if call.pins_context else 0  # num_ctx a load asks for
        # (card, model) -> the model of its weights file whose copy a card's index lists as
        # `model`'s own (shared_copies.as_own_copy): that model loaded it, with its own ask
        self.loaded_as: dict[tuple[str, str], str] = {}

    def trained(self, index: ProviderIndex, model: str) -> int:
        info = self.sizer.info(model, index.view)
        return info.trained_context if info is not None else 0

    def resolve(self, index: ProviderIndex, model: str, requested: int) -> Resolved:
        return context.for_card(index.view, self.sizer.info(model, index.view), requested)

    def load(self, index: ProviderIndex, model: str) -> tuple[Resolved, Footprint | None]:
        """The context a copy loaded here for this call gets, and its footprint. A call over
        Ollama's own API that leaves the context to Ollama gets, on a card whose memory the
        automatic context does not fit, the largest of Ollama's lower steps that fits (the
        steps Ollama lowers an automatic context to once when such a load runs out of
        memory): the sidecar sends it as num_ctx, so the copy never spills to the CPU."""
        declared = self.declared.get(model)
        found = self.sizer.load(model, index.view, self.requested, declared)
        resolved, footprint = found
        usable = index.usable_mib
        if not (resolved.automatic and self.call.pins_context and footprint is not None
                and usable is not None and footprint.total_mib > usable):
            return found
        for step in context.lower_automatic(resolved.context):
            lowered, smaller = self.sizer.load(model, index.view, step, declared)
            if smaller is not None and smaller.total_mib <= usable:
                return replace(lowered, source=f"{resolved.source}, lowered to fit",
                               lowered_from=resolved.context), smaller
        return found

    def lacking(self, index: ProviderIndex, model: str) -> Lack | None:
        """Ollama's refusal of this call on `model` on this card (the first capability it
        needs that the model's /api/show does not list; an embedding the card's Ollama cannot
        run with it), None when it can or that is not known."""
        call = self.call
        if call.served and (wrong := engines.path_refusal(call.path, call.served,
                                                          index.view.version)):
            return wrong
        if (call.refused_by or call.body_check) and (wrong := engines.body_refusal(
                call.refused_by, index.view.version, call.body_check)):
            return wrong
        if not call.needs and not call.embeds:
            return None
        info = self.sizer.info(model, index.view)
        if call.embeds:
            return engines.embedding_refusal(info, index.view.version, call.embeds)
        if info is None or info.capabilities is None:
            return None
        return next((Lack(refusal) for capability, refusal in call.needs
                     if not engines.has_capability(info, capability, index.view.version)),
                    None)

    def window(self, index: ProviderIndex, model: str, ctx: int) -> int:
        """The tokens this call's prompt may take in a slot of `ctx` tokens: the context, or
        for an embedding input the batch llama-server takes it in, where that is less."""
        if self.call.generates:
            return ctx
        return engines.embedding_window(self.sizer.info(model, index.view), index.view.version,
                                        ctx)

    def footprint_mib(self, index: ProviderIndex, model: str) -> int | None:
        footprint = self.load(index, model)[1]
        return footprint.total_mib if footprint is not None else None

    def context_problem(self, index: ProviderIndex, model: str, ctx: int) -> str | None:
        """Why a copy with `ctx` tokens per slot cannot take this call; None if it can (an
        unknown context, 0, never refuses)."""
        call = self.call
        if not ctx:
            return None
        if call.num_ctx:
            trained = self.trained(index, model)
            wanted = min(call.num_ctx, trained) if trained else call.num_ctx
            if ctx < wanted:
                return f"context {ctx} tokens is less than the num_ctx {wanted} asked for"
        window = self.window(index, model, ctx)
        if not context.fits(call.prompt_tokens, window, call.answer_tokens, call.generates,
                            call.answer_capped):
            spare = context.reserve(window, call.answer_tokens, call.generates,
                                    call.answer_capped, call.prompt_tokens)
            room = f"context {ctx} tokens" if window == ctx else \
                f"the embedding batch of {window} tokens (context {ctx})"
            return (f"{room} cannot hold the prompt ({call.prompt_tokens} tokens "
                    f"+ {context.kept(spare, call.generates)})")
        return None

    def copy_problem(self, index: ProviderIndex, model: str, recorded: int) -> str | None:
        """Why the copy loaded (or being loaded) with num_ctx `recorded` cannot take this
        call without Ollama reloading it or cutting the prompt."""
        if recorded and not self.call.pins_context:
            default = self.resolve(index, model, 0)
            if default.requested and self.reloads(index, model, recorded, default.requested):
                recorded = self.as_loaded(index, model, recorded)
                return (f"loaded with num_ctx {recorded}; a call over the OpenAI or Anthropic "
                        f"API gets Ollama's default {default.requested} there and would "
                        "reload it")
        return self.context_problem(index, model,
                                    context.effective(recorded, self.trained(index, model)))

    def stale_copy(self, index: ProviderIndex, model: str) -> Resident | None:
        """An idle copy Ollama still lists but that may expire before a call arrives, loaded
        with a context other than this call's load would ask for: a load then makes Ollama
        reload it, so it is planned as that copy's eviction."""
        if model in index.residents or model not in index.loaded_models:
            return None  # (loaded_models holds every model the card lists)
        listed = next((r for r in index.view.residents
                       if r.model == model and not r.leaving), None)
        if listed is None or not listed.context_length:
            return None
        resolved = self.load(index, model)[0]
        return listed if self.reloads(index, model, listed.context_length,
                                      resolved.requested) else None

    def sibling(self, index: ProviderIndex, model: str) -> str | None:
        """Another model here made from `model`'s weights file (`ollama create` FROM it, a
        name with a Modelfile of its own) that a load of `model` would make Ollama reload:
        one being loaded or unloaded, or one loaded with other runner options than that
        load's (ModelInfo.runner, or a context it would not ask for). Ollama runs one copy
        per weights file (server/sched.go schedulerModelKey) and reloads it when a call's
        runner options differ (needsReload), so the load is planned as the copy's eviction
        once the copy is loaded and idle. Where the options match, Ollama has the call join
        the copy (`joined_sibling`, weighed first); a matching copy that may expire before
        the call arrives is planned beside, counting the memory twice until the next probe
        (the safe side)."""
        view = index.view
        # (as the claim reads it: a load still making room is not in `index.loading`)
        loading = sibling_loading(view, model, index.tickets,
                                  {r.model for r in view.residents})
        if loading is not None:
            return loading
        leaving = leaving_sibling(index, model)
        if leaving is not None:
            return leaving
        resolved = None
        for other in index.siblings(model):
            if not same_runner(view, model, other):
                return other
            copy = self.copy_context(index, other) or next(
                (r.context_length for r in view.residents if r.model == other), 0)
            resolved = resolved or self.load(index, model)[0]
            if copy and self.reloads(index, other, copy, resolved.requested):
                return other
        return None

    def joined_sibling(self, index: ProviderIndex, model: str,
                       excluded: Container[str] = ()) -> str | None:
        """Another model of `model`'s weights file whose copy here Ollama would have this
        call join (core/shared_copies.py): loaded to last or being loaded, not leaving, with
        runner options a call for `model` shares (`same_runner`), and a context that holds
        the call as it is sent (`copy_problem`: a call over Ollama's API carries the copy's
        num_ctx, one over another API gets Ollama's default); nor may the call need what
        `model` lacks. None when `model` has a copy of its own here, or no such copy is
        here. A model in `excluded` (one the call may run as) is passed over where it can
        take the call."""
        if model in index.loaded_models:
            return None
        siblings = index.siblings(model)
        if not siblings or self.lacking(index, model) is not None:
            return None
        for other in siblings:
            # (one that may expire before the call arrives, or whose load is still making
            # room, is no copy to count on: `sibling` weighs those)
            lasting = other in index.residents or other in index.loading
            runs_as_other = other in excluded and self.lacking(index, other) is None
            if lasting and not runs_as_other and other not in index.leaving and \
                    other not in index.planned_victims and \
                    same_runner(index.view, model, other) and \
                    self.copy_problem(index, model, self.copy_context(index, other)) is None:
                return other
        return None

    def copy_context(self, index: ProviderIndex, model: str) -> int:
        """num_ctx as loaded for the copy this call would join (resident or loading): what
        the call is sent with, so Ollama does not reload it."""
        resident = index.residents.get(model)
        if resident is not None:
            return self.as_loaded(index, model, resident.context_length)
        loader = index.loading.get(model)
        return loader.context if loader is not None else 0

    def reloads(self, index: ProviderIndex, model: str, recorded: int, asked: int) -> bool:
        """Whether Ollama reloads the copy of `model` recorded with num_ctx `recorded` for a
        call sent with `asked` (context.reloads_for)."""
        return context.reloads_for(self.as_loaded(index, model, recorded), asked,
                                   self.trained(index, model),
                                   parse_version(index.view.version))

    def as_loaded(self, index: ProviderIndex, model: str, recorded: int) -> int:
        """A copy's recorded num_ctx as it was loaded (context.as_loaded: from 0.15.5 to
        0.29 a listing at the trained cap does not say), by the ask of the model that
        loaded it: for another model's copy of its weights file listed as its own, that
        model's (a Modelfile's num_ctx makes each name's ask its own)."""
        trained = self.trained(index, model)
        if not trained or recorded < trained:  # (under the cap: no default to work out)
            return recorded
        loader = self.loaded_as.get((index.name, model), model)
        return context.as_loaded(recorded, self.resolve(index, loader, 0).requested, trained,
                                 parse_version(index.view.version))


def leaving_sibling(index: ProviderIndex, model: str) -> str | None:
    """Another model of `model`'s weights file whose copy here is being unloaded: Ollama
    keeps it until its calls end, and a call for `model` finds it there, so any load of
    `model` (a reload of its own copy too) waits until it is gone."""
    return next((other for other in index.siblings(model) if other in index.leaving), None)


def loading_unclaimed(index: ProviderIndex, model: str) -> str | None:
    """A copy of `model`'s weights file whose load was sent and not seen through, its call
    gone (a plan dropped, an agent that left): Ollama neither lists nor expires a copy
    before it is loaded, so an unload asked now is lost, and a load of `model` at other
    options would have Ollama reload it itself. Such a load waits until it is seen."""
    names = {model, *index.siblings(model)}
    return next((r.model for r in index.view.residents if r.loading and r.model in names),
                None)


NOT_READY = "provider not ready"
CIRCUIT_OPEN = "circuit open after repeated failures"
UNREACHABLE = frozenset((NOT_READY, CIRCUIT_OPEN))


def health_reason(index: ProviderIndex, health: Mapping[str, ProviderHealth]) -> str | None:
    if not index.view.ready:
        return NOT_READY
    state = health.get(index.name, HEALTHY).circuit
    if state is Circuit.OPEN:
        return CIRCUIT_OPEN
    return None


def check(index: ProviderIndex, model: str, fitting: Fitting,
          health: Mapping[str, ProviderHealth]) -> Fit:
    """Can `model` run on this provider for this call?"""
    bad = health_reason(index, health)
    if bad:
        return Fit(False, bad)
    lacks = fitting.lacking(index, model)
    if lacks is not None:
        return Fit(False, f"Ollama refuses the call on this model: {lacks.message}")
    warm = index.is_warm(model)
    if warm or index.is_loading(model):
        problem = fitting.copy_problem(index, model, fitting.copy_context(index, model))
        if problem is None:
            return Fit(True, "warm" if warm else "loading", warm=warm, loading=not warm)
        return Fit(False, problem)  # a reload may serve it: step 5 weighs that
    if model in index.planned_victims:
        return Fit(False, "resident but planned for eviction by another call")
    if model in index.leaving:
        return Fit(False, "being unloaded (keep_alive 0); placed again once it is gone")
    if model in index.making_room:  # joinable once its victims are gone; a second load is refused
        return Fit(False, "being loaded here once the copies it unloads are gone")
    if not_listed(index.view, model):
        return Fit(False, "model not pulled on this provider")
    resolved, footprint = fitting.load(index, model)
    short = fitting.context_problem(index, model, resolved.context)
    if short:
        return Fit(False, short)
    leaving = leaving_sibling(index, model)
    if leaving is not None:
        return Fit(False, f"{leaving}, of the same weights file, is being unloaded here: "
                          f"a load of {model} waits until it is gone")
    stale = fitting.stale_copy(index, model)
    if stale is not None:
        return Fit(False, f"an idle copy with num_ctx {stale.context_length} is still listed: "
                          f"a load at {resolved.context} reloads it (planned as its eviction)")
    joined = fitting.joined_sibling(index, model)
    if joined is not None:  # (the call may run there as that model, a candidate of its own)
        return Fit(False, f"Ollama would run the call on the copy of {joined} here (one "
                          "weights file), not load another")
    sibling = fitting.sibling(index, model)
    if sibling is not None:
        return Fit(False, f"{sibling} is loaded from the same weights file: Ollama runs one "
                          f"copy of it, so a load of {model} reloads that copy (planned as "
                          "its eviction once it is loaded and idle)")
    if index.models_over_limit(model):
        limit = loaded_limit(index.view.max_loaded, index.view.gpus)
        return Fit(False, f"{limit} models loaded, the most this Ollama keeps "
                          "(OLLAMA_MAX_LOADED_MODELS): one must be unloaded first")
    usable = index.usable_mib
    if usable is None or footprint is None:
        free = index.free_mib()
        if free is not None and free < fitting.unknown_mib:
            return Fit(False, f"its size is unknown and only {free} MiB is free beside "
                              "residents")
        return Fit(True, "fit unknown (no VRAM total or no footprint published)")
    need = footprint.total_mib
    if need > usable:
        return Fit(False, f"needs {need} MiB at context {resolved.context}, card has "
                          f"{usable} MiB usable")
    free = index.free_mib()
    assert free is not None
    if need > free:
        return Fit(False, f"needs {need} MiB, {free} MiB free beside residents")
    if not index.admits(Load(model, need, footprint.estimate_mib)):
        if index.view.gpus > 1:
            return Fit(False, f"Ollama would unload a model first or spill: {need} MiB "
                              f"spread over {index.view.gpus} GPUs (or its estimate "
                              f"{footprint.estimate_mib} MiB) does not fit beside residents")
        bound = "over 80 % of" if admission_rule(index.view) else "more than"
        return Fit(False, f"Ollama would unload a model first: its estimate "
                          f"{footprint.estimate_mib} MiB is {bound} the memory free")
    return Fit(True, f"fits: {need} MiB of {free} MiB free")
