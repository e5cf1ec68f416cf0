"""What the three buckets hold, and how it turns into the core's types.

Key layouts (documented in docs/operations.md):
- kubemoot_provider_state / <provider>: the provider's probed state.
- kubemoot_provider_tickets / <provider>: {"tickets": {id: ticket}, "residents": {model: entry},
  "loads": {id: load}}
  one key per provider, so a claim is one compare-and-set on one key.
- kubemoot_model_demand / wait.<model>.<agent>, intent.<model>.<agent>, use.<model>.<agent>,
  sel.<agent>: one key per model and agent, so writes need no compare-and-set.
Names are escaped into KV-safe keys with `escape_key()` (NATS key escaping, nothing to do
with the prompt tokens of `proxy.core.tokens`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.core.tickets import Load, Residency, TicketSet
from proxy.core.types import ModelInfo, Resident, Ticket

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def escape_key(name: str) -> str:
    """A KV-safe key: anything but letters, digits, '_' and '-' becomes =XX."""
    return _UNSAFE.sub(lambda m: "".join(f"={b:02X}" for b in m.group().encode()), name)


def unescape_key(text: str) -> str:
    """The name `escape_key` escaped into `text`."""
    return re.sub(r"(?:=[0-9A-F]{2})+",
                  lambda m: bytes.fromhex(m.group().replace("=", "")).decode(), text)


def rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


def parse_rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def encode_model_info(info: ModelInfo) -> dict[str, Any]:
    return {"trainedContext": info.trained_context, "kvBytesPerToken": info.kv_bytes_per_token,
            "estimateKvBytesPerToken": info.estimate_kv_bytes_per_token,
            "numCtx": info.modelfile_num_ctx, "family": info.family,
            "embedding": info.embedding, "vision": info.vision,
            "architecture": info.architecture, "splitProjector": info.split_projector,
            "poolingType": info.pooling_type,
            "swaKvBytesPerToken": info.swa_kv_bytes_per_token, "swaWindow": info.swa_window,
            "swaChunked": info.swa_chunked, "tokenEmbeddingBytes": info.token_embedding_bytes,
            "cpuTableBytes": info.cpu_table_bytes, "logitsBytes": info.logits_bytes,
            "attentionHeads": info.attention_heads, "embeddingLength": info.embedding_length,
            "headDimsEqual": info.head_dims_equal, "blockCount": info.block_count,
            "kvHeads": info.kv_heads,
            **({"weights": info.weights} if info.weights else {}),
            **({"runner": info.runner} if info.runner else {}),
            **({"mtp": True} if info.mtp else {}),
            **({"capabilities": list(info.capabilities)} if info.capabilities is not None
               else {})}


def decode_model_info(d: dict[str, Any]) -> ModelInfo:
    capabilities = d.get("capabilities")  # absent from older writers: unknown
    return ModelInfo(int(d.get("trainedContext") or 0), int(d.get("kvBytesPerToken") or 0),
                     int(d.get("estimateKvBytesPerToken") or 0), int(d.get("numCtx") or 0),
                     str(d.get("family") or ""), bool(d.get("embedding")), bool(d.get("vision")),
                     tuple(str(c) for c in capabilities) if isinstance(capabilities, list)
                     else None, str(d.get("architecture") or ""), bool(d.get("splitProjector")),
                     _int_or(d.get("poolingType"), -1),  # absent from older writers
                     swa_kv_bytes_per_token=_int_or(d.get("swaKvBytesPerToken"), 0),
                     swa_window=_int_or(d.get("swaWindow"), 0),
                     swa_chunked=bool(d.get("swaChunked")),
                     token_embedding_bytes=_int_or(d.get("tokenEmbeddingBytes"), 0),
                     cpu_table_bytes=_int_or(d.get("cpuTableBytes"), 0),
                     logits_bytes=_int_or(d.get("logitsBytes"), 0),
                     attention_heads=_int_or(d.get("attentionHeads"), 0),
                     embedding_length=_int_or(d.get("embeddingLength"), 0),
                     head_dims_equal=d.get("headDimsEqual") is not False,
                     block_count=_int_or(d.get("blockCount"), 0),
                     kv_heads=_int_or(d.get("kvHeads"), 0),
                     weights=str(d.get("weights") or ""), runner=str(d.get("runner") or ""),
                     mtp=d.get("mtp") is True)


def _int_or(value: Any, default: int) -> int:
    return value if type(value) is int else default


@dataclass(frozen=True)
class ProviderState:
    """One `kubemoot_provider_state` entry."""

    name: str
    endpoint: str
    ready: bool
    last_probed_at: float
    total_vram_mib: int | None = None
    context_length: int = 0
    max_parallel: int = 1
    # the models its Ollama keeps loaded (OLLAMA_MAX_LOADED_MODELS, or 3 x its GPUs when
    # unset); 0 from an older publisher is Ollama's automatic limit too
    max_loaded: int | None = None
    gpus: int = 1  # the GPUs its Ollama runs on (the reserve is kept on each)
    kv_cache_type: str = "f16"
    flash_attention: bool | None = None  # OLLAMA_FLASH_ATTENTION; None unset
    loaded_mib: dict[str, int] = field(default_factory=dict)  # size_vram: GPU memory held
    loaded_size_mib: dict[str, int] = field(default_factory=dict)  # size: GPU and CPU
    loaded_ctx: dict[str, int] = field(default_factory=dict)
    loaded_expiry: dict[str, float] = field(default_factory=dict)  # /api/ps expires_at
    # per loaded copy, what the others held when it was first seen (Resident.beside_mib)
    loaded_beside_mib: dict[str, int] = field(default_factory=dict)
    available_mib: dict[str, int] = field(default_factory=dict)
    # Footprints seen here fully on the GPU: model -> num_ctx as recorded -> MiB
    observed: dict[str, dict[int, int]] = field(default_factory=dict)
    models: dict[str, ModelInfo] = field(default_factory=dict)  # on-disk model -> /api/show
    version: str = ""
    # on-disk model -> its manifest digest (/api/tags): names with one digest are one model
    digests: dict[str, str] = field(default_factory=dict)
    # Stubs of models Ollama's cloud runs (/api/tags `remote_host`): listed, never loaded,
    # so not among the models on disk; model -> its remote host
    remote: dict[str, str] = field(default_factory=dict)
    cloud_off: bool = False  # /api/status: OLLAMA_NO_CLOUD, every cloud call refused here
    # While /api/tags fails (the card down): the names it listed last, on disk or as stubs,
    # since the prober started (ProviderView.last_listed)
    listed_before: tuple[str, ...] = ()
    # Its /api/tags has answered (now, or before it failed): the names above are all it
    # has, none included; False: never listed, it may have any model
    listed: bool = False

    def encode(self) -> bytes:
        return orjson.dumps({
            "name": self.name,
            "endpoint": self.endpoint,
            "totalVramMiB": self.total_vram_mib,
            "loadedModelFootprintsMiB": self.loaded_mib,
            "loadedModelSizesMiB": self.loaded_size_mib,
            "loadedModelContextLengths": self.loaded_ctx,
            "loadedModelExpiresAt": {m: rfc3339(t) for m, t in self.loaded_expiry.items()
                                     if math.isfinite(t)},  # (none: unknown)
            "loadedModelBesideMiB": self.loaded_beside_mib,
            "availableModelFootprintsMiB": self.available_mib,
            "availableModelContextLengths": {m: i.trained_context
                                             for m, i in self.models.items()
                                             if i.trained_context},
            "availableModels": {m: encode_model_info(i) for m, i in self.models.items()},
            "observedFootprintsMiB": {m: {str(c): mib for c, mib in seen.items()}
                                      for m, seen in self.observed.items()},
            "contextLength": self.context_length,
            "maxParallel": self.max_parallel,
            "maxLoadedModels": self.max_loaded,
            "gpus": self.gpus,
            "kvCacheType": self.kv_cache_type,
            **({"flashAttention": self.flash_attention} if self.flash_attention is not None
               else {}),
            "ready": self.ready,
            "lastProbedAt": rfc3339(self.last_probed_at),
            "version": self.version,
            "availableModelDigests": self.digests,
            **({"remoteModels": self.remote} if self.remote else {}),
            **({"cloudDisabled": True} if self.cloud_off else {}),
            **({"lastListedModels": self.listed_before} if self.listed_before else {}),
            **({"modelsListed": True} if self.listed else {}),
        })

    @staticmethod
    def decode(raw: bytes) -> ProviderState:
        d = orjson.loads(raw)
        models = {m: decode_model_info(i) for m, i in (d.get("availableModels") or {}).items()}
        for model, trained in (d.get("availableModelContextLengths") or {}).items():
            models.setdefault(model, ModelInfo(trained_context=int(trained)))
        return ProviderState(
            name=str(d["name"]), endpoint=str(d.get("endpoint", "")), ready=bool(d["ready"]),
            last_probed_at=parse_rfc3339(d["lastProbedAt"]),
            total_vram_mib=d.get("totalVramMiB"), context_length=int(d.get("contextLength") or 0),
            max_parallel=int(d.get("maxParallel") or 1),
            max_loaded=d.get("maxLoadedModels"),  # absent from older publishers: None
            gpus=max(1, _int_or(d.get("gpus"), 1)),
            kv_cache_type=str(d.get("kvCacheType") or "f16"),
            flash_attention=fa if isinstance(fa := d.get("flashAttention"), bool) else None,
            loaded_mib=dict(d.get("loadedModelFootprintsMiB") or {}),
            loaded_size_mib=dict(d.get("loadedModelSizesMiB") or {}),
            loaded_ctx=dict(d.get("loadedModelContextLengths") or {}),
            loaded_expiry={m: parse_rfc3339(t)
                           for m, t in (d.get("loadedModelExpiresAt") or {}).items()},
            loaded_beside_mib={m: int(v) for m, v in
                               (d.get("loadedModelBesideMiB") or {}).items()},
            available_mib=dict(d.get("availableModelFootprintsMiB") or {}),
            observed={m: {int(c): int(mib) for c, mib in seen.items()}
                      for m, seen in (d.get("observedFootprintsMiB") or {}).items()
                      if isinstance(seen, dict)},
            models=models,
            version=str(d.get("version", "")),
            digests={str(m): str(v) for m, v in (d.get("availableModelDigests") or {}).items()},
            remote={str(m): str(h) for m, h in (d.get("remoteModels") or {}).items()},
            cloud_off=d.get("cloudDisabled") is True,
            listed_before=tuple(str(m) for m in d.get("lastListedModels") or ()),
            # (an older publisher's: a listing it carries is one; an empty one is unknown)
            listed=d.get("modelsListed") is True or bool(
                d.get("availableModelFootprintsMiB") or d.get("remoteModels") or
                d.get("lastListedModels")),
        )

    def residents(self) -> tuple[Resident, ...]:
        return tuple(Resident(m, mib, self.loaded_ctx.get(m, 0),
                              expires_at=self.loaded_expiry.get(m, math.inf),
                              spilled=mib < self.loaded_size_mib.get(m, mib),
                              beside_mib=self.loaded_beside_mib.get(m, 0))
                     for m, mib in sorted(self.loaded_mib.items()))


def encode_ticket_set(tickets: TicketSet) -> bytes:
    """One `kubemoot_provider_tickets` entry."""
    return orjson.dumps({
        "tickets": {tid: {"model": t.model, "mib": t.footprint_mib, "cold": t.cold,
                          "evicts": dict(t.evicts), "holder": t.holder,
                          "started": t.started_at, "exp": t.expires_at,
                          **({"crew": t.crew} if t.crew else {}),
                          **({"ctx": t.context} if t.context else {}),
                          **({"est": t.estimate_mib} if t.estimate_mib else {}),
                          **({"beside": t.beside_mib} if t.beside_mib else {}),
                          **({"plan": True} if t.plan else {})}
                    for tid, t in tickets.tickets.items()},
        "residents": {m: {"mib": r.mib, "ctx": r.context_length, "at": r.at,
                          **({"leaving": True} if r.leaving else {}),
                          **({"loading": True} if r.loading else {}),
                          **({"abandoned": True} if r.abandoned else {}),
                          **({"beside": r.beside} if r.beside else {}),
                          **({"expires": r.expires} if r.expires != math.inf else {})}
                      for m, r in tickets.residents.items()},
        # (A reader that predates it ignores this key; a writer that does drops it.)
        "loads": {tid: {"model": load.model, "mib": load.mib, "ctx": load.context_length,
                        "at": load.at}
                  for tid, load in tickets.loads.items()},
    })


# A ticket whose expiry is no finite number (JSON has no infinity: orjson writes null) lasts
# the default ticket TTL from its start: counted, and gone in time, not held for good
UNREADABLE_EXPIRY_TTL_S = 60.0


def _expiry(ticket: dict[str, Any]) -> float:
    exp = ticket.get("exp")
    if isinstance(exp, int | float) and not isinstance(exp, bool) and math.isfinite(exp):
        return float(exp)
    return float(ticket["started"]) + UNREADABLE_EXPIRY_TTL_S


def decode_ticket_set(provider: str, raw: bytes | None) -> TicketSet:
    """The ticket set a `kubemoot_provider_tickets` entry holds (empty when there is none)."""
    if not raw:
        return TicketSet()
    d: dict[str, Any] = orjson.loads(raw)
    tickets = {
        tid: Ticket(tid, provider, str(t["model"]), int(t["mib"]), float(t["started"]),
                    _expiry(t), cold=bool(t.get("cold")),
                    evicts={str(k): int(v) for k, v in (t.get("evicts") or {}).items()},
                    holder=str(t.get("holder", "")), crew=str(t.get("crew") or ""),
                    context=int(t.get("ctx") or 0),
                    estimate_mib=int(t.get("est") or 0), plan=bool(t.get("plan")),
                    beside_mib=int(t.get("beside") or 0))
        for tid, t in (d.get("tickets") or {}).items()
    }
    residents = {m: Residency(int(r["mib"]), int(r.get("ctx") or 0), float(r["at"]),
                              leaving=bool(r.get("leaving")), loading=bool(r.get("loading")),
                              abandoned=bool(r.get("abandoned")), beside=int(r.get("beside") or 0),
                              expires=float(r.get("expires", math.inf)))
                 for m, r in (d.get("residents") or {}).items()}
    loads = {tid: Load(str(load["model"]), int(load["mib"]), int(load.get("ctx") or 0),
                       float(load["at"]))
             for tid, load in (d.get("loads") or {}).items()}
    return TicketSet(tickets, residents, loads)
