"""Settings: every documented name from env and from --config, and one-line errors."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy import __version__
from proxy.settings import (
    ConfigError,
    check_model_name,
    load_settings,
    nats_servers,
    unknown_settings,
)

PROVIDERS = [{"name": "a", "endpoint": "http://127.0.0.1:1", "totalVramMiB": 24564,
              "contextLength": 8192, "maxParallel": 2, "weight": 25}]


def test_defaults_are_loopback_and_the_contract_values() -> None:
    s = load_settings()
    assert s.listen == "127.0.0.1:11434"
    assert s.model_candidate_tolerance == 10
    assert s.wait_limit_seconds == 90
    assert s.role == "specialist"
    assert s.namespace == "default"
    assert s.nats_url is None


def test_env_names_from_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {
        "KUBEMOOT_MODEL_MODEL": "qwen3:32b",
        "KUBEMOOT_MODEL_ENDPOINT": "http://static:11434/",
        "KUBEMOOT_MODEL_CANDIDATES_MULLING": json.dumps(
            [{"model": "qwen3:32b", "score": 70}, {"model": "qwen3:8b", "score": 30,
                                                     "vramMib": 6000}]),
        "KUBEMOOT_MODEL_CANDIDATES_TRIAGE": '[{"model": "qwen3:8b", "score": 100}]',
        "KUBEMOOT_TRIAGE_MODEL_MODEL_ID": "qwen3:8b",
        "KUBEMOOT_MODEL_CANDIDATE_TOLERANCE": "-5",
        "KUBEMOOT_DISCUSS_GPU_WAIT_LIMIT_SECONDS": "12",
        "KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS": "30",
        "KUBEMOOT_NAMESPACE": "crew-a",
        "KUBEMOOT_AGENT_NAME": "kubectl-agent",
        "KUBEMOOT_CREW": "homelab",
        "KUBEMOOT_PROVIDERS": json.dumps(PROVIDERS),
        "KUBEMOOT_NATS_URL": "nats://127.0.0.1:4222",
        "KUBEMOOT_ROLE": "coordinator",
        "KUBEMOOT_LISTEN": "[::1]:9000",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    s = load_settings()
    assert s.model_model == "qwen3:32b"
    assert s.model_endpoint == "http://static:11434"
    assert [c.model for c in s.model_candidates_mulling] == ["qwen3:32b", "qwen3:8b"]
    assert s.model_candidates_mulling[1].vram_mib == 6000
    assert s.triage_model == "qwen3:8b"
    assert s.triage_endpoint == "http://static:11434"  # defaults to the static endpoint
    assert s.tolerance == 0  # negative acts as 0
    assert s.wait_limit_seconds == 12
    assert (s.namespace, s.agent_name, s.crew) == ("crew-a", "kubectl-agent", "homelab")
    p = s.providers[0]
    assert (p.name, p.total_vram_mib, p.context_length, p.max_parallel, p.weight) == (
        "a", 24564, 8192, 2, 25)
    assert s.role == "coordinator"
    assert s.listen_host_port == ("::1", 9000)


def test_wait_limit_zero_means_synthesis_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEMOOT_DISCUSS_SYNTHESIS_TIMEOUT_SECONDS", "45")
    assert load_settings().wait_limit_seconds == 45


def test_providers_from_a_yaml_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("- name: a\n  endpoint: http://a:11434\n  totalVramMiB: 32768\n")
    monkeypatch.setenv("KUBEMOOT_PROVIDERS", str(path))
    assert load_settings().providers[0].total_vram_mib == 32768


def test_config_file_sets_keys_and_env_wins(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text("model_model: qwen3:14b\nKUBEMOOT_ROLE: coordinator\n"
                    "providers:\n  - {name: a, endpoint: 'http://a:1'}\n")
    s = load_settings(path)
    assert (s.model_model, s.role, s.providers[0].name) == ("qwen3:14b", "coordinator", "a")
    monkeypatch.setenv("KUBEMOOT_MODEL_MODEL", "qwen3:8b")
    assert load_settings(path).model_model == "qwen3:8b"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"KUBEMOOT_MODEL_CANDIDATES_MULLING": "[{not json"}, "KUBEMOOT_MODEL_CANDIDATES_MULLING"),
        ({"KUBEMOOT_PROVIDERS": '[{"name": "a"}]'}, "KUBEMOOT_PROVIDERS[0].endpoint"),
        ({"KUBEMOOT_PROVIDERS": '[{"name": "a", "endpoint": "a:1"}]'},
         "KUBEMOOT_PROVIDERS[0].endpoint"),
        ({"KUBEMOOT_PROVIDERS": "/no/such/file.yaml"}, "KUBEMOOT_PROVIDERS"),
        ({"KUBEMOOT_LISTEN": "localhost"}, "KUBEMOOT_LISTEN"),
        ({"KUBEMOOT_LISTEN": "127.0.0.1:99999"}, "KUBEMOOT_LISTEN"),
        ({"KUBEMOOT_LISTEN": "http://127.0.0.1:11434"}, "KUBEMOOT_LISTEN"),
        ({"KUBEMOOT_OPS_LISTEN": "https://0.0.0.0:9090"}, "KUBEMOOT_OPS_LISTEN"),
        ({"KUBEMOOT_ROLE": "boss"}, "KUBEMOOT_ROLE"),
        ({"KUBEMOOT_MODEL_CANDIDATE_TOLERANCE": "lots"}, "KUBEMOOT_MODEL_CANDIDATE_TOLERANCE"),
        ({"KUBEMOOT_MAX_REQUEST_BYTES": "abc"}, "KUBEMOOT_MAX_REQUEST_BYTES"),
        ({"KUBEMOOT_ORIGINS": "not an origin"}, "KUBEMOOT_ORIGINS"),
        ({"KUBEMOOT_ORIGINS": "https://ok.example.com,app.example.com"}, "KUBEMOOT_ORIGINS"),
        ({"KUBEMOOT_ORIGINS": "https://app.example.com/"}, "KUBEMOOT_ORIGINS"),
        ({"KUBEMOOT_MODEL_CANDIDATES_MULLING": '[{"model": "qwen3:8b", "score": 70}, '
                                               '{"model": "x"}]'},
         "KUBEMOOT_MODEL_CANDIDATES_MULLING[1]: the entry for 'x' has no score"),
        ({"KUBEMOOT_MODEL_CANDIDATES_TRIAGE": '[{"model": "bad model!!", "score": 1}]'},
         "KUBEMOOT_MODEL_CANDIDATES_TRIAGE[0].model: 'bad model!!' is not a model name"),
        ({"KUBEMOOT_MODEL_MODEL": "bad model!!"},
         "KUBEMOOT_MODEL_MODEL: 'bad model!!' is not a model name as Ollama reads one"),
        ({"KUBEMOOT_TRIAGE_MODEL_MODEL_ID": "qwen3:"}, "KUBEMOOT_TRIAGE_MODEL_MODEL_ID"),
        # a static endpoint with no host was taken and failed at the first call
        ({"KUBEMOOT_MODEL_ENDPOINT": "http://"}, "KUBEMOOT_MODEL_ENDPOINT: is no URL"),
        ({"KUBEMOOT_TRIAGE_MODEL_ENDPOINT": "http://ollama:99999"},
         "KUBEMOOT_TRIAGE_MODEL_ENDPOINT: is no URL"),
        # a file that is there but cannot be read was an OSError's traceback
        ({"KUBEMOOT_PROVIDERS": "/proc/self/mem"},
         "KUBEMOOT_PROVIDERS: file /proc/self/mem cannot be read"),
        ({"KUBEMOOT_PROVIDERS": '[{"name": "a", "endpoint": "http://a:11434", '
                                '"dcgmUrl": "dcgm-exporter:9400/metrics"}]'},
         "KUBEMOOT_PROVIDERS[0].dcgmUrl: must start with http:// or https://"),
        ({"KUBEMOOT_PROVIDERS": '[{"name": "a", "endpoint": "http://a:11434", "gpus": 2, '
                                '"totalVramMiB": 4096, "gpuOverheadBytes": 2147483648}]'},
         "KUBEMOOT_PROVIDERS[0]: gpuOverheadBytes (2147483648) leaves nothing of totalVramMiB"),
        # a password without its user was left out of the connect without a word
        ({"KUBEMOOT_NATS_PASSWORD": "s3cret"},
         "KUBEMOOT_NATS_PASSWORD: set without KUBEMOOT_NATS_USER"),
    ],
)
def test_bad_configuration_names_the_setting(env: dict[str, str], named: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith(named), message
    assert "\n" not in message


@pytest.mark.parametrize(("name", "bad_part"), [
    ("qwen3:8b", None), ("qwen3", None), ("glm-4.6:cloud", None), ("_m", None),
    ("qwen2.5-coder:1.5b-instruct-q4_K_M", None), ("library/qwen3", None),
    ("hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M", None), ("localhost:5000/team/m:v1", None),
    ("https://registry.example.com/team/m:v1", None),
    # types/model/name.go:344-376: what isValidPart refuses, in the part it refuses it
    ("bad model!!", "model"), ("-m", "model"), (":8b", "model"), ("m@sha256:abc", "model"),
    ("m" * 81, "model"), ("qwen3:", "tag"), ("qwen3:8b!", "tag"), ("/qwen3", "namespace"),
    ("my.team/m", "namespace"), ("a/b/c/d", "host"), ("ho st/ns/m", "host"),
])
def test_model_names_as_ollama_reads_them(name: str, bad_part: str | None) -> None:
    if bad_part is None:
        assert check_model_name(name) == name
    else:
        with pytest.raises(ValueError, match=f"its {bad_part} is not valid"):
            check_model_name(name)


def test_a_candidate_list_as_the_operator_publishes_it(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    monkeypatch.setenv("KUBEMOOT_MODEL_CANDIDATES_MULLING", json.dumps(
        [{"model": "qwen3:32b", "score": 70}, {"model": "qwen3:8b", "score": 0,
                                               "vramMib": 6000, "extra": 1}]))
    assert [(c.model, c.score) for c in load_settings().model_candidates_mulling] == [
        ("qwen3:32b", 70), ("qwen3:8b", 0)]


@pytest.mark.parametrize(("text", "said"), [
    ("providers: [\n", "not valid YAML: expected the node content, but found '<stream end>' "
                       "at line 2, column 1 (while parsing a flow node)"),
    ("a: b\n  c: d\n", "not valid YAML: mapping values are not allowed here at line 2, "
                      "column 4"),
])
def test_a_config_file_that_is_no_yaml_is_said_in_one_line(
        text: str, said: str, tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(info.value) == f"--config {path}: {said}"


def test_a_providers_file_that_is_no_yaml_is_said_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text("- name: a\n  endpoint: [\n")
    monkeypatch.setenv("KUBEMOOT_PROVIDERS", str(path))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value).startswith(f"KUBEMOOT_PROVIDERS: file {path} is not valid YAML/JSON:")
    assert "\n" not in str(info.value) and "line 3, column 1" in str(info.value)


@pytest.mark.parametrize("url", [
    "nats://nats:4222", "tls://nats-0.nats:4222,tls://nats-1.nats:4222", "nats://[::1]:4222",
    "nats-0:4222", "nats", "nats://agent:s3cret@nats:4222", "wss://nats.example.com",
    "ws://127.0.0.1:8080, ws://127.0.0.2:8080"])
def test_nats_urls_as_nats_py_takes_them(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEMOOT_NATS_URL", url)
    assert load_settings().nats_url == url
    assert len(nats_servers(url)) == url.count(",") + 1


@pytest.mark.parametrize(("url", "said"), [
    ("nats://nats:42x2", "'nats://nats:42x2': the port must be a number from 1 to 65535"),
    ("nats://127.0.0.1:99999", "'nats://127.0.0.1:99999': the port must be a number"),
    ("nats://nats:0", "'nats://nats:0': the port must be a number"),
    ("nast://127.0.0.1:4222", "'nast://127.0.0.1:4222': the scheme must be nats://, tls://"),
    ("NATS://nats:4222", "'NATS://nats:4222': the scheme must be"),  # nats-py: a host "nats"
    ("http://nats:4222", "'http://nats:4222': the scheme must be"),
    ("nats://:4222", "'nats://:4222': no valid host name in it"),
    ("nats://my nats:4222", "'nats://my nats:4222': no valid host name in it"),
    ("nats://a:4222,", "an empty entry in the comma-separated list"),
    ("nats://a:4222,ws://b:80", "websocket (ws://, wss://) and other servers mixed"),
    # the credentials stay out of the line, whatever else is wrong
    ("tls://agent:s3cret@nats:42x2", "'tls://***@nats:42x2': the port must be a number"),
    ("agent:s3c@ret@nats:42x2", "'***@nats:42x2': the port must be a number"),
    ("agent:s3cret@nast://nats", "'***@nast://nats': the scheme must be"),
])
def test_a_bad_nats_url_is_named_with_the_entry_and_no_password(
        url: str, said: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEMOOT_NATS_URL", url)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value).startswith(f"KUBEMOOT_NATS_URL: {said}"), str(info.value)
    assert "s3c" not in str(info.value) and "agent" not in str(info.value)


@pytest.mark.parametrize("origins", ["*", "https://*.example.com", "http://10.0.0.7:8080",
                                     "app://obsidian.md, https://chat.example.com"])
def test_origins_as_ollama_takes_them(origins: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEMOOT_ORIGINS", origins)
    assert load_settings().origins == [o.strip() for o in origins.split(",")]


def test_a_bad_origin_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBEMOOT_ORIGINS", "https://ok.example.com,not an origin")
    with pytest.raises(ConfigError, match="KUBEMOOT_ORIGINS: 'not an origin' is not an origin"):
        load_settings()


def test_unknown_names_with_the_closest_known_one(tmp_path: Path) -> None:
    environ = {
        "KUBEMOOT_PROVIDRES": "x", "KUBEMOOT_LOG_LEVEL": "info", "kubemoot_orgins": "*",
        "KUBEMOOT_SOMETHING_ELSE": "1", "PATH": "/usr/bin",
        # Service links of Services named kubemoot and kubemoot-proxy: not settings, no noise
        "KUBEMOOT_SERVICE_HOST": "10.0.0.1", "KUBEMOOT_SERVICE_PORT": "80",
        "KUBEMOOT_SERVICE_PORT_HTTP": "80", "KUBEMOOT_PORT": "tcp://10.0.0.1:80",
        "KUBEMOOT_PORT_80_TCP": "tcp://10.0.0.1:80", "KUBEMOOT_PORT_80_TCP_PROTO": "tcp",
        "KUBEMOOT_PORT_80_TCP_PORT": "80", "KUBEMOOT_PORT_80_TCP_ADDR": "10.0.0.1",
        "KUBEMOOT_PROXY_SERVICE_HOST": "10.0.0.2",
        "KUBEMOOT_PROXY_PORT_9464_UDP_ADDR": "10.0.0.2",
        # a port set by hand is no service link: its value is not one
        "KUBEMOOT_OPS_PORT": "9464"}
    config = tmp_path / "sidecar.yaml"
    config.write_text("model_modle: qwen3:8b\nKUBEMOOT_ROEL: coordinator\nrole: coordinator\n"
                      "zzz: 1\n")
    found = {u.name: (u.source, u.did_you_mean)
             for u in unknown_settings(config, environ=environ)}
    assert found == {
        "KUBEMOOT_PROVIDRES": ("environment", "KUBEMOOT_PROVIDERS"),
        "kubemoot_orgins": ("environment", "KUBEMOOT_ORIGINS"),
        "KUBEMOOT_SOMETHING_ELSE": ("environment", None),
        "KUBEMOOT_OPS_PORT": ("environment", found["KUBEMOOT_OPS_PORT"][1]),
        "model_modle": (f"--config {config}", "model_model"),
        "KUBEMOOT_ROEL": (f"--config {config}", "KUBEMOOT_ROLE"),
        "zzz": (f"--config {config}", None)}


def test_serve_warns_of_a_misspelt_name_and_starts(tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text("model_modle: qwen3:8b\n")
    serve = _serve("--listen", "127.0.0.1:0", "--config", str(config),
                   KUBEMOOT_MODEL_ENDPOINT="http://127.0.0.1:9", KUBEMOOT_ORIGNS="*",
                   KUBEMOOT_PORT="tcp://10.0.0.1:80")
    try:
        assert serve.stdout is not None and serve.stderr is not None
        assert "listening on" in serve.stdout.readline()
        warnings = [json.loads(serve.stderr.readline()) for _ in range(2)]
    finally:
        serve.kill()
        serve.communicate()
    assert [(w["level"], w["setting"], w["did_you_mean"]) for w in warnings] == [
        ("warning", "KUBEMOOT_ORIGNS", "KUBEMOOT_ORIGINS"),
        ("warning", "model_modle", "model_model")]


def test_a_misspelt_name_is_told_after_the_error_it_caused() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "serve"], timeout=60, text=True,
                          env={"PATH": "/usr/bin:/bin", "KUBEMOOT_PROVIDRES": "[]"},
                          capture_output=True)
    assert done.returncode == 2
    first, hint = done.stderr.strip().splitlines()
    assert first.startswith("kubemoot-proxy: bad configuration: KUBEMOOT_PROVIDERS:")
    assert "KUBEMOOT_PROVIDRES" in hint and "did you mean KUBEMOOT_PROVIDERS?" in hint


def test_a_key_given_twice_in_a_settings_file_is_one_line(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # It was the last one silently winning: a card's memory given twice, one of them wrong.
    providers = tmp_path / "providers.yaml"
    providers.write_text("- name: a\n  endpoint: http://a:11434\n  totalVramMiB: 24564\n"
                         "  totalVramMiB: 245640\n")
    monkeypatch.setenv("KUBEMOOT_PROVIDERS", str(providers))
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == (f"KUBEMOOT_PROVIDERS: file {providers} is not valid YAML/JSON: "
                               "key 'totalVramMiB' is given twice in one mapping at line 4, "
                               "column 3")
    monkeypatch.setenv("KUBEMOOT_PROVIDERS", '[{"name": "a", "endpoint": "http://a:11434", '
                       '"name": "b"}]')
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == ("KUBEMOOT_PROVIDERS: is not valid JSON (key 'name' is given "
                               "twice in one object)")
    monkeypatch.delenv("KUBEMOOT_PROVIDERS")
    config = tmp_path / "settings.yaml"
    config.write_text("max_plans: 2\nmax_plans: 20\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert str(info.value) == (f"--config {config}: not valid YAML: key 'max_plans' is given "
                               "twice in one mapping at line 2, column 1")


@pytest.mark.parametrize(("given", "said"), [
    ("", "--config: an empty path"),  # it was read as no --config at all
    ("{tmp}", "--config {tmp}: a directory, not a file"),  # it was "no such file"
])
def test_a_config_path_that_is_no_file_is_said_so(given: str, said: str, tmp_path: Path
                                                  ) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(given.format(tmp=tmp_path))
    assert str(info.value) == said.format(tmp=tmp_path)


def test_an_empty_address_or_identity_is_its_default(monkeypatch: pytest.MonkeyPatch
                                                     ) -> None:
    # A manifest's `value: ""` (a chart value left unset) was exit 2 for the namespace and
    # agent name, a TypeError for the address: it is unset, as for the other settings.
    for name in ("LISTEN", "NAMESPACE", "AGENT_NAME"):
        monkeypatch.setenv(f"KUBEMOOT_{name}", " ")
    settings = load_settings()
    assert (settings.listen, settings.namespace, settings.agent_name) == (
        "127.0.0.1:11434", "default", socket.gethostname())


def test_an_empty_nats_file_setting_is_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # (it was Path(""), the working directory: "KUBEMOOT_NATS_CREDS=.: a directory")
    for name in ("CREDS", "TLS_CA", "TLS_CERT", "TLS_KEY"):
        monkeypatch.setenv(f"KUBEMOOT_NATS_{name}", "")
    settings = load_settings()
    assert (settings.nats_creds, settings.nats_tls_ca, settings.nats_tls_cert,
            settings.nats_tls_key) == (None, None, None, None)


def test_a_config_file_that_is_no_text_is_one_line(tmp_path: Path) -> None:
    config = tmp_path / "settings.yaml"
    config.write_bytes(b"\xff\xfe\x00listen: x")
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(config)],
                          env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"kubemoot-proxy: bad configuration: --config {config}: cannot read: not UTF-8 text "
        "(byte 0)"]


def test_cli_exits_nonzero_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"KUBEMOOT_PROVIDERS": '[{"name": "a"}]', "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "proxy", "serve"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "KUBEMOOT_PROVIDERS[0].endpoint" in lines[0], done.stderr


def test_cli_without_anything_to_call_says_how_to_fix() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "serve"], env={"PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "KUBEMOOT_PROVIDERS" in done.stderr and "--demo" in done.stderr


def test_secrets_stay_out_of_logs_and_reprs(monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.adapters.nats_kv import redact

    monkeypatch.setenv("KUBEMOOT_NATS_USER", "agent")
    monkeypatch.setenv("KUBEMOOT_NATS_PASSWORD", "hunter2")
    monkeypatch.setenv("KUBEMOOT_NATS_TOKEN", "t0ken")
    text = repr(load_settings())
    assert "hunter2" not in text and "t0ken" not in text
    assert redact("nats://agent:hunter2@nats-1:4222,tls://t0ken@nats-2:4222") == (
        "nats://***@nats-1:4222,tls://***@nats-2:4222")


def _serve(*args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "proxy", "serve", *args],
                            env={"PATH": "/usr/bin:/bin", **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_an_address_in_use_exits_2_with_one_line_before_any_banner() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        serve = _serve("--listen", f"127.0.0.1:{port}",
                       KUBEMOOT_MODEL_ENDPOINT="http://127.0.0.1:9")
        out, err = serve.communicate(timeout=60)
    assert serve.returncode == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"--listen: cannot listen on 127.0.0.1:{port}" in lines[0], err


def test_a_bad_listen_flag_is_named_as_the_flag_not_the_setting() -> None:
    serve = _serve("--listen", "foo", KUBEMOOT_MODEL_ENDPOINT="http://127.0.0.1:9")
    out, err = serve.communicate(timeout=60)
    assert serve.returncode == 2 and out == ""
    assert err.strip() == ("kubemoot-proxy: bad configuration: --listen: expected host:port, "
                           "got 'foo'"), err


def test_serve_says_in_one_line_where_it_listens_and_what_state_it_uses() -> None:
    with socket.create_server(("127.0.0.1", 0)) as free:
        port = free.getsockname()[1]
    serve = _serve("--listen", f"127.0.0.1:{port}", KUBEMOOT_MODEL_ENDPOINT="http://127.0.0.1:9",
                   KUBEMOOT_NATS_URL="nats://agent:s3cret@127.0.0.1:9,agent:s3cret@[::1]:9")
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
    finally:
        serve.kill()
        serve.communicate()
    assert line.startswith(f"kubemoot-proxy {__version__} listening on http://127.0.0.1:{port}")
    assert "the static endpoint" in line and "NATS at nats://127.0.0.1:9, nats://[::1]:9" in line
    assert "s3cret" not in line and "agent" not in line


def test_ollama_gpu_overhead_comes_off_each_gpu_rounded_up_to_a_mib(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """OLLAMA_GPU_OVERHEAD's bytes, as the operator copies them from Ollama's environment:
    the card counts its total less that on each GPU (proxy/settings.py counted_total_mib)."""
    monkeypatch.setenv("KUBEMOOT_PROVIDERS", json.dumps([
        {**PROVIDERS[0], "gpus": 2, "totalVramMiB": 49128, "gpuOverheadBytes": 1073741825},
        {**PROVIDERS[0], "name": "b", "endpoint": "http://127.0.0.1:2"}]))
    spread, plain = load_settings().providers
    assert spread.gpu_overhead_mib == 1025
    assert spread.counted_total_mib(49128) == 49128 - 2 * 1025
    assert spread.counted_total_mib(None) is None
    assert plain.counted_total_mib(24564) == 24564
