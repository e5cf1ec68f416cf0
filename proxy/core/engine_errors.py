"""What an engine's error messages say: out of memory, busy, or a prompt over the context.

The texts are Ollama's own (llm/status.go IsOutOfMemory; sched.go ErrMaxQueue) and, for an
over-long prompt, Ollama's, llama-server's and the 0.12 runners' refusals.
"""

from __future__ import annotations

import re

OUT_OF_MEMORY = ("out of memory", "out of device memory", "cudamalloc failed",
                 "hipmalloc failed", "failed to allocate", "allocation failed",
                 "not enough memory", "insufficient memory", "erroroutofmemory")
SERVER_BUSY = "server busy"
PROMPT_TOO_LONG = ("prompt is longer than the context length",
                   "exceeds the available context size",
                   "input length exceeds the context length",
                   "input exceeds maximum context length")
_PROMPT_TOKENS = re.compile(r'request \((\d+) tokens\)|"n_prompt_tokens\\*"?:\s*(\d+)')


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
