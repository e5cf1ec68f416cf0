"""What the status page draws: the fleet's figures add up to each GPU's memory, the demand
lists every model someone wants, and this sidecar's calls are kept newest first, bounded."""

from __future__ import annotations

import asyncio

from proxy.api.status import gpu_json, view_json
from proxy.core.fleet import fleet_figures
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.types import ModelDemand
from proxy.observability.recent import RecentCalls
from tests.unit.builders import GIB24, SIZES, gpu, snapshot, ticket


def test_a_gpus_bar_adds_up_to_its_memory() -> None:
    snap = snapshot(gpu("a", GIB24, ("qwen3:8b",), parallel=2),
                    tickets=(ticket("a", "qwen3:8b"), ticket("a", "phi3:mini", cold=True)),
                    demand={"qwen3:14b": ModelDemand(waiters=2, intents=1),
                            "idle:1b": ModelDemand()})
    fleet = fleet_figures(snap, DEFAULT_POLICY)
    bar = gpu_json(fleet.gpus[0])
    assert bar["reserveMiB"] == DEFAULT_POLICY.reserve_mib(GIB24)
    assert {(c["model"], c["state"]) for c in bar["copies"]} == {
        ("qwen3:8b", "loaded"), ("phi3:mini", "loading")}
    assert bar["claimedMiB"] == SIZES["phi3:mini"] + bar["scratchMiB"]
    assert bar["residentMiB"] + bar["claimedMiB"] + bar["freeMiB"] + bar["reserveMiB"] == GIB24
    assert (bar["calls"], bar["parallel"]) == (2, 2)
    assert [(m.model, m.waiters, m.intents) for m in fleet.demand] == [("qwen3:14b", 2, 1)]


def test_an_unpublished_gpu_has_no_bar_figures() -> None:
    bar = gpu_json(fleet_figures(snapshot(gpu("a", None)), DEFAULT_POLICY).gpus[0])
    assert bar["totalMiB"] is None and bar["freeMiB"] is None and bar["reserveMiB"] is None


def test_recent_calls_are_bounded_and_newest_first() -> None:
    recent = RecentCalls(size=3)
    for n in range(5):
        recent.add_call(f"m{n}", "a", "warm", (), 0, 0.1, True, None)
    recent.add_refusal("m9", "gpu-busy", "every GPU stayed busy")
    view = view_json(fleet_figures(snapshot(), DEFAULT_POLICY), recent, "ns/agent", "embedded")
    assert [c["model"] for c in view["calls"]] == ["m4", "m3", "m2"]
    assert view["refusals"][0]["reason"] == "gpu-busy"


async def test_a_watcher_wakes_when_a_call_is_added() -> None:
    recent = RecentCalls()
    waiting = asyncio.ensure_future(recent.wait_past(recent.version))
    await asyncio.sleep(0)
    assert not waiting.done()
    recent.add_refusal(None, "bad-request", "no model")
    await asyncio.wait_for(waiting, 1)
