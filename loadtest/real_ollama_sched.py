"""Scheduling scenarios, run by hand against a real Ollama and the simulator: their OUTCOME
(what /api/ps lists, whether a call reloaded, how many streams run at once), never timing.

Both servers run with OLLAMA_MAX_LOADED_MODELS=1, OLLAMA_NUM_PARALLEL=2 and
OLLAMA_MAX_QUEUE=1 (the simulator: `--max-loaded 1 --parallel 2 --max-queue 1`). Each side
names four models: A; B, another name of A's weights file with a PARAMETER of its own (a real
Ollama keys its runners by the weights file, server/sched.go); C, other weights; D, A's weights
with `PARAMETER num_ctx 512`. A call reloaded when its `load_duration` is over RELOAD_NS (a
warm call on a tiny CPU model is ~2 ms, a cold load ~40 ms; the simulator's ~0 and seconds).

    python -m loadtest.ollama_sim --port 22411 --version 0.12.6 --max-loaded 1 --parallel 2 \
        --max-queue 1 --derived phib=phi3:mini:0 --derived phid=phi3:mini:512 &
    python -m loadtest.real_ollama_sched --real http://127.0.0.1:22401 \
        --real-models tiny,tinyb,tinyc,tinyd --sim http://127.0.0.1:22411 \
        --sim-models phi3:mini,phib,llama3.2:3b,phid
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import httpx

RELOAD_NS = 10_000_000
# Sampling that keeps the tiny model from repeating one token 31 times (llm/server.go
# aborts such a stream without its done chunk) or stopping at once: a stream of ~1 s on CPU.
# `sim_answer_tokens` makes the simulator's answer that long (a real Ollama ignores it).
LONG_STREAM = {"temperature": 2, "top_k": 0, "top_p": 1, "repeat_penalty": 3,
               "repeat_last_n": -1, "seed": 1}


@dataclass(frozen=True)
class Models:
    """One server and its models: A, B (A's weights, another name), C (other weights),
    D (A's weights, `PARAMETER num_ctx 512`)."""

    url: str
    a: str
    b: str
    c: str
    d: str

    def letter(self, name: str) -> str:
        """A name as /api/ps lists it, as its letter (both sides then read alike)."""
        base = name.split(":latest")[0]
        for letter, model in (("A", self.a), ("B", self.b), ("C", self.c), ("D", self.d)):
            if base == model.split(":latest")[0]:
                return letter
        return name


def _gen(cl: httpx.Client, m: Models, model: str, **extra: Any) -> dict[str, Any]:
    opts = {"num_predict": 3, "temperature": 0, "seed": 1, **extra.pop("options", {})}
    resp = cl.post(f"{m.url}/api/generate", json={
        "model": model, "prompt": "hello", "stream": False, "options": opts, **extra})
    body: dict[str, Any] = resp.json()
    body["status"] = resp.status_code
    return body


def reloaded(answer: dict[str, Any]) -> bool:
    return int(answer.get("load_duration") or 0) > RELOAD_NS


def ps(cl: httpx.Client, m: Models) -> list[str]:
    """What /api/ps lists: each copy as its letter and context, sorted."""
    models = cl.get(f"{m.url}/api/ps").json().get("models") or []
    return sorted(f"{m.letter(x.get('name', ''))}@{x.get('context_length', '?')}"
                  for x in models)


def unload_all(cl: httpx.Client, m: Models) -> None:
    for name in (m.a, m.b, m.c, m.d):
        cl.post(f"{m.url}/api/generate", json={"model": name, "keep_alive": 0})
    _wait(lambda: not ps(cl, m), 10)


def _wait(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _ctx_rel(entries: list[str], base: list[str]) -> list[str]:
    """Contexts as `base` (the first copy's) or `other`: the models' defaults differ."""
    ctx0 = base[0].split("@")[1] if base else ""
    return [e.split("@")[0] + ("@base" if e.split("@")[1] == ctx0 else "@other")
            for e in entries]


def s_max_loaded_other_weights(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """MAX_LOADED_MODELS=1: A warm, a call for C: A unloaded first, C loaded."""
    _gen(cl, m, m.a)
    after_a = ps(cl, m)
    ans = _gen(cl, m, m.c)
    return {"ps after A": [e.split("@")[0] for e in after_a], "C status": ans["status"],
            "C reloaded": reloaded(ans), "ps after C": [e.split("@")[0] for e in ps(cl, m)]}


def s_same_weights_other_name(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """A warm, a call for B (A's weights file, a PARAMETER of its own): joins A's copy or
    loads its own?"""
    _gen(cl, m, m.a)
    ans = _gen(cl, m, m.b)
    return {"B status": ans["status"], "B reloaded": reloaded(ans),
            "ps after B": [e.split("@")[0] for e in ps(cl, m)]}


def s_num_ctx_change(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """A warm at its default context, then num_ctx 512, then 512 again with temperature 0.9
    (not a load option), then the default again."""
    _gen(cl, m, m.a)
    base = ps(cl, m)
    small = _gen(cl, m, m.a, options={"num_ctx": 512})
    after_small = ps(cl, m)
    temp = _gen(cl, m, m.a, options={"num_ctx": 512, "temperature": 0.9})
    back = _gen(cl, m, m.a)
    return {"num_ctx 512 reloaded": reloaded(small), "ps after 512": after_small,
            "temperature reloaded": reloaded(temp), "default again reloaded": reloaded(back),
            "ps at end": _ctx_rel(ps(cl, m), base)}


def _stream(m: Models, model: str, n: int, out: dict[str, float], key: str,
            t0: float) -> None:
    """One streamed call; the times (from t0) of its first chunk and its end."""
    with httpx.Client(timeout=120) as cl, cl.stream("POST", f"{m.url}/api/generate", json={
            "model": model, "prompt": "hello", "stream": True,
            "options": {"num_predict": n, "sim_answer_tokens": n, **LONG_STREAM}}) as resp:
        for line in resp.iter_lines():
            if line.strip():
                out.setdefault(key + ".first", time.monotonic() - t0)
                chunk = json.loads(line)
                if chunk.get("done") or chunk.get("error"):
                    out[key + ".end"] = time.monotonic() - t0
                    out[key + ".done"] = bool(chunk.get("done"))


def s_parallel_three(cl: httpx.Client, m: Models, n: int = 400) -> dict[str, Any]:
    """NUM_PARALLEL=2, three streamed calls at once on a warm copy: how many had their first
    chunk before any call ended (the ones that ran together), and the copies listed."""
    _gen(cl, m, m.a)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    threads = [threading.Thread(target=_stream, args=(m, m.a, n, times, str(i), t0))
               for i in range(3)]
    for t in threads:
        t.start()
        time.sleep(0.02)  # ordered starts; the outcome, not the timing, is compared
    for t in threads:
        t.join()
    return {"ran together": together(times), "ps": [e.split("@")[0] for e in ps(cl, m)]}


def together(times: dict[str, float]) -> int:
    """How many calls started (first chunk) before the first one ended."""
    ends = [v for k, v in times.items() if k.endswith(".end")]
    if not ends:
        return 0
    return sum(1 for k, v in times.items() if k.endswith(".first") and v < min(ends))


def s_keep_alive_0_while_streaming(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """A long stream on A; meanwhile a call with keep_alive 0 ends: is the copy still listed
    while the stream runs, and gone once it ends?"""
    _gen(cl, m, m.a)
    times: dict[str, float] = {}
    th = threading.Thread(target=_stream, args=(m, m.a, 1500, times, "s", time.monotonic()))
    th.start()
    _wait(lambda: "s.first" in times, 30)
    _gen(cl, m, m.a, keep_alive=0)
    during = "s.end" not in times, [e.split("@")[0] for e in ps(cl, m)]
    th.join()
    gone = _wait(lambda: not ps(cl, m), 5)
    return {"stream still running": during[0], "ps during stream": during[1],
            "gone within 5 s of the stream's end": gone}


def _with_stream(cl: httpx.Client, m: Models, then: Callable[[], dict[str, Any]]
                 ) -> dict[str, Any]:
    """`then()` while a long stream on a warm A runs; whether the stream ended whole, and
    whether `then` came back before the stream's end (it waited for it, or not)."""
    _gen(cl, m, m.a)
    times: dict[str, float] = {}
    t0 = time.monotonic()
    th = threading.Thread(target=_stream, args=(m, m.a, 1500, times, "s", t0))
    th.start()
    _wait(lambda: "s.first" in times, 30)
    out = then()
    back = time.monotonic() - t0
    th.join()
    return {**out, "stream whole": times.get("s.done"),
            "answered before the stream ended": back < times.get("s.end", 0)}


def s_other_model_while_streaming(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """MAX_LOADED_MODELS=1: a call for C while A streams: waits for A's stream, then swaps."""
    def then() -> dict[str, Any]:
        ans = _gen(cl, m, m.c)
        return {"C status": ans["status"], "C reloaded": reloaded(ans)}
    out = _with_stream(cl, m, then)
    return {**out, "ps at end": [e.split("@")[0] for e in ps(cl, m)]}


def s_num_ctx_while_streaming(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """num_ctx 512 on A while A streams at its default: waits, then reloads A at 512."""
    def then() -> dict[str, Any]:
        ans = _gen(cl, m, m.a, options={"num_ctx": 512})
        return {"512 status": ans["status"], "512 reloaded": reloaded(ans)}
    out = _with_stream(cl, m, then)
    return {**out, "ps at end": ps(cl, m)}


def s_same_weights_while_streaming(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """B (A's weights, its own temperature) while A streams: joins the copy at once."""
    def then() -> dict[str, Any]:
        ans = _gen(cl, m, m.b)
        return {"B status": ans["status"], "B reloaded": reloaded(ans)}
    out = _with_stream(cl, m, then)
    return {**out, "ps at end": [e.split("@")[0] for e in ps(cl, m)]}


def _expiry(cl: httpx.Client, m: Models) -> str:
    models = cl.get(f"{m.url}/api/ps").json().get("models") or []
    return "forever" if models and str(models[0].get("expires_at", ""))[:4] > "2100" else (
        "soon" if models else "gone")


def s_keep_alive_last_wins(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """keep_alive -1, then a call without keep_alive, then -1, then "10m": each call sets the
    copy's expiry."""
    seen = []
    for keep in (-1, None, -1, "10m"):
        _gen(cl, m, m.a, **({} if keep is None else {"keep_alive": keep}))
        seen.append(_expiry(cl, m))
    return {"expiry after -1, none, -1, 10m": seen}


def s_two_models_at_once_cold(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """MAX_LOADED_MODELS=1, nothing loaded: A and C at once: both answered, one copy left."""
    out: list[tuple[int, str]] = []
    threads = [threading.Thread(target=_post_status, args=(replace(m, a=name), out))
               for name in (m.a, m.c)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    return {"statuses": sorted(s for s, _ in out),
            "ps at end": [e.split("@")[0] for e in ps(cl, m)]}


def s_swap_abandoned_while_streaming(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """MAX_LOADED_MODELS=1: a call for C while A streams, abandoned (client gone) before
    the stream ends: what is loaded once the stream has ended?"""
    def then() -> dict[str, Any]:
        try:
            cl.post(f"{m.url}/api/generate", timeout=0.1, json={
                "model": m.c, "prompt": "hello", "stream": False,
                "options": {"num_predict": 3}})
            return {"C answered": True}
        except httpx.TimeoutException:
            return {"C answered": False}
    out = _with_stream(cl, m, then)
    out.pop("answered before the stream ended")  # C never answers: only timing is left
    _wait(lambda: False, 2)  # the scheduler's wake-ups after the stream: let them settle
    return {**out, "ps at end": [e.split("@")[0] for e in ps(cl, m)]}


def s_keep_alive_forever_evicted(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """MAX_LOADED_MODELS=1: A loaded with keep_alive -1, idle; a call for C evicts it."""
    _gen(cl, m, m.a, keep_alive=-1)
    ans = _gen(cl, m, m.c)
    return {"C status": ans["status"], "ps after C": [e.split("@")[0] for e in ps(cl, m)]}


def s_other_name_own_num_ctx(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """D: A's weights with `PARAMETER num_ctx 512`: a call for it while A is warm reloads the
    one copy at 512 (one weights file, one runner), and A's next call reloads it back."""
    _gen(cl, m, m.a)
    d = _gen(cl, m, m.d)
    after_d = ps(cl, m)
    a = _gen(cl, m, m.a)
    return {"D reloaded": reloaded(d), "ps after D": after_d, "A again reloaded": reloaded(a),
            "copies at end": len(ps(cl, m))}


def _post_status(m: Models, out: list[tuple[int, str]]) -> None:
    with httpx.Client(timeout=120) as cl:
        resp = cl.post(f"{m.url}/api/generate", json={
            "model": m.a, "prompt": "hello", "stream": False, "options": {"num_predict": 3}})
    out.append((resp.status_code, str(resp.json().get("error", ""))))


def s_queue_full(cl: httpx.Client, m: Models, n: int = 4) -> dict[str, Any]:
    """OLLAMA_MAX_QUEUE=1: four calls at once for a cold A. The scheduler is busy with the
    load while the others arrive: one waits in the queue, the rest are turned away."""
    out: list[tuple[int, str]] = []
    threads = [threading.Thread(target=_post_status, args=(m, out)) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"statuses": sorted(s for s, _ in out),
            "errors": sorted({e for _, e in out if e})}


def s_keep_alive_1s(cl: httpx.Client, m: Models) -> dict[str, Any]:
    """keep_alive "1s": listed right after, gone after about a second idle."""
    _gen(cl, m, m.a, keep_alive="1s")
    t0 = time.monotonic()
    listed = [e.split("@")[0] for e in ps(cl, m)]
    gone = _wait(lambda: not ps(cl, m), 10)
    took = time.monotonic() - t0
    return {"ps right after": listed, "gone": gone, "gone in 0.5-3 s": gone and 0.5 <= took <= 3}


SCENARIOS: tuple[Callable[[httpx.Client, Models], dict[str, Any]], ...] = (
    s_max_loaded_other_weights, s_same_weights_other_name, s_num_ctx_change,
    s_parallel_three, s_keep_alive_0_while_streaming, s_keep_alive_1s,
    s_other_model_while_streaming, s_num_ctx_while_streaming, s_keep_alive_forever_evicted,
    s_other_name_own_num_ctx, s_queue_full, s_same_weights_while_streaming,
    s_keep_alive_last_wins, s_two_models_at_once_cold, s_swap_abandoned_while_streaming,
)


def diff(real: dict[str, Any], sim: dict[str, Any]) -> list[str]:
    return [f"{k}: real {real.get(k)!r}, sim {sim.get(k)!r}"
            for k in sorted(set(real) | set(sim)) if real.get(k) != sim.get(k)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.real_ollama_sched", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--real", required=True)
    p.add_argument("--sim", required=True)
    p.add_argument("--real-models", default="tiny,tinyb,tinyc,tinyd", help="A,B,C,D")
    p.add_argument("--sim-models", default="phi3:mini,phib,llama3.2:3b,phid", help="A,B,C,D")
    p.add_argument("--only", default="")
    args = p.parse_args(argv)
    sides = [Models(url.rstrip("/"), *names.split(",")) for url, names in
             ((args.real, args.real_models), (args.sim, args.sim_models))]
    differing = 0
    with httpx.Client(timeout=120) as cl:
        chosen = [s for s in SCENARIOS if args.only in s.__name__]
        for scenario in chosen:
            outs = []
            for side in sides:
                unload_all(cl, side)
                outs.append(scenario(cl, side))
            lines = diff(*outs)
            differing += bool(lines)
            print(f"{'DIFF' if lines else 'same'}  {scenario.__name__}")
            for line in lines:
                print(f"      {line}")
            print(f"      real {outs[0]}\n      sim  {outs[1]}")
        print(f"{differing} of {len(chosen)} scenarios differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
