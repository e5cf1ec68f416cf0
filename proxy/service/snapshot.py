"""Gathering the core's Snapshot from the store's mirror, the prober and local figures.

Decoded entries are cached by revision, so a placement decodes only what changed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from proxy.core.aliases import canonical_names, fold, names_here
from proxy.core.lengths import NO_LENGTHS, CallLengths
from proxy.core.load_times import LoadTimes
from proxy.core.models import listing, not_listed
from proxy.core.tickets import TicketSet, merge_recorded
from proxy.core.types import ModelDemand, ProviderHealth, ProviderView, Snapshot, Ticket
from proxy.ports import PROVIDER_STATE, Entry, StateStore
from proxy.service.codec import ProviderState, escape_key
from proxy.service.tickets import TicketBook
from proxy.settings import ProviderConfig

T = TypeVar("T")


class _Decoded:
    """key -> (revision, decoded value)."""

    def __init__(self) -> None:
        self._cache: dict[str, tuple[int, object]] = {}

    def get(self, key: str, entry: Entry, decode: Callable[[bytes], T]) -> T:
        hit = self._cache.get(key)
        if hit is not None and hit[0] == entry.revision:
            return hit[1]  # type: ignore[return-value]
        value = decode(entry.value)
        self._cache[key] = (entry.revision, value)
        return value


class StateView:
    def __init__(self, store: StateStore, configs: list[ProviderConfig],
                 local_states: Mapping[str, ProviderState], stale_s: float,
                 tickets: TicketBook) -> None:
        self.store = store
        self.configs = configs
        self.local_states = local_states  # the sidecar's own probes
        self.tickets = tickets  # the newest ticket sets, own writes included
        self.stale_s = stale_s
        self._states = _Decoded()
        self._cards: dict[str, _Card] = {}  # per card: see _card
        self._last: _Fleet | None = None  # the last snapshot's: see snapshot
        # the states the names were read from, and the names (the same object while equal)
        self._names: tuple[tuple[ProviderState | None, ...], Mapping[str, str]] = ((), {})

    def provider_state(self, name: str, now: float) -> ProviderState | None:
        """The freshest state for a provider: shared store or own probe, None if stale."""
        best: ProviderState | None = None
        entry = self.store.view(PROVIDER_STATE).get(escape_key(name))
        if entry is not None:
            try:
                best = self._states.get(name, entry, ProviderState.decode)
            except (ValueError, KeyError):
                best = None
        local = self.local_states.get(name)
        if local is not None and (best is None or local.last_probed_at > best.last_probed_at):
            best = local
        if best is None or now - best.last_probed_at > self.stale_s:
            return None
        return best

    def providers_with(self, model: str, now: float) -> list[str]:
        """Providers whose fresh state lists the model on disk or loaded."""
        out = []
        for config in self.configs:
            state = self.provider_state(config.name, now)
            if state is not None and state.ready and (
                    model in state.available_mib or model in state.loaded_mib):
                out.append(config.name)
        return out

    def canonical(self, now: float) -> Mapping[str, str]:
        """Each name that is one model with another -> the name it is placed under
        (core/aliases.py), from every fresh card's `/api/tags` digests."""
        return self._canonical(tuple(self.provider_state(c.name, now) for c in self.configs))

    def _canonical(self, states: tuple[ProviderState | None, ...]) -> Mapping[str, str]:
        seen, names = self._names
        if len(seen) == len(states) and all(a is b for a, b in zip(seen, states, strict=True)):
            return names
        found = canonical_names(s.digests for s in states if s is not None)
        # the same object while equal: every card's view is kept while its names are
        self._names = (states, names if found == names else found)
        return self._names[1]

    def placed_name(self, name: str) -> str:
        """The name the model Ollama lists as `name` is placed under (as the last snapshot
        read the names)."""
        return self._names[1].get(name, name)

    def known_models(self, now: float) -> set[str]:
        """Every model a fresh provider state lists on disk or loaded."""
        known: set[str] = set()
        for config in self.configs:
            state = self.provider_state(config.name, now)
            if state is not None:
                known.update(state.available_mib, state.loaded_mib)
        return known

    def any_ready(self, now: float) -> bool:
        """At least one provider with fresh state that can take calls."""
        return any((s := self.provider_state(c.name, now)) is not None and s.ready
                   for c in self.configs)

    def unreachable(self, now: float) -> set[str]:
        """Providers whose fresh state says they did not answer their last probe."""
        return {c.name for c in self.configs
                if (s := self.provider_state(c.name, now)) is not None and not s.ready}

    def stale_providers(self, now: float, margin: float = 0.5) -> list[str]:
        """Providers whose shared state is missing or older than margin x the limit."""
        out = []
        for config in self.configs:
            entry = self.store.view(PROVIDER_STATE).get(escape_key(config.name))
            fresh = False
            if entry is not None:
                try:
                    state = self._states.get(config.name, entry, ProviderState.decode)
                    fresh = now - state.last_probed_at <= self.stale_s * margin
                except (ValueError, KeyError):
                    fresh = False
            if not fresh or not self.store.connected:
                out.append(config.name)
        return out

    def ticket_set(self, name: str, now: float) -> TicketSet:
        try:
            return self.tickets.known(name)[0].live(now)
        except (ValueError, KeyError, TypeError):  # an entry no version of this writes
            return TicketSet()

    def provider_view(self, config: ProviderConfig, now: float) -> ProviderView:
        # (with the names the last snapshot read: what a decision on it goes on to do
        # sends each card its own name of the model placed)
        return self._card(config, now, self.provider_state(config.name, now),
                          self._names[1]).view

    def _card(self, config: ProviderConfig, now: float, state: ProviderState | None,
              canonical: Mapping[str, str]) -> _Card:
        """The card's view and live tickets, kept while what they are made of is the same:
        its state (the same object, fresh), its ticket set (the same object) and no ticket
        or entry of it expiring since. Every decision builds a snapshot, and a sidecar's
        waiting calls each decide again on every change of any card."""
        try:
            known = self.tickets.known(config.name)[0]
        except (ValueError, KeyError, TypeError):
            known = _NO_TICKETS
        if not (known.tickets or known.residents or known.loads):
            known = _NO_TICKETS  # (a card without an entry gets a new empty set each time)
        kept = self._cards.get(config.name)
        if kept is not None and kept.config is config and kept.state is state and \
                kept.known is known and kept.canonical is canonical and \
                kept.built_at <= now < kept.until:
            return kept
        if known is _NO_TICKETS:
            live, until = _NO_TICKETS, math.inf
        else:
            try:
                live, until = known.live(now), known.live_until(now)
            except (ValueError, KeyError, TypeError):
                live, until = _NO_TICKETS, math.inf
        card = _Card(config, state, known, canonical, now, until,
                     self._build_view(config, state, live, canonical), live)
        self._cards[config.name] = card
        return card

    @staticmethod
    def _build_view(config: ProviderConfig, state: ProviderState | None, live: TicketSet,
                    canonical: Mapping[str, str]) -> ProviderView:
        if state is None:
            return ProviderView(config.name, config.counted_total_mib(config.total_vram_mib),
                                ready=False,
                                context_length=config.context_length or 0,
                                max_parallel=config.max_parallel,
                                max_loaded=config.max_loaded_models, gpus=config.gpus,
                                weight=config.weight,
                                kv_cache_type=config.kv_cache_type,
                                flash_attention=config.flash_attention)
        view = ProviderView(
            name=config.name,
            total_vram_mib=state.total_vram_mib
            or config.counted_total_mib(config.total_vram_mib),
            ready=state.ready, residents=state.residents(),
            context_length=state.context_length or config.context_length or 0,
            max_parallel=state.max_parallel or config.max_parallel,
            max_loaded=config.max_loaded_models if state.max_loaded is None
            else state.max_loaded, gpus=config.gpus, weight=config.weight,
            disk_mib=state.available_mib, models=state.models, observed=state.observed,
            kv_cache_type=state.kv_cache_type, flash_attention=state.flash_attention,
            version=state.version,
            probed_at=state.last_probed_at, remote=state.remote, cloud_off=state.cloud_off,
            last_listed=frozenset() if state.available_mib else
            listing(state.listed_before or state.remote), listed=state.listed)
        if canonical:
            view = _one_name_a_model(view, state, canonical)
        return merge_recorded(_unlisted_leaving(view), live)

    def snapshot(self, now: float, health: Mapping[str, ProviderHealth],
                 demand: Mapping[str, ModelDemand], loads: LoadTimes,
                 extra_tickets: tuple[Ticket, ...] = (), lengths: CallLengths = NO_LENGTHS
                 ) -> Snapshot:
        states = tuple(self.provider_state(c.name, now) for c in self.configs)
        canonical = self._canonical(states)
        cards = [self._card(c, now, state, canonical)
                 for c, state in zip(self.configs, states, strict=True)]
        last = self._last
        if last is not None and len(last.cards) == len(cards) and all(
                a is b for a, b in zip(last.cards, cards, strict=True)):
            views = last.views  # the same objects: the core keeps what it worked out of them
            tickets = last.tickets if last.extra == extra_tickets else \
                (*extra_tickets, *last.tickets[len(last.extra):])
        else:
            views = tuple(card.view for card in cards)
            listed: list[Ticket] = list(extra_tickets)
            for card in cards:
                listed.extend(card.live.tickets.values())
            tickets = tuple(listed)
        self._last = _Fleet(tuple(cards), views, extra_tickets, tickets)
        return Snapshot(now, views, tickets, demand, health, loads, lengths)


