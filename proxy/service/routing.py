"""The seam where placement plugs in: a call comes in, its attempts (or a Refusal) go out.

The API layer knows only `Calls` and `Attempts`; service/calls.py implements them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from proxy.core.tokens import PromptSize
from proxy.core.types import CallSpec
from proxy.ports import Clock, ModelServer
from proxy.settings import ProviderConfig

if TYPE_CHECKING:
    from proxy.service.claims import Claimed

STATIC = "static"
CLOUD = "cloud"  # the placement of a call a provider's Ollama sends on to its cloud
NATIVE_PATHS = frozenset(("/api/chat", "/api/generate", "/api/embed", "/api/embeddings"))
EMBEDDING_PATHS = frozenset(("/api/embed", "/api/embeddings", "/v1/embeddings"))
NO_PROMPT = PromptSize()  # frozen: one instance serves as every default


@dataclass(frozen=True)
class CallRequest:
    """What the placement service needs to know about one inference call."""

    path: str
    model: str | None
    phase: str = "mulling"
    thread: str | None = None
    can_wait: bool = True
    prompt: PromptSize = NO_PROMPT
    num_ctx: int | None = None
    num_predict: int = 0  # the answer's cap (num_predict, max_tokens); 0 none
    # /api/generate's `context`: an earlier answer's tokens, which Ollama puts first.
    context_tokens: int = 0
    # One digest per prefix of the conversation (core.tokens.conversation_digests).
    conversation: tuple[int, ...] = ()
    # Of the prompt, the agent's prefix every conversation of it shares (core/affinity.py)
    shared_prompt: PromptSize = NO_PROMPT
    unloads_after: bool = False  # keep_alive 0: Ollama unloads the model when the call ends
    # the keep-alive it sets for its copy, in seconds (negative: forever); None: none set
    keep_alive_s: float | None = None
    # The agent sent `truncate: true`: a prompt no copy holds whole may go where Ollama cuts it
    cut_allowed: bool = False
    # tools offered, a tool's result last (core.tokens.answers_tool_result): an answer that
    # calls no tool ends the agent's loop
    ends_loop_unless_tool_called: bool = False
    # The capabilities the call needs, each with Ollama's refusal where the model lacks it
    # (api/capabilities.py)
    needs: tuple[tuple[str, str], ...] = ()
    # The path, when the call has inputs to embed (api/capabilities.py `embeds`)
    embeds: str = ""
    # The source the model's name asks for ("local", "cloud"; core/models.py model_ref);
    # a "local" call's `model` is the name without it
    source: str = ""
    # The Ollama versions that serve the path (api/routes.py SERVED_IN; () every one)
    served: tuple[tuple[tuple[int, int, int], tuple[int, int, int] | None], ...] = ()
    # The fleet's Ollama versions that refuse the body, with their words (api/wire.py
    # validate_in_fleet): in a fleet of mixed versions their cards are left out
    refused_by: tuple[tuple[tuple[int, int, int], str], ...] = ()
    # The body's check for a version none of the fleet's had at the call's check (a card
    # whose version was heard since): that version's refusal, None when it takes the body
    body_check: Callable[[tuple[int, int, int]], str | None] | None = None
    # Resolves when the client goes away, so a call waiting for a GPU stops waiting.
    disconnected: Callable[[], Awaitable[None]] | None = None
    # When the request arrived (the service clock's monotonic time), before its body was
    # read and checked: its wait limit runs from then; None: from its placement
    arrived: float | None = None

    @property
    def pins_context(self) -> bool:
        """Ollama's own API carries options, so the call can name the context it joins."""
        return self.path in NATIVE_PATHS

    @property
    def generates(self) -> bool:
        return self.path not in EMBEDDING_PATHS

    @property
    def tokens_apart(self) -> int:
        """Tokens counted apart from the text: the generate `context` and the images."""
        return self.context_tokens + self.prompt.image_tokens


@dataclass(frozen=True)
class CallOutcome:
    # The provider did its part, whether or not the call got its answer: a 5xx, a broken
    # connection or answer are its failures (its circuit's and upstream errors'); its
    # refusal of the call (a 4xx: the caller's mistake, or Ollama's 404 for a model it lacks)
    # is none
    healthy: bool
    seconds: float
    prompt_eval_count: int | None = None
    load_seconds: float | None = None
    error: str | None = None
    # The agent went away before the answer ended: nothing is known of the provider's health.
    client_left: bool = False
    # The engine refused the prompt as longer than the context (`prompt_eval_count`: its count,
    # or the context when it gave none, a lower bound)
    prompt_too_long: bool = False
    began: bool = True  # the engine began an answer (False: it refused or failed before)
    # The engine's own figures, when it gives them: the answer's tokens (Ollama's eval_count,
    # or the usage of the OpenAI and Anthropic APIs) and the seconds it spent generating them
    # (eval_duration) and reading the prompt (prompt_eval_duration).
    answer_tokens: int | None = None
    answer_seconds: float | None = None
    prompt_seconds: float | None = None
    # Of the prompt, the tokens the engine says it found cached (no Ollama version says it
    # yet; docs/affinity.md)
    prompt_cached_count: int | None = None
    # Whether the answer called a tool (None: not read, or it failed)
    called_tools: bool | None = None
    # The engine itself said the call failed (its error line, its 5xx, a stream it closed
    # unfinished), not the connection to it
    engine_failed: bool = False
    # Ollama answered 404 for the model: the card's listing, which placed it there, is stale
    # (`ollama rm` since it was probed)
    model_missing: bool = False

    @property
    def answered(self) -> bool:
        """The call got its answer from the provider: no failure, refusal or cut."""
        return self.healthy and self.error is None and not self.client_left


