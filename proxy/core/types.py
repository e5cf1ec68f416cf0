"""The placement core's vocabulary: frozen snapshots in, decisions out. Standard library only."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from proxy.core.conversations import NO_CACHES, Conversation, PromptCaches
from proxy.core.lengths import NO_LENGTHS, CallLength, CallLengths
from proxy.core.load_times import NO_LOAD_TIMES, LoadTimes
from proxy.core.prefill import NO_RATES, PrefillRates


@dataclass(frozen=True, slots=True)
class Resident:
    """A model loaded on a provider, as `/api/ps` reports it."""

    model: str
    footprint_mib: int  # what it holds of the GPU's memory (`size_vram`)
    # num_ctx as Ollama records it (/api/ps `context_length`; up to 0.15.4 as asked, before
    # the trained cap, from 0.15.5 what the runner got: v0.15.5 server/routes.go:1914);
    # 0: unknown (an old Ollama)
    context_length: int = 0
    last_used_at: float = 0.0
    expires_at: float = math.inf  # when Ollama's keep-alive unloads it if idle; inf: unknown
    leaving: bool = False  # asked to unload: never joined or loaded again until seen gone
    spilled: bool = False  # partly or wholly in CPU memory (`size_vram` < `size`): slow
    # A load a call started that Ollama may not list yet: its memory counts, nobody joins it
    loading: bool = False
    # What the other copies held (with their runners' overhead) when this one was first seen:
    # Ollama >= 0.30 reads a card's free memory from a runner's own accounting, fixed at its
    # load, so it goes on counting those copies after they leave (docs/engine.md)
    beside_mib: int = 0


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What `/api/show` says of a model on disk, reduced to what sizing it needs."""

    trained_context: int = 0  # <arch>.context_length; 0 unknown
    # KV cache bytes per token of context at f16, every layer (llama.cpp's real cache:
    # per-layer KV heads x (key + value length)); 0: architecture unknown
    kv_bytes_per_token: int = 0
    # The same as Ollama's own pre-load estimate counts it (PredictServerVRAM: block count x
    # the fewest KV heads x embedding / the most heads, key and value)
    estimate_kv_bytes_per_token: int = 0
    modelfile_num_ctx: int = 0  # PARAMETER num_ctx in its Modelfile; 0 none
    family: str = ""
    embedding: bool = False  # an embedding model: Ollama gives it one slot
    vision: bool = False
    # What /api/show lists under `capabilities` ("completion", "tools", "thinking", ...);
    # None: not said (an older Ollama, or not probed), so nothing is refused for it
    capabilities: tuple[str, ...] | None = None
    architecture: str = ""  # general.architecture; "" unknown (`family` stands in)
    split_projector: bool = False  # a vision projector in its own file (`projector_info`)
    # <arch>.pooling_type (llama.cpp's: 1 mean, 2 CLS, 3 last); -1 absent or not known
    pooling_type: int = -1
    # Sliding-window (or chunked) attention: the part of kv_bytes_per_token in the layers
    # that keep only a window of tokens, and that window; 0 none (every layer full)
    swa_kv_bytes_per_token: int = 0
    swa_window: int = 0
    swa_chunked: bool = False  # llama4's chunks, not a sliding window
    # The token embedding table at f16 (vocabulary x embedding length x 2 B): what of the file
    # llama.cpp may keep on the CPU, at most; 0 unknown
    token_embedding_bytes: int = 0
    # From /api/show's tensors: the token embedding table as stored, when the file has an
    # output layer of its own (llama.cpp then keeps the table on the CPU only); 0 when the
    # output layer reads the table (tied: the GPU holds it too) or nothing is listed
    cpu_table_bytes: int = 0
    # The compute buffers' logits for a batch of 512 tokens, 4 x 512 x (embedding +
    # vocabulary) B (core/sizing.py `batch_logits_bytes`); 0 unknown
    logits_bytes: int = 0
    # What the attention scores without flash attention are sized by: the most query heads
    # of any layer and the embedding length (core/attention.py); 0 unknown
    attention_heads: int = 0
    embedding_length: int = 0
    # Key and value heads of one size (what flash attention needs, SupportsFlashAttention)
    head_dims_equal: bool = True
    # Layers (<arch>.block_count) and the most KV heads of one: what Ollama's estimate before
    # 0.30 sizes a layer and its graphs by (core/fit_before_030.py); 0 unknown
    block_count: int = 0
    kv_heads: int = 0
    # The weights file its Modelfile's FROM names (`sha256-...`): Ollama runs one copy per
    # weights file, whatever name loaded it; "" unknown
    weights: str = ""
    # What else its copy's runner is loaded with (service/prober.py: runner PARAMETERs, adapters,
    # projectors); models of one weights file share a copy only where this matches
    runner: str = ""
    # A multi-token-prediction head in its weights file (<arch>.nextn_predict_layers > 0):
    # from 0.30 llama-server runs it as the draft when draft_num_predict is set
    mtp: bool = False


