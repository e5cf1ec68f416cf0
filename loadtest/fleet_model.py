"""A model of a GPU fleet running Ollama, for the virtual-clock simulation.

Each GPU behaves like one `ollama serve` at HEAD: a load takes the runner's start-up plus the
read of the weights file (not the footprint: the KV cache is allocated, never read), seen
ready on Ollama's 250 ms poll (`load_seconds`); loads go one at a time in arrival order, a
call for a loaded copy bypassing them; OLLAMA_NUM_PARALLEL slots per loaded model with a FIFO
queue beyond them, keep-alive expiry, and Ollama's own eviction (of a busy copy too, once its
calls end) when a load does not fit; unloads go one at a time, each followed by Ollama's wait
for the freed memory, a copy waiting for the unloader still loaded and taking calls
(docs/development.md, "The policy simulation's fleet model"). What a real fleet would suffer
is counted: a load that does not fit beside the residents (the engine has to evict on its
own, or cannot load at all: an out-of-memory event), and a prompt longer than the context
(silently cut).

Calls decoding at once share the card. Each loaded model is a runner process of its own
(server/sched.go:577 -> llm/llama_server.go:423-436 starts one llama-server per model; v0.12.6:
server/sched.go:421 -> llm/server.go:294-342, `ollama runner`) that decodes all its busy slots
in one batch per step (v0.12.6 runner/llamarunner/runner.go:389-462: every sequence's next
token into one batch, one Decode; llama-server's update_slots likewise adds "sampled tokens from
any ongoing sequences" to one batch). A step with n sequences costs (1 + batch_cost x (n - 1))
times one alone: decoding is memory-bound, one more sequence adds its KV-cache reads, not
another read of the weights. Runners on one card time-slice it: each decoding call gets a
token per period, the sum of the step times of the card's runners that are decoding
(`GpuSpec.slicing = "time"` instead gives each decoding runner an equal share of the card's
time). Prefill runs at full speed, unshared. `GpuSpec.share_gpu = False` decodes every call
at full speed.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from loadtest.sim_cache import (
    DEFAULT_DEPTH_SCALE,
    Block,
    CacheSlot,
    PromptCache,
    depth_scale,
    prefill_seconds,
)
from loadtest.sim_model import CATALOG, accounted_free_mib, blob_path, recovery_s, weights_of
from loadtest.sim_model import load_seconds as sim_load_seconds
from proxy.core.conversations import Conversation

CACHE_VERSION = "0.33.0"  # the slot choice of Ollama's current llama-server runner
# Prefill slows with depth (sim_cache.py): each model's depth scale from its architecture
DEPTH_SCALES = {m.name: depth_scale(m) for m in CATALOG}


CATALOG_DISK_MIB = {m.name: m.disk_mib for m in CATALOG}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    footprint_mib: int  # in VRAM once loaded: weights, KV cache, graph
    tokens_per_s: float  # generation speed on this class of GPU
    # The weights file a load reads (/api/tags `size`; v0.12.6 ml/backend/ggml/ggml.go:495
    # reads the GGUF tensor data). None: the whole footprint, for a model stated by it alone.
    disk_mib: int | None = None
    # The sha256 of its weights file, which Ollama keys its runners by (sim_model.SimModel's):
    # its own when empty; `dataclasses.replace(m, name=...)` keeps m's (an alias)
    weights: str = ""

    def __post_init__(self) -> None:
        if not self.weights:
            object.__setattr__(self, "weights", weights_of(self.name))
        if self.disk_mib is not None and not 0 < self.disk_mib <= self.footprint_mib:
            raise ValueError(f"{self.name}: weights of {self.disk_mib} MiB do not fit its "
                             f"footprint of {self.footprint_mib} MiB")

    @classmethod
    def catalogued(cls, name: str, footprint_mib: int, tokens_per_s: float) -> ModelSpec:
        """A model of the simulator's catalogue (loadtest/sim_model.py), its file's size."""
        return cls(name, footprint_mib, tokens_per_s, CATALOG_DISK_MIB[name])

    @property
    def blob_path(self) -> str:
        return blob_path(self.weights)

    @property
    def read_mib(self) -> int:
        """What a load reads from disk."""
        return self.footprint_mib if self.disk_mib is None else self.disk_mib


@dataclass(frozen=True)
class GpuSpec:
    name: str
    total_mib: int
    context: int = 8192
    slots: int = 1
    load_mib_per_s: float = 1024.0  # reading the weights file (hardware: disk, PCIe)
    startup_s: float = 1.0  # a load's runner start-up before the read (process, CUDA init)
    # From an unload's kill to its memory back (the process's exit, the driver's release)
    unload_s: float = 1.0
    # A bootstrap GPU discovery, what HEAD's wait for freed memory reads with no runner left
    # on the card (Ollama caps it at 3 s)
    discovery_s: float = 0.5
    keep_alive_s: float = 300.0
    prompt_tokens_per_s: float = 2000.0  # at depth 0: deeper tokens are slower (sim_cache)
    # One more sequence in a decode step, as a share of one alone: its KV-cache reads (the
    # step is memory-bound; the weights are read once for the whole batch). A hardware figure.
    batch_cost: float = 0.1
    share_gpu: bool = True  # False: every call decodes at full speed, whatever else runs
    # How runners decoding at once share the card: "steps", one step of each a round (a
    # token of every call waits for every busy runner's step); "time", equal shares of the
    # card's time (a call's token takes its runner's step x the busy runners). A hardware
    # question Ollama's source does not settle: the driver's time-slicing between processes.
    slicing: str = "steps"


def load_seconds(model: ModelSpec, gpu: GpuSpec) -> float:
    """A load from its start to the runner seen ready (sim_model.load_seconds)."""
    return sim_load_seconds(gpu.startup_s, model.read_mib, gpu.load_mib_per_s)


@dataclass
class SimCall:
    ident: int
    agent: str
    candidates: tuple[tuple[str, float], ...]  # (model, score), preferred first
    prompt_tokens: int
    output_tokens: int
    arrived: float
    model: str = ""
    gpu: str = ""
    placement: str = ""
    started: float = 0.0
    finished: float = 0.0
    truncated: bool = False
    failed: str = ""  # why it never ran: oom, model-too-large, prompt-too-large, gpu-busy
    on_done: Callable[[SimCall], None] | None = None
    # A tool loop's call: its prompt as the sidecar knows it and as the prompt cache
    # compares it (loadtest/tool_loops.py); what it found cached and its prefill time
    conversation: Conversation | None = None
    blocks: tuple[Block, ...] = ()
    cached_tokens: int = 0
    prefill_s: float = 0.0
    ends_loop: bool = False  # its answer calls no tool: the loop's last call

    @property
    def preferred(self) -> str:
        return self.candidates[0][0]


@dataclass
class Resident:
    model: ModelSpec
    ready: bool = False
    running: int = 0
    queue: deque[SimCall] = field(default_factory=deque)
    last_used: float = 0.0
    expiry_token: int = 0
    cache: PromptCache | None = None  # its slots' prompt caches (sim_cache.py): empty at load
    slots_held: dict[int, CacheSlot] = field(default_factory=dict)  # call ident -> its slot
    decoding: int = 0  # its calls past their prefill: one batch per step
    # What the card had free when its load started (llama-server logs it, and HEAD's
    # accounting keeps it for the runner's life: sim_model.recovery_s)
    free_at_load_mib: int = 0
    # Its sessionDuration: the card's keep-alive, 0 once an unload is asked of it (no call in
    # this model sets keep_alive, so it stays 0)
    keep_alive_s: float = 0.0
    # An expiry of it is with the unloader: it goes the first time the unloader finds it idle,
    # loaded (and taking calls) until then
    expiring: bool = False
    # The scheduler asked for its unload (Gpu.unload): the scheduler's next load is taken as
    # sent once it is gone
    leaving: bool = False

    @property
    def vram_mib(self) -> int:
        return self.model.footprint_mib

    @property
    def idle(self) -> bool:
        return not self.running and not self.queue

    @property
    def accounted_free_mib(self) -> int:
        return accounted_free_mib(self.free_at_load_mib, self.vram_mib)


@dataclass(eq=False)
class Unload:
    """A copy killed, its memory held until `back_at`."""

    resident: Resident
    back_at: float


@dataclass
class Decode:
    """A call past its prefill: the answer tokens it has still to decode, as of the card's
    last change, and the version of its finish event (older events are stale)."""

    call: SimCall
    resident: Resident
    left: float
    version: int = 0


@dataclass
class Counters:
    cold_loads: int = 0
    loaded_mib: int = 0
    evictions: int = 0
    overcommits: int = 0
    oom_events: int = 0
    truncations: int = 0


class Gpu:
    def __init__(self, spec: GpuSpec, schedule: Callable[[float, Callable[[], None]], None],
                 now: Callable[[], float], counters: Counters,
                 on_change: Callable[[], None], seed: int = 0) -> None:
        self.spec = spec
        self.schedule = schedule
        self.now = now
        self.counters = counters
        self.on_change = on_change
        # s.loaded and the copy loading, by the model blob (schedulerModelKey, server/sched.go:
        # 111-128), whichever name loaded it: a copy whose unload is asked for stays until killed
        self.residents: dict[str, Resident] = {}
        # processPending: calls for a model not loaded, one load at a time in arrival order
        self.loads: deque[tuple[ModelSpec, SimCall]] = deque()
        self.loading: Resident | None = None  # the load processPending blocks on
        # Ollama's own eviction waiting on unloadedCh, which any unload's recovery sends
        self.evicting = False
        self.overcommitted: set[int] = set()  # calls already counted as sent without room
        # processCompleted: expired copies killed one at a time, each then waiting for the
        # freed memory; the map order of that wait is drawn from a seeded generator per card
        self.expiries: deque[Resident] = deque()  # expiredCh: listed copies, in turn
        self.unloads: list[Unload] = []  # killed, their memory not yet back
        self.recovering = False  # the unloader blocked in its wait for freed memory
        self.rng = random.Random(f"{seed}/{spec.name}")
        self.memory_trace: list[tuple[float, int]] = [(0.0, 0)]
        # Processor sharing of the decode: each decoding call gains a token per `token_s`
        self.decoding: dict[int, Decode] = {}
        self.decoded_at = 0.0  # when each Decode.left was last brought up to date

    # -- memory ----------------------------------------------------------------------------
    def used_mib(self) -> int:
        """What a load must fit beside: the copies loaded or loading, but those the scheduler
        asked to unload (it sends its load once they are gone; their memory is waited for)."""
        return sum(r.vram_mib for r in self.residents.values() if not r.leaving)

    def held_mib(self) -> int:
        """What the card holds: every copy loaded or loading, those waiting for the unloader
        among them, and those killed whose memory is not back."""
        return sum(r.vram_mib for r in self.residents.values()) + \
            sum(u.resident.vram_mib for u in self.unloads)

    def _trace(self) -> None:
        self.memory_trace.append((self.now(), self.held_mib()))

    def in_flight(self) -> int:
        return sum(r.running + len(r.queue) for r in self.residents.values()) + len(self.loads)

    def unload(self, model: ModelSpec) -> None:
        """keep_alive 0 from the scheduler (expireRunner, server/sched.go:1713-1731; v0.12.6
        :809-826): a copy still loading is not in s.loaded and stays; a loaded one goes
        through the unloader once idle (at once if idle now, else when its last call ends),
        loaded until killed. The scheduler sends the load it made room for once its victims
        are gone (the sidecar waits for /api/ps): `leaving`."""
        resident = self.residents.get(model.weights)
        if resident is None or not resident.ready:
            return
        resident.leaving = True
        self._zero_keep_alive(resident)

    def _zero_keep_alive(self, resident: Resident) -> None:
        """An unload asked of a copy, the scheduler's or Ollama's own eviction's: its
        sessionDuration 0 and its keep-alive timer stopped (:1719-1729, :338-348; 6 :814-824,
        :239-249); queued for the unloader if idle, else once its last call ends (:385-392;
        6 :285-292). Counted once a copy."""
        if resident.keep_alive_s > 0 and not resident.expiring:
            self.counters.evictions += 1
        resident.keep_alive_s = 0.0
        resident.expiry_token += 1
        if resident.idle:
            self._queue_unload(resident)

    # -- unloads: processCompleted -----------------------------------------------------------
    def _queue_unload(self, resident: Resident) -> None:
        """An idle copy into expiredCh (once): it stays loaded, and takes calls, until the
        unloader kills it."""
        resident.expiring = True
        if not any(r is resident for r in self.expiries):
            self.expiries.append(resident)
        self._next_unload()

    def _next_unload(self) -> None:
        """processCompleted (server/sched.go:414-470) takes one expiry at a time. A copy a
        call holds goes back to the queue until idle (:417-427, every 10 ms; here `_done`
        queues it again when its last call ends); an idle one is killed."""
        while self.expiries and not self.recovering:
            resident = self.expiries.popleft()
            if self.residents.get(resident.model.weights) is resident and resident.idle:
                self._kill(resident)

    def _kill(self, resident: Resident) -> None:
        """The unloader reads the baseline over s.loaded, kills the runner, drops it from
        s.loaded, and blocks in waitForVRAMRecovery (:1441-1497) before it takes the next
        expiry (:453-466); the memory is back `unload_s` after the kill."""
        now = self.now()
        # s.loaded at the kill: the victim, the copies queued behind it, the other loaded ones
        # (a copy joins s.loaded once its load is over, :727)
        queued = list(self.expiries)
        loaded = [resident, *queued] + [r for r in self.residents.values() if r.ready and
                                        r is not resident and not any(r is q for q in queued)]
        wait = recovery_s(resident, loaded, self.rng, self.spec.discovery_s)
        del self.residents[resident.model.weights]
        unload = Unload(resident, now + self.spec.unload_s)
        self.unloads.append(unload)
        self.recovering = True
        self.schedule(unload.back_at, partial(self._memory_back, unload))
        self.schedule(now + wait, self._recovered)

    def _memory_back(self, unload: Unload) -> None:
        self.unloads = [u for u in self.unloads if u is not unload]
        self._trace()
        self._next_load()
        self.on_change()

    def _recovered(self) -> None:
        """The wait is over: unloadedCh (:463-466), which wakes Ollama's own eviction whichever
        copy went, its victim or another (:349-358; 6 :250-259). The unloader takes its next
        expiry before the loader checks again, as in the HTTP simulator."""
        self.recovering = False
        self.evicting = False
        self._next_unload()
        self._next_load()
        self.on_change()  # the next copy killed: no longer loaded

    # -- calls -----------------------------------------------------------------------------
    def submit(self, call: SimCall, model: ModelSpec) -> None:
        call.gpu, call.model = self.spec.name, model.name
        if call.prompt_tokens + call.output_tokens > self.spec.context:
            # Ollama drops the oldest messages and says nothing; or the answer reaches the
            # end of the context, which the engine shifts: the start of the prompt goes,
            # mid-answer (llama-server's --context-shift, llm/llama_server.go:420, 789-795)
            call.truncated = True
            self.counters.truncations += 1
        resident = self.residents.get(model.weights)
        if resident is not None and resident.ready:
            # GetRunner's fast path (server/sched.go:199-202): a loaded copy, no queue
            resident.queue.append(call)
            self._start_calls(resident)
            return
        # pendingReqCh (:204-208): behind every load asked for before it, even one of its
        # own model still loading (a copy joins s.loaded once loaded)
        self.loads.append((model, call))
        self._next_load()

    def _next_load(self) -> None:
        """processPending (server/sched.go:225-365): the oldest call for a model not loaded,
        one at a time. The load blocks it until the runner is ready (llama.Load waits in
        WaitUntilRunning, llm/llama_server.go:1047-1084); a load that does not fit makes
        Ollama unload a copy (`_evict`) and wait for the next unload's recovery, whichever
        copy's (unloadedCh, :326-358); a load that fits once unloaded memory is back starts
        then."""
        while self.loads and self.loading is None and not self.evicting:
            model, call = self.loads[0]
            resident = self.residents.get(model.weights)
            # loaded by a call ahead of it, or waiting for the unloader (:255-264)
            if resident is not None and resident.ready:
                self.loads.popleft()
                resident.queue.append(call)
                self._start_calls(resident)
                continue
            if model.footprint_mib > self.spec.total_mib:
                self.loads.popleft()
                self.counters.oom_events += 1
                call.failed = "oom"
                call.finished = self.now()
                if call.on_done:
                    call.on_done(call)
                continue
            if self.used_mib() + model.footprint_mib > self.spec.total_mib:
                if call.ident not in self.overcommitted:
                    self.overcommitted.add(call.ident)
                    self.counters.overcommits += 1  # sent a load that does not fit
                self._evict()  # and wait until an unload's recovery is over
                return
            if self.held_mib() + model.footprint_mib > self.spec.total_mib:
                return  # until the memory it needs is back
            self.loads.popleft()
            self.overcommitted.discard(call.ident)
            self._start_load(model, call)

    def _start_load(self, model: ModelSpec, call: SimCall) -> None:
        resident = Resident(model, cache=PromptCache(self.spec.slots, CACHE_VERSION),
                            free_at_load_mib=self.spec.total_mib - self.held_mib(),
                            keep_alive_s=self.spec.keep_alive_s)
        resident.queue.append(call)
        self.residents[model.weights] = resident
        self.loading = resident
        self.counters.cold_loads += 1
        self.counters.loaded_mib += model.footprint_mib
        self._trace()
        done_at = self.now() + load_seconds(model, self.spec)
        self.schedule(done_at, lambda: self._loaded(resident))

    def _evict(self) -> None:
        """Ollama's own eviction (findRunnerToUnload, server/sched.go:1664-1693; 6 :760-789):
        the first idle copy by keep-alive, then the model blob's path (ByDurationAndName,
        :1557-1578; 6 :738-751; no LRU), so a victim still waiting for the unloader, at
        keep-alive 0, comes first again; with every copy busy, the first of them, which goes
        once its calls end (`_zero_keep_alive`). Either way the loader then waits on
        unloadedCh (:349-358)."""
        ordered = sorted((r for r in self.residents.values() if r.ready and not r.leaving),
                         key=lambda r: (r.keep_alive_s, r.model.blob_path))
        if ordered:
            self.evicting = True
            self._zero_keep_alive(next((r for r in ordered if r.idle), ordered[0]))

    def _loaded(self, resident: Resident) -> None:
        if self.loading is resident:
            self.loading = None
        if self.residents.get(resident.model.weights) is resident:
            resident.ready = True
            self._start_calls(resident)
        self._next_load()
        self.on_change()

    def _start_calls(self, resident: Resident) -> None:
        if not resident.ready:
            return
        while resident.running < self.spec.slots and resident.queue:
            call = resident.queue.popleft()
            resident.running += 1
            call.started = self.now()
            prompt = min(call.prompt_tokens, self.spec.context)
            if resident.cache is not None and call.blocks and not call.truncated:
                slot, call.cached_tokens = resident.cache.take(call.blocks, prompt)
                resident.slots_held[call.ident] = slot
            call.prefill_s = prefill_seconds(
                call.cached_tokens, prompt, self.spec.prompt_tokens_per_s,
                DEPTH_SCALES.get(resident.model.name, DEFAULT_DEPTH_SCALE))
            if not self.spec.share_gpu:
                duration = call.prefill_s + call.output_tokens / resident.model.tokens_per_s
                self.schedule(self.now() + duration, partial(self._done, call, resident))
                continue
            self.schedule(self.now() + call.prefill_s, partial(self._decode, call, resident))

    # -- decoding, shared --------------------------------------------------------------------
    def step_s(self, resident: Resident) -> float:
        """One decode step of the runner: a token for each of its decoding calls."""
        extra = self.spec.batch_cost * (resident.decoding - 1)
        return (1.0 + extra) / resident.model.tokens_per_s

    def _decode(self, call: SimCall, resident: Resident) -> None:
        if call.output_tokens <= 0:
            self._done(call, resident)
            return
        self._catch_up()
        self.decoding[call.ident] = Decode(call, resident, float(call.output_tokens))
        resident.decoding += 1
        self._reschedule()

    def token_s(self) -> Callable[[Resident], float]:
        """Seconds a token takes a decoding call of a runner, while the card's set of
        decoding runners stays as it is now (`GpuSpec.slicing`)."""
        busy = {d.resident.model.weights: d.resident for d in self.decoding.values()}
        if self.spec.slicing == "time":
            return lambda resident: self.step_s(resident) * len(busy)
        period = sum(self.step_s(r) for r in busy.values())
        return lambda _: period

    def _catch_up(self) -> None:
        """Every decoding call gains the tokens of the time since the last change."""
        now = self.now()
        if self.decoding:
            token_s = self.token_s()
            for decode in self.decoding.values():
                decode.left -= (now - self.decoded_at) / token_s(decode.resident)
        self.decoded_at = now

    def _reschedule(self) -> None:
        """The set of decoding calls changed: each call's finish moved."""
        token_s = self.token_s()
        now = self.now()
        for decode in self.decoding.values():
            decode.version += 1
            self.schedule(now + max(decode.left, 0.0) * token_s(decode.resident),
                          partial(self._decoded, decode, decode.version))

    def _decoded(self, decode: Decode, version: int) -> None:
        if decode.version != version:
            return  # the card changed since: a later event holds its finish
        self._catch_up()
        del self.decoding[decode.call.ident]
        decode.resident.decoding -= 1
        self._reschedule()
        self._done(decode.call, decode.resident)

    def _done(self, call: SimCall, resident: Resident) -> None:
        slot = resident.slots_held.pop(call.ident, None)
        if slot is not None:
            PromptCache.release(slot)
        resident.running -= 1
        resident.last_used = call.finished = self.now()
        self._start_calls(resident)
        if resident.idle:
            if resident.expiring or resident.keep_alive_s <= 0:
                # an expiry put back while it was busy, or an unload asked of it then
                self._queue_unload(resident)
            else:
                resident.expiry_token += 1
                token = resident.expiry_token
                self.schedule(self.now() + resident.keep_alive_s,
                              lambda: self._expire(resident, token))
        self._next_load()
        if call.on_done:
            call.on_done(call)
        self.on_change()

    def _expire(self, resident: Resident, token: int) -> None:
        """Its keep-alive ran out: into the unloader's queue like any expiry."""
        if resident.expiry_token == token and resident.idle and \
                self.residents.get(resident.model.weights) is resident:
            self._queue_unload(resident)
            self.on_change()
