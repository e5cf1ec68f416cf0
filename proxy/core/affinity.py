"""Conversation cache affinity as a cost in seconds (docs/affinity.md).

A call's prefill on a copy: the time to evaluate its prompt there from the end of the prefix
the copy is expected to hold to its end, at the copy's learned rate (deeper tokens slower:
core/prefill.py). It adds to the queue and load
terms, so a tool loop's next call goes back to the copy holding its history when that saves
more than it waits, and elsewhere when that copy's queue costs more than reading it again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from proxy.core.conversations import PromptCaches, cache_slots
from proxy.core.occupancy import ProviderIndex
from proxy.core.tokens import CONVERSATION_KEYS, SHARED_KEYS, PromptSize, prompt_size
from proxy.core.types import CallSpec, Snapshot

# What pushing another conversation's prompt out of a copy is charged, of the prefill it will
# cost that conversation later: a tool loop's conversation nearly always comes back.
DISPLACED_WEIGHT = 1.0


def expected_cached(index: ProviderIndex, model: str, call: CallSpec, snapshot: Snapshot
                    ) -> int:
    """The tokens of the call's prompt this copy is expected to hold: none on a copy being
    loaded or not loaded, nor where the prompt no longer fits the copy's context."""
    conversation = call.conversation
    resident = index.residents.get(model)
    if conversation is None or resident is None or not index.is_warm(model):
        return 0
    if resident.context_length and conversation.tokens >= resident.context_length:
        return 0  # cut to fit: it starts differently from anything a slot holds
    slots = cache_slots(index.slots(model), index.view.version)
    return snapshot.caches.expected_cached(index.name, model, conversation, slots)


def prefill_terms(index: ProviderIndex, model: str, call: CallSpec, snapshot: Snapshot
                  ) -> dict[str, float]:
    """{"prefill": seconds} for a call that carries a conversation, and {"cache_eviction":
    seconds} where it would push another conversation's prompt out of a full copy; nothing
    for a call without one (it reads its whole prompt wherever it goes)."""
    conversation = call.conversation
    if conversation is None or not conversation.digests:
        return {}
    speed = snapshot.prefill.speed(index.name, model)
    cached = expected_cached(index, model, call, snapshot)
    terms = {"prefill": speed.seconds(cached, conversation.tokens)}
    if index.is_warm(model):
        slots = cache_slots(index.slots(model), index.view.version)
        displaced = snapshot.caches.displaced(index.name, model, conversation, slots,
                                              snapshot.now)
        if displaced:  # its conversation will read it again, here or elsewhere
            terms["cache_eviction"] = DISPLACED_WEIGHT * speed.seconds(0, displaced)
    return terms


def seen_loads(caches: PromptCaches, snapshot: Snapshot,
               shared: Iterable[tuple[str, str]] = ()) -> PromptCaches:
    """The caches less what any sidecar's loads wiped: a live claim that loads a copy (cold,
    a reload) or evicts it, from its start; a copy absent from a reachable provider with no
    load under way, from now; a copy whose context changed, from when the old one was last
    seen. `shared`: the copies other sidecars hold prompts on (their loaded_at filters them)."""
    loading: set[tuple[str, str]] = set()
    for ticket in snapshot.tickets:
        if ticket.plan:
            continue  # a plan loads nothing until a call takes it
        if ticket.cold:
            loading.add((ticket.provider, ticket.model))
            caches = caches.wiped(ticket.provider, ticket.model, ticket.started_at)
        for victim in ticket.evicts:
            caches = caches.wiped(ticket.provider, victim, ticket.started_at)
    contexts = dict(caches.contexts)
    known: dict[str, list[str]] = {}  # per provider, in the order the copies are known
    for provider, model in {*caches.held, *contexts, *shared}:
        known.setdefault(provider, []).append(model)
    for view in snapshot.providers:
        if not view.ready:
            continue  # unreachable: its state is unknown, not empty
        present = {r.model: r for r in view.residents if not r.loading and not r.leaving}
        for model in known.get(view.name, ()):
            if model not in present and (view.name, model) not in loading:
                caches = caches.wiped(view.name, model, snapshot.now)
                contexts.pop((view.name, model), None)
        for model, resident in present.items():
            key = (view.name, model)
            before = contexts.get(key)
            if before is not None and 0 < before[0] != resident.context_length > 0:
                caches = caches.wiped(view.name, model, before[1])
            contexts[key] = (resident.context_length, snapshot.now)
    return replace(caches, contexts=contexts)


def holder(indexes: Iterable[ProviderIndex], models: Sequence[str], call: CallSpec,
           snapshot: Snapshot) -> tuple[ProviderIndex, str] | None:
    """The warm copy of an acceptable model expected to hold most of the call's prompt."""
    if call.conversation is None:
        return None
    best: tuple[int, str, ProviderIndex, str] | None = None
    for index in indexes:
        for model in models:
            cached = expected_cached(index, model, call, snapshot)
            if cached and (best is None or (-cached, index.name) < (-best[0], best[1])):
                best = (cached, index.name, index, model)
    return None if best is None else (best[2], best[3])


def shared_prompt_size(body: dict[str, Any]) -> PromptSize:
    """What every conversation of the agent shares at the start of its prompt: the system
    text, instructions and tools, and the first message (its system prompt, in chat)."""
    shared: dict[str, Any] = {k: body[k] for k in SHARED_KEYS if k in body}
    for key in CONVERSATION_KEYS:
        items = body.get(key)
        if isinstance(items, list) and items:
            shared[key] = items[:1]
            break
    return prompt_size(shared)
