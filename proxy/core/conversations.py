"""What each loaded copy is expected to hold in its prompt cache (docs/affinity.md).

Ollama keeps one KV cache per slot of a loaded copy and evaluates a prompt from the end of
the longest prefix a slot holds (docs/engine.md, "The prompt cache"). The sidecar cannot see
the slots; it keeps, per copy (provider and model), the prompts it sent there, newest first,
and expects a prompt to survive while:

- fewer other conversations than the copy's cache slots were sent there since (Ollama before
  0.30 keeps one conversation per copy whatever its slots: a used slot shares the first token
  with any prompt, so the longest-prefix rule hands it the next conversation);
- the copy has not been loaded again since (a reload starts every slot empty);
- the prompt still fits the context the copy gives it.

Sending a call to a copy whose slots all hold other conversations pushes out the least
recent one, which costs a re-read unless that conversation has ended: its last call gave
the model a tool's result and the answer called no tool (the loop's final answer), or it has
been idle longer than the longest pause between calls seen on the copy.

A prompt is known by the conversation digests of core/tokens.py: one per prefix of its
messages, each also covering the system text and tools. A call continues a held prompt when
its digest at the held prompt's length is the held prompt's last digest; it shares the
agent's prefix (system prompt, tools, the first message) when its first digest is the held
prompt's first. Standard library only: the snapshot carries it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

KEEP_PER_COPY = 16  # prompts remembered per copy, beyond any slot count Ollama runs
# A conversation idle for this many times the longest pause between calls seen on its copy
# is taken as ended: a tool loop comes back within its cadence, one that outgrew its task
# or finished never does, and pushing its history out costs nobody a re-read.
ENDED_AFTER_PAUSES = 1.0
Copy = tuple[str, str]  # (provider, model)


@dataclass(frozen=True, slots=True)
class Conversation:
    """A call's prompt as the cache sees it."""

    digests: tuple[int, ...]  # core.tokens.conversation_digests
    tokens: int  # the whole prompt's expected tokens
    shared_tokens: int = 0  # of those, the agent's prefix (system text, tools, first message)


@dataclass(frozen=True, slots=True)
class Held:
    """A prompt sent to a copy, as compact as sharing it across sidecars needs."""

    first: int  # its first digest (the agent's prefix)
    ident: int  # its second digest (the prefix and the task): which conversation it is
    last: int  # its last digest (the whole prompt)
    items: int  # how many digests (messages) it had
    tokens: int
    shared_tokens: int
    at: float
    # the longest time between two of its calls seen (0: one call known); not part of what
    # makes two entries the same
    pause: float = field(default=0.0, compare=False)
    # its answer ended the loop: a tool's result answered without a tool call
    finished: bool = field(default=False, compare=False)

    @staticmethod
    def of(conversation: Conversation, at: float, pause: float = 0.0) -> Held:
        digests = conversation.digests
        return Held(digests[0], ident_of(digests), digests[-1],
                    len(digests), conversation.tokens, conversation.shared_tokens, at, pause)

    def leads_to(self, digests: tuple[int, ...]) -> bool:
        """Whether this is the prompt with these digests or an earlier one of it."""
        return self.items <= len(digests) and digests[self.items - 1] == self.last

    def same_conversation(self, other: Held) -> bool:
        return self.ident == other.ident

    def prefix_of(self, conversation: Conversation) -> int:
        """The tokens of `conversation` this held prompt gives it: all of it when the call
        continues it, the agent's prefix when they share only that, else none."""
        digests = conversation.digests
        if not digests or digests[0] != self.first:
            return 0
        if self.leads_to(digests):
            return self.tokens
        return min(self.shared_tokens, conversation.shared_tokens)


def ident_of(digests: tuple[int, ...]) -> int:
    """Which conversation a prompt belongs to: its digest of the agent's prefix and the
    task (the first message after the system text)."""
    return digests[min(1, len(digests) - 1)]


def cache_slots(slots: int, version: str) -> int:
    """How many conversations a copy keeps at once (see the module's docstring)."""
    numbers = version.split(".")
    try:
        major, minor = int(numbers[0]), int(numbers[1])
    except (IndexError, ValueError):
        return max(slots, 1)  # unknown: the newest rules
    return 1 if (major, minor) < (0, 30) else max(slots, 1)


