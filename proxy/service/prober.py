"""Probing providers and publishing their state (the `publish` command and the sidecar's
own fallback when the shared store has nothing fresh).

Readiness and version from `/api/version`; residents with `size_vram`, `size` and
`context_length` from `/api/ps` (a copy with `size_vram` < `size` is partly in CPU memory);
on-disk sizes from `/api/tags` and what sizing needs of each on-disk model from `/api/show`
(architecture, trained context, Modelfile num_ctx; once per model and digest, and a verbose
one for a model whose sizing needs an array the plain one withholds); total VRAM,
context, slots and KV cache type from the provider configuration, the total VRAM otherwise
from a GPU memory gauge (a DCGM exporter). Each footprint seen fully on the GPU is kept per
model and context.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from proxy.core.models import model_name
from proxy.core.occupancy import loaded_limit
from proxy.core.sizing import (
    arrays_withheld,
    attention_shape,
    batch_logits_bytes,
    cpu_table_bytes,
    held_by_runners,
    kv_per_token,
    listed_tensors,
    token_embedding_bytes,
    windowed_kv,
    with_arrays,
)
from proxy.core.types import ModelInfo
from proxy.observability.logging import get_logger
from proxy.ports import (
    PROVIDER_STATE,
    SYSTEM_CLOCK,
    Clock,
    GpuMemoryGauge,
    ModelServer,
    ShowAnswer,
    StateStore,
    StoreUnavailable,
    UpstreamError,
)
from proxy.service.codec import ProviderState, escape_key, parse_rfc3339
from proxy.settings import ProviderConfig

log = get_logger("kubemoot.prober")
MIB = 1024 * 1024
PROBE_TIMEOUT_S = 2.0
# Ollama sets a copy's /api/ps expiry when it goes idle and stops its timer while a call holds
# it (server/sched.go:405, 409, 479-482; v0.12.6 :305, 309, 379-382): a copy listed this long
# past its expiry is in use by a client the sidecars do not see, or its unload waits behind
# another's wait for freed memory (5 s at most each, :101; v0.12.6 :654) and a call sent now
# still gets it (:197-209, 414-427; v0.12.6 :106-117, 314-327). Its expiry is then unknown.
STALE_EXPIRY_S = 6.0  # (a clock of Ollama's more than this behind the sidecar's misleads it)
# Footprints seen per model: the newest contexts kept (see _observe)
OBSERVED_KEPT = 16


def _significant(state: ProviderState) -> tuple[Any, ...]:
    return (state.ready, state.total_vram_mib, state.context_length, state.max_parallel,
            state.max_loaded, state.kv_cache_type, state.flash_attention, state.version,
            sorted(state.loaded_mib.items()), sorted(state.loaded_ctx.items()),
            sorted(state.loaded_size_mib.items()), sorted(state.available_mib.items()),
            sorted(state.loaded_beside_mib.items()),
            sorted(m for m in state.loaded_mib if m not in state.loaded_expiry),  # in use
            sorted(state.models.items()), sorted(state.digests.items()),
            sorted((m, sorted(seen.items())) for m, seen in state.observed.items()),
            state.listed_before, state.listed)


def listed_before(previous: ProviderState | None) -> tuple[str, ...]:
    """What a card whose /api/tags fails listed last: its previous state's listing, or
    what that state carried from before."""
    if previous is None:
        return ()
    if previous.available_mib or previous.remote:
        return tuple(sorted({*previous.available_mib, *previous.remote}))
    return previous.listed_before


def trained_context(show: Any) -> int:
    """`model_info["<arch>.context_length"]` of an /api/show answer; 0 when absent."""
    info = show.get("model_info") if isinstance(show, dict) else None
    if not isinstance(info, dict):
        return 0
    arch = info.get("general.architecture")
    value = info.get(f"{arch}.context_length")
    if value is None:
        value = next((v for k, v in info.items() if k.endswith(".context_length")), None)
    return int(value) if isinstance(value, int | float) and value > 0 else 0


_NUM_CTX = re.compile(r"^num_ctx\s+(\S+)\s*$")


def modelfile_num_ctx(show: dict[str, Any]) -> int:
    """PARAMETER num_ctx from /api/show `parameters` (a key padded to 30 columns, then its
    value, one per line); 0 when the Modelfile sets none."""
    for line in str(show.get("parameters") or "").splitlines():
        match = _NUM_CTX.match(line.strip())
        if match:
            with contextlib.suppress(ValueError):
                return max(0, int(float(match[1])))
    return 0


_BLOB = re.compile(r"(?:^|[/\\])(sha256[-:][0-9a-f]{64})$")
# The Modelfile PARAMETERs that are runner options (api.Runner): a copy loaded with other
# values is reloaded (server/sched.go needsReload); num_ctx is compared on its own
RUNNER_PARAMETERS = ("num_batch", "num_gpu", "main_gpu", "use_mmap", "num_thread",
                     "draft_num_predict")


def _modelfile(show: dict[str, Any]) -> list[tuple[str, str]]:
    """/api/show's modelfile as (COMMAND, argument) lines (server/images.go:586-640); the
    "# FROM <name>" hint above them is a comment."""
    lines = (line.strip().partition(" ") for line in str(show.get("modelfile") or "")
             .splitlines())
    return [(command.upper(), argument.strip()) for command, _, argument in lines
            if command and not command.startswith("#")]


def _blob(argument: str) -> str:
    """The blob a FROM or ADAPTER names (`sha256-...`); "" for anything else."""
    match = _BLOB.search(argument)
    return match[1].replace(":", "-") if match else ""


def weights_file(show: dict[str, Any]) -> str:
    """The weights file the Modelfile's first FROM names (its blob, `sha256-...`); "" when
    it names none (a model that is not one GGUF file, or no modelfile)."""
    return next((_blob(argument) for command, argument in _modelfile(show)
                 if command == "FROM"), "")


def runner_files(show: dict[str, Any]) -> str:
    """What besides the weights file and the context a copy of the model is loaded with, as
    needsReload compares it (server/sched.go:1400-1425): its Modelfile's runner PARAMETERs,
    its ADAPTER files, its projector files (the FROMs after the first) and its DRAFT model
    (HEAD images.go:601-606: sized with the copy, core/sizing.py draft_mib), in order; ""
    for none. Two models of one weights file share a copy only where this matches as
    needsReload compares it (core/occupancy.py same_runner: a draft by the
    draft_num_predict it implies, not its file)."""
    parts = []
    for line in str(show.get("parameters") or "").splitlines():
        key, _, value = line.strip().partition(" ")
        if key in RUNNER_PARAMETERS:
            parts.append(f"{key}={value.strip()}")
    commands = _modelfile(show)
    adapters = [argument for command, argument in commands if command == "ADAPTER"]
    projectors = [argument for command, argument in commands if command == "FROM"][1:]
    drafts = [argument for command, argument in commands if command == "DRAFT"]
    parts += [f"adapter={_blob(a) or a}" for a in adapters]
    parts += [f"from={_blob(a) or a}" for a in projectors]
    parts += [f"draft={_blob(a) or a}" for a in drafts]
    return ";".join(parts)


def model_info(show: Any) -> ModelInfo:
    """What sizing needs of a model from its /api/show answer."""
    if not isinstance(show, dict):
        return ModelInfo()
    info = show.get("model_info")
    info = info if isinstance(info, dict) else {}
    arch = str(info.get("general.architecture") or "")
    real, estimate = kv_per_token(info, arch) if arch else (0, 0)
    windowed, window, chunked = windowed_kv(info, arch) if arch else (0, 0, False)
    listed = show.get("capabilities")  # absent from an older Ollama: unknown
    capabilities = [str(c) for c in listed] if isinstance(listed, list) else []
    details = show.get("details")
    pooling = info.get(f"{arch}.pooling_type")
    family = str(details.get("family") or "") if isinstance(details, dict) else ""
    tensors = listed_tensors(show.get("tensors"))
    heads, embedding, dims_equal, blocks, kv_heads = attention_shape(info, arch) if arch \
        else (0, 0, True, 0, 0)
    return ModelInfo(
        trained_context=trained_context(show), kv_bytes_per_token=real,
        estimate_kv_bytes_per_token=estimate, modelfile_num_ctx=modelfile_num_ctx(show),
        family=family or arch,
        embedding=f"{arch}.pooling_type" in info or (
            "embedding" in capabilities and "completion" not in capabilities),
        vision="vision" in capabilities,
        capabilities=tuple(capabilities) if isinstance(listed, list) else None,
        architecture=arch, split_projector=bool(show.get("projector_info")),
        pooling_type=pooling if type(pooling) is int else -1,
        swa_kv_bytes_per_token=windowed, swa_window=window, swa_chunked=chunked,
        token_embedding_bytes=token_embedding_bytes(info, arch) if arch else 0,
        cpu_table_bytes=cpu_table_bytes(tensors), logits_bytes=batch_logits_bytes(
            tensors, info, arch),
        attention_heads=heads, embedding_length=embedding, head_dims_equal=dims_equal,
        block_count=blocks, kv_heads=kv_heads,
        weights=weights_file(show), runner=runner_files(show), mtp=has_mtp(info, arch))


def has_mtp(info: dict[str, Any], arch: str) -> bool:
    """Whether the weights file carries an MTP head Ollama runs as a draft (hasMTPDraft,
    llm/llama_server.go:837-842). Only its nextn_predict_layers key is read: a legacy qwen35
    file shows its "mtp." tensors only to a verbose /api/show, which the prober asks only
    for arrays (_with_arrays)."""
    layers = info.get(f"{arch}.nextn_predict_layers")
    return type(layers) is int and layers > 0


def cloud_off(status: ShowAnswer) -> bool:
    """Whether /api/status says the cloud is off here (OLLAMA_NO_CLOUD, Ollama 0.17+); an
    older Ollama's 404, or an odd answer, says nothing."""
    try:
        cloud = status.details().get("cloud")
    except (UpstreamError, AttributeError):
        return False
    return isinstance(cloud, dict) and cloud.get("disabled") is True


