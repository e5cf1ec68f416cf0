"""The virtual-clock simulation: deterministic, same trace for every policy, and the
targets of the bursty crew scenario held by the shipped core."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

from loadtest.policies import POLICIES
from loadtest.scenarios import SCENARIOS
from loadtest.simulate import Result, simulate

KEYS = {"policy", "scenario", "calls", "completed", "refused", "p50_s", "p95_s", "mean_s",
        "limit_p95_s", "cold_loads", "loaded_gib", "evictions", "overcommits", "truncations"}


@functools.cache
def run(scenario: str, policy: str) -> Result:
    """One run per scenario and policy for the whole module (runs are deterministic: the
    first test checks it with a fresh run)."""
    return simulate(scenario, policy)


def test_cli_lists_and_prints_one_json_object() -> None:
    listed = subprocess.run([sys.executable, "-m", "loadtest.simulate", "--list"],
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert all(name in listed for name in [*SCENARIOS, *POLICIES])
    out = subprocess.run([sys.executable, "-m", "loadtest.simulate", "--scenario",
                          "hot-model", "--policy", "static", "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert set(json.loads(out)) >= KEYS


# The shipped core with affinity off costs as much as kubemoot's run (~8 s a scenario) and is
# compared only on tool-loops, whose target test works it out
ONE_CORE_RUN = [policy for policy in POLICIES if policy != "kubemoot-no-affinity"]


# One test a scenario, so its runs are cached on one xdist worker, not worked out on both
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_policy_sees_the_same_trace_and_kubemoot_never_overcommits_nor_truncates(
        scenario: str) -> None:
    results = [run(scenario, policy) for policy in ONE_CORE_RUN]
    assert len({r.calls for r in results}) == 1
    assert len({r.limit_p95_s for r in results}) == 1
    ours = run(scenario, "kubemoot")
    assert ours.overcommits == 0 and ours.truncations == 0


# A fresh run is ~4 s of the core's work a scenario: two scenarios that exercise waits,
# loads and the prompt caches stand for the rest
@pytest.mark.parametrize("scenario", ["burst-while-loading", "tool-loops"])
def test_a_run_is_deterministic(scenario: str) -> None:
    assert simulate(scenario, "kubemoot").summary() == run(scenario, "kubemoot").summary()


def test_bursty_crew_targets() -> None:
    ours = run("bursty-crew", "kubemoot")
    assert ours.p95_s <= 1.25 * ours.limit_p95_s
    for policy in POLICIES:
        if not policy.startswith("kubemoot"):  # the baselines
            theirs = run("bursty-crew", policy)
            assert ours.p95_all_s < theirs.p95_all_s, policy  # failures count as never


def test_tool_loops_targets() -> None:
    """Conversation cache affinity: at least 30 % less prefill than the same placement blind
    to the prompt caches, and a lower p95 than returning every call to its last card."""
    ours = run("tool-loops", "kubemoot")
    blind = run("tool-loops", "kubemoot-no-affinity")
    sticky = run("tool-loops", "sticky")
    assert ours.prefill_s <= 0.7 * blind.prefill_s
    assert ours.cache_hit_rate > blind.cache_hit_rate
    assert ours.p95_s < sticky.p95_s
    assert ours.refused == blind.refused
