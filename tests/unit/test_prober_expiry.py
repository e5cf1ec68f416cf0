"""Ollama sets a copy's `/api/ps` expiry when it goes idle and stops its keep-alive timer while a
call holds it (server/sched.go:405, 409, 479-482): a copy still listed well past its expiry is
in use by a client the sidecars do not see (or its unload waits its turn), so the prober takes
its expiry as unknown rather than past."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime

from proxy.adapters.memory_kv import MemoryStore
from proxy.ports import PROVIDER_STATE
from proxy.service.codec import ProviderState
from proxy.service.prober import STALE_EXPIRY_S, Prober
from proxy.settings import load_settings
from tests.unit.test_stale_free_memory import TOTAL, _copy, _Ps


class _Clock:
    def __init__(self, now: float) -> None:
        self.at = now

    def now(self) -> float:
        return self.at


def _expiring(model: str, at: float) -> dict[str, object]:
    stamp = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
    return {**_copy(model, 6000), "expires_at": stamp}


async def test_a_copy_listed_past_its_expiry_is_taken_as_in_use_and_published() -> None:
    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server, clock, store = _Ps(), _Clock(1_800_000_000.0), MemoryStore()
    prober = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                    gpu_memory=None, clock=clock)  # type: ignore[arg-type]
    now = clock.now()
    server.listed = [_expiring("qwen3:8b", now + 120), _expiring("phi3:mini", now - 1),
                     _expiring("llama3.2:3b", now - STALE_EXPIRY_S - 1)]
    state, = await prober.round(force=True)
    expiry = {r.model: r.expires_at for r in state.residents()}
    assert expiry["qwen3:8b"] == now + 120
    assert expiry["phi3:mini"] == now - 1  # just run out: its unload is on its way
    assert math.isinf(expiry["llama3.2:3b"])
    published = ProviderState.decode(store.view(PROVIDER_STATE)["a"].value)
    assert {r.model: r.expires_at for r in published.residents()} == expiry


async def test_a_copy_turning_in_use_is_written_at_once() -> None:
    """A state is rewritten at most every 5 s unless something significant changed: a copy
    turning in use (its expiry unknown) is, so other sidecars stop taking it as expiring."""
    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server, clock, store = _Ps(), _Clock(1_800_000_000.0), MemoryStore()
    prober = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                    gpu_memory=None, clock=clock, write_every_s=5.0)  # type: ignore[arg-type]
    server.listed = [_expiring("qwen3:8b", clock.now() - STALE_EXPIRY_S + 1)]
    await prober.round()  # just run out: its unload may be on its way
    clock.at += 2.0  # still listed: in use, 2 s after the last write
    await prober.round()
    published = ProviderState.decode(store.view(PROVIDER_STATE)["a"].value)
    assert math.isinf(published.residents()[0].expires_at)


async def test_one_cards_odd_answer_stops_no_other_cards_probe() -> None:
    settings = load_settings(providers=[
        {"name": "a", "endpoint": "http://a:11434", "totalVramMiB": TOTAL},
        {"name": "b", "endpoint": "http://b:11434", "totalVramMiB": TOTAL}])
    good, odd, store = _Ps(), _Ps(), MemoryStore()
    good.listed = [_copy("qwen3:8b", 6000)]
    odd.listed = [{**_copy("phi3:mini", 3600), "size_vram": "n/a"}]
    prober = Prober(list(settings.providers), {"a": good, "b": odd},  # type: ignore[dict-item]
                    store, gpu_memory=None)  # type: ignore[arg-type]
    states = await prober.round(force=True)
    assert [s.name for s in states] == ["a"]
    assert set(store.view(PROVIDER_STATE)) == {"a"}


class _Down(_Ps):
    """A card whose /api/tags the test sets, or makes fail (the card down)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags_listed: list[dict[str, object]] | None = []

    async def tags(self, timeout_s: float | None = None) -> list[dict[str, object]]:
        if self.tags_listed is None:
            raise ConnectionError("connection refused")
        return self.tags_listed


