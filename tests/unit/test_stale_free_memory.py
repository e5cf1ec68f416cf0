"""Ollama >= 0.30 reads a card's free memory, for its 80 % rule before a load, from a loaded
runner's own accounting, fixed when that runner loaded (server/sched.go:276, 1295-1335;
discover/runner.go:285-331; llm/llama_server.go:2600-2636): a copy that loaded beside others
goes on counting them after they leave. The sidecar keeps, per copy, what the others held
when a probe first saw it (Resident.beside_mib) and plans for the stalest reading."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.core.occupancy import Load, admission_problem
from proxy.core.placement import place
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.sizing import RUNNER_OVERHEAD_MIB, Sizer
from proxy.core.tickets import (
    Admitted,
    Residency,
    TicketSet,
    claim,
    merge_residency,
    record_residency,
)
from proxy.core.types import ModelInfo, ProviderView, Resident, Ticket
from proxy.ports import ShowAnswer
from proxy.service.prober import Prober
from tests.unit.builders import call, snapshot
from tests.unit.test_placement import QWEN3_14B

TOTAL = 24576


def test_a_copy_that_loaded_beside_one_since_gone_still_counts_it() -> None:
    """phi3 (3903 MiB) stays; the 8b it loaded beside has left. A 14b estimated at 12000
    MiB fits 80 % of the memory phi3 leaves (24576 - 3903 - 457: 16173 MiB free, 80 %:
    12938), but not of what phi3's runner still counts with the 8b's 6000 MiB in it."""
    x = Load("qwen3:14b", 12500, 12000)
    assert admission_problem(TOTAL, {"phi3:mini": 3903}, [x]) is None
    beside = {"phi3:mini": 6000 + RUNNER_OVERHEAD_MIB}
    assert admission_problem(TOTAL, {"phi3:mini": 3903}, [x], beside) == x
    # once phi3 goes too, nothing stale is left to read
    gone = Load("qwen3:14b", 12500, 12000, frozenset({"phi3:mini"}))
    assert admission_problem(TOTAL, {"phi3:mini": 3903}, [gone], beside) is None


def test_the_planner_evicts_the_copy_ollama_would_evict_itself() -> None:
    """A 20000 MiB card on 0.33 with phi3 alone, idle: a 14b (estimate 9940 MiB) passes
    Ollama's 80 % rule beside it (15640 MiB free), unless phi3 loaded beside an 8b since
    gone (its runner reads 9183 MiB free: 80 % is 7346), and then Ollama would unload phi3
    on its own; the plan unloads it."""
    for beside, kind in ((0, "cold"), (6000 + RUNNER_OVERHEAD_MIB, "evict")):
        card = ProviderView("a", 20000, residents=(
            Resident("phi3:mini", 3903, 4096, beside_mib=beside),), context_length=4096,
            version="0.33.0", disk_mib={"qwen3:14b": 9300, "phi3:mini": 2176},
            models={"qwen3:14b": QWEN3_14B})
        decision = place(call("qwen3:14b"), snapshot(card))
        assert decision.placement is not None, decision.reason
        assert decision.placement.kind == kind
    assert dict(decision.placement.evicts) == {"phi3:mini": 3903}


class _Ps:
    """A model server whose /api/ps the test sets."""

    def __init__(self) -> None:
        self.listed: list[dict[str, Any]] = []

    async def version(self, timeout_s: float | None = None) -> str:
        return "0.33.0"

    async def ps(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        return self.listed

    async def tags(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        return []

    async def fetch(self, path: str, timeout_s: float | None = None) -> ShowAnswer:
        return ShowAnswer(404, b"404 page not found")


def _copy(model: str, mib: int, ctx: int = 4096) -> dict[str, Any]:
    return {"name": model, "model": model, "size": mib << 20, "size_vram": mib << 20,
            "context_length": ctx}


async def test_the_prober_keeps_what_each_copy_was_first_seen_beside() -> None:
    from proxy.settings import load_settings

    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server = _Ps()
    prober = Prober(list(settings.providers), {"a": server}, None,  # type: ignore[dict-item]
                    gpu_memory=None)  # type: ignore[arg-type]
    server.listed = [_copy("qwen3:8b", 6000)]
    assert (await prober.probe("a")).loaded_beside_mib == {"qwen3:8b": 0}
    server.listed = [_copy("qwen3:8b", 6000), _copy("phi3:mini", 3600)]
    assert (await prober.probe("a")).loaded_beside_mib == {
        "qwen3:8b": 0, "phi3:mini": 6000 + RUNNER_OVERHEAD_MIB}
    server.listed = [_copy("phi3:mini", 3600)]  # the 8b left: phi3 still counts it
    state = await prober.probe("a")
    assert state.loaded_beside_mib == {"phi3:mini": 6000 + RUNNER_OVERHEAD_MIB}
    assert state.residents()[0].beside_mib == 6000 + RUNNER_OVERHEAD_MIB
    server.listed = [_copy("phi3:mini", 3600, ctx=8192)]  # reloaded at another context
    assert (await prober.probe("a")).loaded_beside_mib == {"phi3:mini": 0}
    # between two probes the 3b arrives and phi3 leaves: the 3b may have loaded beside it
    server.listed = [_copy("llama3.2:3b", 2500)]
    assert (await prober.probe("a")).loaded_beside_mib == {
        "llama3.2:3b": 3600 + RUNNER_OVERHEAD_MIB}


def test_a_copy_a_call_loaded_since_the_probe_counts_what_the_probe_listed() -> None:
    """phi3 loaded by a call beside the 32b the last probe listed; the 32b recorded unloaded
    since: the view keeps phi3 counting the 32b until a probe says otherwise."""
    view = ProviderView("a", 32768, residents=(Resident("qwen3:32b", 24970),), probed_at=10.0)
    recorded = {"phi3:mini": Residency(3183, 4096, 12.0),
                "qwen3:32b": Residency(0, 0, 13.0)}
    merged = merge_residency(view, recorded)
    assert [(r.model, r.beside_mib) for r in merged.residents] == [
        ("phi3:mini", 24970 + RUNNER_OVERHEAD_MIB)]


def test_a_claim_counts_the_loads_in_flight_its_decision_did_not_see() -> None:
    """Another sidecar's 14b load was claimed after this one decided: the claim, against
    the set as it is, records that the 8b loads beside it."""
    other = Ticket("t1", "a", "qwen3:14b", 12765, 5.0, 65.0, cold=True)
    mine = Ticket("t2", "a", "qwen3:8b", 8516, 6.0, 66.0, cold=True)
    view = ProviderView("a", 32768, probed_at=1.0)
    admitted = claim(TicketSet(tickets={"t1": other}), mine, view, DEFAULT_POLICY, 60.0, 6.0)
    assert isinstance(admitted, Admitted)
    assert admitted.tickets.tickets["t2"].beside_mib == 12765 + RUNNER_OVERHEAD_MIB


async def test_a_copy_first_seen_after_its_neighbours_left_takes_what_another_probe_saw() -> None:
    """Another process's probe saw phi3 arrive beside the 32b and published it; this
    prober first sees phi3 alone: it keeps the published figure, not its own 0."""
    from proxy.adapters.memory_kv import MemoryStore
    from proxy.ports import PROVIDER_STATE
    from proxy.service.codec import ProviderState, escape_key
    from proxy.settings import load_settings

    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    store = MemoryStore()
    seen_elsewhere = ProviderState("a", "http://a:11434", True, 0.0, loaded_mib={
        "phi3:mini": 3600}, loaded_ctx={"phi3:mini": 4096}, loaded_beside_mib={
        "phi3:mini": 24970 + RUNNER_OVERHEAD_MIB})
    await store.put(PROVIDER_STATE, escape_key("a"), seen_elsewhere.encode())
    server = _Ps()
    prober = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                    gpu_memory=None)  # type: ignore[arg-type]
    server.listed = [_copy("phi3:mini", 3600)]
    state = await prober.probe("a")
    assert state.loaded_beside_mib == {"phi3:mini": 24970 + RUNNER_OVERHEAD_MIB}


def test_loads_in_flight_together_each_count_the_other_whichever_ollama_loads_first() -> None:
    """The fleet soak's case on a 49140 MiB card at 0.33: llama3.2 is claimed first, but its
    load waits for an unload, and an 8b claimed after it loads first; llama's runner then
    counts the 8b. Once the 8b is unloaded, a 32b (estimate 25320 MiB) fits 80 % of the
    memory beside llama alone, not of what llama's runner reads: Ollama would unload llama,
    busy, on its own. The claim is refused while llama's ticket holds what it loaded beside."""
    empty = ProviderView("a", 49140, version="0.33.0", probed_at=0.0)
    llama = Ticket("llama", "a", "llama3.2:3b", 6477, 0, 0, cold=True, estimate_mib=6000)
    eight = Ticket("8b", "a", "qwen3:8b", 10676, 0, 0, cold=True, estimate_mib=10000)
    first = claim(TicketSet(), llama, empty, DEFAULT_POLICY, 60, 1.0)
    assert isinstance(first, Admitted)
    second = claim(first.tickets, eight, empty, DEFAULT_POLICY, 60, 2.0)
    assert isinstance(second, Admitted)
    assert second.tickets.tickets["llama"].beside_mib == 10676 + RUNNER_OVERHEAD_MIB
    # both loaded; no probe saw them together; the 8b's call is over, llama's goes on
    both = ProviderView("a", 49140, version="0.33.0", probed_at=3.0, residents=(
        Resident("llama3.2:3b", 6477, 16384), Resident("qwen3:8b", 10676, 16384)))
    held = TicketSet(tickets={"llama": second.tickets.tickets["llama"]})
    big = Ticket("32b", "a", "qwen3:32b", 28810, 0, 0, cold=True, estimate_mib=25320,
                 evicts={"qwen3:8b": 10676})
    refused = claim(held, big, both, DEFAULT_POLICY, 60, 4.0)
    assert not isinstance(refused, Admitted)
    assert "Ollama would unload a model" in refused.reason
    # with llama's call over, its copy may go with the 8b: the plan Ollama would not upset
    both_go = claim(TicketSet(), replace(big, evicts={"qwen3:8b": 10676, "llama3.2:3b": 6477}),
                    both, DEFAULT_POLICY, 60, 4.0)
    assert isinstance(both_go, Admitted)


