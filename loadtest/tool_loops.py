"""Agents' tool loops for the simulation: each agent keeps several conversations going at
once and sends their calls interleaved; every call resends its conversation's whole history
(the agent's system prompt and tools, the task, each call and tool result so far) and adds
one turn. A conversation that outgrows its length starts over as a new one.

A call carries its prompt twice: as the sidecar knows it (conversation digests, the
expected tokens, the agent's shared prefix) and as a copy's prompt cache compares it
(loadtest/sim_cache.py blocks).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from loadtest.sim_cache import Block
from proxy.core.conversations import Conversation

BOS: Block = (0, 1)


@dataclass(frozen=True)
class LoopSpec:
    """An agent's tool loops."""

    loops: int = 3  # conversations at once
    system_tokens: int = 2000  # its system prompt and tools, shared by all its loops
    task_tokens: tuple[int, int] = (500, 1500)
    turn_tokens: tuple[int, int] = (1000, 3000)  # a call and its tool's result
    max_tokens: int = 30000  # beyond it the loop ends and a new one starts


@dataclass
class _Loop:
    ident: int
    turns: list[Block] = field(default_factory=list)


class ToolLoops:
    """Every agent's conversations; `next_call` gives the next call's prompt."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._loops: dict[str, list[_Loop]] = {}
        self._turn: dict[str, int] = {}

    def next_call(self, agent: str, spec: LoopSpec, rng: random.Random
                  ) -> tuple[int, Conversation, tuple[Block, ...], bool]:
        """(prompt tokens, the conversation, its blocks, whether it is the loop's last: its
        answer calls no tool) of the agent's next call."""
        loops = self._loops.setdefault(agent, [])
        turn = self._turn.get(agent, 0)
        self._turn[agent] = turn + 1
        if len(loops) < spec.loops:
            loops.append(self._start(rng, spec))
        loop = loops[turn % len(loops)]
        tokens = 1 + spec.system_tokens + sum(t for _, t in loop.turns)
        if tokens > spec.max_tokens:
            loop = loops[turn % len(loops)] = self._start(rng, spec)
        loop.turns.append((next(self._ids), rng.randint(*spec.turn_tokens)))
        system: Block = (hash(("system", agent)), spec.system_tokens)
        blocks = (BOS, system, *loop.turns)
        digests = tuple(itertools.accumulate(blocks[1:], lambda d, b: hash((d, b)), initial=0)
                        )[1:]
        total = sum(t for _, t in blocks)
        last = total > spec.max_tokens  # the next call of this loop starts a new one
        return total, Conversation(digests, total, 1 + spec.system_tokens), blocks, last

    def _start(self, rng: random.Random, spec: LoopSpec) -> _Loop:
        return _Loop(next(self._ids), [(next(self._ids), rng.randint(*spec.task_tokens))])