_NO_TICKETS = TicketSet()


def _unlisted_leaving(view: ProviderView) -> ProviderView:
    """A copy of a model the card's listing lacks (`ollama rm` while loaded) runs on, holding
    its memory until its keep-alive ends, but Ollama answers 404 to every call for it (its
    manifest is gone: server/routes.go GetModel): it counts as leaving, never joined."""
    gone = tuple(r.model for r in view.residents if not r.leaving and
                 r.model not in view.remote and not_listed(view, r.model))
    if not gone:
        return view
    return replace(view, residents=tuple(replace(r, leaving=True) if r.model in gone else r
                                         for r in view.residents))


def _one_name_a_model(view: ProviderView, state: ProviderState, canonical: Mapping[str, str]
                      ) -> ProviderView:
    """The card's models under the names they are placed under, and the card's own names
    of each model placed under another (to send it)."""
    on_disk = set(state.available_mib) | set(state.models)
    aliases = {}
    for placed in {canonical[n] for n in on_disk if n in canonical}:
        own = names_here(placed, on_disk, canonical)
        if own != (placed,):
            aliases[placed] = own
    return replace(
        view, residents=tuple(replace(r, model=canonical.get(r.model, r.model))
                              for r in view.residents),
        disk_mib=fold(view.disk_mib, canonical), models=fold(view.models, canonical),
        observed=fold(view.observed, canonical), aliases=aliases)


@dataclass(frozen=True, slots=True)
class _Card:
    """One card's view and live tickets, and what they were made of."""

    config: ProviderConfig
    state: ProviderState | None
    known: TicketSet  # the ticket set they were made from
    canonical: Mapping[str, str]  # the names they were made with (StateView.canonical)
    built_at: float
    until: float  # when a ticket or entry of it expires or ages out
    view: ProviderView
    live: TicketSet


@dataclass(frozen=True, slots=True)
class _Fleet:
    """The last snapshot's cards, views and tickets (the extra ones first)."""

    cards: tuple[_Card, ...]
    views: tuple[ProviderView, ...]
    extra: tuple[Ticket, ...]
    tickets: tuple[Ticket, ...]