def test_a_copy_capped_at_its_trained_context_keeps_what_its_load_was_beside() -> None:
    """The wide fleet soak's case (49140 MiB at 0.33, num_ctx 16384): phi3 (trained on 4096
    tokens) loaded beside a 14b and an 8b; its call recorded the copy at the num_ctx it asked
    for, 16384, and /api/ps lists it at 4096, the context its runner got. Once the 14b and the
    8b are unloaded, the probe that lists phi3 first saw it alone. Its runner still counts
    them, so a 32b (estimate 25320 MiB) may not load beside it: Ollama would unload phi3."""
    phi3 = ModelInfo(trained_context=4096)
    beside = 15165 + 10676 + 2 * RUNNER_OVERHEAD_MIB
    view = ProviderView("a", 49140, version="0.33.0", probed_at=5.0, models={
        "phi3:mini": phi3}, residents=(Resident("phi3:mini", 6207, 4096),))
    recorded = {"phi3:mini": Residency(6207, 16384, 4.0, beside=beside)}
    merged = merge_residency(view, recorded)
    assert [(r.model, r.beside_mib) for r in merged.residents] == [("phi3:mini", beside)]
    big = Ticket("32b", "a", "qwen3:32b", 28810, 0, 0, cold=True, estimate_mib=25320)
    refused = claim(TicketSet(residents=recorded), big, view, DEFAULT_POLICY, 60, 6.0)
    assert not isinstance(refused, Admitted)
    assert "Ollama would unload a model" in refused.reason


