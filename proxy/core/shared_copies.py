"""A call for one model on the copy of another made from its weights file.

Ollama runs one copy per weights file, whatever name loaded it (server/sched.go
schedulerModelKey), lists it under the name of the call that loaded it, and has a call for
another model of that file (`ollama create X` with `FROM Y`) join it when the runner options
and the context match (needsReload, sched.go:1400-1425). The call still runs with its own
model's template and system prompt. So, for one call, a card where such a copy of Y is
listed or being loaded is planned as if the copy were the call's model's own: its slots,
its calls and its memory, counted once. The placement then names Y as the copy its ticket
claims, and the call is sent under its own name.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace

from proxy.core.feasibility import Fitting
from proxy.core.occupancy import ProviderIndex, index_providers
from proxy.core.policy import Policy
from proxy.core.types import Placement, Snapshot, Ticket


def joined_copies(indexes: Mapping[str, ProviderIndex], models: Iterable[str],
                  fitting: Fitting, names: Collection[str]) -> dict[str, tuple[str, str]]:
    """Per card, the first of `models` (the call's acceptable ones, preferred first) with
    another model's copy there to join (`Fitting.joined_sibling`), that copy's model not
    among `names` (those the call may run as under their own names): card -> (model, the
    copy's model)."""
    models = tuple(models)
    out: dict[str, tuple[str, str]] = {}
    for name, index in indexes.items():
        if not index.loaded_models:
            continue
        for model in models:
            copy = fitting.joined_sibling(index, model, names)
            if copy is not None:
                out[name] = (model, copy)
                break
    return out


def as_own_copy(index: ProviderIndex, model: str, copy: str, now: float, policy: Policy
                ) -> ProviderIndex:
    """The card's index with `copy`'s listed copy, its tickets and the plans to unload it
    under `model`'s name."""
    view = replace(index.view, residents=tuple(
        replace(r, model=model) if r.model == copy else r for r in index.view.residents))
    tickets = tuple(_renamed_ticket(t, copy, model) for t in index.tickets)
    return index_providers(Snapshot(now, (view,), tickets), policy)[view.name]


def _renamed_ticket(ticket: Ticket, copy: str, model: str) -> Ticket:
    if ticket.model != copy and copy not in ticket.evicts:
        return ticket
    evicts = {model if victim == copy else victim: mib for victim, mib in ticket.evicts.items()}
    return replace(ticket, model=model if ticket.model == copy else ticket.model,
                   evicts=evicts)


def as_own_caches(snapshot: Snapshot, joined: Mapping[str, tuple[str, str]]) -> Snapshot:
    """`snapshot` with what each joined copy's prompt cache holds, and its prefill rate,
    under the call's model (as `as_own_copy` lists the copy)."""
    def renamed(key: tuple[str, str]) -> tuple[str, str]:
        provider, name = key
        found = joined.get(provider)
        return (provider, found[0]) if found is not None and found[1] == name else key

    caches, prefill = snapshot.caches, snapshot.prefill
    return replace(snapshot, caches=replace(
        caches, held={renamed(k): v for k, v in caches.held.items()},
        loaded_at={renamed(k): v for k, v in caches.loaded_at.items()},
        contexts={renamed(k): v for k, v in caches.contexts.items()}),
        prefill=replace(prefill, rates={renamed(k): v for k, v in prefill.rates.items()}))


def on_copy(placement: Placement, joined: Mapping[str, tuple[str, str]]) -> Placement:
    """`placement`, made on indexes where a card's joined copy was listed as its model's own,
    in the card's real names: a call that joins it names the copy (`Placement.copy`), a load
    that unloads it names it among its victims."""
    found = joined.get(placement.provider)
    if found is None:
        return placement
    model, copy = found
    evicts = {copy if victim == model else victim: mib
              for victim, mib in placement.evicts.items()}
    joins = placement.model == model and not placement.loads
    return replace(placement, evicts=evicts,
                   copy=placement.copy or (copy if joins else ""))