async def _nothing() -> None:
    return None


# /api/status says whether the cloud is off (OLLAMA_NO_CLOUD), which changes only when Ollama
# restarts: asked now and then, each time within a short limit, so that an endpoint slow on it
# (a gateway in front of Ollama) holds back no probe round for long
STATUS_EVERY_S = 30.0
STATUS_TIMEOUT_S = 0.25

SHOWS_AT_ONCE = 8  # /api/show asks in flight to one card


# A verbose /api/show, asked only for a model whose sizing needs an array the plain answer
# withheld (core/sizing.py arrays_withheld), carries every array of the file: the tokenizer's
# (150k strings and more) too. Read within these bounds; past them the model is sized with
# the larger figures.
VERBOSE_SHOW_TIMEOUT_S = 5.0
VERBOSE_SHOW_MAX_BYTES = 32 * MIB


async def _details(server: ModelServer, model: str) -> Any:
    show = (await server.show({"model": model}, PROBE_TIMEOUT_S)).details()
    return await _with_arrays(server, model, show)


async def _with_arrays(server: ModelServer, model: str, show: Any) -> Any:
    """The answer with the arrays sizing needs that it withheld (null: a non-verbose
    /api/show gives every non-empty array so) read from a verbose one, only their keys
    kept; those still unknown taken at their larger figures (with a warning)."""
    info = show.get("model_info") if isinstance(show, dict) else None
    if not isinstance(info, dict):
        return show
    arch = str(info.get("general.architecture") or "")
    if not arch or not (withheld := arrays_withheld(info, arch)):
        return show
    try:
        shown, error = await _verbose_model_info(server, model, withheld), ""
    except (UpstreamError, TimeoutError, ValueError) as exc:
        shown, error = {}, str(exc) or type(exc).__name__
    sized, unknown = with_arrays(info, arch, shown)
    if unknown:
        log.warning("model arrays unread, sized with the larger figures", model=model,
                    keys=list(unknown), error=error or "null in the verbose answer too")
    return {**show, "model_info": sized}


