"""What a decision pays for the demand board, as the number of agents grows.

    python -m loadtest.demand_bench [--agents 10,50,200] [--repeat 2000]

Each agent has use entries for 4 models and a selection entry (5 entries per agent), in the
embedded store. Timed: the board's view when nothing changed since the last decision (reused)
and when it must be summed again (after any write to the board).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from proxy.adapters.memory_kv import MemoryStore
from proxy.ports import MODEL_DEMAND
from proxy.service.demand import DemandBoard, aggregate, decode_entries

MODELS = ("qwen3:8b", "qwen3:14b", "qwen3:32b", "llama3.1:8b")


async def board_of(agents: int) -> tuple[MemoryStore, DemandBoard]:
    store = MemoryStore()
    boards = [DemandBoard(store, f"crew/agent-{i}") for i in range(agents)]
    for board in boards:
        for model in MODELS:
            board.note_use(model)
        await board.flush_uses()
        await board.selected(MODELS[:2])
        await board.close()
    return store, boards[0]


def time_us(call: Callable[[], object], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - started) / repeat * 1e6


async def measure(agents: int, repeat: int) -> tuple[int, float, float]:
    """Entries on the board; µs per view reused; µs per view summed again."""
    store, board = await board_of(agents)
    board.view()
    reused = time_us(board.view, repeat)
    entries = store.view(MODEL_DEMAND)
    decoded: dict[str, tuple[int, dict[str, Any]]] = {}
    # What view() does once the board has changed (entries already decoded).
    summed = time_us(lambda: aggregate(decode_entries(entries, decoded), time.time()), repeat)
    return len(entries), reused, summed


async def run(agents: list[int], repeat: int) -> None:
    print("agents  entries  reused_us  summed_us")
    for n in agents:
        entries, reused, summed = await measure(n, repeat)
        print(f"{n:6d}  {entries:7d}  {reused:9.1f}  {summed:9.1f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--agents", default="10,50,200")
    p.add_argument("--repeat", type=int, default=2000)
    a = p.parse_args(argv)
    asyncio.run(run([int(x) for x in a.agents.split(",")], a.repeat))


if __name__ == "__main__":
    main()
