"""A copy loaded by a sidecar that died: the others count it after the dead call's ticket
expires, until a probe shows the card (Ollama itself lists the copy only once loaded)."""

from __future__ import annotations

import asyncio
import contextlib

from proxy.adapters.memory_kv import MemoryStore
from tests.service.fakes import Answer, FakeModelServer
from tests.service.harness import Answered, Fleet, Sidecar

TTL_S = 5.0
CARD_MIB = 24564


async def kill(sidecar: Sidecar, call: asyncio.Task[Answered]) -> None:
    """The sidecar dies mid-call: its ticket is never released, renewed or probed again."""
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    await sidecar.services.claims.close()  # no more renewals
    probing = sidecar.services._probing
    if probing is not None:
        probing.cancel()


async def one_card_two_sidecars(fleet: Fleet) -> tuple[FakeModelServer, Sidecar, Sidecar]:
    """A 24 GiB card, a survivor and a doomed sidecar on one store. Both probe the card
    before the doomed one's load; the survivor not again for a minute, so it knows of that
    load only what the doomed sidecar wrote to the shared store."""
    card = fleet.gpu("gpu", total_vram_mib=CARD_MIB, context_length=4096)
    store = MemoryStore(clock=fleet.clock)
    survivor = await fleet.sidecar(store, ticket_ttl_seconds=TTL_S, probe_interval_seconds=60,
                                   state_stale_seconds=120)
    doomed = await fleet.sidecar(store, ticket_ttl_seconds=TTL_S, probe_interval_seconds=600,
                                 state_stale_seconds=1200)
    card.script(Answer(seconds=600))
    return card, survivor, doomed


async def test_a_copy_a_dead_sidecar_loaded_counts_after_its_ticket_expires(
        fleet: Fleet) -> None:
    card, survivor, doomed = await one_card_two_sidecars(fleet)
    call = doomed.start_chat("qwen3:32b")  # ~21.2 GiB at context 4096: loads in ~21 s
    await asyncio.sleep(30)
    assert card.loaded["qwen3:32b"].loaded.is_set() and card.loaded["qwen3:32b"].calls == 1
    await kill(doomed, call)

    fourteen = survivor.start_chat("qwen3:14b")  # ~9.9 GiB: no room beside the 32b
    await asyncio.sleep(2 * TTL_S)
    assert survivor.tickets() == []  # the dead call's ticket has expired
    assert "qwen3:32b" in survivor.residents("gpu")  # its copy still counts
    assert not fourteen.done() and card.stats.loads == 1

    answered = await fourteen  # the next probe lists the 32b idle: unloaded, then the 14b
    assert answered.status == 200, answered.error
    assert answered.last.evicted == ("qwen3:32b",)
    assert card.stats.peak_mib <= CARD_MIB  # never both at once
    assert sorted(card.loaded) == ["qwen3:14b"]


async def test_a_client_unload_leaves_a_dead_sidecar_load_counted(fleet: Fleet) -> None:
    """`ollama stop` while a copy is recorded loading (here a dead sidecar's load: had its
    connection stayed open, a vanished node, Ollama would still be loading it; a closed one
    aborts the load): while llama.Load runs keep_alive 0 finds nothing in Ollama's scheduler
    to expire (server/sched.go:627, 726, 1713-1731), so the copy is neither asked to unload
    nor recorded unloaded; it keeps counting (the safe side)."""
    _, survivor, doomed = await one_card_two_sidecars(fleet)
    call = doomed.start_chat("qwen3:32b")  # loads in ~21 s
    await asyncio.sleep(10)
    await kill(doomed, call)
    await asyncio.sleep(2 * TTL_S)
    assert survivor.tickets() == []

    assert await survivor.services.scheduler.unload_everywhere("qwen3:32b") == []
    await asyncio.sleep(1)
    assert "qwen3:32b" in survivor.residents("gpu")