@dataclass(frozen=True, slots=True)
class PromptCaches:
    """Per copy, the prompts sent there newest first, and when it was last (re)loaded."""

    held: Mapping[Copy, tuple[Held, ...]] = field(default_factory=dict)
    loaded_at: Mapping[Copy, float] = field(default_factory=dict)
    # each loaded copy's context as last seen, and when: another context means a reload
    contexts: Mapping[Copy, tuple[int, float]] = field(default_factory=dict)

    def expected_cached(self, provider: str, model: str, conversation: Conversation | None,
                        slots: int) -> int:
        """The tokens of the call's prompt the copy is expected to hold."""
        if conversation is None or not conversation.digests:
            return 0
        best = 0
        loaded = self.loaded_at.get((provider, model), float("-inf"))
        others: list[Held] = []  # other conversations sent since, newest first
        for held in self.held.get((provider, model), ()):
            if held.at < loaded:
                break  # a load since wiped it, and everything older
            if any(held.same_conversation(o) for o in others):
                continue  # an older prompt of a conversation already counted
            if len(others) >= slots:
                break
            best = max(best, held.prefix_of(conversation))
            others.append(held)
        return min(best, conversation.tokens)

    def displaced(self, provider: str, model: str, conversation: Conversation | None,
                  slots: int, now: float) -> int:
        """The tokens of another conversation's prompt that sending this call to the copy
        is expected to push out: the least recent of those it holds when they fill its
        slots, this conversation is not among them (Ollama's least recently used), and
        that one has not ended (`ended`)."""
        if conversation is None or not conversation.digests:
            return 0
        loaded = self.loaded_at.get((provider, model), float("-inf"))
        ident = ident_of(conversation.digests)
        kept: list[Held] = []
        for held in self.held.get((provider, model), ()):
            if held.at < loaded or len(kept) >= slots:
                break
            if held.ident == ident:
                return 0
            if not any(held.same_conversation(k) for k in kept):
                kept.append(held)
        if len(kept) < slots or self.ended(provider, model, kept[-1], now):
            return 0
        return kept[-1].tokens

    def ended(self, provider: str, model: str, held: Held, now: float) -> bool:
        """Whether the conversation is taken as over: its last answer ended its loop, or it
        has been idle for ENDED_AFTER_PAUSES times the longest pause between calls of any
        conversation the copy holds (its calls' cadence: think time, tools, the other loops'
        turns; never while no pause is known)."""
        if held.finished:
            return True
        cadence = max((h.pause for h in self.held.get((provider, model), ())), default=0.0)
        return cadence > 0 and now - held.at > ENDED_AFTER_PAUSES * cadence

    def sent(self, provider: str, model: str, conversation: Conversation, now: float
             ) -> PromptCaches:
        """A call of this conversation went to the copy: its prompt is the newest there."""
        if not conversation.digests:
            return self
        ident = ident_of(conversation.digests)
        earlier = [h for kept in self.held.values() for h in kept if h.ident == ident]
        pause = max((h.pause for h in earlier), default=0.0)
        latest = max(earlier, key=lambda h: h.at, default=None)
        if latest is not None and not latest.finished:  # after a final answer: no cadence
            pause = max(pause, now - latest.at)
        new = Held.of(conversation, now, pause)
        key = (provider, model)
        kept = tuple(h for h in self.held.get(key, ()) if not h.same_conversation(new))
        return replace(self, held={**self.held, key: (new, *kept)[:KEEP_PER_COPY]})

    def finished(self, digests: tuple[int, ...]) -> PromptCaches:
        """A call with this prompt answered a tool's result without calling a tool: its loop
        is over. Its prompt and the earlier ones of its conversation are marked, on every
        copy; a later call of it (sent before this answer came) is not."""
        if not digests:
            return self
        held = {key: tuple(replace(h, finished=True) if h.leads_to(digests) else h
                           for h in kept) for key, kept in self.held.items()}
        return replace(self, held=held)

    def loaded(self, provider: str, model: str, now: float) -> PromptCaches:
        """The copy was (re)loaded: every slot starts empty."""
        key = (provider, model)
        held = {k: v for k, v in self.held.items() if k != key}
        return PromptCaches(held, {**self.loaded_at, key: now}, self.contexts)

    def wiped(self, provider: str, model: str, at: float) -> PromptCaches:
        """The copy was (re)loaded at `at`, by anyone: whatever was sent there before, by
        this sidecar or another, is gone."""
        key = (provider, model)
        if self.loaded_at.get(key, float("-inf")) >= at:
            return self
        held = {**self.held, key: tuple(h for h in self.held.get(key, ()) if h.at >= at)}
        return replace(self, held=held, loaded_at={**self.loaded_at, key: at})

    def lost(self, provider: str, model: str, conversation: Conversation) -> PromptCaches:
        """An answer showed the copy held less than expected: it holds this call's prompt
        now, and nothing older is counted on."""
        key = (provider, model)
        newest = tuple(h for h in self.held.get(key, ())[:1]
                       if h.first == conversation.digests[0])
        return replace(self, held={**self.held, key: newest})

    def merged(self, shared: Mapping[Copy, tuple[Held, ...]]) -> PromptCaches:
        """Other sidecars' prompts on the same copies, interleaved by time."""
        held = dict(self.held)
        for key, theirs in shared.items():
            mine = held.get(key, ())
            seen = set(mine)
            both = sorted((*mine, *(h for h in theirs if h not in seen)),
                          key=lambda h: -h.at)
            held[key] = tuple(both[:KEEP_PER_COPY])
        return replace(self, held=held)


NO_CACHES = PromptCaches()
