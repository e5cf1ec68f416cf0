"""A loaded copy's prompt cache: one KV cache per slot, as Ollama's runners keep it.

A prompt is a list of blocks (the tool schema, each message, an earlier answer's `context`),
each a digest of its content and its tokens; two prompts share a block exactly when its
content is the same, so the common prefix is counted in whole blocks.

- The slot a call takes (after a free slot was found):
  - 0.12 (Ollama's own runners, OLLAMA_MULTIUSER_CACHE unset: findLongestCacheSlot,
    runner/ollamarunner/cache.go:151-172 at v0.12.6): the free slot with the longest common
    prefix, the first on ties;
  - 0.30 and later (llama-server, `cache_prompt: true`, llm/llama_server.go:1562 at HEAD,
    `-np` slots of `-c num_ctx x parallel` at :375-376): the free slot whose common prefix
    is the largest share of the prompt above llama.cpp's `slot_prompt_similarity` (0.1),
    else the least recently used free slot.
- The prompt is evaluated from the end of the common prefix, but never less than one token
  (cache.go:121-124 at v0.12.6: "Leave one input to sample"); the slot then holds this
  prompt (cache.go:145).
- A reload is a new runner: every slot starts empty.

Prefill time (`prefill_seconds`) is llama.cpp's compute, not an Ollama rule: each token
evaluated attends to every token before it, so a token at depth d costs the weights' work
(2 FLOPs per parameter) plus the attention's (4 x layers x query width x d FLOPs: Q.K and
the weighted sum of V). The time to evaluate from depth d0 to d1 is then
(d1 - d0) / r0 x (1 + (d0 + d1) / 2 / D), with r0 the rate at depth 0 and
D = parameters / (2 x layers x query width) the depth at which a token costs twice as much
(`depth_scale`; from each model's architecture: about 28k tokens for qwen3:8b, 36k for
qwen3:14b, 31k for qwen3:32b, 19k for llama3.2:3b).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sim_engine import version_tuple
from .sim_model import SimModel

SLOT_PROMPT_SIMILARITY = 0.1  # llama.cpp server's default (--slot-prompt-similarity)
DEFAULT_DEPTH_SCALE = 32768.0  # a model whose architecture the simulator does not know


def depth_scale(model: SimModel) -> float:
    """The depth (tokens) at which evaluating one more token costs twice as much as at
    depth 0: the weights' FLOPs over the attention's per token of depth (module docstring)."""
    size = model.parameter_size
    parameters = float(size.rstrip("BM")) * (1e6 if size.endswith("M") else 1e9)
    width = model.head_count * model.key_length if model.key_length else model.embedding_length
    return parameters / (2 * model.block_count * width)


def prefill_seconds(start: int, end: int, tokens_per_s: float, scale: float) -> float:
    """The time to evaluate a prompt's tokens from depth `start` to depth `end`."""
    evaluated = max(end - start, 0)
    return evaluated / tokens_per_s * (1 + (start + end) / 2 / scale)

Block = tuple[int, int]  # (digest of the content, tokens)


@dataclass
class CacheSlot:
    blocks: tuple[Block, ...] = ()
    in_use: bool = False
    last_used: int = 0  # a tick of the copy's own clock: the order of use is what counts


def common_prefix_tokens(held: tuple[Block, ...], prompt: tuple[Block, ...]) -> int:
    tokens = 0
    for mine, theirs in zip(held, prompt, strict=False):
        if mine != theirs:
            break
        tokens += mine[1]
    return tokens


@dataclass
class PromptCache:
    slot_count: int
    version: str
    slots: list[CacheSlot] = field(default_factory=list)
    _tick: int = 0

    def __post_init__(self) -> None:
        self.slots = [CacheSlot() for _ in range(max(self.slot_count, 1))]

    def take(self, prompt: tuple[Block, ...], total: int) -> tuple[CacheSlot, int]:
        """The slot the call runs in and the tokens of `total` it finds there (evaluated:
        `total` less those)."""
        free = [s for s in self.slots if not s.in_use]
        assert free, "a slot is taken only after the copy's slot semaphore let the call in"
        shares = [(common_prefix_tokens(s.blocks, prompt), s) for s in free]
        if version_tuple(self.version) >= (0, 30, 0):
            best_tokens, best = max(shares, key=lambda pair: pair[0])
            if best_tokens <= SLOT_PROMPT_SIMILARITY * max(total, 1):
                best = min(free, key=lambda s: s.last_used)
                best_tokens = common_prefix_tokens(best.blocks, prompt)
        else:
            best_tokens, best = shares[0]
            for tokens, slot in shares[1:]:
                if tokens > best_tokens:
                    best_tokens, best = tokens, slot
        cached = min(best_tokens, max(total - 1, 0))
        self._tick += 1
        best.in_use, best.last_used, best.blocks = True, self._tick, prompt
        return best, cached

    @staticmethod
    def release(slot: CacheSlot) -> None:
        slot.in_use = False
