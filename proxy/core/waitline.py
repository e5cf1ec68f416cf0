"""Late binding's waiting line: which of the calls waiting for a model a free slot is due to,
on any sidecar.

Each waiting call has a turn: its arrival plus a slack of its expected length
(`lengths.CallLengths.work`), at most MAX_SLACK_S; a call whose length is not known yet has
no slack. Free slots go to the soonest turns first. Calls of equal length keep arrival
order; a short call may pass a longer one that arrived before it, but only if it arrived
within that call's slack, so a call is passed only by calls that arrived before its turn:
no call starves, and its extra wait is bounded by the work of the calls that arrived in its
slack (docs/rules.md, "Late binding").

The demand board lists every waiting call's turn (ModelDemand.turns). A call may take a slot
while fewer calls with sooner turns wait for the model than the model has free slots; else
those calls are due the slots first. A load is never yielded: it takes no slot another call
could use (it makes new ones). The service bounds how long a call yields (a call that cannot
use the slot, or whose sidecar died, must not hold it), so the line cannot deadlock.
"""

from __future__ import annotations

from proxy.core.lengths import CallLength
from proxy.core.occupancy import copy_users, indexes_for
from proxy.core.policy import Policy
from proxy.core.types import Placement, Snapshot

# How long a free slot is left to the calls due it first before another call takes it: a
# waiting call on any sidecar gets it within a store round trip (milliseconds); one that
# cannot use it, whose sidecar died or is starved of CPU, must not hold it idle for long.
YIELD_S = 0.25
# A call may be passed by calls that arrive within this many of its own expected lengths
# after it: short calls do not queue behind long ones, and a long call waits at most about
# its own length more than in arrival order.
SLACK_LENGTHS = 0.75
MAX_SLACK_S = 30.0


def slack_s(length: CallLength | None) -> float:
    """How long after its arrival a call's turn comes: none while its length is unknown."""
    if length is None:
        return 0.0
    return min(MAX_SLACK_S, SLACK_LENGTHS * max(0.0, length.seconds))


def waiters_ahead(snapshot: Snapshot, model: str, turn_at: float) -> int:
    """Calls waiting for `model` whose turn comes before `turn_at` (the call's own entry is
    not in the snapshot's demand)."""
    demand = snapshot.demand.get(model)
    if demand is None:
        return 0
    return sum(1 for other in demand.turns if other < turn_at)


def free_slots(snapshot: Snapshot, policy: Policy, model: str) -> int:
    """Slots free now on every card for calls of `model`: those of its warm copies and of
    copies being loaded, and of the copies of other models of its weights file it runs on
    (core/shared_copies.py; at a context that may not suit every call), less the calls
    bound to them (a copy partly in CPU memory is no free slot)."""
    total = 0
    for index in indexes_for(snapshot, policy).values():
        for copy in index.copies_for(model):
            resident = index.residents.get(copy)
            if resident is not None and resident.spilled:
                continue
            if index.is_warm(copy) or index.is_loading(copy):
                total += max(0, index.free_slots(copy))
    return total


def yields_to_sooner(placement: Placement, snapshot: Snapshot, policy: Policy,
                     turn_at: float) -> int:
    """How many waiting calls with sooner turns the placement's slot is due to first; 0: take
    it. Those of every model Ollama runs on the copy (core/shared_copies.py) count: the slot
    is due to them when, for one of those models, fewer slots are free than such calls."""
    if placement.loads or placement.kind == "queued":  # no free slot taken
        return 0
    view = next((v for v in snapshot.providers if v.name == placement.provider), None)
    users = copy_users(view, placement.copy_model) if view is not None else ()
    ahead = {model: waiters_ahead(snapshot, model, turn_at)
             for model in {placement.model, placement.copy_model, *users}}
    if any(0 < count >= free_slots(snapshot, policy, model) for model, count in ahead.items()):
        return sum(ahead.values())
    return 0
