"""`kubemoot-proxy candidates` on the shipped bundles, and its errors."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", "candidates", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def bundle(name: str) -> dict[str, Any]:
    done = run("-f", str(CONFIG / "crew"), "-f", str(CONFIG / "archetypes"),
               "-f", str(CONFIG / "bundles" / name), "-o", "json", "--strict")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_every_bundle_binds_every_agent_unchanged_crew(name: str) -> None:
    agents = bundle(name)["agents"]
    assert {a["name"] for a in agents} == {"synthesizer", "kubectl-agent", "git-agent",
                                           "metrics-analyst"}
    for agent in agents:
        assert agent["unschedulable"] is None
        for phase in ("mulling", "triage"):
            assert agent["phases"][phase]["model"] and agent["phases"][phase]["endpoint"]
        env = agent["env"]
        assert set(env) == {"KUBEMOOT_MODEL_MODEL", "KUBEMOOT_MODEL_ENDPOINT",
                            "KUBEMOOT_TRIAGE_MODEL_MODEL_ID", "KUBEMOOT_TRIAGE_MODEL_ENDPOINT",
                            "KUBEMOOT_MODEL_CANDIDATES_MULLING",
                            "KUBEMOOT_MODEL_CANDIDATES_TRIAGE"}
        listed = json.loads(env["KUBEMOOT_MODEL_CANDIDATES_MULLING"])
        assert listed[0]["model"] == env["KUBEMOOT_MODEL_MODEL"]  # preferred first


def test_prod_synthesizer_gets_the_large_model_and_toolers_stay_small() -> None:
    agents = {a["name"]: a for a in bundle("prod")["agents"]}
    assert agents["synthesizer"]["phases"]["mulling"]["model"] == "qwen3:32b"
    assert agents["kubectl-agent"]["phases"]["mulling"]["model"] == "qwen3:8b"
    assert agents["git-agent"]["phases"]["mulling"]["model"] == "qwen3:8b"
    # triage lands on the lighter rig (weight 25), away from the mulling provider
    for agent in agents.values():
        assert agent["phases"]["triage"]["provider"] == "ollama-b"


def test_dev_bundle_runs_everyone_on_phi3_mini() -> None:
    for agent in bundle("dev")["agents"]:
        assert agent["env"]["KUBEMOOT_MODEL_MODEL"] == "phi3:mini"


def test_env_output_is_shell_ready() -> None:
    done = run("-f", str(CONFIG / "crew"), "-f", str(CONFIG / "bundles" / "prod"))
    assert done.returncode == 0
    assert "# crew-homelab-pilot/synthesizer" in done.stdout
    assert "KUBEMOOT_MODEL_CANDIDATES_MULLING='[{\"model\":\"qwen3:32b\"" in done.stdout


def documented_commands() -> list[list[str]]:
    """docs/operator-cli.md's `kubemoot-proxy candidates ...` lines, as a reader copies them."""
    page = (ROOT / "docs" / "operator-cli.md").read_text()
    return [shlex.split(line.split("#", 1)[0])[2:] for line in page.splitlines()
            if line.startswith("kubemoot-proxy candidates ")]


@pytest.mark.parametrize("args", documented_commands(), ids=" ".join)
def test_the_documented_commands_run_clean(args: list[str]) -> None:
    done = run(*args)
    assert (done.returncode, done.stderr) == (0, "")


def test_zero_match_reports_last_unschedulable_and_strict_exits_nonzero(tmp_path: Path
                                                                        ) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("""
apiVersion: kubemoot.ai/v1alpha1
kind: CrewSchedulingPolicy
metadata: {name: picky, namespace: crew-homelab-pilot}
spec:
  crewRef: homelab-pilot
  rules:
    - phase: mulling
      require:
        matchLabels: {capability/tool-calling: "true"}
        matchExpressions: [{key: params, operator: In, values: ["70B"]}]
""")
    done = run("-f", str(CONFIG / "crew" / "agents.yaml"), "-f", str(policy),
               "-f", str(CONFIG / "bundles" / "prod"), "-o", "json", "--strict")
    assert done.returncode == 1
    gone = json.loads(done.stdout)["agents"][0]["unschedulable"]
    assert gone["phase"] == "mulling" and gone["crewSchedulingPolicy"] == "picky"
    assert gone["reason"] == ("no Model matches require selectors "
                              "{capability/tool-calling: true, params: 70B}")
    assert gone["observedAt"].endswith("Z")


