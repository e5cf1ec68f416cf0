"""What an engine's error messages say: out of memory, busy, a prompt over the context, or
the caller's own mistake answered as a server error.

The texts are Ollama's own (llm/status.go IsOutOfMemory; sched.go ErrMaxQueue) and, for an
over-long prompt, Ollama's, llama-server's and the 0.12 runners' refusals.
"""

from __future__ import annotations

import re

# Ollama's own list, matched case-insensitively (llm/status.go:85-96, 117-119)
OUT_OF_MEMORY = ("out of memory", "out of device memory", "cudamalloc failed",
                 "hipmalloc failed", "failed to allocate", "allocation failed",
                 "not enough memory", "insufficient memory", "vk_error_out_of_device_memory",
                 "erroroutofmemory")
SERVER_BUSY = "server busy"
PROMPT_TOO_LONG = ("prompt is longer than the context length",
                   "exceeds the available context size",
                   "input length exceeds the context length",
                   "input exceeds maximum context length")
# Ollama answers these 500, but they are the call's fault, whichever card gets it: an option
# of the wrong type (api/types.go:991-1089 Options.FromMap, via server/routes.go:218-221 and
# handleScheduleError's default, :3107-3119), a `format` that is neither "json" nor a schema
# (llm/llama_server.go:1594, 2320-2325; v0.12.6 llm/server.go:1435-1441), a chat template
# that fails on the messages (server/routes.go:2701-2704; Go's text/template errors), and an
# embedding with a model that cannot embed, which Ollama answers 501 or 500 once it has
# loaded it (llama-server's words from 0.30, Ollama's own runner's before: core/engines.py).
CALLERS_ERROR = re.compile(r'^(?:option "[^"]*" must be of |invalid format: '
                           r'|invalid JSON schema in format|template: '
                           r'|(?:This server|this model) does not support embeddings)')
_PROMPT_TOKENS = re.compile(r'request \((\d+) tokens\)|"n_prompt_tokens\\*"?:\s*(\d+)')


# What Ollama says when a runner's answer broke off (its stream closed unexpectedly): it has
# closed the runner (llm/llama_server.go:1759-1766; v0.12.6 llm/server.go:1566-1574) but
# keeps it listed, and reloads it for the next call (its Ping fails, server/sched.go:1426).
RUNNER_CLOSED = "an error was encountered while running the model"


def runner_closed(message: str) -> bool:
    return RUNNER_CLOSED in message


def is_out_of_memory(message: str) -> bool:
    lowered = message.lower()
    return any(text in lowered for text in OUT_OF_MEMORY)


def prompt_too_long(message: str) -> int | None:
    """For Ollama's refusal of a prompt longer than the context: the engine's count of it
    when the message gives one (llama-server's does), else 0; None for any other error."""
    lowered = message.lower()
    if not any(text in lowered for text in PROMPT_TOO_LONG):
        return None
    match = _PROMPT_TOKENS.search(message)
    return int(match[1] or match[2]) if match else 0


def callers_error(message: str) -> bool:
    """Whether an engine's 500 (or 501) is the call's own mistake (another card would refuse
    it too)."""
    return CALLERS_ERROR.match(message) is not None


_HTML_TITLE = re.compile(rb"<title[^>]*>\s*(.*?)\s*</title>", re.IGNORECASE | re.DOTALL)


def html_title(data: bytes) -> str | None:
    """An HTML page's title (what an ingress's 502 or a sign-in proxy's page says), else
    None: such a page is not Ollama's answer and its markup says nothing more."""
    found = _HTML_TITLE.search(data[:8192])
    return found.group(1)[:200].decode(errors="replace") if found else None


def body_excerpt(data: bytes) -> str:
    """A failed answer's body for a message: an HTML page by its title, else its start."""
    if (title := html_title(data)) is not None:
        return f"{title} (an HTML page, not Ollama's)"
    return data[:200].decode(errors="replace").strip()
