"""The scale bench reads the sidecar's own placement metrics, by the names the sidecar
exports them under (a renamed metric would leave its figures at zero), and fails a run on
what must never happen. (A run itself takes 15 s at least: too long for the suite.)"""

from __future__ import annotations

import collections

import pytest

from loadtest.scale_bench import Served, bucket_bound, figures, placement_figures, since
from proxy.observability.metrics import Metrics


def test_placement_figures_are_read_from_the_sidecars_metrics() -> None:
    metrics = Metrics()
    for seconds in (0.0002, 0.004, 0.004):
        metrics.decision_seconds.observe(seconds)
    metrics.placements.labels("warm", "gpu-a", "qwen3:8b").inc(2)
    metrics.placements.labels("waiting", "-", "qwen3:8b").inc()
    before = placement_figures(metrics.render().decode())
    for seconds in (0.004, 0.3):
        metrics.decision_seconds.observe(seconds)
    metrics.placements.labels("cold", "gpu-b", "qwen3:14b").inc()
    metrics.placements.labels("waiting", "-", "qwen3:14b").inc(2)
    metrics.ticket_claims.labels("won").inc(3)
    metrics.ticket_claims.labels("refused").inc()
    metrics.ticket_conflicts.inc(2)
    after = placement_figures(metrics.render().decode())

    assert (after["decisions"], after["placements"], after["waited"]) == (5, 3, 3)
    assert (after["claims"], after["conflicts"]) == (4, 2)
    assert bucket_bound(after, 0.5) == 0.005  # the third of five decisions took 4 ms
    assert bucket_bound(after, 0.95) == 0.5
    assert after["decision_s"] == pytest.approx(0.3122)
    during = since(after, before)
    assert (during["decisions"], during["placements"], during["waited"]) == (2, 1, 2)
    assert bucket_bound(during, 0.5) == 0.005 and bucket_bound(during, 1.0) == 0.5


def test_what_must_never_happen_makes_the_run_fail() -> None:
    def problems(gpus: dict[str, int], tickets: int, outcomes: list[str]) -> list[str]:
        served = [Served([0.1], collections.Counter(outcomes)),
                  Served([0.2], collections.Counter(["200"]))]
        load = {"seconds": 1.0, "nats_in_msgs_per_s": 9.0, "nats_out_msgs_per_s": 18.0}
        result = figures(2, 1.0, {}, load, collections.defaultdict(float), served,
                         ["qwen3:8b", "qwen3:8b"], collections.Counter(gpus), tickets)
        return list(result["problems"])

    assert problems({"loads": 3, "unloads": 2}, 0, ["200", "503", "413", "507"]) == []
    assert problems({"self_evictions": 1}, 0, ["200"]) == ["self_evictions: 1"]
    assert problems({"truncations": 2}, 0, ["200"]) == ["truncations: 2"]
    assert problems({}, 1, ["200"]) == ["tickets left: 1"]
    assert problems({}, 0, ["200", "ReadError", "500"]) == [
        "calls ended otherwise: {'ReadError': 1, '500': 1}"]
