"""A load's time in the fleet model and in the slot-aware bound: the runner's start-up, then the
weights file (not the footprint) read at the card's rate, seen ready on Ollama's 250 ms
/health poll (llm/llama_server.go:1368-1381; v0.12.6 llm/server.go:1323). Figures worked out
by hand."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, MutableSequence
from dataclasses import replace
from functools import partial

import pytest

from loadtest import bounds
from loadtest.fleet_model import Counters, Gpu, GpuSpec, ModelSpec, SimCall, load_seconds
from loadtest.scenarios import MODELS, SCENARIOS

# 12224 MiB in VRAM, a 9300 MiB file (qwen3:14b's); a name without a depth scale
FOURTEEN = ModelSpec("fourteen", 12224, 50.0, disk_mib=9300)


def lettered(name: str, footprint_mib: int) -> ModelSpec:
    """A model of a 1024 MiB file whose blob path sorts as its name does (its sha256 the
    name's bytes in hex, zero-padded): Ollama's order among equal keep-alives, by blob path
    (ByDurationAndName, server/sched.go:1557-1578), is the name order here."""
    return ModelSpec(name, footprint_mib, 10.0, disk_mib=1024,
                     weights=name.encode().hex().ljust(64, "0"))


def names(gpu: Gpu) -> list[str]:
    """The copies on the card, by the name each was loaded under."""
    return [r.model.name for r in gpu.residents.values()]


@pytest.mark.parametrize(("model", "gpu", "seconds"), [
    # 1 + 9300/1024 = 10.08 s: seen ready at the next poll, 10.25 s (footprint/speed: 11.94)
    (FOURTEEN, GpuSpec("card", 24564), 10.25),
    # 1 + 1024/1024 = 2 s, on the grid: not a poll later
    (ModelSpec("m", 4096, 10.0, disk_mib=1024), GpuSpec("card", 8192), 2.0),
    # 0.3 + 2048/4096 = 0.8 s -> 1.0 s
    (ModelSpec("m", 4096, 10.0, disk_mib=2048),
     GpuSpec("card", 8192, startup_s=0.3, load_mib_per_s=4096.0), 1.0),
    # no file stated: the footprint is read, 1 + 3000/1024 = 3.93 s -> 4.0 s
    (ModelSpec("m", 3000, 10.0), GpuSpec("card", 8192), 4.0),
    # no start-up: 512/1024 = 0.5 s, on the grid
    (ModelSpec("m", 4096, 10.0, disk_mib=512), GpuSpec("card", 8192, startup_s=0.0), 0.5),
])
def test_a_load_is_startup_and_the_files_read_on_the_poll_grid(
        model: ModelSpec, gpu: GpuSpec, seconds: float) -> None:
    assert load_seconds(model, gpu) == pytest.approx(seconds)


def test_the_footprint_beyond_the_file_costs_no_load_time() -> None:
    small = ModelSpec("m", 9300, 10.0, disk_mib=9300)
    assert load_seconds(FOURTEEN, GpuSpec("card", 24564)) == \
        load_seconds(small, GpuSpec("card", 24564))


def test_weights_larger_than_the_footprint_are_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        ModelSpec("m", 1000, 10.0, disk_mib=1001)
    with pytest.raises(ValueError):
        ModelSpec("m", 1000, 10.0, disk_mib=0)


def test_a_catalogued_model_reads_its_file() -> None:
    assert ModelSpec.catalogued("qwen3:14b", 12224, 45.0).disk_mib == 9300
    assert ModelSpec.catalogued("qwen3:32b", 27000, 25.0).disk_mib == 20200
    with pytest.raises(KeyError):
        ModelSpec.catalogued("not-in-the-catalogue", 1000, 10.0)


class Card:
    """One card on a virtual clock: the events in time order, ties first come first."""

    def __init__(self, spec: GpuSpec, seed: int = 0) -> None:
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.counters = Counters()
        self.gpu = Gpu(spec, self.schedule, lambda: self.now, self.counters, lambda: None,
                       seed)

    def schedule(self, at: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (at, next(self.seq), action))

    def run(self, calls: list[tuple[SimCall, ModelSpec]]) -> None:
        """Every event, keep-alive expiries too."""
        for call, model in calls:
            self.schedule(call.arrived, partial(self.gpu.submit, call, model))
        while self.events:
            self.now, _, action = heapq.heappop(self.events)
            action()


def call(ident: int, model: ModelSpec, at: float, output_tokens: int) -> SimCall:
    return SimCall(ident, "agent", ((model.name, 1.0),), 0, output_tokens, at)


def test_the_fleet_model_starts_a_cold_call_when_its_load_is_seen_ready() -> None:
    card = Card(GpuSpec("card", 24564))
    first, warm = call(1, FOURTEEN, 3.0, 100), call(2, FOURTEEN, 30.0, 100)
    card.run([(first, FOURTEEN), (warm, FOURTEEN)])
    assert first.started == pytest.approx(3.0 + 10.25)
    assert first.finished == pytest.approx(3.0 + 10.25 + 100 / 50.0)
    assert warm.started == pytest.approx(30.0)  # the copy is loaded: no load


@pytest.mark.parametrize(("total_mib", "load_from"), [
    (16376, 21.0),  # no room for two copies: the reload starts when the memory is back
    (24564, 20.0),  # room for the new copy beside the old one's memory: it starts at once
])
def test_the_fleet_model_loads_once_the_memory_it_needs_is_back(
        total_mib: int, load_from: float) -> None:
    card = Card(GpuSpec("card", total_mib, unload_s=1.0))
    first, again = call(1, FOURTEEN, 0.0, 100), call(2, FOURTEEN, 20.0, 0)
    # done at 12.25 s; unloaded at 20 s, the memory back at 21 s
    card.schedule(20.0, partial(card.gpu.unload, FOURTEEN))
    card.run([(first, FOURTEEN), (again, FOURTEEN)])
    assert first.finished == pytest.approx(10.25 + 2.0)
    assert again.started == pytest.approx(load_from + 10.25)


def test_the_bound_loads_a_copy_as_the_fleet_model_does() -> None:
    """A lone cold call: the bound is the fleet model's latency, no more, no less."""
    gpu = GpuSpec("card", 24564)
    lone = call(1, FOURTEEN, 5.0, 100)
    Card(gpu).run([(lone, FOURTEEN)])
    bound = bounds.slot_aware([call(1, FOURTEEN, 5.0, 100)], {FOURTEEN.name: FOURTEEN}, [gpu])
    assert bound == pytest.approx([lone.finished - lone.arrived])
    assert bound == pytest.approx([10.25 + 2.0])


def test_the_bound_takes_the_card_that_loads_the_file_soonest() -> None:
    """A model whose file is a quarter of its footprint: the slow reader with no start-up
    (1024 / 512 = 2.0 s) beats the fast one that starts up (1.1 + 1024 / 1024 = 2.1 s, seen at
    2.25 s); by footprint / speed it would be the other way (8 s against 4 s)."""
    model = ModelSpec("m", 4096, 10.0, disk_mib=1024)
    slow = GpuSpec("slow-read", 8192, startup_s=0.0, load_mib_per_s=512.0)
    fast = GpuSpec("fast-read", 8192, startup_s=1.1, load_mib_per_s=1024.0)
    calls = [call(1, model, 0.0, 10), call(2, model, 0.0, 10)]  # single slots: a copy each
    # the first on the slow reader, 2.0 + 1 s; the second on the fast one's own copy,
    # 2.25 + 1 s, sooner than the slow reader's slot at 3 s + 1 s
    assert bounds.slot_aware(calls, {"m": model}, [fast, slow]) == pytest.approx([3.0, 3.25])


def test_the_scenarios_models_read_the_catalogues_files() -> None:
    assert {n: m.disk_mib for n, m in MODELS.items()} == \
        {"qwen3:32b": 20200, "qwen3:14b": 9300, "qwen3:8b": 5200}
    # 1 + 20200/1024 = 20.73, 1 + 9300/1024 = 10.08, 1 + 5200/1024 = 6.08: the next polls
    # (footprint / speed: 26.37, 11.94 and 5.86 s)
    gpu = GpuSpec("card", 32768)
    assert [load_seconds(MODELS[n], gpu) for n in ("qwen3:32b", "qwen3:14b", "qwen3:8b")] == \
        pytest.approx([20.75, 10.25, 6.25])


def test_burst_while_loading_quotes_its_load_time() -> None:
    scenario = SCENARIOS["burst-while-loading"]
    seconds = {load_seconds(MODELS["qwen3:14b"], g) for g in scenario.gpus}
    assert seconds == {10.25}
    assert "its copies load (10.25 s" in scenario.description


# Loads of 2 s (1 s start-up, 1024 MiB at 1024 MiB/s) and 4 s; single slots
ALPHA = ModelSpec("alpha", 8000, 10.0, disk_mib=1024)
BETA = ModelSpec("beta", 8000, 10.0, disk_mib=3072)
GAMMA = ModelSpec("gamma", 6000, 10.0, disk_mib=1024)


def test_loads_on_one_card_go_one_at_a_time_in_arrival_order() -> None:
    """processPending blocks on a load until its runner is ready (llm/llama_server.go:
    1047-1084, WaitUntilRunning): each load starts when the one before it is seen ready."""
    card = Card(GpuSpec("card", 24576))
    a, b, c = call(1, ALPHA, 0.0, 10), call(2, BETA, 0.5, 10), call(3, GAMMA, 0.6, 10)
    card.run([(a, ALPHA), (b, BETA), (c, GAMMA)])
    assert [x.started for x in (a, b, c)] == pytest.approx([2.0, 2.0 + 4.0, 6.0 + 2.0])
    assert card.counters.cold_loads == 3


def test_a_call_for_a_copy_still_loading_waits_behind_the_loads_asked_before_it() -> None:
    """A copy joins s.loaded once loaded (server/sched.go:727), so a call for it while it
    loads queues in pendingReqCh behind the loads asked for before it; a call for a loaded
    copy takes GetRunner's fast path past them (:199-202)."""
    card = Card(GpuSpec("card", 24576, slots=2))
    first, beta = call(1, ALPHA, 0.0, 10), call(2, BETA, 0.5, 10)
    again = call(3, ALPHA, 1.0, 10)  # alpha still loading, beta asked for before it
    warm = call(4, ALPHA, 3.0, 10)  # alpha loaded at 2 s, beta loading until 6 s
    card.run([(first, ALPHA), (beta, BETA), (again, ALPHA), (warm, ALPHA)])
    assert (first.started, beta.started) == pytest.approx((2.0, 6.0))
    assert again.started == pytest.approx(6.0)  # behind beta's load, its own copy's slot free
    assert warm.started == pytest.approx(3.0)
    assert card.counters.cold_loads == 2


class MapOrder(random.Random):
    """Go's map order as the test fixes it: s.loaded as given, or backwards."""

    def __init__(self, backwards: bool) -> None:
        super().__init__(0)
        self.backwards = backwards

    def shuffle(self, x: MutableSequence[object]) -> None:  # type: ignore[override]
        if self.backwards:
            x.reverse()


# Two copies of 8000 MiB and one of 17000 MiB that needs both gone on a 24576 MiB card
X = lettered("x", 8000)
Y = lettered("y", 8000)
Z = lettered("z", 17000)


def two_idle_copies(backwards: bool = False, seed: int = 0) -> Card:
    """x loaded at 2 s (24576 MiB free then: its accounting says 16576 free), y after it at
    4 s (16576 free: 8576), both idle."""
    card = Card(GpuSpec("card", 24576, unload_s=1.0, discovery_s=0.5), seed)
    if seed == 0:
        card.gpu.rng = MapOrder(backwards)
    for ident, model in ((1, X), (2, Y)):
        card.schedule(0.0, partial(card.gpu.submit, call(ident, model, 0.0, 0), model))
    return card


@pytest.mark.parametrize(("backwards", "z_loads_at"), [
    # x's kill at 10 s: s.loaded is [x, y], x's reading first for the baseline, y's for the
    # ticks: 8576 - 16576 < 0 (uint64 wraps): done at the first tick, 10.25 s. y's kill then,
    # alone (a tick and a discovery), its memory back at 11.25 s, when z starts
    (False, 11.25),
    # y first: its reading is the baseline and every tick, no change: 5 s. y killed at 15 s,
    # its memory back at 16 s
    (True, 16.0),
])
def test_unloads_go_one_at_a_time_each_after_the_previous_ones_recovery(
        backwards: bool, z_loads_at: float) -> None:
    """processCompleted kills one expired runner at a time and blocks in waitForVRAMRecovery
    before the next (server/sched.go:414-470, 1441-1497); the load the scheduler sent with
    both unloads starts when the memory it needs is back (x's at 11 s is not enough)."""
    card = two_idle_copies(backwards)
    z = call(3, Z, 10.0, 0)
    card.schedule(10.0, partial(card.gpu.unload, X))
    card.schedule(10.0, partial(card.gpu.unload, Y))
    card.run([(z, Z)])
    assert z.started == pytest.approx(z_loads_at + 2.0)
    assert (card.counters.evictions, card.counters.overcommits) == (2, 0)
    # what the card holds: x's memory back at 11 s, y's then, z's load
    held = [(t, mib) for t, mib in card.gpu.memory_trace if 10.0 <= t <= z_loads_at]
    assert held == [(11.0, 8000), (z_loads_at, 0), (z_loads_at, 17000)]


@pytest.mark.parametrize(("backwards", "z_loads_at"), [
    # x evicted at 10 s (first by blob path), done at 10.25 s as above; still no room: y evicted
    # then, its memory back at 11.25 s
    (False, 11.25),
    (True, 16.0),
])
def test_ollamas_own_eviction_unloads_one_copy_at_a_time_and_waits_for_each(
        backwards: bool, z_loads_at: float) -> None:
    """A load sent without room: processPending expires one idle runner, waits for its
    unloadedCh (sent after the recovery wait, server/sched.go:326-357, 463-466) and checks
    again."""
    card = two_idle_copies(backwards)
    z = call(3, Z, 10.0, 0)
    card.run([(z, Z)])
    assert z.started == pytest.approx(z_loads_at + 2.0)
    assert (card.counters.evictions, card.counters.overcommits) == (2, 1)


def test_the_recovery_wait_follows_the_cards_seed() -> None:
    """The map order is drawn from a generator seeded per card: a seed gives the same waits
    every run, and the seeds between them give both of HEAD's outcomes."""
    def z_start(seed: int) -> float:
        card = two_idle_copies(seed=seed)
        z = call(3, Z, 10.0, 0)
        card.run([(z, Z)])
        return z.started

    starts = [z_start(seed) for seed in range(1, 13)]
    assert sorted(set(starts)) == pytest.approx([11.25 + 2.0, 16.0 + 2.0])
    assert [z_start(seed) for seed in range(1, 13)] == starts


def test_a_copy_whose_keep_alive_ran_out_goes_through_the_unloader() -> None:
    """A keep-alive's timer sends the runner to expiredCh like any expiry (server/sched.go:
    393-408): killed by processCompleted, its memory back after the unload."""
    card = Card(GpuSpec("card", 24576, keep_alive_s=5.0, unload_s=1.0))
    x, z = call(1, X, 0.0, 10), call(2, Z, 8.5, 0)
    card.run([(x, X), (z, Z)])
    assert x.finished == pytest.approx(3.0)  # idle from 3 s: expired at 8 s
    assert z.started == pytest.approx(9.0 + 2.0)
    assert card.counters.evictions == 0


@pytest.mark.parametrize(("tokens", "killed_at"), [
    (10, 12.0),  # done at 11 s: idle when the unloader takes it at 12 s
    (50, 15.0),  # busy at 12 s: put back, killed once its call ends at 15 s
])
def test_a_copy_waiting_for_the_unloader_is_still_loaded_and_takes_calls(
        tokens: int, killed_at: float) -> None:
    """An expiry waits its turn with the copy still in s.loaded (processCompleted drops it
    only at the kill, server/sched.go:459-460), so a call for it takes GetRunner's fast path
    (:197-202) with no load; the unloader puts back an expiry of a busy copy until it is idle
    (:417-427) and kills it then. Its memory counts once, until it is back."""
    card = Card(GpuSpec("card", 24576, keep_alive_s=5.0, unload_s=1.0, discovery_s=0.5))
    card.gpu.rng = MapOrder(backwards=True)
    # x idle from 2 s, y from 4 s: their keep-alives run out at 7 and 9 s. x killed at 7 s
    # waits 5 s (y's reading is the baseline and every tick), y's expiry behind it until 12 s
    x, y = call(1, X, 0.0, 0), call(2, Y, 0.0, 0)
    again = call(3, Y, 10.0, tokens)
    held: list[tuple[int, int]] = []
    card.schedule(10.5, lambda: held.append((card.gpu.used_mib(), card.gpu.held_mib())))
    card.run([(x, X), (y, Y), (again, Y)])
    assert again.started == pytest.approx(10.0)  # y still loaded: no load
    assert again.finished == pytest.approx(10.0 + tokens / 10.0)
    assert card.counters.cold_loads == 2
    assert held == [(8000, 8000)]  # y's, once (x's back at 8 s)
    assert [(t, mib) for t, mib in card.gpu.memory_trace if t > 7.0] == \
        [(8.0, 8000), (killed_at + 1.0, 0)]


def test_the_schedulers_unload_of_a_busy_copy_takes_it_once_its_calls_end() -> None:
    """keep_alive 0 for a copy still loading finds nothing in s.loaded (server/sched.go:
    1713-1731); for a busy one it sets its sessionDuration to 0, and the copy goes once its
    last call ends (:385-392), serving the calls that reach it first."""
    card = Card(GpuSpec("card", 24576, unload_s=1.0, discovery_s=0.5))
    first, joins = call(1, X, 0.0, 50), call(2, X, 4.0, 10)  # x loaded at 2 s, busy to 7 s
    card.schedule(1.0, partial(card.gpu.unload, X))  # still loading: no effect
    card.schedule(3.0, partial(card.gpu.unload, X))
    card.run([(first, X), (joins, X)])
    assert joins.started == pytest.approx(7.0)  # the copy's one slot, after the first call
    assert card.counters.evictions == 1
    # killed when idle at 8 s, alone on the card: its memory back at 9 s
    assert card.gpu.memory_trace[-1] == (pytest.approx(9.0), 0)


# Copies of 8000, 8000, 4000 and 4000 MiB on a 24576 MiB card (24000 MiB), loaded one after
# the other in 2 s each; a 12000 MiB load that needs a or b gone beside the other
A = lettered("a", 8000)
B = lettered("b", 8000)
C = lettered("c", 4000)
D = lettered("d", 4000)
TWELVE = lettered("twelve", 12000)


def test_ollamas_own_eviction_wakes_on_any_unloads_recovery() -> None:
    """processPending waits on unloadedCh (server/sched.go:349-358; v0.12.6 :250-259), sent
    after every unload's recovery wait (:463-466; 6 :363-366), not only its victim's: it
    checks again once the scheduler's unload ahead of its victim is over, and loads as soon
    as its victim's memory is back, not after the victim's own 5 s wait."""
    card = Card(GpuSpec("card", 24576, unload_s=1.0, discovery_s=0.5))
    card.gpu.rng = MapOrder(backwards=True)
    for ident, model in ((1, A), (2, B), (3, C)):  # loaded at 2, 4 and 6 s
        card.schedule(0.0, partial(card.gpu.submit, call(ident, model, 0.0, 0), model))
    # a killed at 10 s, c's reading first: 5 s. z does not fit beside b and c (a is going):
    # b, idle and first by blob path, is Ollama's victim, queued behind a
    card.schedule(10.0, partial(card.gpu.unload, A))
    load = call(4, Z, 10.0, 0)
    card.run([(load, Z)])
    # a's wait over at 15 s: b killed (c's reading first again: 5 s, to 20 s), the loader
    # checks again and finds room once b's memory is back at 16 s
    assert load.started == pytest.approx(16.0 + 2.0)
    assert (card.counters.evictions, card.counters.overcommits) == (2, 1)


def test_a_victim_still_waiting_for_the_unloader_is_ollamas_first_choice_again() -> None:
    """Woken by another unload's recovery, processPending checks again while its victim still
    waits its turn: findRunnerToUnload sorts by keep-alive first (ByDurationAndName, server/
    sched.go:1557-1578; 6 :738-751), and the victim's is 0 (:344; 6 :245), so it picks the
    victim again, not the copy that went idle meanwhile and sorts first by blob path."""
    card = Card(GpuSpec("card", 24576, unload_s=1.0, discovery_s=0.5))
    card.gpu.rng = MapOrder(backwards=True)
    busy = call(1, A, 0.0, 100)  # a busy from 2 to 12 s
    card.schedule(0.0, partial(card.gpu.submit, busy, A))
    for ident, model in ((2, B), (3, C), (4, D)):  # loaded at 4, 6 and 8 s
        card.schedule(0.0, partial(card.gpu.submit, call(ident, model, 0.0, 0), model))
    # c killed at 10 s (d's reading first: 5 s), d queued; the load counts a and b: b, the
    # idle one, is Ollama's victim, queued behind d
    card.schedule(10.0, partial(card.gpu.unload, C))
    card.schedule(10.0, partial(card.gpu.unload, D))
    load = call(5, TWELVE, 10.0, 0)
    loaded_at_30: list[str] = []
    card.schedule(30.0, lambda: loaded_at_30.extend(names(card.gpu)))
    card.run([(load, TWELVE)])
    assert busy.finished == pytest.approx(12.0)
    # 15 s: d killed (a's reading first: 5 s); the loader checks again, a idle since 12 s,
    # and picks b. 20 s: b killed; room once its memory is back at 21 s
    assert load.started == pytest.approx(21.0 + 2.0)
    assert card.counters.evictions == 3  # c, d and b
    assert loaded_at_30 == ["a", "twelve"]


def test_with_every_copy_busy_ollama_waits_for_the_first_by_keep_alive_and_name() -> None:
    """No idle copy: findRunnerToUnload returns the first by keep-alive and blob path (server/
    sched.go:1690-1692; v0.12.6 :786-788), busy; processPending sets its keep-alive to 0 and
    waits on unloadedCh (:337-358), which another copy going idle does not send. The victim
    goes once its calls end (:385-392), and the load then fits beside the other copy."""
    card = Card(GpuSpec("card", 24576, unload_s=1.0, discovery_s=0.5, share_gpu=False))
    card.gpu.rng = MapOrder(backwards=False)
    sixteen = lettered("sixteen", 16000)  # fits beside one of x, y
    long, short = call(1, X, 0.0, 100), call(2, Y, 0.0, 20)  # x busy 2-12 s, y 4-6 s
    load = call(3, sixteen, 5.0, 0)
    loaded_at_20: list[str] = []
    card.schedule(20.0, lambda: loaded_at_20.extend(names(card.gpu)))
    card.run([(long, X), (short, Y), (load, sixteen)])
    # x killed when idle at 12 s (its own reading first, y's lower: one tick); the loader
    # finds room beside y and loads once x's memory is back at 13 s
    assert load.started == pytest.approx(13.0 + 2.0)
    assert loaded_at_20 == ["y", "sixteen"]
    assert (card.counters.evictions, card.counters.overcommits) == (1, 1)


def test_every_name_of_one_weights_file_is_served_by_its_one_copy() -> None:
    """Ollama keys s.loaded by the model blob (schedulerModelKey, server/sched.go:111-128,
    198-202; v0.12.6 ModelPath, :107): a call for an alias (`ollama cp`) of a loaded model
    takes its copy, with no load; the scheduler's unload under either name is of that copy."""
    model = ModelSpec("m", 8000, 10.0, disk_mib=1024)
    alias = replace(model, name="m-alias")
    card = Card(GpuSpec("card", 24576, unload_s=1.0, discovery_s=0.5))
    first, other = call(1, model, 0.0, 10), call(2, alias, 5.0, 10)  # m loaded at 2 s
    card.schedule(10.0, partial(card.gpu.unload, alias))
    card.run([(first, model), (other, alias)])
    assert other.started == pytest.approx(5.0)
    assert card.counters.cold_loads == 1 and card.counters.evictions == 1
    assert card.gpu.residents == {}


def test_ollamas_own_victim_among_equal_idle_copies_is_the_first_blob_path() -> None:
    """ByDurationAndName sorts equal keep-alives by runnerRef.modelPath, the blob (server/
    sched.go:1557-1578; v0.12.6 :738-751): qwen3:8b's sorts before qwen3:14b's, whose name
    sorts first."""
    older = ModelSpec("qwen3:14b", 8000, 10.0, disk_mib=1024)
    newer = ModelSpec("qwen3:8b", 8000, 10.0, disk_mib=1024)
    card = Card(GpuSpec("card", 24576, unload_s=1.0, discovery_s=0.5))
    for ident, model in ((1, older), (2, newer)):  # loaded at 2 and 4 s, then idle
        card.schedule(0.0, partial(card.gpu.submit, call(ident, model, 0.0, 0), model))
    twelve = lettered("twelve", 12000)  # not beside both
    loaded_at_30: list[str] = []
    card.schedule(30.0, lambda: loaded_at_30.extend(names(card.gpu)))
    card.run([(call(3, twelve, 10.0, 0), twelve)])
    assert loaded_at_30 == ["qwen3:14b", "twelve"]
    assert newer.blob_path < older.blob_path and older.name < newer.name
