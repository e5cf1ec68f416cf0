"""A load's time in the fleet model and in the slot-aware bound: the runner's start-up, then the
weights file (not the footprint) read at the card's rate, seen ready on Ollama's 250 ms
/health poll (llm/llama_server.go:1368-1381; v0.12.6 llm/server.go:1323). Figures worked out
by hand."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from functools import partial

import pytest

from loadtest import bounds
from loadtest.fleet_model import Counters, Gpu, GpuSpec, ModelSpec, SimCall, load_seconds
from loadtest.scenarios import MODELS, SCENARIOS

# 12224 MiB in VRAM, a 9300 MiB file (qwen3:14b's); a name without a depth scale
FOURTEEN = ModelSpec("fourteen", 12224, 50.0, disk_mib=9300)


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

    def __init__(self, spec: GpuSpec) -> None:
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.gpu = Gpu(spec, self.schedule, lambda: self.now, Counters(), lambda: None)

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


def test_the_fleet_model_loads_after_an_unload_returns_the_memory() -> None:
    card = Card(GpuSpec("card", 24564, unload_s=1.0))
    first, again = call(1, FOURTEEN, 0.0, 100), call(2, FOURTEEN, 20.0, 0)
    # done at 12.25 s; unloaded at 20 s, the memory back at 21 s, when the reload starts
    card.schedule(20.0, partial(card.gpu.unload, FOURTEEN.name))
    card.run([(first, FOURTEEN), (again, FOURTEEN)])
    assert first.finished == pytest.approx(10.25 + 2.0)
    assert again.started == pytest.approx(20.0 + 1.0 + 10.25)


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
