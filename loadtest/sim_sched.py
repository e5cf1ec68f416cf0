"""One simulated `ollama serve`: its runners and its scheduler, as Ollama's server/sched.go
runs them.

- A call for a loaded copy whose load options match goes straight to it; any other waits
  in one queue (OLLAMA_MAX_QUEUE, then 503 "server busy") for the loader, which handles one
  load at a time (processPending) on either version: 0.12's own engine lists a copy (and
  lets calls for it wait outside the queue) once its memory is committed, yet the next load
  still waits until it has read its weights (acquire, _load).
- The loader reloads a copy whose options differ (needsReload: counted as a reload), unloads
  a model of its own choosing at OLLAMA_MAX_LOADED_MODELS or when the load does not pass its
  admission (HEAD: the estimate within 80 % of the free memory, as the first loaded runner in
  map order accounts it; 0.12: the whole footprint free) beside the models loaded (counted
  as self-evictions), waiting for the next unload (a busy victim's once its calls end), and
  loads a model that does not fit alone partly into CPU memory (a spill).
- A copy whose unload was asked for stays listed, and takes calls, until the unloader finds
  it idle; on a busy copy the unload holds only until a call sets keep_alive.
- A runner's memory follows its architecture x context x slots (sim_model.py).
- A runner decodes its busy slots in one batch a step, and the runners decoding at once
  time-slice the card (token_period_s; docs/engine.md).
- A load takes the runner's start-up and the read of the weights file, seen on the 250 ms
  poll grid (load_s); unloads go one at a time, each followed by the version's wait for the
  freed memory (processCompleted and waitForVRAMRecovery: _next_unload, recovery_s).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from .sim_cache import PromptCache
from .sim_engine import (
    MIB,
    MINIMUM_MEMORY_MIB,
    SERVER_BUSY,
    LoadOptions,
    batch_surcharge_mib,
    commits_before_read,
    embedding_batch,
    fits_in_80,
    needs_reload,
    resolve_options,
    version_tuple,
)
from .sim_gpus import (
    CUDA_CONTEXT_MIB,
    SPILL_MARGIN_MIB,
    Parts,
    counted_by_ollama,
    fewest_gpus,
    gpu_sizes,
    lay_out,
    single_gpu_fit,
    spread_admits,
)
from .sim_model import (
    RECOVERY_TIMEOUT_S,
    PromptTokens,
    SimConfig,
    SimModel,
    accounted_free_mib,
    decode_step_s,
    driver_recovery_s,
    in_map_order,
    load_seconds,
    recovery_s,
    tokens_for_text,
)

log = logging.getLogger("ollama_sim")  # loads, unloads and evictions, when asked for
BOS_BLOCK = (0, 1)  # the prompt's first token, the same in every prompt


class SimError(Exception):
    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Runner:
    """A loaded (or loading) model, like Ollama's runnerRef."""

    model: SimModel
    options: LoadOptions  # what it was loaded with (num_ctx as Ollama records it)
    ctx: int  # the context each slot really has (capped at the trained one)
    footprint_mib: int  # all it takes, GPU and CPU
    vram_mib: int  # what of it is on the GPU
    slots: asyncio.Semaphore
    slot_count: int = 1
    loaded: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    refcount: int = 0
    keep_alive_s: float = 300.0
    expires_at: float = math.inf  # time.time() seconds
    # An expiry of it is in the unloader's queue (expiredCh), put back while it is busy: it
    # unloads the first time the unloader finds it idle, whatever keep_alive calls set since
    unload_requested: bool = False
    evicted: bool = False  # processPending expired it for a load (counted once)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    cache: PromptCache | None = None  # its slots' prompt caches: empty at every (re)load
    died_at: float | None = None  # time.monotonic() when it died (the driver frees it then)
    decoding: int = 0  # its calls between their first token and their last: its batch
    # What the card had free when it loaded ("using device ... MiB free", llm/llama_server.go:
    # 2735, 2785): with its own VRAM, the free memory it reports (GetDeviceInfos, :2600-2636)
    free_at_load_mib: int = 0
    queued: bool = False  # waiting for the unloader
    timer: asyncio.TimerHandle | None = None  # its keep-alive (expireTimer)
    # In s.loaded (and /api/ps) while still reading its weights: 0.12's own engine once its
    # memory is committed (commits_before_read)
    listed: bool = False
    # Its part on each GPU of a server with several (sim_gpus); None on one GPU
    parts: Parts | None = None

    @property
    def crashed(self) -> bool:
        """Its llama-server died: listed until a call reloads it."""
        return self.died_at is not None

    @property
    def spilled(self) -> bool:
        return self.vram_mib < self.footprint_mib

    @property
    def speed(self) -> float:
        """Layers in CPU memory are slower: the share on the GPU, at least a fifth."""
        return max(0.2, self.vram_mib / self.footprint_mib) if self.footprint_mib else 1.0

    @property
    def accounted_free_mib(self) -> int:
        return accounted_free_mib(self.free_at_load_mib, self.vram_mib)