def test_a_copy_loaded_for_a_join_after_its_load_was_abandoned_keeps_what_that_load_was_beside(
        ) -> None:
    """Sweep seed 4071 (0.33): phi3:mini's load, beside a 14b, was abandoned (its client
    left); a call for phi3-helper (FROM phi3:mini: one weights file) had joined it, and
    Ollama loaded the copy for that call, beside the 14b too. The 14b is gone by the first
    probe that lists phi3-helper, whose runner still counts it: what phi3:mini's load record
    says was beside it counts for the copy of its weights file."""
    weights = ModelInfo(trained_context=4096, weights="sha256-phi3")
    beside = 11238 + RUNNER_OVERHEAD_MIB
    view = ProviderView("b", 22550, version="0.33.0", probed_at=5.0, models={
        "phi3:mini": weights, "phi3-helper": weights},
        residents=(Resident("phi3-helper", 6220, 4096),))
    abandoned = Residency(6220, 4096, 4.0, loading=True, abandoned=True, beside=beside)
    merged = merge_residency(view, {"phi3:mini": abandoned})
    assert [(r.model, r.beside_mib) for r in merged.residents] == [("phi3-helper", beside)]
    # another weights file's record says nothing of it
    other = replace(view, models={"phi3:mini": weights,
                                  "phi3-helper": replace(weights, weights="sha256-other")})
    assert merge_residency(other, {"phi3:mini": abandoned}).residents[0].beside_mib == 0