@dataclass(frozen=True, slots=True)
class Lack:
    """Ollama's refusal of a call on a model that cannot take it: its words and status."""

    message: str
    status: int = 400


@dataclass(frozen=True, slots=True)
class ProviderView:
    """One GPU (one Ollama) as the placement sees it."""

    name: str
    total_vram_mib: int | None  # None: never published, proves nothing
    ready: bool = True
    residents: tuple[Resident, ...] = ()
    context_length: int = 0  # configured per-slot context (OLLAMA_CONTEXT_LENGTH); 0 unknown
    max_parallel: int = 1
    # OLLAMA_MAX_LOADED_MODELS: beyond it Ollama unloads a model itself, even mid-work, to
    # load another. 0 (unset): Ollama's automatic limit, 3 per GPU (core/occupancy.py)
    max_loaded: int = 0
    gpus: int = 1  # the GPUs this Ollama runs on
    weight: float = 100.0  # the policy's provider weight (phase-aware)
    disk_mib: Mapping[str, int] = field(default_factory=dict)  # on-disk sizes from /api/tags
    models: Mapping[str, ModelInfo] = field(default_factory=dict)  # from /api/show
    # Footprints seen here fully on the GPU: model -> num_ctx as recorded -> MiB
    observed: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    kv_cache_type: str = "f16"  # OLLAMA_KV_CACHE_TYPE
    flash_attention: bool | None = None  # OLLAMA_FLASH_ATTENTION; None unset
    version: str = ""  # /api/version; "" unknown (the newest rules apply)
    probed_at: float = 0.0  # when the residents were last observed
    # A model placed under one of its names (core/aliases.py) -> this card's own names of
    # it, the one to send first; only where they differ from the placed name alone
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # Stubs of models Ollama's cloud runs, listed here (model -> remote host): never placed
    remote: Mapping[str, str] = field(default_factory=dict)
    cloud_off: bool = False  # OLLAMA_NO_CLOUD: Ollama refuses every cloud call here
    # With no disk listing now (down, its /api/tags failing, or only cloud stubs): every
    # name (model_key) it listed, on disk or as a stub, when it last listed any since its
    # prober started; empty and not `listed`: never listed, so it may have any model
    # (core/placement.py)
    last_listed: frozenset[str] = frozenset()
    # Its /api/tags answered since its prober started, empty or not: an Ollama that lists
    # no model has none (server/routes.go ListHandler answers `{"models": []}`)
    listed: bool = False

    def own_name(self, model: str) -> str:
        """The name of `model` (as placed) this card has, to send it."""
        names = self.aliases.get(model)
        return names[0] if names else model


@dataclass(frozen=True, slots=True)
class Ticket:
    """An active VRAM claim on a provider."""

    ticket_id: str
    provider: str
    model: str
    footprint_mib: int
    started_at: float
    expires_at: float
    cold: bool = False  # claimed to load the model (full occupancy), not to share a copy
    evicts: Mapping[str, int] = field(default_factory=dict)  # planned victims: model -> MiB
    holder: str = ""
    crew: str = ""  # the holder's crew (KUBEMOOT_CREW), for the operator reading the book
    context: int = 0  # num_ctx of the copy it loads or joins, as Ollama records it; 0 unknown
    estimate_mib: int = 0  # a load: Ollama's own estimate of it (its admission rule reads it)
    plan: bool = False  # held for a plan made at selection, not yet a call
    beside_mib: int = 0  # a load: what the copies beside it held (Resident.beside_mib)

    @property
    def reloads(self) -> bool:
        """A load that first unloads the model's own copy (loaded with another context)."""
        return self.cold and self.model in self.evicts


