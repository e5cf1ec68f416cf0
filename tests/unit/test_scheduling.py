"""Operator-side scheduling: selectors, quality bias, scoring, spread, ordering, zero match."""

from __future__ import annotations

import json

import pytest

from proxy.operator import scheduling as s

LABELS = {"family": "qwen3", "params": "14B", "capability/tool-calling": "true",
          "latencyClass": "medium"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (s.Selector({"family": "qwen3"}), True),
        (s.Selector({"family": "llama"}), False),
        (s.Selector(expressions=(s.Requirement("params", "In", ("14B", "32B")),)), True),
        (s.Selector(expressions=(s.Requirement("params", "In", ("8B",)),)), False),
        (s.Selector(expressions=(s.Requirement("params", "NotIn", ("8B",)),)), True),
        (s.Selector(expressions=(s.Requirement("params", "NotIn", ("14B",)),)), False),
        (s.Selector(expressions=(s.Requirement("latencyClass", "Exists"),)), True),
        (s.Selector(expressions=(s.Requirement("capability/reasoning", "Exists"),)), False),
        (s.Selector(expressions=(s.Requirement("capability/reasoning", "DoesNotExist"),)), True),
        (s.Selector({"family": "qwen3"}, (s.Requirement("params", "In", ("32B",)),)), False),
        (s.Selector(), True),
    ],
)
def test_selectors(selector: s.Selector, matches: bool) -> None:
    assert selector.matches(LABELS) is matches


@pytest.mark.parametrize(
    ("key", "operator", "values"),
    [("a", "Equals", ("x",)), ("a", "In", ()), ("a", "Exists", ("x",))],
)
def test_bad_selectors_are_refused(key: str, operator: str, values: tuple[str, ...]) -> None:
    with pytest.raises(s.SelectorError):
        s.Requirement(key, operator, values)


@pytest.mark.parametrize(
    ("bias", "high", "medium", "low"),
    [(0.0, 0, 0, 100), (0.3, 30, 60, 70), (0.5, 50, 100, 50), (0.7, 70, 60, 30),
     (1.0, 100, 0, 0)],
)
def test_latency_class_tent(bias: float, high: int, medium: int, low: int) -> None:
    assert [s.latency_class_score(c, bias) for c in ("high", "medium", "low")] == [
        high, medium, low]
    assert s.latency_class_score(None, bias) == 0


@pytest.mark.parametrize(
    ("capabilities", "bias_map", "expected"),
    [
        (("reasoning", "tool-calling"), {"reasoning": "0.7", "tool-calling": "0.3"}, 0.7),
        (("tool-calling",), {"reasoning": "0.7", "tool-calling": "0.3"}, 0.3),
        (("kubernetes",), {"tool-calling": "0.3", "default": "0.4"}, 0.4),
        (("kubernetes",), {"tool-calling": "0.3"}, None),
        (("tool-calling",), {"tool-calling": "high", "default": "0.4"}, 0.4),  # unparseable
        (("tool-calling",), {"tool-calling": "1.5"}, None),  # outside [0, 1]
    ],
)
def test_effective_bias(capabilities: tuple[str, ...], bias_map: dict[str, str],
                        expected: float | None) -> None:
    assert s.effective_bias(s.Agent("a", "ns", capabilities), bias_map) == expected


def _model(name: str, ident: str, provider: str, vram: int | None, **labels: str) -> s.Model:
    return s.Model(name, ident, {"capability/tool-calling": "true", **labels}, provider, vram)


PROVIDERS = {
    "big": s.Provider("big", "http://big:11434", True, 32768, 8000, 2, 0, ("qwen3:32b",), 100),
    "small": s.Provider("small", "http://small:11434", True, 24564, 0, 2, 0, (), 25),
    "down": s.Provider("down", "http://down:11434", False, 49152, 0, 2, 0, (), 100),
}
MODELS = [
    _model("qwen3-32b", "qwen3:32b", "big", 20480, latencyClass="high", params="32B"),
    _model("qwen3-14b", "qwen3:14b", "big", 9216, latencyClass="medium", params="14B"),
    _model("qwen3-8b", "qwen3:8b", "small", 6000, latencyClass="low", params="8B"),
]
REQUIRE = s.Selector({"capability/tool-calling": "true"})
BIAS = {"reasoning": "0.7", "tool-calling": "0.3", "default": "0.4"}


def _policy(*rules: s.Rule, spread: s.Spread | None = None, strategy: str = "spread"
            ) -> s.CrewSchedulingPolicy:
    return s.CrewSchedulingPolicy("csp", "ns", rules, BIAS, spread, strategy)