def test_a_load_recorded_over_an_abandoned_one_keeps_what_that_was_beside() -> None:
    """Sweep seed 4071 again: a second call for phi3:mini, claimed as a load beside nothing,
    found the copy loaded (for the call that joined the abandoned load, beside the 14b) and
    recorded it beside 931 MiB: the runner still counts the 14b."""
    beside = 11238 + RUNNER_OVERHEAD_MIB
    abandoned = Residency(6220, 4096, 1.0, loading=True, abandoned=True, beside=beside)
    start = TicketSet(residents={"phi3:mini": abandoned})
    later = record_residency(start, "phi3:mini", Residency(6220, 4096, 2.0, beside=931))
    assert later.residents["phi3:mini"] == Residency(6220, 4096, 2.0, beside=beside)
    # after a record of the copy gone, or at another context, the new load's own figure
    for before in (Residency(0, 0, 1.0), replace(abandoned, context_length=8192)):
        again = record_residency(TicketSet(residents={"phi3:mini": before}), "phi3:mini",
                                 Residency(6220, 4096, 2.0, beside=931))
        assert again.residents["phi3:mini"].beside == 931


async def test_a_model_loaded_at_many_contexts_keeps_the_newest_footprints() -> None:
    """An agent may send a num_ctx per call (some clients size it to the prompt): a figure
    per context ever loaded grew the published state without end."""
    from proxy.settings import load_settings

    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server = _Ps()
    prober = Prober(list(settings.providers), {"a": server}, None,  # type: ignore[dict-item]
                    gpu_memory=None)  # type: ignore[arg-type]
    for i in range(100):
        server.listed = [_copy("qwen3:8b", 6000 + i, ctx=2048 + 16 * i)]
        state = await prober.probe("a")
    seen = state.observed["qwen3:8b"]
    assert len(seen) <= 16
    assert seen[2048 + 16 * 99] == 6099  # the newest stays
    oldest, next_oldest = sorted(seen)[:2]
    server.listed = [_copy("qwen3:8b", 7000, ctx=oldest)]  # seen again: the newest now
    await prober.probe("a")
    server.listed = [_copy("qwen3:8b", 6000, ctx=1024)]
    seen = (await prober.probe("a")).observed["qwen3:8b"]
    assert oldest in seen and next_oldest not in seen and len(seen) == 16


