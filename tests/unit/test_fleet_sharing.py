"""The fleet model's decode sharing on a virtual clock: a runner decodes its busy slots in
one batch a step (each more sequence costs batch_cost of a step alone), and the runners on
one card time-slice it. Figures are worked out by hand from the rule."""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable

import pytest

from loadtest.fleet_model import Counters, Gpu, GpuSpec, ModelSpec, SimCall
from loadtest.policies import LeastBusy
from loadtest.scenarios import MODELS, SCENARIOS
from loadtest.simulate import Simulation, main

# Names the simulator has no depth scale for; a load reads 1024 MiB
TEN = ModelSpec("ten-tps", 1024, 10.0)  # 0.1 s a token alone
TWENTY = ModelSpec("twenty-tps", 1024, 20.0)  # 0.05 s a token alone
LOAD_S = 2.0  # a card's default 1 s start-up, then 1024 MiB at 1024 MiB/s: on the 250 ms grid


class Fleet:
    """One card on a virtual clock: the events run in time order, ties first come first."""

    def __init__(self, spec: GpuSpec) -> None:
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.gpu = Gpu(spec, self.schedule, lambda: self.now, Counters(), lambda: None)
        self.done: dict[int, float] = {}

    def schedule(self, at: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (at, next(self.seq), action))

    def submit(self, at: float, ident: int, model: ModelSpec, output_tokens: int,
               prompt_tokens: int = 0) -> None:
        call = SimCall(ident, "agent", ((model.name, 1.0),), prompt_tokens, output_tokens, at,
                       on_done=lambda c: self.done.__setitem__(c.ident, self.now))
        self.schedule(at, lambda: self.gpu.submit(call, model))

    def run_until_done(self, calls: int) -> dict[int, float]:
        while self.events and len(self.done) < calls:
            self.now, _, action = heapq.heappop(self.events)
            action()
        return self.done


def test_two_calls_on_one_runner_finish_at_one_batched_step_each() -> None:
    fleet = Fleet(GpuSpec("card", 8192, slots=2, batch_cost=0.1))
    fleet.submit(0.0, 1, TEN, 100)
    fleet.submit(0.0, 2, TEN, 100)
    done = fleet.run_until_done(2)
    # loaded at 2 s; 100 steps of two sequences, each 1.1 x 0.1 s
    assert done[1] == pytest.approx(LOAD_S + 100 * 0.11)
    assert done[2] == pytest.approx(LOAD_S + 100 * 0.11)


def test_two_models_on_one_card_each_get_a_token_per_summed_step() -> None:
    fleet = Fleet(GpuSpec("card", 8192, slots=1))
    fleet.submit(0.0, 1, TEN, 0)  # loaded at 2 s, the other after it at 4 s (one at a time)
    fleet.submit(0.0, 2, TWENTY, 0)
    fleet.submit(10.0, 3, TEN, 100)
    fleet.submit(10.0, 4, TWENTY, 100)
    done = fleet.run_until_done(4)
    assert (done[1], done[2]) == pytest.approx((LOAD_S, 2 * LOAD_S))
    # a token each per 0.1 + 0.05 s
    assert done[3] == pytest.approx(10.0 + 100 * 0.15)
    assert done[4] == pytest.approx(10.0 + 100 * 0.15)


def test_with_time_slicing_each_busy_runner_gets_half_the_card() -> None:
    fleet = Fleet(GpuSpec("card", 8192, slots=2, slicing="time"))
    fleet.submit(0.0, 1, TEN, 0)
    fleet.submit(0.0, 2, TWENTY, 0)
    fleet.submit(10.0, 3, TEN, 100)
    fleet.submit(10.0, 4, TEN, 100)
    fleet.submit(10.0, 5, TWENTY, 100)
    done = fleet.run_until_done(5)
    # two runners busy: each step takes twice its time alone. TWENTY's 100 steps of 0.05 s
    # end at 10 s; TEN's batch of two (1.1 x 0.1 s a step) has done 100 x 0.05 / 0.11 steps
    # by then (45.45...), and its remaining steps run alone
    assert done[5] == pytest.approx(10.0 + 100 * 0.05 * 2)
    left = 100 - 100 * 0.05 * 2 / (2 * 0.11)
    assert done[3] == pytest.approx(done[5] + left * 0.11)
    assert done[4] == pytest.approx(done[3])


