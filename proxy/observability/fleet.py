"""The fleet's gauges, computed when Prometheus scrapes (nothing on the call path): per GPU
its memory, copies, calls and circuit, per model its waiters."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.core.fleet import CIRCUIT_LEVEL, FleetFigures

MIB = 1024 * 1024


class FleetCollector(Collector):
    def __init__(self, figures: Callable[[], FleetFigures]) -> None:
        self.figures = figures

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fleet = self.figures()

        def per_gpu(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["provider"])

        total = per_gpu("kubemoot_provider_memory_total_bytes", "The GPU's memory")
        usable = per_gpu("kubemoot_provider_memory_usable_bytes",
                         "What placement may fill: the total less the policy's reserve")
        resident = per_gpu("kubemoot_provider_memory_resident_bytes",
                           "What the loaded (and leaving) copies hold")
        claimed = per_gpu("kubemoot_provider_memory_claimed_bytes",
                          "What tickets claim beside the copies: loads in flight, calls' scratch")
        calls = per_gpu("kubemoot_provider_calls", "Calls and held plans holding a ticket")
        ready = per_gpu("kubemoot_provider_ready", "1 when the provider's state is fresh and up")
        circuit = per_gpu("kubemoot_provider_circuit_state",
                          "The provider's circuit: 0 closed, 1 half-open, 2 open")
        copies = GaugeMetricFamily("kubemoot_provider_copies",
                                   "Copies of a model on a GPU, by state",
                                   labels=["provider", "model", "state"])
        for gpu in fleet.gpus:
            if gpu.total_mib is not None:
                total.add_metric([gpu.provider], gpu.total_mib * MIB)
            if gpu.usable_mib is not None:
                usable.add_metric([gpu.provider], gpu.usable_mib * MIB)
            resident.add_metric([gpu.provider], gpu.resident_mib * MIB)
            claimed.add_metric([gpu.provider], gpu.claimed_mib * MIB)
            calls.add_metric([gpu.provider], gpu.calls)
            ready.add_metric([gpu.provider], 1 if gpu.ready else 0)
            circuit.add_metric([gpu.provider], CIRCUIT_LEVEL[gpu.circuit])
            for copy in gpu.copies:
                copies.add_metric([gpu.provider, copy.model, copy.state], 1)
        waiters = GaugeMetricFamily("kubemoot_model_waiters",
                                    "Calls waiting for a GPU, every sidecar's", labels=["model"])
        for model, count in sorted(fleet.waiters.items()):
            waiters.add_metric([model], count)
        yield from (total, usable, resident, claimed, calls, ready, circuit, copies, waiters)
