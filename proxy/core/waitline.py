"""Late binding's arrival order: a call that would take a free slot of a copy yields it to the
calls that have waited longer for that model, on any sidecar.

The demand board lists every waiting call's arrival (ModelDemand.arrivals). A call may take a
slot while fewer calls older than it wait for the model than the model has free slots; else
the older calls are due those slots first. A load is never yielded: it takes no slot an older
call could use (it makes new ones). The service bounds how long a call yields (an older call
that cannot use the slot, or whose sidecar died, must not hold it), so the order cannot
deadlock.
"""

from __future__ import annotations

from proxy.core.occupancy import index_providers
from proxy.core.policy import Policy
from proxy.core.types import Placement, Snapshot

# How long a free slot is left to the model's older waiting calls before a younger call takes
# it: an older call on any sidecar gets it within a store round trip; one that cannot use it,
# or whose sidecar died, must not hold it.
YIELD_S = 1.0


def waiters_ahead(snapshot: Snapshot, model: str, since: float) -> int:
    """Calls waiting for `model` that arrived before `since` (the call's own entry is not in
    the snapshot's demand)."""
    demand = snapshot.demand.get(model)
    if demand is None:
        return 0
    return sum(1 for arrived in demand.arrivals if arrived < since)


def free_slots(snapshot: Snapshot, policy: Policy, model: str) -> int:
    """Slots of `model` free now on every card: its warm copies' and those of copies being
    loaded, less the calls bound to them (a copy partly in CPU memory is no free slot)."""
    total = 0
    for index in index_providers(snapshot, policy).values():
        resident = index.residents.get(model)
        if resident is not None and resident.spilled:
            continue
        if index.is_warm(model) or index.is_loading(model):
            total += max(0, index.free_slots(model))
    return total


def yields_to_older(placement: Placement, snapshot: Snapshot, policy: Policy, since: float
                    ) -> int:
    """How many older waiting calls the placement's slot is due to first; 0: take it."""
    if placement.loads or placement.kind == "queued":  # no free slot taken
        return 0
    ahead = waiters_ahead(snapshot, placement.model, since)
    if ahead == 0 or ahead < free_slots(snapshot, policy, placement.model):
        return 0
    return ahead