def test_quality_bias_puts_reasoning_on_the_large_model_and_toolers_small() -> None:
    policy = _policy(s.Rule("mulling", REQUIRE))
    equal = {n: s.Provider(p.name, p.endpoint, p.ready, p.vram_total_mib, p.vram_used_mib,
                           p.max_parallel, p.agent_count, p.loaded, 100)
             for n, p in PROVIDERS.items()}
    synth = s.schedule_agent(s.Agent("synth", "ns", ("reasoning", "tool-calling")), policy,
                             MODELS, equal, s.Options())
    tooler = s.schedule_agent(s.Agent("tool", "ns", ("tool-calling",)), policy, MODELS,
                              equal, s.Options())
    assert synth["mulling"].chosen and synth["mulling"].chosen.model.identifier == "qwen3:32b"
    assert tooler["mulling"].chosen and tooler["mulling"].chosen.model.identifier == "qwen3:8b"


def test_explicit_prefer_wins_over_quality_bias() -> None:
    rule = s.Rule("mulling", REQUIRE, (s.Preference(100, s.Selector({"params": "14B"})),))
    out = s.schedule_agent(s.Agent("synth", "ns", ("reasoning",)), _policy(rule), MODELS,
                           PROVIDERS, s.Options())
    assert out["mulling"].chosen and out["mulling"].chosen.model.identifier == "qwen3:14b"
    assert [c[:2] for c in out["mulling"].candidates] == [
        ("qwen3:14b", 100), ("qwen3:32b", 0), ("qwen3:8b", 0)]


def test_candidate_list_preferred_first_then_score_then_name_quality_only() -> None:
    policy = _policy(s.Rule("mulling", REQUIRE))
    out = s.schedule_agent(s.Agent("a", "ns", ("observability",)), policy, MODELS, PROVIDERS,
                           s.Options())  # default bias 0.4: medium 80, low 60, high 40
    assert [(m, q) for m, q, _ in out["mulling"].candidates] == [
        ("qwen3:14b", 80), ("qwen3:8b", 60), ("qwen3:32b", 40)]
    env = s.agent_env(out)
    assert json.loads(env["KUBEMOOT_MODEL_CANDIDATES_MULLING"])[0] == {
        "model": "qwen3:14b", "score": 80, "vramMib": 9216}


def test_ties_go_to_the_smaller_declared_vram_then_the_name() -> None:
    models = [_model("x-undeclared", "a:1b", "small", None), _model("y-big", "b:1b", "small",
                                                                   9000),
              _model("z-small", "c:1b", "small", 3000)]
    policy = s.CrewSchedulingPolicy("p", "ns", (s.Rule("mulling", REQUIRE),))
    out = s.schedule_agent(s.Agent("a", "ns"), policy, models, PROVIDERS, s.Options())
    assert out["mulling"].chosen and out["mulling"].chosen.model.identifier == "c:1b"


@pytest.mark.parametrize(("phase", "provider"), [("mulling", "big"), ("triage", "small")])
def test_provider_weight_is_phase_aware(phase: str, provider: str) -> None:
    models = [_model("q8-big", "qwen3:8b", "big", 6000), _model("q8-small", "qwen3:8b",
                                                               "small", 6000)]
    policy = s.CrewSchedulingPolicy("p", "ns", (s.Rule(phase, REQUIRE),))
    out = s.schedule_agent(s.Agent("a", "ns"), policy, models, PROVIDERS, s.Options())
    assert out[phase].chosen and out[phase].chosen.provider.name == provider


def test_image_locality_and_capacity_strategy() -> None:
    twins = [_model("q-big", "m:1b", "big", 1000), _model("q-small", "m:1b", "small", 1000)]
    flat = {n: s.Provider(n, "", True, 24564, used, 2, 0, loaded, 100)
            for n, used, loaded in (("big", 20000, ("m:1b",)), ("small", 0, ()))}
    policy = s.CrewSchedulingPolicy("p", "ns", (s.Rule("other", REQUIRE),))
    out = s.schedule_agent(s.Agent("a", "ns"), policy, twins, flat, s.Options())
    assert out["other"].chosen and out["other"].chosen.provider.name == "big"  # locality +10
    no_locality = {n: s.Provider(n, "", True, 24564, p.vram_used_mib, 2, 0, (), 100)
                   for n, p in flat.items()}
    spread = s.schedule_agent(s.Agent("a", "ns"), policy, twins, no_locality, s.Options())
    binpack_policy = s.CrewSchedulingPolicy("p", "ns", policy.rules, strategy="binpack")
    binpack = s.schedule_agent(s.Agent("a", "ns"), binpack_policy, twins, no_locality,
                               s.Options())
    assert spread["other"].chosen and spread["other"].chosen.provider.name == "small"
    assert binpack["other"].chosen and binpack["other"].chosen.provider.name == "big"