def test_phase_outside_the_archetype_vocabulary_is_reported(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("""
apiVersion: kubemoot.ai/v1alpha1
kind: CrewSchedulingPolicy
metadata: {name: odd, namespace: crew-homelab-pilot}
spec:
  crewRef: homelab-pilot
  archetypeRef: consent-3
  rules: [{phase: brainstorm, require: {matchLabels: {capability/tool-calling: "true"}}}]
""")
    done = run("-f", str(policy), "-f", str(CONFIG / "archetypes"), "--strict")
    assert done.returncode == 1 and "'brainstorm' is not in archetype consent-3" in done.stderr


def test_a_spread_phase_key_that_no_rule_has_is_reported(tmp_path: Path) -> None:
    # `phaseKeys: [mulling, triag]` spread nothing and said nothing
    (tmp_path / "policy.yaml").write_text(edited(POLICY, "phaseKeys: [mulling, triage]",
                                                 "phaseKeys: [mulling, triag]"))
    done = run("-f", str(tmp_path), "-f", str(CONFIG / "crew" / "agents.yaml"),
               "-f", str(CONFIG / "archetypes"), "-f", str(CONFIG / "bundles" / "prod"),
               "--strict")
    assert done.returncode == 1
    assert done.stderr == ("kubemoot-proxy candidates: CrewSchedulingPolicy/homelab-pilot-"
                           "default: topologySpread.phaseKeys names 'triag', which no rule "
                           "has (mulling, triage)\n")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: Model\nmetadata: {name: x}\nspec: [1\n", "malformed YAML at line"),
        ("kind: Gadget\nmetadata: {name: g}\n", "document 1 (Gadget/g): unknown kind"),
        ("kind: CrewSchedulingPolicy\nmetadata: {name: p}\nspec:\n  rules:\n"
         "    - phase: mulling\n      require:\n        matchExpressions:\n"
         "          - {key: a, operator: Like, values: [b]}\n",
         "(CrewSchedulingPolicy/p): spec.rules[0].require.matchExpressions[0]: "
         "unknown operator 'Like'"),
        ("kind: Model\nmetadata: {name: m}\nspec: {model: m}\n",
         "(Model/m): spec.providerRef is required"),
        # a kind that is no string was a TypeError's traceback (unhashable list)
        ("kind: [Agent]\nmetadata: {name: a}\n", "unknown kind ['Agent']"),
        ("kind: {Agent: 1}\nmetadata: {name: a}\n", "unknown kind {'Agent': 1}"),
        # a key given twice is Kubernetes' error too; it was the last one silently winning
        ("kind: Agent\nkind: Model\nmetadata: {name: a}\nspec: {model: m}\n",
         "malformed YAML at line 2: key 'kind' is given twice in one mapping"),
        # a "billion laughs" in a field printed back took minutes and gigabytes
        ("".join(f"_{n}: &{n} [{', '.join([f'*{p}' if p else 'lol'] * 9)}]\n"
                 for p, n in zip(["", *"abcdefgh"], "abcdefghi", strict=True))
         + "kind: Agent\nmetadata: {name: a}\nspec: {capabilities: {x: *i}}\n",
         "malformed YAML at line 6: aliases expand it past 1000000 nodes (excessive aliasing)"),
    ],
)
def test_bad_documents_get_one_clear_line(tmp_path: Path, text: str, expected: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    done = run("-f", str(bad))
    assert done.returncode == 2
    assert expected in done.stderr and str(bad) in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


PROD = (CONFIG / "bundles" / "prod" / "models.yaml").read_text()
CREW = (CONFIG / "crew" / "agents.yaml").read_text()
POLICY = (CONFIG / "crew" / "policy.yaml").read_text()


def edited(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("bundle", "crew", "policy", "expected"),
    [
        (edited(PROD, "vramMib: 9216", "vramMib: lots"), CREW, POLICY,
         "document 4 (Model/qwen3-14b): spec.vramMib: Input should be a valid integer"),
        (edited(PROD, "weight: 25", "weight: heavy"), CREW, POLICY,
         "(ModelProvider/ollama-b): spec.scheduling.weight: Input should be a valid number"),
        (edited(PROD, "vramMib: 6000", "vramMib: -5"), CREW, POLICY,
         "(Model/qwen3-8b): spec.vramMib: Input should be greater than or equal to 0 (got -5)"),
        (edited(PROD, "ready: true", 'ready: "false"'), CREW, POLICY,
         "(ModelProvider/ollama-a): status.ready: Input should be a valid boolean (got 'false')"),
        (edited(PROD, "vramTotalMiB: 32768", "vramTotalMiB: big"), CREW, POLICY,
         "(ModelProvider/ollama-a): status.capacity.vramTotalMiB: Input should be a valid"),
        (PROD, edited(CREW, "capabilities: [reasoning, tool-calling]",
                      "capabilities: reasoning"), POLICY,
         "(Agent/synthesizer): spec.capabilities must be a list (got 'reasoning')"),
        (PROD, CREW, POLICY[:POLICY.index("  rules:")] + "  rules: 5\n",
         "(CrewSchedulingPolicy/homelab-pilot-default): spec.rules must be a list (got 5)"),
        (edited(PROD, "providerRef: ollama-b", "providerRef: ollama-zzz"), CREW, POLICY,
         "Model/qwen3-8b: spec.providerRef 'ollama-zzz' names no ModelProvider document"),
        # the second rule for a phase silently replaced the first
        (PROD, CREW, edited(POLICY, "    - phase: triage\n", "    - phase: mulling\n"),
         "(CrewSchedulingPolicy/homelab-pilot-default): spec.rules: phase 'mulling' has two "
         "rules (rules[0] and rules[1]): one rule per phase"),
        # a misspelt field was ignored: no declared size (no VRAM check), no selector
        (edited(PROD, "vramMib: 9216", "vramMiB: 9216"), CREW, POLICY,
         "document 4 (Model/qwen3-14b): spec: unknown field 'vramMiB': did you mean 'vramMib'?"),
        (PROD, CREW, edited(POLICY, "        matchLabels:\n", "        matchLabel:\n"),
         "(CrewSchedulingPolicy/homelab-pilot-default): spec.rules[0].require: unknown field "
         "'matchLabel': did you mean 'matchLabels'?"),
        (PROD, edited(CREW, "  namespace: crew-homelab-pilot\n",
                      "  namspace: crew-homelab-pilot\n"), POLICY,
         "(Agent/synthesizer): metadata: unknown field 'namspace': did you mean 'namespace'?"),
        # a quoted number was taken, where the CRD's `type: integer` refuses it at apply
        (edited(PROD, "vramMib: 9216", 'vramMib: "9216"'), CREW, POLICY,
         "document 4 (Model/qwen3-14b): spec.vramMib: Input should be a valid integer "
         "(got '9216')"),
        (edited(PROD, "weight: 25", 'weight: "25"'), CREW, POLICY,
         "(ModelProvider/ollama-b): spec.scheduling.weight: Input should be a valid number "
         "(got '25')"),
        # another API group is another resource to the cluster: it was read as ours
        (edited(PROD, "kubemoot.ai/v1alpha1\nkind: Model\nmetadata:\n  name: qwen3-8b\n",
                "v1\nkind: Model\nmetadata:\n  name: qwen3-8b\n"), CREW, POLICY,
         "(Model/qwen3-8b): apiVersion: must be kubemoot.ai/v1alpha1 (this kind's API group is "
         "kubemoot.ai) (got 'v1')"),
        # printed into env vars that `serve` refuses (exit 2), as the sidecar's own settings
        (edited(PROD, "model: qwen3:14b", 'model: "qwen3 14b"'), CREW, POLICY,
         "(Model/qwen3-14b): spec.model: 'qwen3 14b' is not a model name as Ollama reads one"),
        (edited(PROD, "http://ollama.ollama-b:11434", "http://ollama.ollama-b:114340"), CREW,
         POLICY, "(ModelProvider/ollama-b): spec.endpoint: is no URL (Port out of range"),
        # two candidate entries of one model: the env printed made `serve` exit 2
        (edited(PROD, "model: qwen3:8b\n  providerRef: ollama-b",
                "model: Qwen3:8B\n  providerRef: ollama-b"), CREW, POLICY,
         "document 6 (Model/qwen3-8b-a): spec.model 'qwen3:8b' is 'Qwen3:8B' (Model/qwen3-8b, "),
    ],
    ids=["vram-word", "weight-word", "vram-negative", "ready-quoted", "capacity-word",
         "capabilities-string", "rules-number", "unknown-provider", "phase-twice",
         "vram-misspelt", "matchlabels-misspelt", "namespace-misspelt", "vram-quoted",
         "weight-quoted", "api-group", "model-name", "endpoint-port", "model-spelt-twice"],
)
def test_a_wrong_field_is_one_line_naming_file_document_and_field(
        tmp_path: Path, bundle: str, crew: str, policy: str, expected: str) -> None:
    for name, text in (("models.yaml", bundle), ("agents.yaml", crew), ("policy.yaml", policy)):
        (tmp_path / name).write_text(text)
    done = run("-f", str(tmp_path), "--strict")
    assert done.returncode == 2, done.stdout
    assert expected in done.stderr and str(tmp_path) in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_provider_with_no_measured_capacity_is_accepted(tmp_path: Path) -> None:
    """0, as absent, is "not checked": a CPU provider, or one a reconciler has not measured."""
    zero = edited(PROD, "vramTotalMiB: 32768", "vramTotalMiB: 0")
    assert "maxParallel: 1" in zero
    zero = zero.replace("maxParallel: 1", "maxParallel: 0", 1)
    for name, text in (("models.yaml", zero), ("agents.yaml", CREW), ("policy.yaml", POLICY)):
        (tmp_path / name).write_text(text)
    done = run("-f", str(tmp_path), "-f", str(CONFIG / "archetypes"), "--strict")
    assert done.returncode == 0, done.stderr


MODEL_8B = PROD[PROD.index("apiVersion: kubemoot.ai/v1alpha1\nkind: Model\nmetadata:\n"
                           "  name: qwen3-8b\n"):PROD.index("---", PROD.index("name: qwen3-8b\n"))]
PROVIDER_A = PROD[PROD.index("apiVersion"):PROD.index("---")]
AGENT_GIT = CREW[CREW.index("apiVersion: kubemoot.ai/v1alpha1\nkind: Agent\nmetadata:\n"
                            "  name: git-agent"):].split("---")[0]


@pytest.mark.parametrize(("extra", "expected"), [
    (MODEL_8B, "Model/qwen3-8b is declared twice"),
    (PROVIDER_A, "ModelProvider/ollama-a is declared twice"),
    (AGENT_GIT, "Agent/git-agent is declared twice"),
])
def test_a_name_declared_twice_names_both_files(tmp_path: Path, extra: str, expected: str
                                                ) -> None:
    again = tmp_path / "again.yaml"
    again.write_text(extra)
    done = run("-f", str(CONFIG / "crew"), "-f", str(CONFIG / "bundles" / "prod"),
               "-f", str(again))
    assert done.returncode == 2
    assert expected in done.stderr and str(again) in done.stderr
    assert str(CONFIG) in done.stderr  # the first declaration's file
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_file_named_twice_is_read_once() -> None:
    # `-f config -f config/crew/agents.yaml`: one file, so no Agent is "declared twice"
    done = run("-f", str(CONFIG / "crew"), "-f", str(CONFIG / "crew" / "agents.yaml"),
               "-f", str(CONFIG / "bundles" / "staging"), "-f", str(CONFIG / "archetypes"),
               "--strict")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.count("# crew-homelab-pilot/") == 4


def test_what_kubectl_get_writes_is_read_as_its_items(tmp_path: Path) -> None:
    # `kubectl get models,modelproviders,agents,... -o yaml` writes one `kind: List`
    # document; it was "unknown kind 'List'"
    import yaml

    texts = (CREW, POLICY, (CONFIG / "bundles" / "staging" / "models.yaml").read_text())
    items = [doc for text in texts for doc in yaml.safe_load_all(text) if doc]
    listed = tmp_path / "listed.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    archetypes = str(CONFIG / "archetypes")
    done = run("-f", str(listed), "-f", archetypes, "--strict")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == run("-f", str(CONFIG / "crew"), "-f", archetypes,
                              "-f", str(CONFIG / "bundles" / "staging")).stdout
    items[0]["spec"]["capabilities"] = "reasoning"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    bad = run("-f", str(listed))
    assert bad.returncode == 2
    assert bad.stderr == (f"kubemoot-proxy candidates: {listed}: document 1, item 1 (Agent/"
                          "synthesizer): spec.capabilities must be a list (got 'reasoning')\n")


def test_merge_keys_may_override_what_they_merge(tmp_path: Path) -> None:
    # `<<: *base` then a key of the base again is YAML's override, not a key given twice
    docs = tmp_path / "agents.yaml"
    docs.write_text(edited(CREW, "metadata:\n  name: synthesizer\n",
                           "metadata:\n  <<: {name: base}\n  name: synthesizer\n"))
    done = run("-f", str(docs), "-f", str(CONFIG / "crew" / "policy.yaml"),
               "-f", str(CONFIG / "bundles" / "staging"))
    assert done.returncode == 0 and "# crew-homelab-pilot/synthesizer" in done.stdout, \
        done.stderr


def test_no_documents_is_a_warning_and_strict_fails(tmp_path: Path) -> None:
    done = run("-f", str(tmp_path))
    assert done.returncode == 0 and done.stdout == ""
    assert "no Agent document" in done.stderr and str(tmp_path) in done.stderr
    assert run("-f", str(tmp_path), "--strict").returncode == 1


def test_a_reader_that_stops_early_gets_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "proxy", "candidates", "-f", str(CONFIG / "crew"),
             "-f", str(CONFIG / "archetypes"), "-f", str(CONFIG / "bundles" / "prod")],
            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT)
    finally:
        os.close(write_end)
    assert done.stderr == "" and done.returncode == 0


