"""What a call needs its model to be able to do, with the refusal Ollama gives a model that
cannot: Ollama checks these before it loads anything (server/routes.go:448-469 generate,
:2610-2637 chat), so the sidecar places the call only on models that can, and answers
Ollama's own 400 when none can (placement step 5, "unsupported"). An embedding Ollama
refuses only once the model is loaded, in words and status of the card's version: the
sidecar answers the same without the load."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.core.context import NEWEST, Version
from proxy.core.engines import THINK_LEVEL
from proxy.core.models import full_model_name

# The paths Ollama serves with its chat handler and with its generate handler (the OpenAI
# and Anthropic layers put their requests through them)
CHAT_PATHS = frozenset(("/api/chat", "/v1/chat/completions", "/v1/responses", "/v1/messages"))
GENERATE_PATHS = frozenset(("/api/generate", "/v1/completions"))
EMBED, LEGACY_EMBED, OPENAI_EMBED = "/api/embed", "/api/embeddings", "/v1/embeddings"
# ThinkValue.Bool (api/types.go:1166-1180): true, or one of these levels
THINKING = frozenset(("high", "medium", "low", "max"))
# OpenAI's reasoning efforts each Ollama takes ("none" turns thinking off; any other is its
# 400, layers.effort_error): high, medium and low; max from 0.22 (commit c2ebb4d57); minimal,
# xhigh and ultra from 0.32.11 (openai/openai.go thinkFromReasoningEffort, commit 01d04d50f)
EFFORTS_BY_VERSION: tuple[tuple[Version, tuple[str, ...]], ...] = (
    ((0, 0, 0), ("high", "medium", "low")),
    ((0, 22, 0), ("max",)),
    ((0, 32, 11), ("minimal", "xhigh", "ultra")))
# The Responses API reads `reasoning.effort` from 0.22 (openai/responses.go, commit
# ea01af6f7); an older Ollama ignores it, and the call asks for no thinking.
RESPONSES_EFFORT_SINCE: Version = (0, 22, 0)

Needs = tuple[tuple[str, str], ...]


def thinking_efforts(version: Version) -> frozenset[str]:
    """The reasoning efforts that ask Ollama `version` to think."""
    return frozenset(effort for since, efforts in EFFORTS_BY_VERSION if version >= since
                     for effort in efforts)


def reasoning_effort(path: str, body: dict[str, Any]) -> Any:
    """The effort a call on OpenAI's chat or Responses API asks for: `reasoning.effort`
    when `reasoning` is given (an object), else the chat's `reasoning_effort`."""
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        return reasoning.get("effort")
    return body.get("reasoning_effort") if path == "/v1/chat/completions" else None


def call_needs(path: str, body: dict[str, Any], model: str,
               version: Version = NEWEST) -> Needs:
    """The capabilities the call needs, each with Ollama's refusal, in the order Ollama checks
    them: a think level on a card before 0.17.7 and a model without harmony
    (`engines.THINK_LEVEL`), thinking asked of a model that cannot think (`think`; on the OpenAI
    paths a reasoning effort, openai/openai.go:697-705 and responses.go:575; the Anthropic layer
    relaxes it, server/routes.go:2624), then a model without "completion" (an embedding model),
    then `tools` on a model without "tools", or a non-empty `suffix` (generate's,
    /v1/completions', openai/openai.go:841) on one without "insert" (its template has no
    `.Suffix`, server/images.go:251-253): scheduling errors, which name the model in full
    (server/routes.go:448-451, images.go:543-584, routes.go:3107-3110). An embedding checks no
    capability (routes.go:854, 1072): whether the model embeds depends on the card's Ollama
    (`embeds`, core/engines.py `embedding_refusal`)."""
    if path in CHAT_PATHS:
        verb = "chat"
    elif path in GENERATE_PATHS:
        verb = "generate"
    else:
        return ()
    quoted = orjson.dumps(model).decode()  # Go's %q of a plain name
    needs: list[tuple[str, str]] = []
    if thinks(path, body, version):
        if level := think_level(path, body):  # judged by each card's version (engines)
            needs.append((THINK_LEVEL, f"think value {orjson.dumps(level).decode()} is not "
                          "supported for this model"))
        needs.append(("thinking", f"{quoted} does not support thinking"))
    needs.append(("completion", f"{quoted} does not support {verb}"))
    tools = body.get("tools")
    if verb == "chat" and isinstance(tools, list) and tools:
        needs.append(("tools", f"{full_model_name(model)} does not support tools"))
    suffix = body.get("suffix")
    if verb == "generate" and isinstance(suffix, str) and suffix:
        needs.append(("insert", f"{full_model_name(model)} does not support insert"))
    return tuple(needs)


def thinks(path: str, body: dict[str, Any], version: Version = NEWEST) -> bool:
    """Whether the call asks the model to think, as Ollama `version` reads it."""
    if path in ("/api/chat", "/api/generate"):
        think = body.get("think")
        return think is True or (isinstance(think, str) and think in THINKING)
    if path == "/v1/responses" and version < RESPONSES_EFFORT_SINCE:
        return False
    if path in ("/v1/chat/completions", "/v1/responses"):
        effort = reasoning_effort(path, body)
        return isinstance(effort, str) and effort in thinking_efforts(version)
    return False


def think_level(path: str, body: dict[str, Any]) -> str | None:
    """The level a call asks the model to think at, as the string Ollama's handler gets
    (`think` on its own API, a reasoning effort from its OpenAI chat layer); None for a
    boolean or none."""
    asked = body.get("think") if path in ("/api/chat", "/api/generate") else \
        reasoning_effort(path, body) if path == "/v1/chat/completions" else None
    return asked if isinstance(asked, str) and asked in THINKING else None


def embeds(path: str, body: dict[str, Any]) -> str:
    """The path, when the call has an input for the model to embed; "" otherwise. /api/embed
    with no input (`""`, `[]`, none) and the legacy path with an empty `prompt` load the
    model and answer without embedding (server/routes.go:820-840, 861-864, 1078-1082); the
    OpenAI layer turns `""` into one input, and refuses none or `[]` itself with 400
    (middleware/openai.go:412-424), which Ollama's answer is left to give."""
    given = body.get("prompt" if path == LEGACY_EMBED else "input")
    if path == OPENAI_EMBED:
        return path if given is not None and given != [] else ""
    if path == EMBED and isinstance(given, list):  # Ollama's 400 for a text of another type
        return path if given and all(isinstance(text, str) for text in given) else ""
    return path if path in (EMBED, LEGACY_EMBED) and isinstance(given, str) and given else ""
