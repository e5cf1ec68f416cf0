"""Bad configuration through the real `kubemoot-proxy serve`: exit 2 and one line naming the
setting, before anything listens (CONTRACT.md, "Program"). The cases of a test run at once
(each process spends most of its time importing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.commands import run_all

ROOT = Path(__file__).resolve().parents[2]
STATIC = {"KUBEMOOT_MODEL_ENDPOINT": "http://127.0.0.1:9", "KUBEMOOT_LISTEN": "127.0.0.1:0"}


def serve_all(cases: list[tuple[list[str], dict[str, str]]]
              ) -> list[subprocess.CompletedProcess[str]]:
    """`serve` with each case's arguments and settings, all at once."""
    return run_all([(["serve", *args], {"PATH": "/usr/bin:/bin", **STATIC, **env})
                    for args, env in cases], timeout_s=60)


BAD_MODEL_SETTINGS = [
    ({"KUBEMOOT_MODEL_CANDIDATES_MULLING": '[{"model": "qwen3:8b"}]'},
     "KUBEMOOT_MODEL_CANDIDATES_MULLING[0]: the entry for 'qwen3:8b' has no score"),
    ({"KUBEMOOT_MODEL_MODEL": "bad model!!"},
     "KUBEMOOT_MODEL_MODEL: 'bad model!!' is not a model name as Ollama reads one"),
    ({"KUBEMOOT_MODEL_CANDIDATES_TRIAGE": '[{"model": "qwen3:8b!", "score": 5}]'},
     "KUBEMOOT_MODEL_CANDIDATES_TRIAGE[0].model: 'qwen3:8b!' is not a model name"),
    ({"KUBEMOOT_MODEL_CANDIDATES_MULLING": '[{"model": "qwen3:8b", "score": 70}, '
                                           '{"model": "Qwen3:8B", "score": 10}]'},
     "KUBEMOOT_MODEL_CANDIDATES_MULLING: 'Qwen3:8B' is listed twice (also as 'qwen3:8b'); "
     "one entry per model"),
]


def test_a_bad_model_setting_ends_serve_with_one_line() -> None:
    runs = serve_all([([], env) for env, _ in BAD_MODEL_SETTINGS])
    for (env, said), done in zip(BAD_MODEL_SETTINGS, runs, strict=True):
        assert (done.returncode, done.stdout) == (2, ""), (env, done.stderr)
        assert done.stderr.startswith(f"kubemoot-proxy: bad configuration: {said}"), env
        assert done.stderr.count("\n") == 1, (env, done.stderr)


def test_a_config_file_that_is_no_yaml_ends_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text("model_model: qwen3:8b\nproviders: [\n")
    [done] = serve_all([(["--config", str(config)], {})])
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"kubemoot-proxy: bad configuration: --config {config}: not valid YAML: "
               "expected the node content, but found '<stream end>' at line 3, column 1 "
               "(while parsing a flow node)\n")


def test_well_formed_model_settings_start_serve() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve"], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={
            "PATH": "/usr/bin:/bin", **STATIC,
            "KUBEMOOT_MODEL_MODEL": "hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M",
            "KUBEMOOT_MODEL_CANDIDATES_MULLING": '[{"model": "qwen3:32b", "score": 70}, '
                                                '{"model": "qwen3:8b", "score": 0}]'})
    try:
        assert proc.stdout is not None
        assert "listening on" in proc.stdout.readline()
    finally:
        proc.kill()
        proc.communicate()


ONE_OLLAMA_TWO_WAYS = [
    ("http://localhost:11501", "http://localhost:11501/"),
    ("http://localhost:11501", "http://LOCALHOST:11501"),
    ("http://gpu-0.ollama", "http://gpu-0.ollama:80"),
]


def test_one_ollama_under_two_provider_names_ends_serve_with_one_line() -> None:
    # Its GPU's memory would count twice: two loads "beside" each other on one card.
    runs = serve_all([([], {"KUBEMOOT_PROVIDERS": f'[{{"name": "gpu-a", "endpoint": "{first}"}}, '
                                                  f'{{"name": "gpu-b", "endpoint": "{second}"}}]'})
                      for first, second in ONE_OLLAMA_TWO_WAYS])
    for (first, second), done in zip(ONE_OLLAMA_TWO_WAYS, runs, strict=True):
        assert (done.returncode, done.stdout) == (2, ""), (first, second, done.stderr)
        assert done.stderr == (
            "kubemoot-proxy: bad configuration: KUBEMOOT_PROVIDERS: providers 'gpu-a' and "
            f"'gpu-b' have one endpoint ({second.rstrip('/')}): one Ollama is one provider\n")
