"""The context window as Ollama resolves it, and whether a prompt fits in it.

From Ollama's source (ollama/ollama; docs/engine.md):
- precedence: the request's `num_ctx` > the Modelfile's > OLLAMA_CONTEXT_LENGTH > the
  version's default (server/routes.go:129-150);
- the default: 2048 before 0.6.7, 4096 up to 0.15.4, from 0.15.5 by the total VRAM
  (>= 47 GiB 262144, >= 23 GiB 32768, else 4096; routes.go:2043-2058);
- gpt-oss and qwen3vl at least 8192 on >= 20 GiB from 0.11.0 to 0.15.4 (v0.12.6 routes.go:141);
- a floor of 4, of 2048 for vision models (sched.go:169-177), then the trained context caps
  it (llm/server.go:111-116); the cap is what the copy gets, per parallel slot;
- an automatic context (none of the above set) whose load runs out of memory is lowered:
  above 32768 to 32768, above 4096 to 4096 (sched.go:650-663, 917-926);
- a prompt of num_ctx tokens or more is cut or refused: it must be <= num_ctx - 1
  (llm/llama_server.go:290); an embedding input <= num_ctx - 2 (BOS and EOS, routes.go:875).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

from proxy.core.types import ModelInfo, ProviderView

Version = tuple[int, int, int]
# Unknown versions (a source build says "0.0.0") get the newest rules.
NEWEST: Version = (9999, 0, 0)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")

GIB = 1024
# Room kept in the context beyond the prompt: the engine's own token (a prompt must be at
# most num_ctx - 1), and the start of the answer when its length is not capped. A call that
# sets num_predict keeps room for that many tokens, up to half the context: an answer that
# runs past the end makes the engine shift the context, and the start of the conversation goes.
ANSWER_RESERVE = 256
# What a prompt's estimate may fall short of the engine's count by, as a share (1/32): the
# most seen over 33,004 soak calls of 500 tokens or more, tool-loop histories with CJK text
# and images among them, was 2.7 %. A capped answer keeps it free besides its cap. (An answer
# capped for `shift: false` keeps the looser ESTIMATE_SHORTFALL, which costs only answer length.)
ESTIMATE_MISS = 32
EMBEDDING_RESERVE = 2
VISION_MIN_CONTEXT = 2048
BUMPED_FAMILIES = frozenset(("gptoss", "gpt-oss", "qwen3vl", "qwen3vlmoe"))


@functools.lru_cache(maxsize=256)
def parse_version(text: str) -> Version:
    match = _VERSION.match(text.strip())
    if match is None:
        return NEWEST
    version = (int(match[1]), int(match[2]), int(match[3]))
    return NEWEST if version == (0, 0, 0) else version


def default_context(version: Version, total_vram_mib: int | None) -> int:
    """Ollama's context when nothing sets one; 0 when it depends on a VRAM total not known."""
    if version < (0, 6, 7):
        return 2048
    if version < (0, 15, 5):
        return 4096
    if total_vram_mib is None:
        return 0
    if total_vram_mib >= 47 * GIB:
        return 262144
    return 32768 if total_vram_mib >= 23 * GIB else 4096


@dataclass(frozen=True, slots=True)
class Resolved:
    """The context a copy loaded for a call gets."""

    requested: int  # num_ctx as Ollama records it (before the trained cap); 0 unknown
    context: int  # what each slot gets; 0 unknown
    source: str  # where it came from: request, modelfile, provider, default <version>
    automatic: bool = False  # Ollama's default: it lowers it when the load runs out of memory
    lowered_from: int = 0  # the automatic context the card's memory could not hold; 0 none


def resolve(*, requested: int, modelfile: int, configured: int, version: Version,
            total_vram_mib: int | None, trained: int = 0, vision: bool = False,
            family: str = "", as_sent: bool = True) -> Resolved:
    """What Ollama resolves num_ctx to, before and after its caps (`requested` 0: the call
    does not set one); `requested` as the sidecar sends it (`as_loaded`) unless not
    `as_sent`."""
    asked = _asked(requested=requested, modelfile=modelfile, configured=configured,
                   version=version, total_vram_mib=total_vram_mib, trained=trained,
                   vision=vision, family=family)
    if as_sent and asked.requested and requested > 0 and trained and \
            asked.requested >= trained and \
            CAPPED_LISTING_SINCE <= version < CAPPED_COMPARE_SINCE:
        automatic = _asked(requested=0, modelfile=modelfile, configured=configured,
                           version=version, total_vram_mib=total_vram_mib, trained=trained,
                           vision=vision, family=family).requested
        asked = replace(asked, requested=as_loaded(asked.requested, automatic, trained,
                                                   version))
    return asked