async def _verbose_model_info(server: ModelServer, model: str, keys: tuple[str, ...]
                              ) -> dict[str, Any]:
    """`keys` of the model's verbose /api/show model_info; UpstreamError when it fails or
    its body exceeds VERBOSE_SHOW_MAX_BYTES, TimeoutError past VERBOSE_SHOW_TIMEOUT_S."""
    body = bytearray()
    async with asyncio.timeout(VERBOSE_SHOW_TIMEOUT_S):
        response = await server.open("/api/show",
                                     orjson.dumps({"model": model, "verbose": True}))
        try:
            if response.status_code >= 400:
                raise UpstreamError(f"verbose /api/show: HTTP {response.status_code}")
            async for chunk in response.chunks():
                body += chunk
                if len(body) > VERBOSE_SHOW_MAX_BYTES:
                    raise UpstreamError(f"verbose /api/show: over "
                                        f"{VERBOSE_SHOW_MAX_BYTES // MIB} MiB")
        finally:
            await response.aclose()
    answer = orjson.loads(body)
    info = answer.get("model_info") if isinstance(answer, dict) else None
    return {k: info.get(k) for k in keys} if isinstance(info, dict) else {}


def _observe(seen: dict[int, int], context: int, mib: int) -> None:
    """Note a copy seen fully on the GPU at `context`: the newest OBSERVED_KEPT contexts of a
    model are kept (an agent may send a num_ctx per call; each is loaded, and a figure per
    context ever loaded would grow the published state without end)."""
    seen.pop(context, None)
    seen[context] = mib
    while len(seen) > OBSERVED_KEPT:
        del seen[next(iter(seen))]