def test_an_agent_in_a_namespace_without_policy_is_not_bound_by_anothers(tmp_path: Path
                                                                         ) -> None:
    # The only policy of the cluster (another crew's namespace) bound it by that crew's rules
    stray = tmp_path / "stray.yaml"
    stray.write_text("kind: Agent\nmetadata: {name: lonely, namespace: elsewhere}\n"
                     "spec: {capabilities: [tool-calling]}\n")
    done = run("-f", str(CONFIG / "crew" / "policy.yaml"), "-f", str(CONFIG / "archetypes"),
               "-f", str(CONFIG / "bundles" / "prod"), "-f", str(stray), "-o", "json")
    assert done.returncode == 0, done.stderr
    (agent,) = json.loads(done.stdout)["agents"]
    assert agent["env"] == {} and agent["unschedulable"]["crewSchedulingPolicy"] is None
    assert agent["unschedulable"]["reason"] == (
        "no CrewSchedulingPolicy applies to this agent (namespace elsewhere has none)")


def test_bind_with_a_bad_document_at_start_says_it_in_one_line(tmp_path: Path) -> None:
    # It also logged "the last good ones stay in force", of documents it never had
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Model\nmetadata: {name: m}\nspec: {model: m}\n")
    done = subprocess.run([sys.executable, "-m", "proxy", "bind", "-f", str(bad)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "KUBEMOOT_NATS_URL": "nats://127.0.0.1:9"})
    assert (done.returncode, done.stdout, done.stderr) == (
        2, "", f"kubemoot-proxy bind: {bad}: document 1 (Model/m): spec.providerRef is "
        "required\n")


