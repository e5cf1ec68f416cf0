"""Named fleets and workloads for the simulation. Agents run closed loops: a burst of calls,
each issued a think time after the previous one ended, bursts tied to discussions."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.fleet_model import GpuSpec, ModelSpec
from loadtest.tool_loops import LoopSpec

# Loads read the catalogue's files: 20200, 9300 and 5200 MiB, 20.75, 10.25 and 6.25 s on a
# card's defaults (1 s start-up, 1024 MiB/s, the 250 ms poll: fleet_model.load_seconds)
QWEN32 = ModelSpec.catalogued("qwen3:32b", 27000, 25.0)
QWEN14 = ModelSpec.catalogued("qwen3:14b", 12224, 45.0)
QWEN8 = ModelSpec.catalogued("qwen3:8b", 6000, 80.0)
MODELS = {m.name: m for m in (QWEN32, QWEN14, QWEN8)}


@dataclass(frozen=True)
class AgentSpec:
    name: str
    candidates: tuple[tuple[str, float], ...]
    calls_per_burst: int
    think_s: float
    offset_s: tuple[float, float]  # when in a discussion its burst starts
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    loops: LoopSpec | None = None  # its calls are tool loops' (prompt_tokens unused)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    gpus: tuple[GpuSpec, ...]
    agents: tuple[AgentSpec, ...]
    discussion_every_s: float
    duration_s: float
    tolerance: float = 10.0
    wait_limit_s: float = 90.0


SYNTH = ("qwen3:32b", 70.0), ("qwen3:14b", 60.0), ("qwen3:8b", 30.0)
TOOLER = ("qwen3:8b", 70.0), ("qwen3:14b", 50.0)
ANALYST = ("qwen3:14b", 60.0), ("qwen3:8b", 55.0)

HETERO = (GpuSpec("gpu-32g", 32768), GpuSpec("gpu-24g", 24564), GpuSpec("gpu-16g", 16376))


def _toolers(n: int, calls: int = 4) -> tuple[AgentSpec, ...]:
    return tuple(AgentSpec(f"tooler-{i}", TOOLER, calls, 1.0, (0.0, 3.0), (500, 2500),
                           (50, 150)) for i in range(n))


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario(
        "bursty-crew",
        "a synthesizer (32B-class, reasoning), an analyst (14B) and four toolers (8B) in "
        "bursts every ~40 s on 32/24/16 GiB cards",
        HETERO,
        (AgentSpec("synthesizer", SYNTH, 1, 0.0, (20.0, 26.0), (3000, 6000), (300, 500)),
         AgentSpec("analyst", ANALYST, 2, 2.0, (4.0, 8.0), (1000, 3000), (150, 300)),
         *_toolers(4)),
        discussion_every_s=40.0, duration_s=1800.0),
    Scenario(
        "crews-single-slot",
        "two crews in bursts on single-slot 24 GiB cards: six toolers (8B, four calls a "
        "burst) and three analysts (14B, three calls a burst), every ~30 s",
        (GpuSpec("gpu-24a", 24564), GpuSpec("gpu-24b", 24564), GpuSpec("gpu-24c", 24564)),
        (*_toolers(6),
         *(AgentSpec(f"analyst-{i}", ANALYST, 3, 1.0, (0.0, 4.0), (1000, 3000), (150, 300))
           for i in range(3))),
        discussion_every_s=30.0, duration_s=1800.0),
    Scenario(
        "mixed-lengths",
        "eight agents on one 8B model, half with short answers (20-60 tokens) and half with "
        "long ones (200-500), in bursts every ~30 s on two single-slot 16 GiB cards",
        (GpuSpec("gpu-16a", 16376), GpuSpec("gpu-16b", 16376)),
        tuple(AgentSpec(f"{'short' if i % 2 else 'long'}-{i}", TOOLER, 2, 1.0, (0.0, 5.0),
                        (300, 1500), (20, 60) if i % 2 else (200, 500)) for i in range(8)),
        discussion_every_s=30.0, duration_s=1800.0),
    Scenario(
        "burst-while-loading",
        "a tooler keeps an 8B copy busy; every ~60 s eight analysts that accept only the 14B "
        "ask for it at once, and it is not loaded (keep-alive 20 s): the burst arrives while "
        "its copies load (10.25 s: 1 s start-up, 9300 MiB of weights at 1024 MiB/s)",
        tuple(GpuSpec(n, 24564, keep_alive_s=20.0) for n in ("gpu-24a", "gpu-24b")),
        (AgentSpec("steady", TOOLER, 20, 0.5, (0.0, 0.0), (500, 1500), (50, 150)),
         *(AgentSpec(f"burst-{i}", (("qwen3:14b", 60.0),), 1, 0.0, (30.0, 31.0), (500, 1500),
                     (100, 250))
           for i in range(8))),
        discussion_every_s=60.0, duration_s=1800.0),
    Scenario(
        "steady-mixed",
        "nine agents spread over the three model sizes, a call every ~15 s each",
        (GpuSpec("gpu-24a", 24564), GpuSpec("gpu-24b", 24564), GpuSpec("gpu-16g", 16376)),
        tuple(AgentSpec(f"{m.split(':')[1]}-{i}", cands, 1, 0.0, (0.0, 15.0), (500, 3000),
                        (100, 300))
              for i in range(3)
              for m, cands in (("qwen3:8b", TOOLER), ("qwen3:14b", ANALYST),
                               ("qwen3:32b", SYNTH))),
        discussion_every_s=15.0, duration_s=1800.0),
    Scenario(
        "long-context",
        "four readers with prompts from 500 to 20000 tokens on cards configured with 4k, 8k "
        "and 32k contexts (the 32k card has two slots)",
        (GpuSpec("gpu-32g", 32768, context=32768, slots=2),
         GpuSpec("gpu-24g", 24564, context=8192), GpuSpec("gpu-16g", 16376, context=4096)),
        tuple(AgentSpec(f"reader-{i}", ANALYST if i % 2 else TOOLER, 2, 1.0, (0.0, 10.0),
                        (500, 20000), (100, 200)) for i in range(4)),
        discussion_every_s=45.0, duration_s=1800.0),
    Scenario(
        "hot-model",
        "twelve agents on one 8B model in synchronized bursts, two slots per card",
        tuple(GpuSpec(g.name, g.total_mib, slots=2) for g in HETERO),
        _toolers(12, calls=3),
        discussion_every_s=30.0, duration_s=1800.0),
)}


def _loopers(n: int) -> tuple[AgentSpec, ...]:
    """Agents each running two tool loops at once, interleaved: bursts of four calls two
    seconds apart; a 1k-token system prompt and tools, a 9-14k task (the files it read),
    1-3k tokens more a call, up to 30k."""
    loops = LoopSpec(loops=2, system_tokens=1000, task_tokens=(9000, 14000))
    return tuple(AgentSpec(f"looper-{i}", TOOLER if i % 3 else ANALYST, 4, 2.0, (0.0, 6.0),
                           (0, 0), (100, 300), loops) for i in range(n))


SCENARIOS["tool-loops"] = Scenario(
    "tool-loops",
    "six agents (four 8B, two 14B), each running two interleaved tool loops with histories "
    "of 10k to 30k tokens, on 32/24/16 GiB cards with four slots and 32k contexts, prompts "
    "read at 2000 tokens/s",
    tuple(GpuSpec(g.name, g.total_mib, context=32768, slots=4) for g in HETERO),
    _loopers(6),
    discussion_every_s=60.0, duration_s=1800.0)