def heard_version(answered: object, last: ProviderState | None) -> str:
    """The version `/api/version` answered, else the one last heard: an Ollama that stopped
    answering is still that version, so a path or field only it serves is one for a card
    that is down (the call waits for it, or has the 503), not one no provider serves (the
    API's 404 or 400, api/routes.py fleet_versions)."""
    if isinstance(answered, str):
        return answered
    return last.version if last is not None else ""

class Prober:
    def __init__(self, configs: list[ProviderConfig], clients: Mapping[str, ModelServer],
                 store: StateStore | None, *, gpu_memory: GpuMemoryGauge,
                 clock: Clock = SYSTEM_CLOCK, write_every_s: float = 5.0) -> None:
        self.configs = {c.name: c for c in configs}
        self.clients = clients
        self.store = store
        self.gpu_memory = gpu_memory  # read when a provider's total VRAM is not configured
        self.clock = clock
        self.write_every_s = write_every_s
        self.latest: dict[str, ProviderState] = {}
        # provider -> model -> num_ctx as recorded -> MiB, of copies fully on the GPU
        self.observed: dict[str, dict[str, dict[int, int]]] = {}
        # provider -> loaded model -> (its num_ctx, what the others held when first seen), and
        # what the last probe listed (model -> MiB)
        self._beside: dict[str, dict[str, tuple[int, int]]] = {}
        self._listed: dict[str, dict[str, int]] = {}
        self._status_at: dict[str, float] = {}  # when /api/status was last asked
        self._cloud_off: dict[str, bool] = {}  # what it said last
        # provider -> model -> (digest, what /api/show says of it)
        self._shown: dict[str, dict[str, tuple[str, ModelInfo]]] = {}
        # provider -> model -> what another process's /api/show said of it (shared state)
        self._described: dict[str, dict[str, ModelInfo]] = {}
        self._written: dict[str, tuple[tuple[Any, ...], float]] = {}
        self._unwritten: dict[str, tuple[Any, ...]] = {}  # the last state the store missed
        # Told of every probe as it ends (the circuit breakers: a card back from an outage)
        self.watchers: list[Callable[[ProviderState], None]] = []

    async def probe(self, name: str) -> ProviderState:
        config = self.configs[name]
        client = self.clients[name]
        # Stamped when the probe starts: what /api/ps says may be that old, so a change a
        # call records after this moment must win over it (see merge_residency).
        now = self.clock.now()
        asks_status = now - self._status_at.get(name, -math.inf) >= STATUS_EVERY_S
        version, ps, tags, status = await asyncio.gather(
            client.version(PROBE_TIMEOUT_S), client.ps(PROBE_TIMEOUT_S),
            client.tags(PROBE_TIMEOUT_S), client.fetch("/api/status", STATUS_TIMEOUT_S)
            if asks_status else _nothing(), return_exceptions=True)
        if asks_status:
            self._status_at[name] = now
            if isinstance(status, ShowAnswer):  # (failed: what it said last holds)
                self._cloud_off[name] = cloud_off(status)
        total = config.total_vram_mib
        if total is None and config.dcgm_url:
            total = await self.gpu_memory.total_mib(config.dcgm_url, config.gpus)
        total = config.counted_total_mib(total)
        ready = not isinstance(version, BaseException) and not isinstance(ps, BaseException)
        loaded_mib: dict[str, int] = {}
        loaded_size: dict[str, int] = {}
        loaded_ctx: dict[str, int] = {}
        loaded_expiry: dict[str, float] = {}
        observed = self.observed.setdefault(name, {})
        if not isinstance(ps, BaseException):
            for m in ps:
                model = model_name(m)
                size_vram = int(m.get("size_vram") or 0)
                size = max(int(m.get("size") or 0), size_vram)
                loaded_mib[model] = size_vram // MIB  # memory on the GPU (0: all on CPU)
                loaded_size[model] = size // MIB
                loaded_ctx[model] = int(m.get("context_length") or 0)
                expires = m.get("expires_at")
                if isinstance(expires, str):
                    with contextlib.suppress(ValueError):  # an odd date: expiry unknown
                        expiry = parse_rfc3339(expires)
                        if expiry >= now - STALE_EXPIRY_S:
                            loaded_expiry[model] = expiry
                if size_vram and size_vram >= size:  # a spilled copy is no footprint
                    _observe(observed.setdefault(model, {}), loaded_ctx[model],
                             size_vram // MIB)
        available = {}
        remote: dict[str, str] = {}
        digests: dict[str, str] = {}
        if not isinstance(tags, BaseException):
            for m in tags:
                model = model_name(m)
                if m.get("remote_host"):
                    remote[model] = str(m["remote_host"])
                    continue
                available[model] = int(m.get("size") or 0) // MIB
                digests[model] = str(m.get("digest") or "")
            for model in [m for m in observed if m not in available and m not in loaded_mib]:
                del observed[model]  # removed from disk
        models = await self._shown_models(
            name, digests, version if isinstance(version, str) else "")
        beside = self._first_seen_beside(name, loaded_mib, loaded_ctx) \
            if not isinstance(ps, BaseException) else {}
        state = ProviderState(
            name=name, endpoint=config.endpoint, ready=ready, last_probed_at=now,
            total_vram_mib=total, context_length=config.context_length or 0,
            max_parallel=config.max_parallel,
            max_loaded=loaded_limit(config.max_loaded_models, config.gpus), gpus=config.gpus,
            kv_cache_type=config.kv_cache_type, flash_attention=config.flash_attention,
            loaded_mib=loaded_mib, loaded_size_mib=loaded_size, loaded_ctx=loaded_ctx,
            loaded_expiry=loaded_expiry, loaded_beside_mib=beside, available_mib=available,
            observed={m: dict(seen) for m, seen in observed.items()}, models=models,
            version=heard_version(version, self.latest.get(name)), digests=digests,
            remote=remote, cloud_off=self._cloud_off.get(name, False),
            listed_before=self._last_listing(name)
            if isinstance(tags, BaseException) else (),
            listed=not isinstance(tags, BaseException) or self._listed_once(name))
        if not ready and (name not in self.latest or self.latest[name].ready):
            # (once when it goes, and once at start for one never reached: a wrong endpoint
            # or an Ollama that is down would otherwise be silent)
            # (with what it answered: a server that is not Ollama is not one that is down)
            log.warning("provider unreachable", provider=name, endpoint=config.endpoint,
                        error=str(version if isinstance(version, BaseException) else ps))
        self.latest[name] = state
        for watch in self.watchers:
            watch(state)
        return state

    def _first_seen_beside(self, name: str, loaded_mib: Mapping[str, int],
                           loaded_ctx: Mapping[str, int]) -> dict[str, int]:
        """Per loaded copy, what the other copies held (with their runners' overhead) when
        a probe first saw it (a copy listed at another context is a reload: seen anew): the
        copies listed with it, and those the probe before listed, which may have left after
        it loaded. A copy loaded before the first probe is taken to have loaded beside all
        it was first seen with: its runner may count them all."""
        known = self._beside.get(name, {})
        around = {**self._listed.get(name, {}), **loaded_mib}
        shared = self._published(name)
        seen: dict[str, tuple[int, int]] = {}
        for model in loaded_mib:
            ctx = loaded_ctx.get(model, 0)
            before = known.get(model)
            if before is not None and before[0] == ctx:
                seen[model] = before
            else:
                others = [mib for other, mib in around.items() if other != model]
                seen[model] = (ctx, held_by_runners(others))
            if shared is not None and shared.loaded_ctx.get(model) == ctx and \
                    shared.loaded_beside_mib.get(model, 0) > seen[model][1]:
                seen[model] = (ctx, shared.loaded_beside_mib[model])  # seen loading by another
        self._beside[name] = seen
        self._listed[name] = dict(loaded_mib)
        return {m: held for m, (_, held) in seen.items()}

    def _last_listing(self, name: str) -> tuple[str, ...]:
        """The newer listing of this process's last probe and the published state: with
        shared state this one probes a card only while nobody publishes it fresh, so its own
        may be far older (lacking a model pulled since: a false 404 while the card is down).
        A state that carries no listing (a prober that never saw one) does not hide one."""
        states = [s for s in (self.latest.get(name), self._published(name))
                  if s is not None and listed_before(s)]
        newest = max(states, key=lambda s: s.last_probed_at, default=None)
        return listed_before(newest)

    def _listed_once(self, name: str) -> bool:
        """Its /api/tags answered once, here or for another prober (an empty listing too:
        an Ollama with no models has none)."""
        return any(s is not None and s.listed
                   for s in (self.latest.get(name), self._published(name)))

    def _published(self, name: str) -> ProviderState | None:
        """The provider's state as the store holds it: other processes' probes, which may
        have seen a copy arrive that this one first sees after its neighbours left."""
        if self.store is None:
            return None
        entry = self.store.view(PROVIDER_STATE).get(escape_key(name))
        if entry is None:
            return None
        try:
            return ProviderState.decode(entry.value)
        except (ValueError, KeyError):
            return None

    def described(self, provider: str, models: Mapping[str, ModelInfo]) -> None:
        """What another process's probes say of the provider's models: taken as this
        process's own for the digests the next probe lists, instead of asking again."""
        self._described[provider] = dict(models)

    async def _shown_models(self, name: str, digests: dict[str, str], version: str
                            ) -> dict[str, ModelInfo]:
        """Asks /api/show only for models (or digests) not seen before on this Ollama
        version (another may describe a file otherwise: its capabilities, say), nor described
        by another process's probe; a failed ask is retried on the next probe. A few at a
        time: a card with hundreds of models on disk is not sent hundreds at once."""
        known = self._shown.setdefault(name, {})
        seen_as = {m: f"{digest}@{version}" for m, digest in digests.items()}
        for model, info in self._described.pop(name, {}).items():
            # (one that names no weights file is asked again: an older sidecar's, which
            # never read it, or a model that is not one GGUF file, which costs an ask)
            if model in seen_as and model not in known and info.weights:
                known[model] = (seen_as[model], info)
        new = [m for m, key in seen_as.items() if m not in known or known[m][0] != key]
        if new:
            asking = asyncio.Semaphore(SHOWS_AT_ONCE)

            async def details(model: str) -> Any:
                async with asking:
                    return await _details(self.clients[name], model)

            shows = await asyncio.gather(*(details(m) for m in new), return_exceptions=True)
            for model, show in zip(new, shows, strict=True):
                if not isinstance(show, BaseException):
                    known[model] = (seen_as[model], model_info(show))
        for model in [m for m in known if m not in digests]:
            del known[model]  # removed from disk
        return {m: info for m, (_, info) in known.items()}

    async def publish(self, state: ProviderState, force: bool = False) -> bool:
        """Write the state if it changed or the write interval passed; False if not written."""
        if self.store is None:
            return False
        if not self.store.connected:
            self._tell_waiting(state)
            return False
        fingerprint = _significant(state)
        last = self._written.get(state.name)
        if not force and last and last[0] == fingerprint and \
                state.last_probed_at - last[1] < self.write_every_s:
            return False
        try:
            await self.store.put(PROVIDER_STATE, escape_key(state.name), state.encode())
        except StoreUnavailable as exc:
            log.warning("provider state not written", provider=state.name, error=str(exc))
            return False
        self._written[state.name] = (fingerprint, state.last_probed_at)
        return True

    def _tell_waiting(self, state: ProviderState) -> None:
        """A state not written (the store away) wakes the calls waiting for room as a write
        would, when it says something new: a copy loaded meanwhile serves them."""
        fingerprint = _significant(state)
        if self._unwritten.get(state.name) != fingerprint and self.store is not None:
            self._unwritten[state.name] = fingerprint
            self.store.changes.bump()

    async def round(self, names: list[str] | None = None, force: bool = False
                    ) -> list[ProviderState]:
        targets = names if names is not None else list(self.configs)
        results = await asyncio.gather(*(self.probe(n) for n in targets),
                                       return_exceptions=True)
        states = []
        for name, result in zip(targets, results, strict=True):
            if isinstance(result, Exception):  # one card's odd answer stops no other's
                log.warning("probe failed", provider=name, error=repr(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                states.append(result)
        await asyncio.gather(*(self.publish(s, force) for s in states))
        return states

    async def refresh(self, name: str, after_s: float = 0.0) -> None:
        """Probe one provider (`after_s` from now) and publish at once (after an unload or a
        load)."""
        if after_s > 0:
            await asyncio.sleep(after_s)
        if name in self.configs:
            with_state = await self.probe(name)
            await self.publish(with_state, force=True)

    async def run(self, interval_s: float, wanted: Callable[[], list[str]]) -> None:
        """Probe what `wanted()` names every `interval_s` until cancelled."""
        while True:
            try:
                names = wanted()
                if names:
                    await self.round(names)
            except (UpstreamError, StoreUnavailable) as exc:
                log.warning("probe round failed", error=str(exc))
            except Exception:  # a bug must not end probing: the view would freeze
                log.exception("probe round failed unexpectedly")
            await asyncio.sleep(interval_s)
