"""A model of a GPU fleet running Ollama, for the virtual-clock simulation.

Each GPU behaves like one `ollama serve` at HEAD: a load takes the runner's start-up plus the
read of the weights file (not the footprint: the KV cache is allocated, never read), seen
ready on Ollama's 250 ms poll (`load_seconds`); loads go one at a time in arrival order, a
call for a loaded copy bypassing them; OLLAMA_NUM_PARALLEL slots per loaded model with a FIFO
queue beyond them, keep-alive expiry, and Ollama's own eviction of idle models when a load
does not fit; unloads go one at a time, each followed by Ollama's wait for the freed memory
(docs/development.md, "The policy simulation's fleet model"). What a real fleet would suffer
is counted:
a load that does not fit beside the residents (the engine has to evict on its own, or cannot
load at all: an out-of-memory event), and a prompt longer than the context (silently cut).

Calls decoding at once share the card. Each loaded model is a runner process of its own
(server/sched.go:577 -> llm/llama_server.go:423-436 starts one llama-server per model; v0.12.6:
server/sched.go:421 -> llm/server.go:294-342, `ollama runner`) that decodes all its busy slots
in one batch per step (v0.12.6 runner/llamarunner/runner.go:389-462: every sequence's next
token into one batch, one Decode; llama-server's update_slots likewise adds "sampled tokens from
any ongoing sequences" to one batch). A step with n sequences costs (1 + batch_cost x (n - 1))
times one alone: decoding is memory-bound, one more sequence adds its KV-cache reads, not
another read of the weights. Runners on one card time-slice it: each decoding call gets a
token per period, the sum of the step times of the card's runners that are decoding. Prefill
runs at full speed, unshared. `GpuSpec.share_gpu = False` decodes every call at full speed.
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
from loadtest.sim_model import CATALOG, accounted_free_mib, recovery_s
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

    def __post_init__(self) -> None:
        if self.disk_mib is not None and not 0 < self.disk_mib <= self.footprint_mib:
            raise ValueError(f"{self.name}: weights of {self.disk_mib} MiB do not fit its "
                             f"footprint of {self.footprint_mib} MiB")

    @classmethod
    def catalogued(cls, name: str, footprint_mib: int, tokens_per_s: float) -> ModelSpec:
        """A model of the simulator's catalogue (loadtest/sim_model.py), its file's size."""
        return cls(name, footprint_mib, tokens_per_s, CATALOG_DISK_MIB[name])

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

    @property
    def vram_mib(self) -> int:
        return self.model.footprint_mib

    @property
    def accounted_free_mib(self) -> int:
        return accounted_free_mib(self.free_at_load_mib, self.vram_mib)


@dataclass
class Unload:
    """A copy on its way out: in the unloader's queue (`back_at` None), then killed, its
    memory held until `back_at`."""

    resident: Resident
    back_at: float | None = None


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
        self.residents: dict[str, Resident] = {}
        # processPending: calls for a model not loaded, one load at a time in arrival order
        self.loads: deque[tuple[ModelSpec, SimCall]] = deque()
        self.loading: Resident | None = None  # the load processPending blocks on
        self.evicting: Resident | None = None  # Ollama's own victim it waits on (unloadedCh)
        self.overcommitted: set[int] = set()  # calls already counted as sent without room
        # processCompleted: expired copies killed one at a time, each then waiting for the
        # freed memory; the map order of that wait is drawn from a seeded generator per card
        self.unloads: list[Unload] = []  # queued or killed with their memory not yet back
        self.unloading: Unload | None = None  # killed, its recovery wait not over
        self.rng = random.Random(f"{seed}/{spec.name}")
        self.memory_trace: list[tuple[float, int]] = [(0.0, 0)]
        # Processor sharing of the decode: every decoding call gains a token per `period`
        self.decoding: dict[int, Decode] = {}
        self.period = 0.0
        self.decoded_at = 0.0  # when each Decode.left was last brought up to date

    # -- memory ----------------------------------------------------------------------------
    def used_mib(self) -> int:
        """What the copies loaded or loading hold (not those on their way out)."""
        return sum(r.model.footprint_mib for r in self.residents.values())

    def held_mib(self) -> int:
        """What the card holds: the copies and those unloaded whose memory is not back."""
        return self.used_mib() + sum(u.resident.model.footprint_mib for u in self.unloads)

    def _trace(self) -> None:
        self.memory_trace.append((self.now(), self.held_mib()))

    def in_flight(self) -> int:
        return sum(r.running + len(r.queue) for r in self.residents.values()) + len(self.loads)

    def unload(self, name: str) -> None:
        """keep_alive:0 from the scheduler: the model goes once idle, through the unloader."""
        resident = self.residents.get(name)
        if resident is None or resident.running or resident.queue:
            return
        self.counters.evictions += 1
        self._queue_unload(resident)

    # -- unloads: processCompleted -----------------------------------------------------------
    def _queue_unload(self, resident: Resident) -> None:
        """An idle copy into expiredCh; nothing new starts on it."""
        del self.residents[resident.model.name]
        self.unloads.append(Unload(resident))
        self._next_unload()

    def _next_unload(self) -> None:
        """processCompleted (server/sched.go:414-470) takes one expiry at a time: it reads
        the baseline, kills the runner, and blocks in waitForVRAMRecovery (:1441-1497) before
        it takes the next; the memory is back `unload_s` after the kill."""
        if self.unloading is not None:
            return
        unload = next((u for u in self.unloads if u.back_at is None), None)
        if unload is None:
            return
        now = self.now()
        # s.loaded at the kill: the victim, the copies queued behind it, the loaded ones
        # (a copy joins s.loaded once its load is over, :727)
        loaded = [u.resident for u in self.unloads if u.back_at is None] + \
            [r for r in self.residents.values() if r.ready]
        wait = recovery_s(unload.resident, loaded, self.rng, self.spec.discovery_s)
        unload.back_at = now + self.spec.unload_s
        self.unloading = unload
        self.schedule(unload.back_at, partial(self._memory_back, unload))
        self.schedule(now + wait, partial(self._recovered, unload))

    def _memory_back(self, unload: Unload) -> None:
        self.unloads.remove(unload)
        self._trace()
        self._next_load()
        self.on_change()

    def _recovered(self, unload: Unload) -> None:
        """The wait is over: unloadedCh, which Ollama's own eviction waits for."""
        self.unloading = None
        if self.evicting is unload.resident:
            self.evicting = None
        self._next_unload()
        self._next_load()

    # -- calls -----------------------------------------------------------------------------
    def submit(self, call: SimCall, model: ModelSpec) -> None:
        call.gpu, call.model = self.spec.name, model.name
        if call.prompt_tokens + call.output_tokens > self.spec.context:
            # Ollama drops the oldest messages and says nothing; or the answer reaches the
            # end of the context, which the engine shifts: the start of the prompt goes,
            # mid-answer (llama-server's --context-shift, llm/llama_server.go:420, 789-795)
            call.truncated = True
            self.counters.truncations += 1
        resident = self.residents.get(model.name)
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
        Ollama unload an idle copy and wait for that unload's recovery (unloadedCh,
        :326-357), or wait behind busy ones; a load that fits once unloaded memory is back
        starts then."""
        while self.loads and self.loading is None and self.evicting is None:
            model, call = self.loads[0]
            resident = self.residents.get(model.name)
            if resident is not None and resident.ready:  # loaded by a call ahead of it
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
                # until its victim's recovery is over, or behind busy models (head of line,
                # retried as calls end)
                self._evict_idle()
                return
            if self.held_mib() + model.footprint_mib > self.spec.total_mib:
                return  # until the memory it needs is back
            self.loads.popleft()
            self.overcommitted.discard(call.ident)
            self._start_load(model, call)

    def _start_load(self, model: ModelSpec, call: SimCall) -> None:
        resident = Resident(model, cache=PromptCache(self.spec.slots, CACHE_VERSION),
                            free_at_load_mib=self.spec.total_mib - self.held_mib())
        resident.queue.append(call)
        self.residents[model.name] = resident
        self.loading = resident
        self.counters.cold_loads += 1
        self.counters.loaded_mib += model.footprint_mib
        self._trace()
        done_at = self.now() + load_seconds(model, self.spec)
        self.schedule(done_at, lambda: self._loaded(resident))

    def _evict_idle(self) -> None:
        """Ollama's own eviction (findRunnerToUnload, server/sched.go:1664-1693): the first
        idle copy by keep-alive, then name (no LRU); none while every copy is busy."""
        idle = sorted((r for r in self.residents.values()
                       if r.ready and not r.running and not r.queue),
                      key=lambda r: r.model.name)
        if idle:
            self.counters.evictions += 1
            self.evicting = idle[0]
            self._queue_unload(idle[0])

    def _loaded(self, resident: Resident) -> None:
        if self.loading is resident:
            self.loading = None
        if self.residents.get(resident.model.name) is resident:
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

    def _catch_up(self) -> None:
        """Every decoding call gains the tokens of the time since the last change."""
        now = self.now()
        if self.decoding:
            gained = (now - self.decoded_at) / self.period
            for decode in self.decoding.values():
                decode.left -= gained
        self.decoded_at = now

    def _reschedule(self) -> None:
        """The set of decoding calls changed: a new period, and each call's finish moved."""
        busy = {d.resident.model.name: d.resident for d in self.decoding.values()}
        self.period = sum(self.step_s(r) for r in busy.values())
        now = self.now()
        for decode in self.decoding.values():
            decode.version += 1
            self.schedule(now + max(decode.left, 0.0) * self.period,
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
        if not resident.running and not resident.queue:
            resident.expiry_token += 1
            token = resident.expiry_token
            self.schedule(self.now() + self.spec.keep_alive_s,
                          lambda: self._expire(resident, token))
        self._next_load()
        if call.on_done:
            call.on_done(call)
        self.on_change()

    def _expire(self, resident: Resident, token: int) -> None:
        """Its keep-alive ran out: into the unloader's queue like any expiry."""
        if resident.expiry_token == token and not resident.running and not resident.queue and \
                self.residents.get(resident.model.name) is resident:
            self._queue_unload(resident)
            self.on_change()