# From 0.15.5 /api/ps lists a copy's context capped at the trained one (v0.15.5 server/
# routes.go:1914), while needsReload compares the num_ctx the copy was loaded with, as asked,
# until 0.30 (v0.24.0 server/sched.go:691-705), which caps both (server/sched.go:1405-1408,
# the runner's own set to what it got at the load, :691-693)
CAPPED_LISTING_SINCE: Version = (0, 15, 5)
CAPPED_COMPARE_SINCE: Version = (0, 30, 0)


def listed_as_loaded(view: ProviderView, model: str, probed: int, loaded: int) -> bool:
    """Whether a copy listed with num_ctx `probed` is the one loaded with `loaded` (0:
    unknown, taken as the same). Before 0.15.5 /api/ps lists the num_ctx asked, which Ollama
    compares as it is (v0.12.6 server/routes.go:1781, server/sched.go:600-606): phi3:mini
    (trained 4096) asked 16384 and reloaded asking 4096 is another copy. From 0.15.5 the
    listing is capped at the trained context: compared so."""
    if not loaded or not probed:
        return True
    if parse_version(view.version) < CAPPED_LISTING_SINCE:
        return probed == loaded
    info = view.models.get(model)
    trained = info.trained_context if info else 0
    return effective(probed, trained) == effective(loaded, trained)


def as_loaded(recorded: int, automatic: int, trained: int, version: Version) -> int:
    """The num_ctx a copy at its trained cap is loaded with, as the sidecar sends it and
    reads a listing of it, where Ollama lists the cap but compares the ask (0.15.5-0.29):
    the ask of a call that sets none (`automatic`, what an OpenAI or Anthropic call sends)
    when that reaches the cap, else the cap. Every copy the sidecar loads at the cap is so
    loaded with one value, which a listing of it, a call over any API and a sidecar that
    did not load it all agree on; a copy loaded with another by a client going around the
    sidecar is reloaded by Ollama at the first call (the listing cannot tell)."""
    if not trained or recorded < trained or \
            not CAPPED_LISTING_SINCE <= version < CAPPED_COMPARE_SINCE:
        return recorded
    return automatic if automatic >= trained else trained


def reloads_for(recorded: int, asked: int, trained: int, version: Version) -> bool:
    """Whether Ollama reloads a copy loaded with num_ctx `recorded` (as loaded: `as_loaded`)
    for a call that asks `asked` (needsReload: the asks compared as they are before 0.30,
    both capped at the trained context from 0.30)."""
    if version >= CAPPED_COMPARE_SINCE:
        return effective(recorded, trained) != effective(asked, trained)
    return recorded != asked


def _asked(*, requested: int, modelfile: int, configured: int, version: Version,
           total_vram_mib: int | None, trained: int, vision: bool, family: str) -> Resolved:
    automatic = False
    if requested > 0:
        value, source = requested, "request"
    elif modelfile > 0:
        value, source = modelfile, "modelfile"
    elif configured > 0:
        value, source = configured, "provider"
    else:
        value, automatic = default_context(version, total_vram_mib), True
        source = "default " + ".".join(map(str, version)) if version != NEWEST else "default"
    if not value:
        return Resolved(0, 0, "unknown (no VRAM total)")
    if family in BUMPED_FAMILIES and (0, 11, 0) <= version < (0, 15, 5) and \
            (total_vram_mib or 0) >= 20 * GIB:
        value = max(value, 8192)
    value = max(value, 4)
    if vision:
        value = max(value, VISION_MIN_CONTEXT)
    context = min(value, trained) if trained else value
    if context < value:
        source += f", trained {trained}"
    return Resolved(value, context, source, automatic)


def lower_automatic(context: int) -> tuple[int, ...]:
    """The smaller contexts Ollama falls back to, largest first, when a copy at an automatic
    `context` does not fit (sched.go:917-926 nextLowerAutoNumCtx)."""
    return tuple(step for step in (32768, 4096) if step < context)


def for_card(view: ProviderView, info: ModelInfo | None, requested: int,
             as_sent: bool = True) -> Resolved:
    """`resolve` with what a card and a model's /api/show say."""
    return resolve(requested=requested, modelfile=info.modelfile_num_ctx if info else 0,
                   configured=view.context_length, version=parse_version(view.version),
                   total_vram_mib=view.total_vram_mib,
                   trained=info.trained_context if info else 0,
                   vision=info.vision if info else False, family=info.family if info else "",
                   as_sent=as_sent)