async def test_footprints_of_a_model_removed_from_disk_are_forgotten() -> None:
    from proxy.settings import load_settings

    class _Disk(_Ps):
        on_disk: list[dict[str, Any]] = []

        async def tags(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
            return self.on_disk

    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server = _Disk()
    prober = Prober(list(settings.providers), {"a": server}, None,  # type: ignore[dict-item]
                    gpu_memory=None)  # type: ignore[arg-type]
    server.on_disk = [{"name": f"custom-{i}", "model": f"custom-{i}", "size": 1 << 30,
                       "digest": f"{i:064x}"} for i in range(50)]
    for i in range(50):  # agents create models, run them, and remove them
        server.listed = [_copy(f"custom-{i}", 6000)]
        await prober.probe("a")
    server.listed, server.on_disk = [], server.on_disk[-1:]
    assert set((await prober.probe("a")).observed) == {"custom-49:latest"}


def test_a_model_made_from_a_file_seen_loaded_is_sized_as_its_copies_were() -> None:
    """The wide fleet soak's case with names (49140 MiB at 0.33, 2 slots): phi3's copy was
    seen at 6220 MiB (4096 x 2), which its file size (2176 MiB) undercounts by the compute
    buffers its small token embeddings do not make up for. phi3-helper, created FROM it,
    was sized from the file alone, 6016 MiB, and claimed beside an 8b. The 8b evicted for a
    32b (estimate 25320 MiB) while the helper still loaded: its runner counts the 8b, and
    Ollama unloaded it, being 115 MiB over 80 % of what it reads free, which 204 MiB too
    few in the helper's figure hid. Sized as phi3's copies were, the claim is refused."""
    phi3 = ModelInfo(trained_context=4096, kv_bytes_per_token=384 * 1024,
                     weights="sha256-phi3")
    adapted = replace(phi3, runner=f"adapter=sha256-{'a' * 64}")
    card = ProviderView("a", 49140, max_parallel=2, version="0.33.0", probed_at=3.0,
                        disk_mib={"phi3:latest": 2176, "phi3-helper:latest": 2176,
                                  "phi3-tuned:latest": 2176},
                        models={"phi3:latest": phi3, "phi3-helper:latest": phi3,
                                "phi3-tuned:latest": adapted},
                        observed={"phi3:latest": {16384: 6220}})
    sizer = Sizer((card,), 1.2)
    helper = sizer.footprint("phi3-helper:latest", card, 4096)
    assert helper is not None and helper.total_mib == 6220, helper
    assert "a copy of phi3:latest" in helper.source
    tuned = sizer.footprint("phi3-tuned:latest", card, 4096)  # an adapter: other weights
    # (its file and the compute floor: no copy seen, no tensors listed)
    assert tuned is not None and tuned.total_mib == 2176 + 256 + 3072 + 768
    # the helper's load in flight beside the 8b (its claim counted the 8b's ticket), the 8b
    # loaded since; the 32b's claim evicts the 8b
    view = replace(card, residents=(Resident("qwen3:8b", 10499, 16384),))
    big = Ticket("32b", "a", "qwen3:32b", 29160, 0, 0, cold=True, estimate_mib=25320,
                 evicts={"qwen3:8b": 10499}, context=16384)
    for mib, admitted in ((6016, True), (helper.total_mib, False)):
        loading = Ticket("helper", "a", "phi3-helper:latest", mib, 1.0, 61.0, cold=True,
                         estimate_mib=5248, beside_mib=10576 + RUNNER_OVERHEAD_MIB,
                         context=4096)
        outcome = claim(TicketSet(tickets={"helper": loading}), big, view, DEFAULT_POLICY,
                        60, 4.0)
        assert isinstance(outcome, Admitted) == admitted, outcome
