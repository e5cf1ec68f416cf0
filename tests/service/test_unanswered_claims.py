"""A claim the store wrote without answering: its leader went before the answer did, or its
caller gave up waiting. The ticket is in the shared book though its sidecar never saw it
won, and must not stay there once its call is over (it would hold the card's memory for
the ticket's whole TTL)."""

from __future__ import annotations

import asyncio
from typing import Literal

from proxy.ports import PROVIDER_TICKETS, StoreUnavailable
from proxy.service.codec import decode_ticket_set
from tests.service.fakes import AwayStore
from tests.service.harness import Fleet

Loss = Literal["error", "no answer"]


class LosesAClaimsAnswer(AwayStore):
    """Writes the next ticket claim, then fails (and is away until `back()`) or never
    answers."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(fleet.clock)
        self.loss: Loss | None = None
        self.landed = asyncio.Event()

    async def cas(self, bucket: str, key: str, value: bytes, last_revision: int) -> int:
        revision = await super().cas(bucket, key, value, last_revision)
        if bucket == PROVIDER_TICKETS and self.loss is not None:
            loss, self.loss = self.loss, None
            self.landed.set()
            if loss == "error":
                self.away = True
                raise StoreUnavailable("nats: no response from stream")
            await asyncio.Event().wait()
        return revision

    def live_tickets(self, provider: str, now: float) -> list[str]:
        entry = self.view(PROVIDER_TICKETS).get(provider)
        if entry is None:
            return []
        return sorted(decode_ticket_set(provider, entry.value).live(now).tickets)


async def test_a_claim_written_while_its_answer_was_lost_goes_once_the_store_is_back(
        fleet: Fleet) -> None:
    fleet.gpu("gpu", total_vram_mib=24564).preload("qwen3:8b")
    store = LosesAClaimsAnswer(fleet)
    sidecar = await fleet.sidecar(store)
    store.loss = "error"
    r = await sidecar.chat("qwen3:8b")  # placed in-process, the store away
    assert (r.status, r.placement) == (200, "warm")
    assert store.landed.is_set() and store.live_tickets("gpu", fleet.clock.now())
    store.back()
    await asyncio.sleep(2)
    assert store.live_tickets("gpu", fleet.clock.now()) == []


async def test_a_claim_its_caller_stopped_waiting_for_is_released(fleet: Fleet) -> None:
    fleet.gpu("gpu", total_vram_mib=24564).preload("qwen3:8b")
    store = LosesAClaimsAnswer(fleet)
    sidecar = await fleet.sidecar(store)
    store.loss = "no answer"
    call = sidecar.start_chat("qwen3:8b")
    await store.landed.wait()
    call.cancel()  # the agent hung up while its claim was being written
    await asyncio.sleep(2)
    assert store.live_tickets("gpu", fleet.clock.now()) == []
    r = await sidecar.chat("qwen3:8b")
    assert (r.status, r.placement) == (200, "warm")


async def test_a_load_whose_claim_lost_its_answer_waits_for_the_store_and_its_ticket_goes(
        fleet: Fleet) -> None:
    """The store wrote a load's claim but its answer was lost with the store: the load is not
    claimed in-process (other sidecars may load into the same room unseen), so the call waits;
    once the store is back, the ticket written is removed and the call placed there."""
    gpu = fleet.gpu("gpu", total_vram_mib=16376)
    gpu.preload("qwen3:14b")
    store = LosesAClaimsAnswer(fleet)
    sidecar = await fleet.sidecar(store)
    store.loss = "error"
    call = sidecar.start_chat("qwen3:8b")
    await store.landed.wait()
    await asyncio.sleep(5)
    assert not call.done() and list(gpu.loaded) == ["qwen3:14b"]  # no load, no eviction
    store.back()
    r = await call
    assert (r.status, r.placement) == (200, "evict")
    await asyncio.sleep(2)
    assert store.live_tickets("gpu", fleet.clock.now()) == []


async def test_a_load_refused_at_the_wait_limit_while_the_store_is_away_names_the_store(
        fleet: Fleet) -> None:
    """An idle card, the store away the whole wait: the call is refused at its limit for
    the outage (no load while NATS is unreachable), not told the cluster is at capacity."""
    fleet.gpu("gpu", total_vram_mib=24564)
    store = LosesAClaimsAnswer(fleet)
    store.away = True
    sidecar = await fleet.sidecar(store)
    r = await sidecar.chat("qwen3:8b")
    assert r.reason == "gpu-busy" and r.refusal is not None
    assert "capacity" not in r.refusal.message and "NATS" in r.refusal.message, \
        r.refusal.message