def test_an_agent_naming_a_crew_no_policy_has_is_not_bound_by_another_crews(
        tmp_path: Path) -> None:
    # A mistyped crew label took the namespace's only policy, though it names another crew
    typo = tmp_path / "typo.yaml"
    typo.write_text(edited(CREW.split("---")[0], "kubemoot.ai/crew: homelab-pilot",
                           "kubemoot.ai/crew: homelab-pilto"))
    done = run("-f", str(typo), "-f", str(CONFIG / "crew" / "policy.yaml"),
               "-f", str(CONFIG / "bundles" / "prod"), "-o", "json")
    (agent,) = json.loads(done.stdout)["agents"]
    assert agent["env"] == {}
    assert agent["unschedulable"]["reason"] == (
        "no CrewSchedulingPolicy applies to this agent (no CrewSchedulingPolicy has crewRef "
        "'homelab-pilto'; namespace crew-homelab-pilot has 1 (homelab-pilot-default): check "
        "the Agent's spec.crewRef or kubemoot.ai/crew label)")


def test_a_spread_key_or_a_bias_the_scheduling_ignores_is_reported(tmp_path: Path) -> None:
    # `topologyKey: zone` spread nothing, `reasoning: "7"` (for 0.7) biased nothing: silently
    policy = edited(edited(POLICY, "topologyKey: provider", "topologyKey: zone"),
                    'reasoning: "0.7"', 'reasoning: "7"')
    (tmp_path / "policy.yaml").write_text(policy)
    done = run("-f", str(tmp_path), "-f", str(CONFIG / "crew" / "agents.yaml"),
               "-f", str(CONFIG / "archetypes"), "-f", str(CONFIG / "bundles" / "prod"),
               "--strict")
    where = "kubemoot-proxy candidates: CrewSchedulingPolicy/homelab-pilot-default"
    assert done.returncode == 1
    assert done.stderr == (
        f"{where}: topologySpread.topologyKey 'zone' is not supported (only provider): "
        "nothing is spread\n"
        f"{where}: qualityBias.reasoning '7' is not a number from 0 to 1: ignored\n")
