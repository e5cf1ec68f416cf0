"""Gathering the core's Snapshot from the store's mirror, the prober and local figures.

Decoded entries are cached by revision, so a placement decodes only what changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from proxy.core.lengths import NO_LENGTHS, CallLengths
from proxy.core.load_times import LoadTimes
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
        state = self.provider_state(config.name, now)
        if state is None:
            return ProviderView(config.name, config.total_vram_mib, ready=False,
                                context_length=config.context_length or 0,
                                max_parallel=config.max_parallel,
                                max_loaded=config.max_loaded_models, gpus=config.gpus,
                                weight=config.weight,
                                kv_cache_type=config.kv_cache_type)
        view = ProviderView(
            name=config.name,
            total_vram_mib=state.total_vram_mib or config.total_vram_mib,
            ready=state.ready, residents=state.residents(),
            context_length=state.context_length or config.context_length or 0,
            max_parallel=state.max_parallel or config.max_parallel,
            max_loaded=config.max_loaded_models if state.max_loaded is None
            else state.max_loaded, gpus=config.gpus, weight=config.weight,
            disk_mib=state.available_mib, models=state.models, observed=state.observed,
            kv_cache_type=state.kv_cache_type, version=state.version,
            probed_at=state.last_probed_at)
        return merge_recorded(view, self.ticket_set(config.name, now))

    def snapshot(self, now: float, health: Mapping[str, ProviderHealth],
                 demand: Mapping[str, ModelDemand], loads: LoadTimes,
                 extra_tickets: tuple[Ticket, ...] = (), lengths: CallLengths = NO_LENGTHS
                 ) -> Snapshot:
        views = tuple(self.provider_view(c, now) for c in self.configs)
        tickets: list[Ticket] = list(extra_tickets)
        for config in self.configs:
            tickets.extend(self.ticket_set(config.name, now).tickets.values())
        return Snapshot(now, views, tuple(tickets), demand, health, loads, lengths)
