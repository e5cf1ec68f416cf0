"""A provider's ticket set as the store holds it: the loads cold claims recorded survive a
round trip, and a set written before they were recorded still reads."""

from __future__ import annotations

import orjson

from proxy.core.tickets import Load, Residency, TicketSet
from proxy.core.types import Ticket
from proxy.service.codec import decode_ticket_set, encode_ticket_set

NOW = 1_700_000_000.0


def test_a_ticket_set_with_loads_round_trips() -> None:
    ticket = Ticket("t1", "gpu", "qwen3:14b", 12224, NOW, NOW + 60, cold=True, holder="h",
                    crew="homelab-pilot", context=8192)
    written = TicketSet({"t1": ticket}, {"qwen3:8b": Residency(0, 0, NOW - 5),
                                         "phi3:mini": Residency(3600, 4096, NOW, expires=NOW + 2)},
                        {"t1": Load("qwen3:14b", 12224, 8192, NOW),
                         "dead": Load("phi3:mini", 3600, 0, NOW - 30)})
    assert decode_ticket_set("gpu", encode_ticket_set(written)) == written


def test_a_ticket_set_without_loads_reads_as_none_recorded() -> None:
    old = orjson.dumps({"tickets": {"t1": {"model": "m", "mib": 600, "cold": True,
                                           "evicts": {}, "holder": "h", "started": NOW,
                                           "exp": NOW + 60}},
                        "residents": {"m2": {"mib": 900, "ctx": 4096, "at": NOW}}})
    read = decode_ticket_set("gpu", old)
    assert set(read.tickets) == {"t1"} and read.residents == {"m2": Residency(900, 4096, NOW)}
    assert read.loads == {}