@dataclass(frozen=True)
class Attempt:
    """One try at answering a call: where it goes and what is sent there."""

    provider: str
    client: ModelServer
    model: str
    placement: str
    evicted: tuple[str, ...] = ()
    waited_ms: int = 0
    context_length: int = 0  # the context the call gets there; 0 unknown
    # num_ctx to send: the context of the copy planned (Ollama reloads a copy for a call
    # whose load options differ); 0 leaves the body's options alone
    num_ctx: int = 0
    strip_keep_alive: bool = False  # keep_alive 0: the sidecar unloads when it is safe
    # The engine takes `shift` as a load option of the copy (0.30+), not per call
    shift_at_load: bool = False
    # The engine finds the model under any spelling of its name (models.ANY_SPELLING_SINCE):
    # the caller's goes upstream, and comes back in the answer as Ollama echoes it
    any_spelling: bool = False
    # The engine reads a name's source suffix (models.SOURCE_SUFFIXES_SINCE): a call named
    # `x:local` goes up so named, and Ollama echoes it so
    reads_source: bool = False
    estimated_tokens: int = 0
    binding: str = "env"  # the candidates' source and revision, as resolved for this call
    watches_tool_calls: bool = False  # a loop's step: whether its answer calls a tool
    # The provider's own names of `model` (placed under one of them, core/aliases.py), the
    # one to send first; (): `model` itself
    names_here: tuple[str, ...] = ()


@dataclass(frozen=True)
class Granted:
    """A placed attempt, and the claimed ticket it settles (None: the static endpoint, or
    a call sent on to Ollama's cloud)."""

    attempt: Attempt
    claimed: Claimed | None
    spec: CallSpec
    # A held plan's load still under way when its call took it: the call's own request
    # waits on that load, so it is stopped when the call ends (nobody wants its copy then)
    preload: asyncio.Task[bool] | None = None


RefusalReason = Literal["bad-request", "model-not-found", "prompt-too-large", "client-gone",
                        "gpu-busy", "model-too-large", "not-found"]


@dataclass(frozen=True)
class Refusal:
    """Why the service will not place a call (the API gives each reason its status)."""

    reason: RefusalReason
    message: str
    model: str | None = None
    retry_after_s: int | None = None
    status: int | None = None  # Ollama's own status for its refusal; None: the reason's


class Attempts(Protocol):
    """One call's attempts, owned by the placement service. The relay sends each attempt
    and reports how it ended; the service settles its ticket, learns, writes the call's
    metrics and log line, and decides whether another attempt follows."""

    async def first(self) -> Attempt | Refusal: ...

    async def again(self, outcome: CallOutcome) -> Attempt | Refusal | None:
        """The current attempt failed before its answer began (or the engine refused the
        prompt as too long): settle it, and place another if the call may have one. None:
        no other attempt, the failure is the answer."""
        ...

    async def settle(self, outcome: CallOutcome) -> None:
        """The current attempt ended for good (answered, failed mid-stream, client gone)."""
        ...

    def answering(self) -> None:
        """The current attempt's stream began: its provider took the call and answers."""
        ...


class Calls(Protocol):
    clock: Clock  # the one a call's `arrived` is read on

    def attempts(self, call: CallRequest, started: float, cloud: Granted | None
                 ) -> Attempts:
        """The call's attempts; `cloud` is what `cloud_attempt` answered for it."""
        ...

    def cloud_attempt(self, call: CallRequest) -> Granted | None:
        """The attempt that sends the call on to Ollama's cloud, when a provider's Ollama
        would (core/cloud.py); None: the call is placed. Asked once a call, before its
        checks (Ollama sends a cloud call on before them), and handed to `attempts`."""
        ...

    def cloud_gateway(self) -> str | None:
        """The provider the sidecar reaches Ollama's cloud through (core/cloud.py)."""
        ...

    def bound_model(self, phase: str, thread: str | None) -> str: ...


class ProviderPool:
    """One pooled client per configured provider, plus the static endpoints (a provider's
    own client when it is one of them)."""

    def __init__(self, providers: Sequence[ProviderConfig], static_endpoint: str | None,
                 static_triage_endpoint: str | None,
                 connect: Callable[[str], ModelServer]) -> None:
        self.clients: dict[str, ModelServer] = {p.name: connect(p.endpoint) for p in providers}
        by_endpoint = {p.endpoint: self.clients[p.name] for p in providers}

        def _static(endpoint: str | None) -> ModelServer | None:
            if endpoint is None:
                return None
            return by_endpoint.get(endpoint) or connect(endpoint)

        self.static = _static(static_endpoint)
        self.static_triage = _static(static_triage_endpoint) or self.static

    def everything(self) -> list[tuple[str, ModelServer]]:
        """Providers in configured order; the static endpoint when there are none."""
        if self.clients:
            return list(self.clients.items())
        return [(STATIC, self.static)] if self.static is not None else []

    async def close(self) -> None:
        seen: set[int] = set()
        for client in [*self.clients.values(), self.static, self.static_triage]:
            if client is not None and id(client) not in seen:
                seen.add(id(client))
                await client.close()
