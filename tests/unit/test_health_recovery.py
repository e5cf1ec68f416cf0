"""The circuit of a card that went down as its calls failed half-opens once a probe finds it
ready again; one that answered its probes all along waits out the cooldown."""

from __future__ import annotations

from proxy.core.health import DOWN_BEFORE_FAILURE_S, OPEN_FOR_S, Breaker, ProviderStats
from proxy.core.types import Circuit

OPENED = Breaker().record(False, 100.0).record(False, 100.0).record(False, 100.1)


def test_a_card_seen_down_then_ready_half_opens_before_the_cooldown() -> None:
    down = OPENED.probed(False, 100.2)
    assert down.state(101.0) is Circuit.OPEN
    back = down.probed(True, 102.2)
    assert back.state(102.3) is Circuit.HALF_OPEN and back.allows(102.3)
    trial = back.start_trial(102.3)
    assert not trial.allows(102.4)  # one trial at a time
    assert trial.record(True, 103.0).state(103.0) is Circuit.CLOSED


def test_a_trial_that_fails_after_a_restart_opens_the_circuit_anew() -> None:
    back = OPENED.probed(False, 100.2).probed(True, 102.2).start_trial(102.3)
    reopened = back.record(False, 103.0)
    assert reopened.state(103.0 + OPEN_FOR_S - 0.1) is Circuit.OPEN
    assert reopened.probed(True, 105.0).state(105.0) is Circuit.OPEN  # not seen down again


def test_a_card_in_a_crash_loop_gets_one_early_trial_per_outage() -> None:
    """Down one probe, up the next, failing every call: one early trial, then the full
    cooldown, however often its probes flip; a success closes it and re-arms the rule."""
    breaker, trials, t = OPENED, 0, 100.2
    while t < 100.1 + OPEN_FOR_S - 2:
        breaker = breaker.probed(False, t).probed(True, t + 1)
        if breaker.allows(t + 1.1):
            trials += 1
            breaker = breaker.start_trial(t + 1.1).record(False, t + 1.2)
        t += 2
    assert trials == 1
    closed = Breaker((200.0,), opened_at=200.0, early_spent=True).record(True, 200.0 + OPEN_FOR_S)
    assert closed == Breaker()


def test_a_card_that_answers_its_probes_all_along_waits_out_the_cooldown() -> None:
    ready = OPENED.probed(True, 102.0).probed(True, 104.0)
    assert ready.state(100.1 + OPEN_FOR_S - 0.1) is Circuit.OPEN
    assert ready.state(100.1 + OPEN_FOR_S) is Circuit.HALF_OPEN


def test_an_outage_seen_long_before_the_failures_is_no_restart() -> None:
    early = OPENED.probed(False, 100.0 - DOWN_BEFORE_FAILURE_S - 1).probed(True, 102.0)
    assert early.state(102.0) is Circuit.OPEN
    in_flight = OPENED.probed(False, 99.9).probed(True, 102.0)  # probed as the calls failed
    assert in_flight.state(102.0) is Circuit.HALF_OPEN


def test_a_ready_probe_older_than_the_outage_it_follows_proves_nothing() -> None:
    assert OPENED.probed(False, 101.0).probed(True, 100.5).state(101.0) is Circuit.OPEN


def test_a_closed_circuit_ignores_probes() -> None:
    stats = ProviderStats().record(False, 1.0, 0.0)
    assert stats.probed(False, 1.0) is stats and stats.probed(True, 2.0) is stats