def test_filter_reasons_not_ready_vram_and_parallelism() -> None:
    providers = {
        "down": s.Provider("down", "", False, 49152),
        "tiny": s.Provider("tiny", "", True, 8192),
        "busy": s.Provider("busy", "", True, 49152, 0, 1, 4),
    }
    for provider, why in (("down", "not Ready"), ("tiny", "overhead"), ("busy", "agents")):
        model = _model("m", "m:1b", provider, 9000)
        chosen, reason = s.feasibility(model, providers, s.Options())
        assert chosen is None and why in reason
    assert s.feasibility(_model("m", "m:1b", "nowhere", 1), providers, s.Options())[0] is None


def test_zero_match_names_the_unmatched_selector() -> None:
    require = s.Selector({"capability/tool-calling": "true"},
                         (s.Requirement("params", "In", ("70B", "405B")),))
    out = s.schedule_agent(s.Agent("a", "ns"), _policy(s.Rule("mulling", require)), MODELS,
                           PROVIDERS, s.Options())
    assert out["mulling"].chosen is None
    assert out["mulling"].unschedulable == (
        "no Model matches require selectors {capability/tool-calling: true, params: 70B|405B}")


def test_matching_models_that_are_all_infeasible_say_why() -> None:
    models = [_model("m", "m:1b", "down", 1000)]
    out = s.schedule_agent(s.Agent("a", "ns"), _policy(s.Rule("mulling", REQUIRE)), models,
                           PROVIDERS, s.Options())
    assert out["mulling"].unschedulable and "none is feasible" in out["mulling"].unschedulable
    assert "not Ready" in out["mulling"].unschedulable


@pytest.mark.parametrize(("mode", "triage_provider"),
                         [("ScheduleAnyway", "big"), ("DoNotSchedule", None)])
def test_topology_spread(mode: str, triage_provider: str | None) -> None:
    only_big = [m for m in MODELS if m.provider_ref == "big"]
    spread = s.Spread(mode, "provider", ("mulling", "triage"))
    policy = _policy(s.Rule("mulling", REQUIRE), s.Rule("triage", REQUIRE), spread=spread)
    out = s.schedule_agent(s.Agent("a", "ns", ("reasoning",)), policy, only_big, PROVIDERS,
                           s.Options())
    assert out["mulling"].chosen and out["mulling"].chosen.provider.name == "big"
    chosen = out["triage"].chosen
    assert (chosen.provider.name if chosen else None) == triage_provider
    if triage_provider is None:
        assert out["triage"].unschedulable and "topology spread" in out["triage"].unschedulable


def test_spread_moves_a_phase_to_another_provider_when_it_can() -> None:
    spread = s.Spread("DoNotSchedule", "provider", ("mulling", "triage"))
    policy = _policy(s.Rule("mulling", REQUIRE), s.Rule("triage", REQUIRE), spread=spread)
    out = s.schedule_agent(s.Agent("a", "ns", ("reasoning",)), policy, MODELS, PROVIDERS,
                           s.Options())
    assert out["mulling"].chosen and out["triage"].chosen
    assert out["mulling"].chosen.provider.name != out["triage"].chosen.provider.name


@pytest.mark.parametrize(
    ("key", "fields", "near"),
    [("vramMiB", ["model", "vramMib"], "vramMib"), ("weigth", ["weight"], "weight"),
     ("providerref", ["providerRef"], "providerRef"), ("rule", ["rules"], "rules"),
     # fields the CRDs have beside the ones the scheduling reads stay ignored
     ("maxLoadedModels", ["loadedModels"], None), ("vramUsed", ["vramUsedMiB"], None),
     ("discussRole", ["capabilities", "crewRef"], None), ("type", ["endpoint"], None),
     ("generateName", ["name", "namespace", "labels"], None)],
)
def test_a_misspelt_document_field_is_told_apart_from_an_unread_one(
        key: str, fields: list[str], near: str | None) -> None:
    from proxy.operator.documents import misspelt
    assert misspelt(key, fields) == near
