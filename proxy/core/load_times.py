"""How long a load and an unload take on each card, learned from what the sidecar saw.

Ollama's load reads the model's weights file from the card's disk after a start-up
(docs/engine.md, "Load and unload times"): its time belongs to the card and the model, not
to a fleet-wide speed. Cards differ (a local NVMe against a network volume), and a copy's
footprint grows with its context while its load does not (the KV cache is allocated, not
read). So the estimate for a load is, most specific first:
- the last loads of that model on that card (`load_duration`, faded);
- that card's speed (MiB of weights file per second over its loads of other models);
- the fleet's speed over every load seen;
- the policy's default speed (1 GiB/s, the design doc's figure).
An unload (`keep_alive: 0` until `/api/ps` no longer lists the copy) is learned per card,
per victim: Ollama unloads one copy at a time and waits for the card's memory to come back
before the next, up to 5 s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypeVar

ALPHA = 0.3  # each new sample's weight against what was learned
MIN_LOAD_S = 0.05  # a shorter load_duration is a copy that was there already
MAX_CARDS_REMEMBERED = 4096  # (card, model) pairs: a bound, not a working figure

SOURCES = ("this model on this card", "this card's speed", "the fleet's speed",
           "the default speed")


@dataclass(frozen=True, slots=True)
class LoadEstimate:
    seconds: float
    source: str  # one of SOURCES, for explain


def _fade(old: float | None, sample: float) -> float:
    return sample if old is None else ALPHA * sample + (1 - ALPHA) * old


Key = TypeVar("Key", str, tuple[str, str])


def _with(mapping: Mapping[Key, float], key: Key, value: float) -> Mapping[Key, float]:
    out = dict(mapping)
    out.pop(key, None)  # newest last: the oldest goes first when the bound is reached
    out[key] = value
    while len(out) > MAX_CARDS_REMEMBERED:
        del out[next(iter(out))]
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class LoadTimes:
    """`observe_*` return the next state; a decision reads one as it is."""

    copies: Mapping[tuple[str, str], float] = field(default_factory=dict)  # seconds
    cards: Mapping[str, float] = field(default_factory=dict)  # MiB per second
    fleet_mib_per_s: float | None = None
    unloads: Mapping[str, float] = field(default_factory=dict)  # seconds per victim

    def observe_load(self, provider: str, model: str, mib: int, seconds: float | None
                     ) -> LoadTimes:
        """A load this sidecar asked for, of a `mib` weights file (its footprint when the
        size is unknown), that took `seconds` (Ollama's load_duration). Only loads nothing
        else delayed teach: none queued ahead of it in Ollama's one-at-a-time loader."""
        if seconds is None or seconds < MIN_LOAD_S or mib <= 0:
            return self
        speed = mib / seconds
        return replace(
            self,
            copies=_with(self.copies, (provider, model),
                         _fade(self.copies.get((provider, model)), seconds)),
            cards=_with(self.cards, provider, _fade(self.cards.get(provider), speed)),
            fleet_mib_per_s=_fade(self.fleet_mib_per_s, speed))

    def observe_unload(self, provider: str, victims: int, seconds: float) -> LoadTimes:
        """`victims` copies asked to unload were gone from `/api/ps` after `seconds`."""
        if victims <= 0 or seconds < 0:
            return self
        per_victim = seconds / victims
        return replace(self, unloads=_with(self.unloads, provider, _fade(
            self.unloads.get(provider), per_victim)))

    def load(self, provider: str, model: str, mib: int | None, footprint_mib: int | None,
             default_mib_per_s: float) -> LoadEstimate:
        """A load of `model` on `provider`: a learned speed reads `mib` (the weights file
        when its size is known), the default speed the footprint."""
        learned = self.copies.get((provider, model))
        if learned is not None:
            return LoadEstimate(learned, SOURCES[0])
        card = self.cards.get(provider)
        if card is not None:
            return LoadEstimate((mib or 0) / card, SOURCES[1])
        if self.fleet_mib_per_s is not None:
            return LoadEstimate((mib or 0) / self.fleet_mib_per_s, SOURCES[2])
        return LoadEstimate((footprint_mib or 0) / default_mib_per_s, SOURCES[3])

    def unload_s(self, provider: str, default_s: float) -> float:
        return self.unloads.get(provider, default_s)


NO_LOAD_TIMES = LoadTimes()
