"""Prometheus metrics. One registry per app, so several sidecars can live in one test."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# The `_created` gauge beside every counter and histogram doubles the series and only says
# when the process started, which process_start_time_seconds already does.
disable_created_metrics()  # type: ignore[no-untyped-call]

FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
SLOW_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
RATIO_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 4)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # process_cpu_seconds_total and friends: a rate near 1 means the sidecar's core is
        # saturated and every call queues for it.
        ProcessCollector(registry=r)
        self.placements = Counter("kubemoot_placements", "Placed calls by outcome",
                                  ["placement", "provider", "model"], registry=r)
        self.refusals = Counter("kubemoot_refusals", "Refused calls by reason", ["reason"],
                                registry=r)
        self.decision_seconds = Histogram("kubemoot_decision_seconds",
                                          "Time to place one call (excluding waits)",
                                          buckets=FAST_BUCKETS, registry=r)
        self.wait_seconds = Histogram("kubemoot_wait_seconds",
                                      "Time calls waited for a GPU, by how the wait ended",
                                      ["outcome"], buckets=SLOW_BUCKETS, registry=r)
        self.ticket_claims = Counter("kubemoot_ticket_claims", "VRAM ticket claims by result",
                                     ["result"], registry=r)
        self.ticket_conflicts = Counter("kubemoot_ticket_conflicts",
                                        "Compare-and-set conflicts while claiming", registry=r)
        self.evictions = Counter("kubemoot_evictions", "Models unloaded to make room",
                                 ["provider", "model"], registry=r)
        self.upstream_seconds = Histogram("kubemoot_upstream_seconds",
                                          "Duration of forwarded calls", ["provider"],
                                          buckets=SLOW_BUCKETS, registry=r)
        self.upstream_errors = Counter("kubemoot_upstream_errors", "Failed forwarded calls",
                                       ["provider"], registry=r)
        self.in_flight = Gauge("kubemoot_in_flight", "Calls in flight per provider",
                               ["provider"], registry=r)
        self.circuit_open = Gauge("kubemoot_circuit_open",
                                  "1 when the provider's circuit is open or half-open",
                                  ["provider"], registry=r)
        self.state_age_seconds = Gauge("kubemoot_provider_state_age_seconds",
                                       "Age of the provider state used for placement",
                                       ["provider"], registry=r)
        self.prompt_estimate_ratio = Histogram(
            "kubemoot_prompt_tokens_reported_to_estimated",
            "The engine's prompt count over the sidecar's estimate, per call: above 1 the "
            "estimate was short, and a prompt near a context limit risks being cut",
            buckets=RATIO_BUCKETS, registry=r)
        # Calls that continue a conversation: what the copies were expected to hold of their
        # prompts, what the answers say they held, and how often a copy held less than half
        self.prompt_tokens = Counter(
            "kubemoot_prompt_tokens", "Prompt tokens of conversation calls by what the "
            "engine did with them: cached (found in the slot) or evaluated",
            ["provider", "result"], registry=r)
        self.prompt_cache_expected_tokens = Counter(
            "kubemoot_prompt_cache_expected_tokens",
            "Prompt tokens the sidecar expected the copy to hold, per conversation call",
            ["provider"], registry=r)
        self.prompt_cache_lost = Counter(
            "kubemoot_prompt_cache_lost",
            "Conversation calls whose copy held less than half of what was expected (the "
            "expectation is corrected)", ["provider"], registry=r)
        self.tool_loops_ended = Counter(
            "kubemoot_tool_loops_ended",
            "Tool loops whose last call answered a tool's result without calling a tool: "
            "their cache slots are free to the next conversation", ["provider"], registry=r)
        self.nats_connected = Gauge("kubemoot_nats_connected",
                                    "1 when shared state in NATS is reachable", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
