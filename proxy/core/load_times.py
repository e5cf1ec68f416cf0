"""How long a load and an unload take on each card, learned from what the sidecar saw.

Ollama's load starts the runner and reads the model's weights file from the card's node
(docs/engine.md, "Load and unload times"): its time belongs to the card and the model, not
to a fleet-wide speed. Cards differ (a local NVMe against a network volume), and a copy's
footprint grows with its context while its load does not (the KV cache is allocated, not
read). A load is taken as a start-up (the policy's, a hardware figure) plus the file read at a
speed, and estimated, most specific first, from:
- the last loads of that model on that card (`load_duration`);
- that card's read speed over its loads of other models;
- the fleet's read speed over every load seen;
- the policy's default speed (1 GiB/s): of the file when `/api/tags` gave its size, else of
  the footprint (the design doc's figure).
What delays a load only adds to it (a load queued behind another, Ollama's own eviction
before it), so a figure falls at once to a quicker sample and rises slowly to a slower one.

An unload is learned per card in two parts: the first victim's (`keep_alive: 0` until
`/api/ps` no longer lists it), and the gap between victims, since Ollama unloads one copy at
a time and waits up to 5 s for the memory to come back before the next.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypeVar

TOWARD_QUICKER = 0.5  # a sample's weight when it is quicker than what was learned
TOWARD_SLOWER = 0.1  # ... and when it is slower: a delay is more often the cause
MIN_LOAD_S = 0.05  # a shorter load_duration is a copy that was there already
MIN_READ_S = 0.05  # a load hardly longer than the start-up reads no slower than this
MAX_UNLOAD_SAMPLE_S = 5.5  # Ollama's wait for memory (5 s) and a poll: more is an outlier
MAX_CARDS_REMEMBERED = 4096  # (card, model) pairs: a bound, not a working figure

SOURCES = ("this model on this card", "this card's speed", "the fleet's speed",
           "the default speed")

Key = TypeVar("Key", str, tuple[str, str])


@dataclass(frozen=True, slots=True)
class LoadEstimate:
    seconds: float
    source: str  # one of SOURCES, for explain


def _settle(old: float | None, sample: float, quicker: bool) -> float:
    if old is None:
        return sample
    weight = TOWARD_QUICKER if quicker else TOWARD_SLOWER
    return weight * sample + (1 - weight) * old


def _seconds(old: float | None, sample: float) -> float:
    return _settle(old, sample, old is None or sample < old)


def _speed(old: float | None, sample: float) -> float:
    return _settle(old, sample, old is None or sample > old)


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
    cards: Mapping[str, float] = field(default_factory=dict)  # file MiB read per second
    fleet_mib_per_s: float | None = None
    first_unloads: Mapping[str, float] = field(default_factory=dict)  # seconds
    unload_gaps: Mapping[str, float] = field(default_factory=dict)  # seconds between victims

    def observe_load(self, provider: str, model: str, mib: int, seconds: float | None,
                     startup_s: float) -> LoadTimes:
        """A load this sidecar asked for, of a `mib` weights file (its footprint when the
        size is unknown), that took `seconds` (Ollama's load_duration)."""
        if seconds is None or seconds < MIN_LOAD_S or mib <= 0:
            return self
        speed = mib / max(seconds - startup_s, MIN_READ_S)
        return replace(
            self,
            copies=_with(self.copies, (provider, model),
                         _seconds(self.copies.get((provider, model)), seconds)),
            cards=_with(self.cards, provider, _speed(self.cards.get(provider), speed)),
            fleet_mib_per_s=_speed(self.fleet_mib_per_s, speed))

    def observe_unload(self, provider: str, departures: tuple[float, ...]) -> LoadTimes:
        """Victims asked to unload together were gone from `/api/ps` after `departures`
        seconds (one each, in any order)."""
        if not departures:
            return self
        ordered = sorted(departures)
        first = min(ordered[0], MAX_UNLOAD_SAMPLE_S)
        out = replace(self, first_unloads=_with(self.first_unloads, provider, _seconds(
            self.first_unloads.get(provider), first)))
        if len(ordered) > 1:
            gap = min((ordered[-1] - ordered[0]) / (len(ordered) - 1), MAX_UNLOAD_SAMPLE_S)
            out = replace(out, unload_gaps=_with(out.unload_gaps, provider, _seconds(
                out.unload_gaps.get(provider), gap)))
        return out

    def load(self, provider: str, model: str, file_mib: int | None, footprint_mib: int | None,
             default_mib_per_s: float, startup_s: float) -> LoadEstimate:
        learned = self.copies.get((provider, model))
        if learned is not None:
            return LoadEstimate(learned, SOURCES[0])
        mib = file_mib or footprint_mib or 0
        card = self.cards.get(provider)
        if card is not None:
            return LoadEstimate(startup_s + mib / card, SOURCES[1])
        if self.fleet_mib_per_s is not None:
            return LoadEstimate(startup_s + mib / self.fleet_mib_per_s, SOURCES[2])
        if file_mib:
            return LoadEstimate(startup_s + file_mib / default_mib_per_s, SOURCES[3])
        return LoadEstimate((footprint_mib or 0) / default_mib_per_s, SOURCES[3])

    def unloads_s(self, provider: str, victims: int, default_s: float) -> float:
        """`victims` copies unloaded together, until `/api/ps` lists none of them."""
        if victims <= 0:
            return 0.0
        return self.first_unloads.get(provider, default_s) + \
            (victims - 1) * self.unload_gaps.get(provider, default_s)


NO_LOAD_TIMES = LoadTimes()
