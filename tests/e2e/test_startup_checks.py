"""Bad configuration through the real `kubemoot-proxy serve`: exit 2 and one line naming the
setting, before anything listens (CONTRACT.md, "Program")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATIC = {"KUBEMOOT_MODEL_ENDPOINT": "http://127.0.0.1:9", "KUBEMOOT_LISTEN": "127.0.0.1:0"}


def serve(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "serve", *args], cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", **STATIC, **env}, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("env", "said"), [
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
])
def test_a_bad_model_setting_ends_serve_with_one_line(env: dict[str, str], said: str
                                                      ) -> None:
    done = serve(**env)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith(f"kubemoot-proxy: bad configuration: {said}")
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_config_file_that_is_no_yaml_ends_serve_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text("model_model: qwen3:8b\nproviders: [\n")
    done = serve("--config", str(config))
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


@pytest.mark.parametrize(("first", "second"), [
    ("http://localhost:11501", "http://localhost:11501/"),
    ("http://localhost:11501", "http://LOCALHOST:11501"),
    ("http://gpu-0.ollama", "http://gpu-0.ollama:80"),
])
def test_one_ollama_under_two_provider_names_ends_serve_with_one_line(first: str, second: str
                                                                      ) -> None:
    # Its GPU's memory would count twice: two loads "beside" each other on one card.
    providers = (f'[{{"name": "gpu-a", "endpoint": "{first}"}}, '
                 f'{{"name": "gpu-b", "endpoint": "{second}"}}]')
    done = serve(KUBEMOOT_PROVIDERS=providers)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr == (
        "kubemoot-proxy: bad configuration: KUBEMOOT_PROVIDERS: providers 'gpu-a' and 'gpu-b' "
        f"have one endpoint ({second.rstrip('/')}): one Ollama is one provider\n")