@dataclass
class Fault:
    # midstream: llama-server dies after `after_chunks` pieces (the runner with it)
    mode: str = "none"  # none | error | midstream | stall | slow_first_byte | oom
    count: int = 0  # how many more requests it hits; -1 forever
    status: int = 500
    after_chunks: int = 2
    delay_s: float = 0.0


@dataclass
class Stats:
    requests: int = 0
    loads: int = 0
    unloads: int = 0
    reloads: int = 0  # copies Ollama reloaded because a call's load options differed
    crashes: int = 0  # runners whose llama-server died under a call (the midstream fault)
    self_evictions: int = 0  # models Ollama unloaded itself to load another
    spills: int = 0  # copies loaded partly into CPU memory
    oom_events: int = 0
    truncations: int = 0  # prompts cut or shortened without a word
    too_long_refusals: int = 0  # prompts refused with 400 as longer than the context
    busy_refusals: int = 0  # 503 server busy: the load queue was full
    peak_vram_mib: int = 0
    max_prompt_tokens: int = 0
    inference_requests: int = 0
    abandoned: int = 0  # complete answers whose client left first (generation stopped)
    aborted_loads: int = 0  # loads (or waits for one) given up: the client that asked left
    evaluated_tokens: int = 0  # prompt tokens evaluated
    cached_tokens: int = 0  # prompt tokens found in a slot's cache instead
    cache_hits: int = 0  # calls that found any of their prompt cached
    peak_decoding: int = 0  # the most sequences decoding at once on this card, all runners
    # simulated seconds the unloader waited for freed memory after its unloads, all told
    recovery_s: float = 0.0
    requests_by_model: dict[str, int] = field(default_factory=dict)
    # /api/version, /api/tags, /api/ps and /api/show requests: what probing costs the server
    probes_by_path: dict[str, int] = field(default_factory=dict)