def effective(recorded: int, trained: int) -> int:
    """A copy's per-slot context from what /api/ps reports (up to 0.15.4 the requested
    value, before the trained cap; every version's runner runs at the capped one)."""
    return min(recorded, trained) if trained and recorded else recorded


def kept(spare: int, generates: bool) -> str:
    """What the tokens kept free beside a prompt are for, in a refusal's words: an
    embedding keeps no room for an answer, only for its start and end tokens
    (server/routes.go adjustTokenLimit)."""
    return f"{spare} kept for the answer" if generates else \
        f"{spare} for the input's start and end tokens"


def reserve(context: int, answer_tokens: int, generates: bool = True, capped: bool = False,
            prompt_tokens: int = 0) -> int:
    """Tokens kept free beyond the prompt in a context of `context` tokens for an answer of
    `answer_tokens` (0 unknown; `capped`: the call's num_predict, which the answer cannot
    pass, so no more is kept for it). An answer that reaches the end of the context makes
    the engine shift it (llama-server runs with --context-shift, llm/llama_server.go:420,
    789-795): the start of the prompt goes, mid-answer and without a word. So a capped
    answer also keeps what the estimate of a prompt of `prompt_tokens` may fall short by
    (ESTIMATE_MISS), never more than an uncapped one keeps. Never more than half the
    context (and the engine's token) either way."""
    if not generates:
        return EMBEDDING_RESERVE
    half = context // 2  # a small num_ctx (256) still serves a prompt of half of it
    wanted = min(answer_tokens, half) if answer_tokens > 0 else 0
    floor = min(ANSWER_RESERVE, half)
    if capped and wanted:
        shortfall = -(-prompt_tokens // ESTIMATE_MISS)
        return max(wanted, min(floor, wanted + shortfall)) + 1
    return max(floor, wanted) + 1


# Context shift, and what a call's `shift: false` asks (an answer that reaches the end of the
# context stops, done_reason "length", instead of shifting): before 0.30 each call's own
# (v0.12.6 runner/ollamarunner/runner.go:526-537, runner/llamarunner/runner.go:404-411); from
# 0.30 a load option of the copy, llama-server's --context-shift, which a call whose `shift`
# differs reloads (server/sched.go:129-147, 1413-1419; without it llama-server stops the
# answer at the context's end, llm/llama_server.go:1714-1716).
SHIFT_AT_LOAD_SINCE: Version = (0, 30, 0)
# Of a prompt's estimate, the share kept free besides when an answer must not reach the end
# of the context: what the estimate may fall short by; and at least SHORTFALL_FLOOR tokens,
# a chat template's own before the sidecar has learned the model's (qwen3: "hi" is
# estimated at 4 tokens, and the engine counts 8).
ESTIMATE_SHORTFALL = 8  # an eighth
SHORTFALL_FLOOR = 16


def unshifted_answer_cap(context: int, prompt_tokens: int) -> int:
    """num_predict that keeps an answer from reaching the end of a context of `context`
    tokens after a prompt estimated at `prompt_tokens`, so the engine never shifts it: the
    engine's one token and an eighth of the estimate (at least SHORTFALL_FLOOR) kept free.
    At least 1."""
    free = max(prompt_tokens // ESTIMATE_SHORTFALL, SHORTFALL_FLOOR)
    return max(1, context - 1 - prompt_tokens - free)


def could_run_in(context: int, num_ctx: int, prompt_tokens: int, trained: int) -> bool:
    """Whether a call that asked for `num_ctx` (0 none; capped at the model's `trained`
    context, 0 unknown) with a prompt of `prompt_tokens` could run on a copy with `context`
    tokens per slot (0 unknown: it could). Only what rules the copy out for sure: the
    placement's own check (feasibility.py context_problem) also keeps room for the answer."""
    if not context:
        return True
    wanted = min(num_ctx, trained) if trained else num_ctx
    return wanted <= context and prompt_tokens < context


def fits(prompt_tokens: int, context: int, answer_tokens: int = 0, generates: bool = True,
         capped: bool = False) -> bool:
    """Whether the prompt fits with room for the answer; an unknown context (0) never
    refuses."""
    return context <= 0 or \
        prompt_tokens + reserve(context, answer_tokens, generates, capped,
                                prompt_tokens) <= context
