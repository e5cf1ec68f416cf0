"""Names of one model. Ollama serves every name of one manifest (an alias `ollama cp` makes,
or `qwen3` and `qwen3:8b` as ollama.com tags them) from the one runner of its weights file:
`s.loaded` is keyed by the model blob (server/sched.go:111-128, 198-202; v0.12.6 :107-110),
and `/api/ps` lists the runner under the name of the call that loaded it. So the sidecar
places such names as one model, under the first of them in sort order across the fleet
(the same in every sidecar), and sends each card a name it has."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

V = TypeVar("V")


def canonical_names(digests: Iterable[Mapping[str, str]]) -> dict[str, str]:
    """Each name that shares its manifest digest (`/api/tags`) with another, on any card,
    -> the name their model is placed under; names of a model of their own are absent. A
    name whose manifest differs from card to card (pulled at other times, or written by
    another Ollama version) is no alias of anything: the mapping is by name, fleet-wide, and
    would send a call for an alias to a card where that name is another model."""
    seen: dict[str, set[str]] = {}
    for card in digests:
        for name, digest in card.items():
            if digest:
                seen.setdefault(name, set()).add(digest)
    groups: dict[str, set[str]] = {}
    for name, found in seen.items():
        if len(found) == 1:
            groups.setdefault(next(iter(found)), set()).add(name)
    out: dict[str, str] = {}
    for names in groups.values():
        if len(names) > 1:
            first = min(names)
            out.update((name, first) for name in names if name != first)
    return out


def fold(by_name: Mapping[str, V], canonical: Mapping[str, str]) -> dict[str, V]:
    """`by_name` under the names its models are placed under (one entry a model: the
    placed name's own when the card has it, else its first alias's)."""
    out: dict[str, V] = {}
    for name in sorted(by_name):
        placed = canonical.get(name, name)
        if placed not in out or name == placed:
            out[placed] = by_name[name]
    return out


def names_here(placed: str, names: Iterable[str], canonical: Mapping[str, str]
               ) -> tuple[str, ...]:
    """The card's own names of the model placed as `placed` (among `names`, the card's),
    the placed name first when the card has it; () when it has none."""
    own = sorted(n for n in names if canonical.get(n, n) == placed)
    return tuple(sorted(own, key=lambda n: n != placed))