class OllamaSim:
    """State and behaviour of one simulated `ollama serve` (one GPU)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.runners: dict[str, Runner] = {}
        self.stats = Stats()
        self.fault = Fault()
        # One load at a time, on both versions: processPending runs a load to its end
        # (HEAD: llama-server's Load waits for it, server/sched.go:627, llm/llama_server.go:
        # 1047-1061). 0.12's own engine returns at its commit, but the next request's
        # updateFreeSpace (or needsReload, or the eviction) locks each loaded runner's refMu,
        # held until it is running (v0.12.6 server/sched.go:211, 519-520, 588, 239; 470,
        # 485-487): the next spawn waits for the read all the same
        self._loader = asyncio.Lock()
        self._pending = 0
        self.decoding = 0  # sequences decoding on this card now, all runners
        # processCompleted: expired runners in turn, and the recovery wait it blocks on
        self._expiries: deque[tuple[Runner, str]] = deque()
        self._recovering: asyncio.Task[None] | None = None
        self._unload_waiters: list[asyncio.Future[None]] = []  # processPending on unloadedCh
        self._finished: list[Runner] = []  # calls' ends the unloader has not read yet
        self._rng = random.Random(config.seed)  # s.loaded's map order, reproducibly

    @property
    def newest(self) -> bool:
        return version_tuple(self.config.version) >= (0, 30, 0)

    # -- time ------------------------------------------------------------------------------
    @property
    def fit_margin_mib(self) -> int:
        """What llama-server's fit keeps free on each GPU (0.30+, SimConfig.fit_target_mib)."""
        return self.config.fit_target_mib if self.newest else 0

    async def _sleep(self, seconds: float) -> None:
        scaled = seconds * self.config.time_scale
        if scaled > 0:
            await asyncio.sleep(scaled)

    # -- decoding --------------------------------------------------------------------------
    @contextlib.contextmanager
    def decoding_on(self, runner: Runner) -> Iterator[None]:
        """A call's sequence in `runner`'s batch from its first token to its last; the count
        drops however the call ends (its client left, the runner died)."""
        runner.decoding += 1
        self.decoding += 1
        self.stats.peak_decoding = max(self.stats.peak_decoding, self.decoding)
        try:
            yield
        finally:
            runner.decoding -= 1
            self.decoding -= 1

    def token_period_s(self, runner: Runner) -> float:
        """Simulated seconds until each sequence decoding on `runner` has its next token.

        Each runner is its own llama-server process decoding all its busy slots in one batch
        a step; runners decoding at once time-slice the card, so a token of every sequence
        waits for one step of each busy runner (docs/engine.md). Without sharing, a slot
        decodes alone at full speed."""
        c = self.config
        if not c.share_gpu:
            return decode_step_s(c.tokens_per_s, runner.speed, 1, 0.0)
        busy = [r for r in self.runners.values() if r.decoding and r is not runner]
        busy.append(runner)  # counted even once dropped from the list (a reset, a reload)
        return sum(decode_step_s(c.tokens_per_s, r.speed, r.decoding, c.batch_cost)
                   for r in busy)

    # -- memory ----------------------------------------------------------------------------
    def used_vram_mib(self) -> int:
        return sum(r.vram_mib for r in self.runners.values())

    def driver_used_mib(self) -> int:
        """What the driver says is taken: the runners' buffers and each runner's CUDA
        context (Ollama's free memory is the driver's figure)."""
        return self.used_vram_mib() + MINIMUM_MEMORY_MIB * len(self.runners)

    def _drop(self, name: str, why: str = "unload") -> None:
        runner = self.runners.pop(name, None)
        if runner is not None:
            self._disarm(runner)
            runner.gone.set()
            self.stats.unloads += 1
            log.info("%s %s: %s (%d MiB in use)", self.config.name, why, name,
                     self.used_vram_mib())

    def _expire(self, runner: Runner, why: str, *, timer: bool = False) -> None:
        """All but its keep-alive timer set its sessionDuration to 0 (sched.go:344, 1655,
        1725; v0.12.6 :245, 820), which findRunnerToUnload sorts first, and stop its timer.
        Only an idle runner goes to the unloader; a busy one is queued when its last call
        ends (release) unless a call sets keep_alive before then. Either way it stays in
        s.loaded, and takes calls, until it is unloaded."""
        if not timer:
            runner.keep_alive_s = 0.0
        self._disarm(runner)
        if runner.refcount == 0:
            self._queue_unload(runner, why)
        else:
            log.info("%s %s: %s once its calls end", self.config.name, why, runner.model.name)

    def expire_all(self) -> None:
        """An out-of-memory during inference: every loaded runner is expired
        (expireRunnersForRuntimeOOM, sched.go:1632-1661, walks s.loaded)."""
        for runner in list(self.runners.values()):
            if runner.loaded.is_set():
                self._expire(runner, "expired after running out of memory")

    def _victim(self) -> Runner:
        """findRunnerToUnload: by keep-alive (forever last), then by name; the first idle
        one, else the first."""
        ordered = sorted(self.runners.values(), key=lambda r: (r.keep_alive_s, r.model.name))
        return next((r for r in ordered if r.refcount == 0), ordered[0])

    async def _evict(self, why: str) -> None:
        """processPending expires the victim and waits for unloadedCh (sched.go:326-358)."""
        victim = self._victim()
        if not victim.evicted:
            victim.evicted = True
            self.stats.self_evictions += 1
        self._expire(victim, f"self-eviction ({why})")
        await self._any_unload()

    async def _any_unload(self) -> None:
        """processPending's wait on unloadedCh (sched.go:349-358; v0.12.6 :250-259): sent
        after every unload's recovery wait, whichever copy's (:463-466), so an eviction
        whose victim a call kept (its keep_alive) waits for some other unload."""
        waiter = asyncio.get_running_loop().create_future()
        self._unload_waiters.append(waiter)
        try:
            await waiter
        finally:
            with contextlib.suppress(ValueError):
                self._unload_waiters.remove(waiter)

    def _unloaded(self) -> None:
        """unloadedCh: wakes processPending's wait, if any."""
        waiters, self._unload_waiters = self._unload_waiters, []
        with contextlib.suppress(RuntimeError):  # (a recovery its closed loop drops)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # -- unloads: processCompleted ---------------------------------------------------------
    def _arm(self, runner: Runner, delay: float | None = None) -> None:
        """The keep-alive timer of a runner gone idle (sched.go:393-408), `delay` real
        seconds (its keep-alive unless said)."""
        self._disarm(runner)
        if delay is None:
            delay = runner.keep_alive_s * self.config.time_scale
        if math.isfinite(delay) and delay < 1e9:
            runner.timer = asyncio.get_running_loop().call_later(
                delay, self._keep_alive_over, runner)

    @staticmethod
    def _disarm(runner: Runner) -> None:
        if runner.timer is not None:
            runner.timer.cancel()
            runner.timer = None

    def _keep_alive_over(self, runner: Runner) -> None:
        runner.timer = None
        if runner.refcount == 0 and self.runners.get(runner.model.name) is runner:
            self._expire(runner, "keep-alive expiry", timer=True)

    def _queue_unload(self, runner: Runner, why: str) -> None:
        """An idle runner into expiredCh."""
        runner.unload_requested = True
        if not runner.queued:
            runner.queued = True
            self._expiries.append((runner, why))
        self._next_unload()

    def _unloader_busy(self) -> bool:
        return self._recovering is not None and not self._recovering.done()

    def _next_unload(self) -> None:
        """processCompleted (sched.go:414-470) handles one expiry at a time: it reads the
        baseline, kills the runner and drops it from s.loaded (and /api/ps), then blocks on
        waitForVRAMRecovery before it sends unloadedCh and takes the next expiry."""
        while self._expiries and not self._unloader_busy():
            runner, why = self._expiries.popleft()
            runner.queued = False
            if self.runners.get(runner.model.name) is not runner:
                continue  # a duplicate expiry: already unloaded
            if runner.refcount > 0:
                # a call took it meanwhile: Ollama puts the expiry back every 10 ms until
                # the runner is idle (sched.go:417-427); release queues it again then
                continue
            wait = self.recovery_s(runner)  # its baseline is read before the unload
            self._drop(runner.model.name, why)
            self.stats.recovery_s += wait
            self._recovering = asyncio.get_running_loop().create_task(
                self._recover(wait))
            self._recovering.add_done_callback(self._recovered)

    def _recovered(self, task: asyncio.Task[None]) -> None:
        """An unloader that failed would leave every later unload (and Ollama's own
        evictions waiting for them) hanging: said loudly, and the next one started."""
        if not task.cancelled() and task.exception() is not None:
            log.error("%s unloader failed", self.config.name, exc_info=task.exception())
            self._next_unload()

    async def _recover(self, wait: float) -> None:
        me = asyncio.current_task()  # (a loop closing under it leaves none to ask in finally)
        try:
            await self._sleep(wait)
            self._read_finished()  # (before the next expiry: Go's select picks at random)
        finally:
            if self._recovering is me:  # not one a reset cancelled
                self._recovering = None
            self._unloaded()
        self._next_unload()  # not when cancelled: a reset, or the server stopping

    def recovery_s(self, victim: Runner) -> float:
        """Simulated seconds waitForVRAMRecovery (sched.go:1441-1497; v0.12.6 628-684) keeps
        the unloader after unloading `victim`: done on the first 250 ms tick whose free memory
        is more than 0.75 x the victim's VRAM above the baseline read before the unload, else
        after 5 s; no wait for a runner with nothing on the GPU.

        0.12 reads the driver's free memory: the first tick after the driver has freed the
        victim's (vram_release_s after the kill; a llama-server that died was freed when it
        died, so a baseline read after that never sees memory come back: 5 s).

        HEAD reads runners' static accounting (accounted_free_mib) through the first runner
        on a GPU in s.loaded's map order (sim_model.recovery_s, which the policy
        simulation's fleet model uses too).

        Left out: other devices (one GPU a server), the victim's memory still held by the
        driver after the unload (loads see it free at once: the driver release only times
        0.12's recovery, and HEAD's discovery is taken to see it freed), 0.12's own time to
        read the memory, and the tick the 5 s timeout shares with the last reading."""
        c = self.config
        if victim.vram_mib <= 0:
            return 0.0
        if not self.newest:
            release = c.vram_release_s
            if victim.died_at is not None:
                release -= (time.monotonic() - victim.died_at) / c.time_scale \
                    if c.time_scale > 0 else math.inf
                if release <= 0:
                    return RECOVERY_TIMEOUT_S
            return driver_recovery_s(release)
        loaded = [r for r in self.runners.values() if r.loaded.is_set()]
        return recovery_s(victim, loaded, self._rng, c.discovery_s)

    def reset(self) -> None:
        """/_sim/reset: nothing loaded, nothing waiting to unload, counters at zero."""
        self._expiries.clear()
        self._finished.clear()
        if self._recovering is not None:
            self._recovering.cancel()
            self._recovering = None
        for runner in self.runners.values():
            self._disarm(runner)
            runner.gone.set()
        self.runners.clear()
        self._unloaded()
        self.stats = Stats()
        self.fault = Fault()
        self._rng = random.Random(self.config.seed)  # the same orders as a fresh server

    def adopt_loop(self) -> None:
        """A server (re)starting on a new event loop: what the old loop held went with it (its
        timers never fire, uvicorn cancelled its tasks and nobody awaits its futures), so
        what they stood for is taken on here: the call ends a cut recovery wait left are
        read, each idle copy's keep-alive timer runs again for what is left of it (one
        already past unloads now), and the unloader takes the next expiry."""
        self._recovering = None
        self._unload_waiters.clear()
        self._read_finished()
        now = time.time()
        for runner in list(self.runners.values()):
            if runner.refcount == 0 and runner.loaded.is_set() and not runner.queued:
                if runner.expires_at <= now:
                    self._expire(runner, "keep-alive expiry", timer=True)
                else:
                    self._arm(runner, runner.expires_at - now)
        self._next_unload()

    def resolve(self, model: SimModel, body: dict[str, Any]) -> LoadOptions:
        c = self.config
        options = resolve_options(body, model.modelfile_num_ctx, c.context_length,
                                  c.default_context(), model.trained_ctx, model.vision,
                                  model.model_family, model.slots(c.num_parallel, c.version))
        if model.embedding and self.newest and options.num_batch_auto:
            # HEAD sets an embedding model's num_batch, not automatic (server/routes.go:
            # 150-152, 216-218): compared as any other in needsReload
            return replace(options, num_batch=embedding_batch(options.num_ctx),
                           num_batch_auto=False)
        return options

    def _usable(self, runner: Runner | None, request: LoadOptions) -> bool:
        """needsReload's answer (sched.go:1381-1431), its Ping of a dead llama-server
        included (:1426). Nothing in it looks at an expiry: a runner whose unload was asked
        for is usable until it leaves s.loaded (v0.12.6 :586-618)."""
        return runner is not None and runner.loaded.is_set() \
            and not runner.crashed and not needs_reload(
                runner.options, request, runner.model.trained_ctx, self.config.version)

    @property
    def loads_pending(self) -> int:
        """Loads in Ollama's queue, the one being loaded among them."""
        return self._pending

    async def acquire(self, model: SimModel, body: dict[str, Any], keep_alive_s: float | None
                      ) -> tuple[Runner, float]:
        """The loaded runner for `model` (loading it if needed) and the seconds until it was
        ready: Ollama's load_duration (queue, evictions and load; not the slot wait).
        `keep_alive_s` None: the call did not set it, and a loaded copy keeps its own
        (sched.go:483-485); a load takes OLLAMA_KEEP_ALIVE (:512-515)."""
        started = time.perf_counter()
        request = self.resolve(model, body)
        runner = self.runners.get(model.name)
        if runner is not None and runner.listed and not runner.loaded.is_set():
            # 0.12's own engine: GetRunner finds the copy in s.loaded and needsReload waits
            # for its refMu until it runs (v0.12.6 server/sched.go:106-110, 588; 470,
            # 485-487): outside the load queue, then as for a loaded copy
            await self._loaded_or_gone(runner)
            runner = self.runners.get(model.name)
        if not self._usable(runner, request):
            # pendingReqCh holds OLLAMA_MAX_QUEUE (sched.go:91-95, 205-207) beside the one
            # processPending is loading for
            if self._pending > self.config.max_queue:
                self.stats.busy_refusals += 1
                raise SimError(SERVER_BUSY, 503)
            self._pending += 1
            try:
                async with self._loader:
                    runner = await self._schedule(model, request, keep_alive_s)
            finally:
                self._pending -= 1
        assert runner is not None
        runner.refcount += 1
        runner.idle.clear()
        self._disarm(runner)  # useLoadedRunner stops the keep-alive timer (sched.go:479-482)
        if keep_alive_s is not None:
            runner.keep_alive_s = keep_alive_s  # last writer wins, as in Ollama
        return runner, time.perf_counter() - started

    @staticmethod
    async def _loaded_or_gone(runner: Runner) -> None:
        waits = [asyncio.ensure_future(runner.loaded.wait()),
                 asyncio.ensure_future(runner.gone.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _schedule(self, model: SimModel, request: LoadOptions, keep_alive_s: float | None
                        ) -> Runner:
        """processPending for one request, with the loader held."""
        c = self.config
        while True:
            runner = self.runners.get(model.name)
            if runner is not None:
                if self._usable(runner, request):
                    return runner  # loaded by a call ahead of this one, or leaving later
                if runner.crashed:
                    self._expire(runner, "reload of a runner that died")
                else:
                    if not (runner.unload_requested or runner.evicted):  # not going anyway
                        self.stats.reloads += 1
                    runner.evicted = True
                    self._expire(runner, "reload for other load options")
                await self._any_unload()  # an eviction of itself
                continue
            if len(self.runners) >= c.max_runners:
                await self._evict(f"{c.max_runners} models loaded")
                continue
            slots = model.slots(c.num_parallel, c.version)
            ctx = min(request.num_ctx, model.trained_ctx)
            # (the batch's compute surcharge is a completion model's, sched.go:815-819)
            # (0.12 has no automatic batch: its runner's is 512 unless the call sets one)
            window_batch = request.num_batch if self.newest or not request.num_batch_auto \
                else 512
            need = model.footprint_mib(ctx, slots, c.cache_type,
                                       0 if model.embedding else request.num_batch, c.version,
                                       window_batch)
            if c.gpu_count > 1:
                compute = model.compute_base_mib + batch_surcharge_mib(
                    0 if model.embedding else request.num_batch)
                use = self._gpus_for(model.estimate_mib(ctx, slots), need - compute, compute)
                if use is None:
                    await self._evict(f"{model.name} needs room")
                    continue
                return await self._load(model, request, ctx, slots, need,
                                        c.keep_alive_s if keep_alive_s is None else keep_alive_s,
                                        (use, compute))
            if self.runners:
                if self.newest:
                    free = self.fit_free_mib()
                    fits = fits_in_80(model.estimate_mib(ctx, slots), c.total_vram_mib,
                                      c.total_vram_mib - free)
                else:  # 0.12's estimator keeps the same minimum for CUDA
                    fits = need + MINIMUM_MEMORY_MIB <= c.total_vram_mib - self.driver_used_mib()
                if not fits:
                    await self._evict(f"{model.name} needs room")
                    continue
            return await self._load(model, request, ctx, slots, need,
                                    c.keep_alive_s if keep_alive_s is None else keep_alive_s)

    def gpu_free_mib(self) -> list[int]:
        """What the driver says each GPU has free: its size less every runner's part on it
        and the runner's CUDA context there."""
        c = self.config
        free = list(gpu_sizes(c.total_vram_mib, c.gpu_count))
        for runner in self.runners.values():
            for i, mib in enumerate(runner.parts.on_gpu if runner.parts else ()):
                if mib:
                    free[i] -= mib + CUDA_CONTEXT_MIB
        return free

    def ollama_free_mib(self) -> list[int]:
        """HEAD's free memory on each GPU for its placement and fit check: the GPU less what
        updateFreeSpace counts of each loaded runner on it (server/sched.go:1295-1335; a GPU
        no runner reports is read from the driver, discover/runner.go:335-366, which for a
        GPU with no runner is its size). From 0.30 a copy alone on a GPU but the first is
        not counted (sim_gpus.counted_by_ollama, Ollama issue 18349). The runners' static
        accounting (fit_free_mib) is not modelled per GPU."""
        c = self.config
        free = list(gpu_sizes(c.total_vram_mib, c.gpu_count))
        for runner in self.runners.values():
            if runner.parts is None:
                continue
            for i, mib in enumerate(counted_by_ollama(runner.parts, self.newest)):
                free[i] -= mib
        return [max(0, mib) for mib in free]

    def _gpus_for(self, predicted_mib: int, layered_mib: int, compute_mib: int
                  ) -> list[int] | None:
        """The GPUs a load goes to, or None when Ollama evicts first.

        HEAD (selectLlamaServerPlacement, server/sched.go:967-1031): the single GPU with the
        most free memory whose 80 % holds the estimate (bestSingleGPUFit, :1009-1026,
        1060-1076), else all the GPUs (:1028, 1086-1098); OLLAMA_SCHED_SPREAD always all
        (:1009). Beside loaded runners the estimate must be within 80 % of the chosen GPUs'
        free memory (:544-551), which a single GPU passes by its choice.

        0.12: the fewest GPUs by free memory that hold the whole copy (llm/memory.go:21-44,
        llm/server.go:1003-1011), all with OLLAMA_SCHED_SPREAD; beside loaded runners a copy
        that no set holds makes it evict (requireFull); alone it goes over all and spills."""
        c = self.config
        every = list(range(c.gpu_count))
        if self.newest:
            view = self.ollama_free_mib()
            single = None if c.sched_spread else single_gpu_fit(predicted_mib, view)
            if single is not None:
                return [single]
            if self.runners and not spread_admits(predicted_mib, view):
                return None
            return every
        free = self.gpu_free_mib()
        use = fewest_gpus(layered_mib, compute_mib, free)
        if c.sched_spread and use is not None:
            use = every
        if use is None and self.runners:
            return None
        return use or every

    def fit_free_mib(self) -> int:
        """HEAD's free memory for the fit check beside loaded runners (server/sched.go:
        544-551): GPUDevices asks the first runner on the GPU in processPending's snapshot of
        s.loaded (a map: random order, :249-252, 276) for its own static accounting
        (discover/runner.go:285-331; accounted_free_mib), and updateFreeSpace lowers that to
        the total less the loaded runners' VRAM (:1295-1335). A runner that loaded after a
        copy since unloaded still counts that copy's memory as taken. With no runner on the
        GPU, a bootstrap discovery reads the driver."""
        c = self.config
        loaded = [r for r in self.runners.values() if r.loaded.is_set()]
        on_gpu = in_map_order(loaded, self._rng)
        seen = on_gpu[0].accounted_free_mib if on_gpu else \
            c.total_vram_mib - self.driver_used_mib()
        return max(0, min(seen, c.total_vram_mib - sum(r.vram_mib for r in loaded)))

    def load_s(self, model: SimModel) -> float:
        """Simulated seconds from a load's start to its runner seen ready: the runner's
        start-up and the read of the weights file (the KV cache is allocated, never read),
        seen on WaitUntilRunning's 250 ms poll grid."""
        c = self.config
        return load_seconds(c.startup_s, model.disk_mib, c.load_mib_per_s)

    async def _load(self, model: SimModel, request: LoadOptions, ctx: int, slots: int,
                    need: int, keep_alive_s: float,
                    spread: tuple[list[int], int] | None = None) -> Runner:
        c = self.config
        parts = None
        if spread is None:
            # llama-server fits what the driver says is free, its own CUDA context included,
            # and logs that figure (free_at_load_mib): every other runner's buffers and CUDA
            # context at this moment, kept for the runner's life whatever unloads later
            free = c.total_vram_mib - self.driver_used_mib() - MINIMUM_MEMORY_MIB
            fits = need <= free - self.fit_margin_mib
            vram = need if fits else max(0, free - max(SPILL_MARGIN_MIB, self.fit_margin_mib))
        else:  # over several GPUs: each it uses holds the compute buffers (sim_gpus)
            use, compute = spread
            gpu_free = self.gpu_free_mib()
            parts = lay_out(need - compute, compute, gpu_free, use, self.fit_margin_mib)
            need = parts.vram_mib + parts.cpu_mib
            vram = parts.vram_mib
            free = sum(gpu_free[i] - CUDA_CONTEXT_MIB for i in use)
        if self.newest:  # the runner keeps the context it really got (sched.go:692-694)
            request = replace(request, num_ctx=ctx)
        runner = Runner(model=model, options=request, ctx=ctx, footprint_mib=need,
                        vram_mib=vram, slots=asyncio.Semaphore(slots), slot_count=slots,
                        keep_alive_s=keep_alive_s, free_at_load_mib=max(0, free),
                        cache=PromptCache(slots, self.config.version), parts=parts)
        self.runners[model.name] = runner
        self.stats.loads += 1
        if runner.spilled:
            self.stats.spills += 1
        log.info("%s load: %s at %d x %d (%d MiB%s%s; %d MiB in use)", self.config.name,
                 model.name, ctx, slots, need,
                 f", {need - vram} MiB on the CPU" if runner.spilled else "",
                 f", {'/'.join(map(str, parts.on_gpu))} MiB on the GPUs" if parts else "",
                 self.used_vram_mib())
        self.stats.peak_vram_mib = max(self.stats.peak_vram_mib, self.used_vram_mib())
        try:
            if commits_before_read(model.arch, model.embedding, c.version, c.new_engine):
                # Load returns once the memory is committed (the start-up here) and the
                # runner joins s.loaded; WaitUntilRunning then runs beside it (v0.12.6
                # llm/server.go:827-841, server/sched.go:444, 472-487). Ready at the same time.
                await self._sleep(c.startup_s)  # (load_s holds it: rounded up)
                runner.listed = True
                await self._sleep(self.load_s(model) - c.startup_s)
            else:
                await self._sleep(self.load_s(model))
        except BaseException:
            if self.runners.get(model.name) is runner:  # (else already gone)
                if runner.listed:  # in s.loaded: its failed wait expires it to the unloader
                    self._expire(runner, "load abandoned")  # (v0.12.6 sched.go:487-492)
                else:  # closed, never in s.loaded: no wait
                    self._drop(model.name, "load abandoned")
            raise
        runner.loaded.set()
        return runner

    def release(self, runner: Runner) -> None:
        """A call's end, which processCompleted reads from finishedReqCh (sched.go:374-413;
        v0.12.6 :275-313), in the loop that blocks on the wait for freed memory after each
        unload (:463; v0.12.6 :363): meanwhile the call still holds its runner."""
        if self._unloader_busy():
            self._finished.append(runner)
            return
        self._finish(runner)

    def _read_finished(self) -> None:
        finished, self._finished = self._finished, []
        for runner in finished:
            self._finish(runner)

    def _finish(self, runner: Runner) -> None:
        """An idle runner with sessionDuration 0 is expired, any other gets its keep-alive
        timer; an expiry already queued for it still unloads it."""
        runner.refcount -= 1
        if runner.refcount > 0:
            return
        runner.idle.set()
        if self.runners.get(runner.model.name) is not runner:
            return
        if runner.keep_alive_s <= 0:
            self._queue_unload(runner, "unload")
            return
        runner.expires_at = time.time() + runner.keep_alive_s * self.config.time_scale
        self._arm(runner)
        if runner.unload_requested:  # put back while it was busy (_next_unload)
            self._queue_unload(runner, "unload once idle")
        else:
            runner.evicted = False  # a call's keep_alive kept it: a later eviction counts

    def request_unload(self, model: SimModel) -> None:
        """expireRunner (sched.go:1713-1731) looks only at s.loaded, which a runner joins once
        its load has finished (:627, 727): a copy still loading ignores the unload."""
        runner = self.runners.get(model.name)
        if runner is not None and runner.loaded.is_set():
            runner.expires_at = time.time()  # what /api/ps shows until it leaves (:1720)
            self._expire(runner, "unload")

    def crash(self, runner: Runner) -> None:
        """llama-server died under a call: Ollama closes it (llm/llama_server.go:1759-1766)
        and keeps the copy listed until a call's Ping fails (sched.go:1426) and reloads it."""
        if not runner.crashed:
            runner.died_at = time.monotonic()
            self.stats.crashes += 1
            log.info("%s llama-server died: %s", self.config.name, runner.model.name)

    # -- prompts ---------------------------------------------------------------------------
    def chat_prompt(self, body: dict[str, Any]) -> PromptTokens:
        cpt = self.config.chars_per_token
        prompt = PromptTokens(blocks=[BOS_BLOCK])
        tools = body.get("tools")
        if tools:
            prompt.fixed += tokens_for_text(str(tools), cpt)
            prompt.blocks.append((hash(str(tools)), prompt.fixed))
        for msg in body.get("messages") or []:
            text = str(msg.get("content") or "")
            calls = msg.get("tool_calls")
            if calls:
                text += str(calls)
            images = msg.get("images") or []
            prompt.images += len(images)
            tokens = tokens_for_text(text, cpt) + 4 + self.config.image_tokens * len(images)
            prompt.messages.append(tokens)
            prompt.system_flags.append(msg.get("role") == "system")
            prompt.blocks.append((hash((msg.get("role"), text, str(images))), tokens))
        return prompt

    def generate_prompt(self, body: dict[str, Any]) -> PromptTokens:
        cpt = self.config.chars_per_token
        prompt = PromptTokens(images=len(body.get("images") or []), blocks=[BOS_BLOCK])
        context = body.get("context")
        if isinstance(context, list) and context:  # an earlier answer's tokens, put first
            prompt.messages.append(len(context))
            prompt.system_flags.append(False)
            prompt.blocks.append((hash(str(context)), len(context)))
        for key in ("system", "prompt"):
            text = body.get(key)
            if text:
                prompt.messages.append(tokens_for_text(str(text), cpt) + 4)
                prompt.system_flags.append(key == "system")
                prompt.blocks.append((hash((key, str(text))), prompt.messages[-1]))
        return prompt

    # -- fault injection -------------------------------------------------------------------
    def take_fault(self) -> Fault | None:
        fault = self.fault
        if fault.mode == "none" or fault.count == 0:
            return None
        if fault.count > 0:
            fault.count -= 1
        return Fault(fault.mode, 1, fault.status, fault.after_chunks, fault.delay_s)

    # -- ps / tags / show ------------------------------------------------------------------
    def ps(self) -> dict[str, Any]:
        """Runners in s.loaded, with what each holds of the GPU: loaded ones, and 0.12's own
        engine's still reading their weights (v0.12.6 server/routes.go:1758-1800 reads
        s.loaded unlocked; HEAD lists a llama-server copy once it runs, server/sched.go:627,
        727). The expiry is the one set when the runner last went idle (sched.go:405, 409) or
        was unloaded (:1720), stale while it is busy; never set, now + its keep-alive
        (:1775-1780; v0.12.6 server/routes.go:1778, 1783-1789)."""
        models = []
        now = time.time()
        for runner in self.runners.values():
            if not (runner.loaded.is_set() or runner.listed):
                continue
            if runner.expires_at == math.inf:
                remaining = runner.keep_alive_s * self.config.time_scale
            else:
                remaining = runner.expires_at - now
            remaining = min(remaining, 292 * 365 * 86400.0)
            expires = datetime.now(UTC) + timedelta(seconds=remaining)
            models.append({
                **self._describe(runner.model),
                "expires_at": expires.isoformat().replace("+00:00", "Z"),
                "size": runner.footprint_mib * MIB,
                "size_vram": runner.vram_mib * MIB,
                "context_length": runner.options.num_ctx,  # 0.12: as requested, uncapped
            })
        models.sort(key=lambda m: m["expires_at"], reverse=True)
        return {"models": models}

    def _describe(self, model: SimModel) -> dict[str, Any]:
        return {
            "name": model.name,
            "model": model.name,
            "digest": hashlib.sha256(model.name.encode()).hexdigest(),
            "details": {
                "parent_model": "",
                "format": "gguf",
                "family": model.model_family,
                "families": [model.model_family],
                "parameter_size": model.parameter_size,
                "quantization_level": model.quantization,
            },
        }

    def tags(self) -> dict[str, Any]:
        return {"models": [
            {**self._describe(m), "modified_at": "2026-01-01T00:00:00Z", "size": m.disk_mib * MIB}
            for m in self.config.models
        ]}

    def show(self, model: SimModel) -> dict[str, Any]:
        parameters = ['stop                           "<|im_end|>"']
        if model.modelfile_num_ctx:
            parameters.append(f"{'num_ctx':<30} {model.modelfile_num_ctx}")
        capabilities = ["embedding"] if model.embedding else \
            ["completion", "tools"] if model.tools else ["completion"]
        if model.insert and not model.embedding:
            capabilities.append("insert")
        if model.thinks:
            capabilities.append("thinking")
        if model.vision:
            capabilities.append("vision")
        return {
            "modelfile": f"FROM {model.name}\n",
            "parameters": "\n".join(parameters),
            "template": "{{ .Prompt }}",
            "details": self._describe(model)["details"],
            "model_info": model.model_info(),
            "capabilities": capabilities,
            "modified_at": "2026-01-01T00:00:00Z",
        }