def test_a_call_finishing_speeds_the_other_up_and_prefill_is_not_shared() -> None:
    fleet = Fleet(GpuSpec("card", 8192, slots=2, batch_cost=0.1, prompt_tokens_per_s=1000.0))
    fleet.submit(0.0, 1, TEN, 100)
    # 1000 prompt tokens at 1000 tokens/s, 1 + 500/32768 slower for the depth: 1.0152... s
    fleet.submit(3.0, 2, TEN, 40, prompt_tokens=1000)
    done = fleet.run_until_done(2)
    prefill = 1.0 * (1 + 500 / 32768)
    decoding_from = 3.0 + prefill
    # call 1 decodes alone from 2 s (the load) to the end of call 2's prefill, 0.1 s a token
    left = 100 - (decoding_from - LOAD_S) / 0.1
    # then both at 0.11 s a token: call 2's 40 tokens, as many for call 1
    assert done[2] == pytest.approx(decoding_from + 40 * 0.11)
    # then call 1 alone again for what is left
    assert done[1] == pytest.approx(done[2] + (left - 40) * 0.1)
    assert done[1] > LOAD_S + 100 * 0.1  # slower than alone


def test_a_call_alone_decodes_at_full_speed() -> None:
    fleet = Fleet(GpuSpec("card", 8192))
    fleet.submit(0.0, 1, TEN, 100)
    fleet.submit(20.0, 2, TWENTY, 60)
    done = fleet.run_until_done(2)
    assert done[1] == pytest.approx(LOAD_S + 100 * 0.1)
    assert done[2] == pytest.approx(20.0 + LOAD_S + 60 * 0.05)


@pytest.mark.parametrize("slots", [1, 2])
def test_without_sharing_every_call_decodes_at_full_speed(slots: int) -> None:
    fleet = Fleet(GpuSpec("card", 8192, slots=slots, share_gpu=False))
    fleet.submit(0.0, 1, TEN, 100)
    fleet.submit(0.0, 2, TEN, 100)
    fleet.submit(0.0, 3, TWENTY, 100)
    done = fleet.run_until_done(3)
    # the second queued behind the first on one slot; the other model loaded after the first
    second = LOAD_S + 100 * 0.1 if slots == 2 else LOAD_S + 2 * 100 * 0.1
    assert (done[1], done[2], done[3]) == pytest.approx(
        (LOAD_S + 10.0, second, 2 * LOAD_S + 5.0))


def test_sharing_only_slows_the_decode_of_a_whole_run() -> None:
    """Every call of a simulated run decodes no faster than alone, and some slower: the
    bounds (loadtest/bounds.py) that take full speed stay lower bounds."""
    run = Simulation(SCENARIOS["hot-model"], LeastBusy())
    assert run.run().completed
    slower = 0
    for call in run.calls:
        if call.failed or not call.finished:
            continue
        alone = call.output_tokens / MODELS[call.model].tokens_per_s
        decode = call.finished - call.started - call.prefill_s
        assert decode >= alone - 1e-9, call
        slower += decode > alone * 1.01
    assert slower > 0


def test_the_command_line_sets_every_cards_sharing(capsys: pytest.CaptureFixture[str]) -> None:
    figures = {}
    for flags in ([], ["--no-share-gpu"], ["--batch-cost", "0"], ["--batch-cost", "0.5"],
                  ["--slicing", "time"]):
        main(["--scenario", "hot-model", "--policy", "static", "--json", *flags])
        figures[" ".join(flags)] = json.loads(capsys.readouterr().out)["mean_s"]
    # one model, two slots a card: only the batch cost slows a call, more the higher it is
    assert figures["--no-share-gpu"] == pytest.approx(figures["--batch-cost 0"])
    assert figures["--batch-cost 0"] < figures[""] < figures["--batch-cost 0.5"]
    assert figures["--slicing time"] == pytest.approx(figures[""])  # one runner a card
    with pytest.raises(SystemExit):
        main(["--targets", "7", "--batch-cost", "-1"])
