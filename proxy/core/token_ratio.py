"""What the engine's counts teach about a prompt's tokens: a fixed part per prompt (its chat
template's own tokens, a tools block's instructions) and characters per token for the rest.

A template-heavy prompt (a short question with a tool schema) is mostly fixed tokens: taken
as a ratio alone it teaches ~2 characters per token (1 with a real model's tools block),
and a 100,000-character document after it would be sized at twice its tokens and refused
as too large. So the counts are fitted as a line, tokens = fixed + characters / ratio, by
least squares over the recent prompts, each weighing KEEP of the one after it. Two points
on the starting ratio (3.5, no fixed part) steady the line while the prompts seen are all
of one size: a line through one point has any slope.

Dense characters, digits and everything outside ASCII, are learned apart (tokens each, 1
until taught) from prompts mostly made of them; the minor part of a prompt is taken at the
rate already learned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

DEFAULT_CHARS_PER_TOKEN = 3.5
RATIO_MIN, RATIO_MAX = 1.0, 8.0
DEFAULT_TOKENS_PER_DENSE = 1.0
DENSE_MIN, DENSE_MAX = 0.1, 4.0
DENSE_ALPHA = 0.3
KEEP = 0.9  # each newer prompt's count fades an older one by this much
# The starting ratio as two points of this weight: at no characters and at PRIOR_CHARS.
PRIOR_WEIGHT = 0.5
PRIOR_CHARS = 4000.0
MAX_FIXED_TOKENS = 2048.0
# A prompt the engine counts fewer tokens than this teaches nothing: tokens the sidecar
# does not see (a template's own, a model's image cost) are all of it.
MIN_SAMPLE_TOKENS = 64


@dataclass(frozen=True, slots=True)
class _Sums:
    """Weighted sums of a least-squares line of tokens (y) on characters (x)."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def faded_plus(self, x: float, y: float) -> _Sums:
        return _Sums(self.w * KEEP + 1, self.x * KEEP + x, self.y * KEEP + y,
                     self.xx * KEEP + x * x, self.xy * KEEP + x * y)

    def __add__(self, other: _Sums) -> _Sums:
        return _Sums(self.w + other.w, self.x + other.x, self.y + other.y,
                     self.xx + other.xx, self.xy + other.xy)

    def line(self) -> tuple[float, float]:
        """(fixed tokens, tokens per character), the fixed part kept in [0, MAX_FIXED_TOKENS]
        and the slope within the ratios a tokenizer can have."""
        spread = self.w * self.xx - self.x * self.x
        slope = (self.w * self.xy - self.x * self.y) / spread if spread > 0 else 0.0
        slope = min(max(slope, 1 / RATIO_MAX), 1 / RATIO_MIN)
        fixed = (self.y - slope * self.x) / self.w
        if not 0.0 <= fixed <= MAX_FIXED_TOKENS:
            fixed = min(max(fixed, 0.0), MAX_FIXED_TOKENS)
            slope = min(max((self.xy - fixed * self.x) / self.xx, 1 / RATIO_MAX), 1 / RATIO_MIN)
        return fixed, slope


def _prior(chars_per_token: float, weight: float = PRIOR_WEIGHT) -> _Sums:
    top = PRIOR_CHARS / chars_per_token
    return _Sums(2 * weight, weight * PRIOR_CHARS, weight * top,
                 weight * PRIOR_CHARS ** 2, weight * PRIOR_CHARS * top)


PRIOR = _prior(DEFAULT_CHARS_PER_TOKEN)


@dataclass(frozen=True, slots=True)
class TokenRatio:
    """`observe` returns the next state; `taught` one as if many prompts had taught it."""

    chars_per_token: float = DEFAULT_CHARS_PER_TOKEN
    fixed_tokens: float = 0.0
    samples: int = 0
    tokens_per_dense: float = DEFAULT_TOKENS_PER_DENSE
    dense_samples: int = 0
    seen: _Sums = _Sums()
    prior: _Sums = PRIOR

    @classmethod
    def taught(cls, chars_per_token: float, samples: int = 20) -> TokenRatio:
        return cls(chars_per_token, samples=samples,
                   prior=_prior(chars_per_token, PRIOR_WEIGHT * samples))

    def observe(self, chars: int, prompt_eval_count: int | None, dense: int = 0
                ) -> TokenRatio:
        """A prompt mostly of letters moves the line, one mostly of dense characters their
        rate."""
        if not prompt_eval_count or prompt_eval_count < MIN_SAMPLE_TOKENS or chars <= 0:
            return self
        narrow = chars - dense
        if dense * 2 <= chars:
            rest = prompt_eval_count - dense * self.tokens_per_dense
            if rest <= 0 or not RATIO_MIN <= narrow / rest <= RATIO_MAX:
                # cut to fit or counted without its cached part (too few tokens), or text
                # no tokenizer merges (too many): not prose to learn from
                return self
            seen = self.seen.faded_plus(narrow, rest)
            fixed, slope = (self.prior + seen).line()
            return replace(self, chars_per_token=1 / slope, fixed_tokens=fixed,
                           samples=self.samples + 1, seen=seen)
        per_dense = (prompt_eval_count - self.fixed_tokens - narrow / self.chars_per_token) \
            / dense
        if not DENSE_MIN <= per_dense <= DENSE_MAX:
            return self
        blended = per_dense if self.dense_samples == 0 else \
            DENSE_ALPHA * per_dense + (1 - DENSE_ALPHA) * self.tokens_per_dense
        return replace(self, tokens_per_dense=blended, dense_samples=self.dense_samples + 1)

    def tokens(self, chars: int, dense: int = 0, pieces: int = 0) -> int:
        """Tokens of text added to a prompt (its messages' `pieces` of template each)."""
        if chars <= 0:
            return pieces * PIECE_TOKENS
        return math.ceil((chars - dense) / self.chars_per_token + dense * self.tokens_per_dense
                         + pieces * PIECE_TOKENS)

    def prompt_tokens(self, chars: int, dense: int = 0) -> int:
        """Tokens of a whole prompt: its text and the fixed part of its template."""
        return math.ceil(self.fixed_tokens) + self.tokens(chars, dense)


# The chat template's tokens around each message (role markers, separators: ~5 in Qwen's
# and Llama 3's), added to what a conversation appends to a counted prefix; a whole
# prompt's are in the fitted fixed part and ratio.
PIECE_TOKENS = 8
