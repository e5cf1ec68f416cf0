"""What a simulated Ollama server is: one GPU, a model catalog and Ollama's knobs.

Pure data and arithmetic shared by the HTTP simulator and the fleet presets.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024
IMAGE_TOKENS = 768  # what Ollama counts for each image in a chat message (OLLAMA-API.md 2.6)


@dataclass(frozen=True)
class SimModel:
    """A model on disk: what `/api/tags` and `/api/show` describe."""

    name: str
    disk_mib: int
    vram_mib: int  # footprint once loaded at the default context (weights + KV slab)
    trained_ctx: int = 32768
    family: str = "qwen3"
    parameter_size: str = "8B"
    quantization: str = "Q4_K_M"
    kv_mib_per_kctx: float = 0.0  # extra MiB per 1024 tokens of context per slot

    def footprint_mib(self, ctx: int, num_parallel: int) -> int:
        extra = self.kv_mib_per_kctx * (ctx / 1024) * num_parallel
        return int(self.vram_mib + extra)


@dataclass(frozen=True)
class SimConfig:
    """One simulated GPU running one `ollama serve`."""

    name: str = "sim"
    total_vram_mib: int = 24576
    models: tuple[SimModel, ...] = ()
    num_parallel: int = 1  # OLLAMA_NUM_PARALLEL
    max_loaded_models: int = 3  # OLLAMA_MAX_LOADED_MODELS (default 3 per GPU); 0 no limit
    context_length: int = 0  # OLLAMA_CONTEXT_LENGTH; 0 = automatic, tiered by VRAM
    keep_alive_s: float = 300.0  # OLLAMA_KEEP_ALIVE
    load_mib_per_s: float = 1024.0
    tokens_per_s: float = 50.0
    prompt_tokens_per_s: float = 4000.0
    default_predict: int = 16
    chars_per_token: float = 4.0
    image_tokens: int = IMAGE_TOKENS  # a vision model's own cost per image (qwen2.5vl: more)
    time_scale: float = 1.0  # multiplies every simulated duration; tests use 0.001-0.01
    evict_idle_on_pressure: bool = True  # Ollama's own eviction; counted as self_evictions
    version: str = "0.12.6"


    def model(self, name: str) -> SimModel | None:
        wanted = normalise_name(name)
        for m in self.models:
            if normalise_name(m.name) == wanted:
                return m
        return None

    def default_context(self) -> int:
        """OLLAMA_CONTEXT_LENGTH, or Ollama's VRAM tiers when unset (OLLAMA-API.md 2.5)."""
        if self.context_length > 0:
            return self.context_length
        gib = self.total_vram_mib / 1024
        if gib < 23:
            return 4096
        if gib < 47:
            return 32768
        return 262144


def normalise_name(name: str) -> str:
    """Ollama's `name[:tag]` with the tag defaulting to `latest`."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any, default_s: float) -> float:
    """Seconds; math.inf for 'forever' (any negative), 0 for 'unload now'."""
    if value is None:
        return default_s
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a number or a duration string")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise ValueError(f"time: invalid duration {text!r}") from None
            seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise ValueError("keep_alive must be a number or a duration string")
    return math.inf if seconds < 0 else seconds


DIGITS = "0123456789"


def tokens_for_text(text: str, chars_per_token: float) -> int:
    """ASCII text at `chars_per_token`, but every digit and every non-ASCII character a token
    of its own, as Qwen's tokenizer splits numbers into digits and byte-level tokenizers
    spend one or more on each CJK character."""
    if not text:
        return 0
    dense = sum(map(text.count, DIGITS))
    if not text.isascii():
        dense += sum(1 for c in text if not c.isascii())
    return math.ceil((len(text) - dense) / chars_per_token) + dense


@dataclass
class PromptTokens:
    """A prompt as the engine counts it: per-message tokens plus the tool schema."""

    messages: list[int] = field(default_factory=list)
    system_flags: list[bool] = field(default_factory=list)
    fixed: int = 0  # tools and other never-dropped parts

    @property
    def total(self) -> int:
        return self.fixed + sum(self.messages)


def fit_to_context(prompt: PromptTokens, ctx: int) -> tuple[int, bool]:
    """Ollama's silent front truncation: (tokens kept, truncated?).

    Whole messages are dropped from the front, keeping system messages and the last one;
    what still does not fit is cut at the token level (OLLAMA-API.md 2.6).
    """
    total = prompt.total
    if total <= ctx:
        return total, False
    kept = list(prompt.messages)
    last = len(kept) - 1
    for i in range(len(kept)):
        if sum(kept) + prompt.fixed <= ctx:
            break
        if i == last or prompt.system_flags[i]:
            continue
        kept[i] = 0
    remaining = sum(kept) + prompt.fixed
    return min(remaining, ctx), True


# Catalog used by the demo fleet and the tests: footprints follow SPEC-ADDENDUM's worked figures.
CATALOG: tuple[SimModel, ...] = (
    SimModel("qwen3:32b", disk_mib=20200, vram_mib=27000, trained_ctx=40960,
             parameter_size="32.8B"),
    SimModel("qwen3:14b", disk_mib=9300, vram_mib=12224, trained_ctx=40960,
             parameter_size="14.8B"),
    SimModel("qwen3:8b", disk_mib=5200, vram_mib=6000, trained_ctx=40960,
             parameter_size="8.2B"),
    SimModel(
        "llama3.2:3b",
        disk_mib=1926,
        vram_mib=3100,
        trained_ctx=131072,
        family="llama",
        parameter_size="3.2B",
    ),
    SimModel(
        "phi3:mini",
        disk_mib=2176,
        vram_mib=3600,
        trained_ctx=4096,
        family="phi3",
        parameter_size="3.8B",
    ),
)


def demo_fleet(time_scale: float = 1.0) -> list[SimConfig]:
    """Three heterogeneous GPUs (32, 24 and 16 GiB), each with the whole catalog on disk."""
    return [
        SimConfig(name="gpu-5090", total_vram_mib=32768, models=CATALOG, time_scale=time_scale,
                  context_length=8192),
        SimConfig(name="gpu-4090", total_vram_mib=24564, models=CATALOG, time_scale=time_scale,
                  context_length=8192),
        SimConfig(name="gpu-4080", total_vram_mib=16376, models=CATALOG, time_scale=time_scale,
                  context_length=4096),
    ]
