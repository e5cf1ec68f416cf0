"""What checking a Responses body's function-call arguments costs the thread that does it:
valid arguments (orjson's check) against arguments Go cannot read (the ported scanner, for
Go's words), at the size a body is checked on the event loop up to (256 KiB) and beyond.

    PYTHONPATH=. python -m loadtest.body_check_bench
"""

from __future__ import annotations

import time

import orjson

from proxy.api import layers
from proxy.api.routes import OFF_LOOP_BYTES

VERSION = (0, 33, 0)


def _body(arguments: str) -> dict[str, object]:
    return {"model": "qwen3:8b", "input": [{"type": "function_call", "call_id": "c",
                                             "name": "f", "arguments": arguments}]}


def _best_ms(body: dict[str, object], rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        layers.layer_error("/v1/responses", body, VERSION)
        best = min(best, time.perf_counter() - began)
    return best * 1000


def main() -> None:
    print(f"bodies over {OFF_LOOP_BYTES // 1024} KiB are checked off the event loop")
    print("| arguments | bytes | valid (ms) | cut short (ms) |")
    print("|---|---|---|---|")
    for size in (56 << 10, OFF_LOOP_BYTES, 900 << 10):
        valid = orjson.dumps({"x": "y" * size}).decode()
        cut = valid[:-2]
        print(f"| one string | {len(valid):,} | {_best_ms(_body(valid)):.2f} | "
              f"{_best_ms(_body(cut)):.1f} |")


if __name__ == "__main__":
    main()