@dataclass(frozen=True, slots=True)
class WaitNeed:
    """What one waiting call needs of a copy to run on it, as its demand entry says: the
    num_ctx it asked for (0 none), its prompt's estimated tokens, the providers it may not go
    to (a retry's). An entry that says none of it (an older sidecar's) could take any copy."""

    num_ctx: int = 0
    prompt_tokens: int = 0
    excludes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """What the demand board says about one model."""

    waiters: int = 0
    intents: int = 0
    recent_use: float = 0.0
    predicted: float = 0.0
    last_used_at: float = 0.0
    turns: tuple[float, ...] = ()  # each waiting call's turn (core/waitline.py), soonest first
    needs: tuple[WaitNeed, ...] = ()  # each waiting call's, as the board has them
    # the needs of the calls waiting under another model's name that could run on a copy
    # of this one (one of their other candidates, fitting a card): they protect its copies
    # from eviction, not their turns in its line
    backing: tuple[WaitNeed, ...] = ()

    @property
    def expected_reloads(self) -> float:
        return self.waiters + self.intents + 0.5 * (self.recent_use + self.predicted)


class Circuit(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True, slots=True)
class ProviderHealth:
    circuit: Circuit = Circuit.CLOSED
    latency_ema_s: float | None = None  # per-endpoint EMA of call duration
    success_rate: float | None = None  # None until enough samples


@dataclass(frozen=True, slots=True)
class Candidate:
    model: str
    score: float = 0.0
    vram_mib: int | None = None  # declared occupancy


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One call to place."""

    candidates: tuple[Candidate, ...]  # preferred first
    prompt_tokens: int = 0
    num_ctx: int = 0  # the client's num_ctx: the least context it accepts; 0 none
    num_predict: int = 0  # the client's cap on the answer; 0 none
    # This agent's recent answers of the preferred model, in tokens (0 unknown): the room
    # kept for an answer when the call sets no num_predict
    expected_answer: int = 0
    # When it is due a free slot (core/waitline.py): the waiting calls with sooner turns are
    # the line ahead of it; None counts every waiting call
    turn: float | None = None
    # Sent over Ollama's own API, the call can name the context of the copy it joins; over
    # the OpenAI and Anthropic APIs it cannot, and Ollama gives it the default context.
    pins_context: bool = True
    generates: bool = True  # False: an embedding (no answer to keep room for)
    tolerance: float = 10.0
    phase: Literal["mulling", "triage"] = "mulling"
    # The conversation its prompt continues, for the prompt cache (core/conversations.py)
    conversation: Conversation | None = None
    # False: the call cannot wait for a slot (X-Kubemoot-Wait: false, role coordinator),
    # neither in the sidecar nor queued inside an engine: it takes a free slot or a load, or
    # the scheduler sends it to the static endpoint or refuses it (gpu-busy)
    can_wait: bool = True
    # What is left of the call's wait limit, in seconds (None: no limit to weigh): a wait
    # for a slot expected to outlast it loses to any load (docs/rules.md, "Late binding")
    wait_left_s: float | None = None
    # The capabilities the call needs, each with Ollama's refusal when the model lacks it,
    # in the order Ollama checks them (server/routes.go:448-469, 2610-2637)
    needs: tuple[tuple[str, str], ...] = ()
    # The embedding path of a call with inputs to embed ("" otherwise: an empty input only
    # loads the model): Ollama then runs the model's embedding, which not every model has
    embeds: str = ""
    # The Ollama versions whose router has the call's path (`[low, high)`, high None: open),
    # () every version: a card on another version answers its 404 (core/engines.py)
    served: tuple[tuple[tuple[int, int, int], tuple[int, int, int] | None], ...] = ()
    path: str = ""
    # The Ollama versions that refuse the call's body, with their words: a card on one of
    # them answers a 400 another card would not (core/engines.py body_refusal)
    refused_by: tuple[tuple[tuple[int, int, int], str], ...] = ()
    # The body's check as a version of a card first heard after the call's check runs it
    # (api/wire.py BodyCheck: pure, each version's answer kept), its words when the version
    # refuses the body; None: only `refused_by` is known
    body_check: Callable[[tuple[int, int, int]], str | None] | None = field(
        default=None, compare=False, repr=False)

    @property
    def preferred(self) -> Candidate:
        return self.candidates[0]

    @property
    def answer_tokens(self) -> int:
        """How long an answer the context must leave room for: num_predict, else the
        agent's recent answers."""
        return self.num_predict or self.expected_answer

    @property
    def answer_capped(self) -> bool:
        """The answer cannot run longer than `answer_tokens`: the call set num_predict."""
        return self.num_predict > 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    providers: tuple[ProviderView, ...]
    tickets: tuple[Ticket, ...] = ()
    demand: Mapping[str, ModelDemand] = field(default_factory=dict)
    health: Mapping[str, ProviderHealth] = field(default_factory=dict)
    loads: LoadTimes = NO_LOAD_TIMES  # how long loads and unloads took, learned per card
    lengths: CallLengths = NO_LENGTHS  # how long calls took, learned from the answers
    caches: PromptCaches = NO_CACHES  # what each copy's prompt cache is expected to hold
    prefill: PrefillRates = NO_RATES  # how fast each copy reads a prompt, learned