async def test_a_card_whose_listing_fails_carries_what_it_listed_last() -> None:
    """(ProviderView.last_listed: a mistyped name is no reason to wait for a card that lacked
    it.) Carried through every probe of the outage, to other processes through the store,
    and dropped once the card lists again."""
    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server, store = _Down(), MemoryStore()
    prober = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                    gpu_memory=None)  # type: ignore[arg-type]
    server.tags_listed = [{"name": "qwen3:8b", "model": "qwen3:8b", "size": 5 << 30},
                          {"name": "gpt-oss:120b", "model": "gpt-oss:120b",
                           "remote_host": "https://ollama.com:443"}]
    assert (await prober.round(force=True))[0].listed_before == ()
    server.tags_listed = None
    for _ in range(2):
        state, = await prober.round(force=True)
        assert state.listed_before == ("gpt-oss:120b", "qwen3:8b")
        assert ProviderState.decode(store.view(PROVIDER_STATE)["a"].value).listed_before == \
            state.listed_before
    other = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                   gpu_memory=None)  # type: ignore[arg-type]
    assert (await other.probe("a")).listed_before == ("gpt-oss:120b", "qwen3:8b")
    server.tags_listed = [{"name": "qwen3:8b", "model": "qwen3:8b", "size": 5 << 30}]
    assert (await prober.probe("a")).listed_before == ()


async def test_a_card_down_goes_by_the_newest_listing_its_own_or_published() -> None:
    """Shared state: a sidecar probes a card only while nobody publishes it fresh, so its
    own last probe may be hours older than the published one. A card that goes down then
    goes by the newer listing: the older lacks a model pulled since, refused 404 by every
    sidecar while the card is down (a false 404: the agent gives up)."""
    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server, clock, store = _Down(), _Clock(1_800_000_000.0), MemoryStore()
    mine, theirs = (Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                           gpu_memory=None, clock=clock)  # type: ignore[arg-type]
                    for _ in range(2))
    server.tags_listed = [{"name": "qwen3:8b", "model": "qwen3:8b", "size": 5 << 30}]
    await mine.round(force=True)  # its start: then another publishes the card
    clock.at += 600
    server.tags_listed.append({"name": "llama3.2:3b", "model": "llama3.2:3b", "size": 2 << 30})
    await theirs.round(force=True)
    clock.at += 20  # the other stopped publishing: this one probes again, the card down
    server.tags_listed = None
    state, = await mine.round(force=True)
    assert state.listed_before == ("llama3.2:3b", "qwen3:8b")


async def test_a_newer_state_without_a_listing_does_not_hide_an_older_one() -> None:
    """A prober that never saw the card listed publishes a newer "down" state with no
    listing: the older listing still stands (else every model would be waited for again)."""
    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server, clock, store = _Down(), _Clock(1_800_000_000.0), MemoryStore()
    prober = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                    gpu_memory=None, clock=clock)  # type: ignore[arg-type]
    server.tags_listed = [{"name": "qwen3:8b", "model": "qwen3:8b", "size": 5 << 30}]
    listed, = await prober.round(force=True)
    clock.at += 600
    unlisted = replace(listed, available_mib={}, remote={}, listed_before=(), ready=False,
                       last_probed_at=clock.at)
    await store.put(PROVIDER_STATE, "a", unlisted.encode())
    clock.at += 20
    server.tags_listed = None
    state, = await prober.round(force=True)
    assert state.listed_before == ("qwen3:8b",)


async def test_an_empty_listing_is_a_known_catalog_through_an_outage_and_the_store() -> None:
    """`{"models": []}` is an Ollama with no model (server/routes.go ListHandler): known, as
    a listing is, while /api/tags then fails and for another process; never listed is not.
    An entry from an older publisher (no `modelsListed`) is known only if it lists one."""
    settings = load_settings(providers=[{"name": "a", "endpoint": "http://a:11434",
                                         "totalVramMiB": TOTAL}])
    server, store = _Down(), MemoryStore()
    server.tags_listed = None
    prober = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                    gpu_memory=None)  # type: ignore[arg-type]
    assert not (await prober.round(force=True))[0].listed  # never listed: any model
    server.tags_listed = []
    assert (await prober.round(force=True))[0].listed
    server.tags_listed = None
    state, = await prober.round(force=True)
    assert (state.listed, state.listed_before) == (True, ())
    assert ProviderState.decode(store.view(PROVIDER_STATE)["a"].value).listed
    other = Prober(list(settings.providers), {"a": server}, store,  # type: ignore[dict-item]
                   gpu_memory=None)  # type: ignore[arg-type]
    assert (await other.probe("a")).listed
    older = replace(state, listed=False).encode()
    assert not ProviderState.decode(older).listed
    assert ProviderState.decode(replace(state, listed=False, listed_before=("x:1b",)).encode()
                                ).listed
