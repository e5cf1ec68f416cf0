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


def free_slots(snapshot: Snapshot, policy: Policy, model: str,
               shared_by: frozenset[str] = frozenset()) -> int:
    """Slots of `model` free now on every card: its warm copies' and those of copies being
    loaded, less the calls bound to them (a copy partly in CPU memory is no free slot).
    `shared_by`: only on cards where Ollama runs calls of all these models on its copy
    (`copy_users`)."""
    total = 0
    for index in indexes_for(snapshot, policy).values():
        resident = index.residents.get(model)
        if resident is not None and resident.spilled:
            continue
        if (index.is_warm(model) or index.is_loading(model)) and \
                shared_by.issubset(copy_users(index.view, model) if shared_by else ()):
            total += max(0, index.free_slots(model))
    return total


def yields_to_sooner(placement: Placement, snapshot: Snapshot, policy: Policy,
                     turn_at: float) -> int:
    """How many waiting calls with sooner turns the placement's slot is due to first; 0: take
    it."""
    if placement.loads or placement.kind == "queued":  # no free slot taken
        return 0
    # The models whose calls Ollama runs on the copy (core/shared_copies.py): their waiting
    # calls are due its slot as much as the call's own model's are
    view = next((v for v in snapshot.providers if v.name == placement.provider), None)
    users = copy_users(view, placement.copy_model) if view is not None else ()
    models = {placement.model, placement.copy_model, *users}
    ahead = sum(waiters_ahead(snapshot, model, turn_at) for model in models)
    if ahead == 0:
        return 0
    shared = frozenset(models) if len(models) > 1 else frozenset()
    if ahead < sum(free_slots(snapshot, policy, model, shared) for model in models):
        return 0
    return ahead