PlacementKind = Literal["warm", "loading", "cold", "queued", "evict"]
Outcome = Literal["placed", "wait", "model-too-large", "prompt-too-large", "model-not-found",
                  "unsupported"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One provider's answer for one model: feasible or why not, and the cost terms."""

    provider: str
    model: str
    feasible: bool
    reason: str
    terms: Mapping[str, float] = field(default_factory=dict)
    # The context the call would get there and where it comes from; a load's footprint parts
    sizing: Mapping[str, int | str] = field(default_factory=dict)
    call_length: CallLength | None = None  # how long a call there is expected to take (explain)

    @property
    def cost_s(self) -> float:
        return sum(self.terms.values())


@dataclass(frozen=True, slots=True)
class Placement:
    provider: str
    model: str
    kind: PlacementKind
    step: int  # which CallPlanner step won (1-5)
    footprint_mib: int  # what the ticket claims
    cost_s: float = 0.0
    evicts: Mapping[str, int] = field(default_factory=dict)
    # num_ctx of the copy planned as Ollama records it: sent with the call (when the call
    # can carry options), Ollama keeps or loads exactly that copy; 0 unknown
    num_ctx: int = 0
    # the context the call will get (an embedding input: its window in it); 0 unknown
    context_length: int = 0
    estimate_mib: int = 0  # a load: Ollama's own estimate of it
    # a load: what Ollama will list its copy at, when more than it holds (before 0.30, the
    # llama engine's estimate: core/fit_before_030.py); 0 the footprint
    listed_mib: int = 0
    loads_ahead: int = 0  # a load: loads in flight on its card when it was placed
    beside_mib: int = 0  # a load: what the copies staying beside it hold (Resident.beside_mib)
    # The model whose copy the call joins, when that is another model's of its weights file
    # (core/shared_copies.py): its ticket names that copy; the call goes under `model`
    copy: str = ""

    @property
    def copy_model(self) -> str:
        """The name its card lists the copy under that the call's ticket claims."""
        return self.copy or self.model

    @property
    def loads(self) -> bool:
        """The call loads a copy (cold, or after evicting others) rather than joining one."""
        return self.kind in ("cold", "evict")

    @property
    def needs_free_slot(self) -> bool:
        """It joins a copy counting on a slot free now: with late binding every join does (a
        call never queues inside an engine), so its claim re-checks that slot."""
        return self.kind in ("warm", "loading")


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    placement: Placement | None
    reason: str
    verdicts: tuple[Verdict, ...] = ()
    queue_option_s: float | None = None
    unload_option_s: float | None = None
    status: int = 0  # "unsupported": the status Ollama refuses the call with (0: 400)
