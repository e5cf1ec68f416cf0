"""Operator-side scheduling: filter -> score -> spread -> bind, from Model, ModelProvider,
CrewSchedulingPolicy and Agent documents (docs/operator-cli.md).

Pure: documents are parsed into the frozen types below by the shell (`candidates.py`);
"now" is passed in. Every rejection carries a reason.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.core.models import model_key, normalise_model
from proxy.core.policy import DEFAULT_POLICY
from proxy.core.sizing import Sizer
from proxy.core.types import ProviderView

IMAGE_LOCALITY_BONUS = 10.0
CAPACITY_POINTS = 10.0  # the capacity score spans 0..10 points
# A live binding is compared on merit, its score without the loaded bonus, so a model
# loading or unloading never moves it (nor holds it); it moves to a model whose merit leads
# by more than this, half the capacity score's span, which moves with every load
# (docs/operator-cli.md, "Bind").
BINDING_MARGIN = CAPACITY_POINTS / 2
DEFAULT_CONCURRENCY_FACTOR = 4.0


class SelectorError(ValueError):
    """A selector that is not well formed (unknown operator, missing values)."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist
    values: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise SelectorError(f"unknown operator {self.operator!r} for key {self.key!r}")
        if self.operator in ("In", "NotIn") and not self.values:
            raise SelectorError(f"operator {self.operator} needs values for key {self.key!r}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise SelectorError(f"operator {self.operator} takes no values (key {self.key!r})")

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels


@dataclass(frozen=True)
class Selector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and \
            all(r.matches(labels) for r in self.expressions)

    def describe(self) -> str:
        """`{capability/tool-calling: true, params: 14B|32B}`, as lastUnschedulable says it."""
        parts = [f"{k}: {v}" for k, v in self.match_labels.items()]
        for r in self.expressions:
            if r.operator == "In":
                parts.append(f"{r.key}: {'|'.join(r.values)}")
            elif r.operator == "NotIn":
                parts.append(f"{r.key}: not {'|'.join(r.values)}")
            elif r.operator == "Exists":
                parts.append(f"{r.key}: exists")
            else:
                parts.append(f"{r.key}: absent")
        return "{" + ", ".join(parts) + "}"


@dataclass(frozen=True)
class Model:
    name: str  # the CR name
    identifier: str  # spec.model, what the provider calls it
    labels: Mapping[str, str]
    provider_ref: str
    vram_mib: int | None = None
    ready: bool = True
    namespace: str = "default"


@dataclass(frozen=True)
class Provider:
    name: str
    endpoint: str
    ready: bool = True
    vram_total_mib: int | None = None
    vram_used_mib: int | None = None
    max_parallel: int | None = None
    agent_count: int = 0
    loaded: tuple[str, ...] = ()
    weight: float = 100.0
    # The models on its disk, when its live state says (None: unknown, not checked)
    on_disk: frozenset[str] | None = None
    # Why it is not Ready, when something more precise than its document's status says so
    not_ready: str | None = None
    # The card as its live state shows it (context, slots, KV cache type, models' /api/show):
    # what sizes a model as the sidecar does. None: documents only.
    view: ProviderView | None = None


@dataclass(frozen=True)
class Preference:
    weight: float
    selector: Selector


@dataclass(frozen=True)
class Rule:
    phase: str
    require: Selector
    prefer: tuple[Preference, ...] = ()


@dataclass(frozen=True)
class Spread:
    when_unsatisfiable: str = "ScheduleAnyway"  # or DoNotSchedule
    topology_key: str = "provider"
    phase_keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class CrewSchedulingPolicy:
    """A CrewSchedulingPolicy document: the models each phase requires and prefers (the
    placement's weights are `proxy.core.policy.Policy`, another thing)."""

    name: str
    namespace: str
    rules: tuple[Rule, ...]
    quality_bias: Mapping[str, str] = field(default_factory=dict)
    spread: Spread | None = None
    strategy: str = "spread"  # capacity score: spread (more free) or binpack (less free)
    crew: str | None = None
    # spec.candidateTolerance: published with live bindings (None: the sidecar's own setting)
    candidate_tolerance: float | None = None


@dataclass(frozen=True)
class Agent:
    name: str
    namespace: str
    capabilities: tuple[str, ...] = ()


@dataclass(frozen=True)
class Options:
    eviction_overhead_mib: int | None = None  # None: the runtime's reserve for the card
    concurrency_factor: float = DEFAULT_CONCURRENCY_FACTOR


@dataclass(frozen=True)
class Scored:
    model: Model
    provider: Provider
    quality: float  # prefer weights or qualityBias: what the candidate list carries
    total: float
    reasons: tuple[str, ...]
    loaded_bonus: float = 0.0  # of `total`

    @property
    def merit(self) -> float:
        """The score without the loaded bonus: what a held binding is compared on."""
        return self.total - self.loaded_bonus

    def merit_key(self) -> tuple[float, int, int, str, str]:
        return (-self.merit, *self.rank_key()[1:])

    def rank_key(self) -> tuple[float, int, int, str, str]:
        declared = self.model.vram_mib
        return (-self.total, 0 if declared is not None else 1, declared or 0,
                self.model.identifier, self.provider.name)


@dataclass(frozen=True)
class PhaseBinding:
    phase: str
    chosen: Scored | None
    candidates: tuple[tuple[str, float, int | None], ...]  # (identifier, score, vramMib)
    unschedulable: str | None = None


# -- quality bias -----------------------------------------------------------------------------

def parse_bias(value: str) -> float | None:
    try:
        bias = float(value)
    except (TypeError, ValueError):
        return None
    return bias if 0.0 <= bias <= 1.0 else None


def effective_bias(agent: Agent, quality_bias: Mapping[str, str]) -> float | None:
    """max over the agent's capabilities, then `default`, else none."""
    mapped = [b for c in agent.capabilities if c in quality_bias
              if (b := parse_bias(quality_bias[c])) is not None]
    if mapped:
        return max(mapped)
    if "default" in quality_bias:
        return parse_bias(quality_bias["default"])
    return None


def latency_class_score(latency_class: str | None, bias: float) -> float:
    """The tent: high = 100b, low = 100(1-b), medium peaks at b = 0.5."""
    if latency_class == "high":
        return float(round(100 * bias))
    if latency_class == "low":
        return float(round(100 * (1 - bias)))
    if latency_class == "medium":
        return float(max(0, round(100 - 200 * abs(bias - 0.5))))
    return 0.0


def quality_score(model: Model, rule: Rule, bias: float | None) -> tuple[float, str]:
    if rule.prefer:
        total = float(sum(p.weight for p in rule.prefer if p.selector.matches(model.labels)))
        return total, f"prefer {total:g}"
    if bias is not None:
        latency_class = model.labels.get("latencyClass")
        score = latency_class_score(latency_class, bias)
        return score, f"qualityBias {bias:g} x latencyClass {latency_class or 'none'} = {score:g}"
    return 0.0, "no preference"


# -- filter -----------------------------------------------------------------------------------

def feasibility(model: Model, providers: Mapping[str, Provider], options: Options
                ) -> tuple[Provider | None, str]:
    if not model.ready:
        return None, f"{model.name}: Model not Ready"
    provider = providers.get(model.provider_ref)
    if provider is None:
        return None, f"{model.name}: provider {model.provider_ref} not found"
    if not provider.ready:
        return None, f"{model.name}: provider {provider.name} not Ready" + (
            f" ({provider.not_ready})" if provider.not_ready else "")
    if provider.on_disk is not None and model_key(model.identifier) not in \
            provider.on_disk:
        return None, f"{model.name}: {model.identifier} is not on {provider.name}"
    total = provider.vram_total_mib
    if total:
        overhead = options.eviction_overhead_mib
        if overhead is None:
            overhead = DEFAULT_POLICY.reserve_mib(total, provider.view.gpus if provider.view
                                                  else 1)
        sized = sized_mib(model, provider)
        if sized is not None:
            need, context_length = sized
            if need + overhead > total:
                return None, (f"{model.name}: needs {need} MiB at context {context_length} + "
                              f"{overhead} MiB overhead, {provider.name} has {total} MiB")
        elif model.vram_mib and model.vram_mib + overhead > total:
            return None, (f"{model.name}: needs {model.vram_mib} MiB + {overhead} MiB overhead, "
                          f"{provider.name} has {total} MiB")
    if provider.max_parallel:
        limit = provider.max_parallel * options.concurrency_factor
        if provider.agent_count + 1 > limit:
            return None, (f"{model.name}: {provider.name} serves {provider.agent_count} agents, "
                          f"limit {limit:g}")
    return provider, "feasible"


def sized_mib(model: Model, provider: Provider) -> tuple[int, int] | None:
    """(MiB, context per slot) of a copy of `model` loaded on `provider` by a call that sets
    no num_ctx, as the sidecar sizes it (proxy/core/sizing.py: weights + KV cache for the
    card's context, slots and cache type + compute buffers; a declared vramMib above that
    wins); None when the live state lacks the model's architecture or the context."""
    view = provider.view
    if view is None:
        return None
    identifier = normalise_model(model.identifier)
    sizer = Sizer((view,), 1.0)  # the factor only serves sizes without an architecture
    info = sizer.info(identifier, view)
    if info is None or not info.kv_bytes_per_token:
        return None
    resolved, footprint = sizer.load(identifier, view, 0, model.vram_mib)
    if not resolved.requested or footprint is None:
        return None
    return footprint.total_mib, resolved.context


# -- score ------------------------------------------------------------------------------------

def capacity_score(provider: Provider, strategy: str) -> float:
    total, used = provider.vram_total_mib, provider.vram_used_mib
    if not total or used is None:
        return 0.0
    free_fraction = max(0.0, min(1.0, (total - used) / total))
    share = free_fraction if strategy == "spread" else 1.0 - free_fraction
    return round(CAPACITY_POINTS * share, 3)


def score(model: Model, provider: Provider, rule: Rule, bias: float | None,
          strategy: str) -> Scored:
    quality, why = quality_score(model, rule, bias)
    reasons = [why]
    total = quality
    capacity = capacity_score(provider, strategy)
    if capacity:
        total += capacity
        reasons.append(f"capacity ({strategy}) {capacity:g}")
    bonus = IMAGE_LOCALITY_BONUS if model.identifier in provider.loaded else 0.0
    if bonus:
        total += bonus
        reasons.append(f"loaded on {provider.name} +{bonus:g}")
    sign = 1.0 if rule.phase == "mulling" else -1.0 if rule.phase == "triage" else 0.0
    if sign:
        total += sign * provider.weight
        reasons.append(f"provider weight {sign * provider.weight:+g} ({rule.phase})")
    return Scored(model, provider, quality, total, tuple(reasons), bonus)


# -- bind -------------------------------------------------------------------------------------

def candidate_list(admitted: list[tuple[Model, float]], preferred: str | None
                   ) -> tuple[tuple[str, float, int | None], ...]:
    """One entry per model identifier, preferred first, then score, then name."""
    best: dict[str, tuple[float, int | None]] = {}
    for model, quality in admitted:
        if model.identifier not in best or quality > best[model.identifier][0]:
            best[model.identifier] = (quality, model.vram_mib)
    ordered = sorted(best.items(), key=lambda kv: (kv[0] != preferred, -kv[1][0], kv[0]))
    return tuple((ident, q, mib) for ident, (q, mib) in ordered)


def keep_held(pool: list[Scored], held: tuple[str, str] | None) -> Scored:
    """The best of `pool` (ranked) when nothing is held or the held binding (Model name,
    provider) is no longer in it; else the held one, unless another's merit leads it by more
    than BINDING_MARGIN (then the one with the best merit)."""
    current = next((c for c in pool if (c.model.name, c.provider.name) == held), None)
    if current is None:
        return pool[0]
    best = min(pool, key=Scored.merit_key)
    lead = best.merit - current.merit
    if best is current:
        return current
    if lead > BINDING_MARGIN:
        return best
    return replace(current, reasons=(
        *current.reasons, f"kept: {best.model.name} on {best.provider.name} leads by "
        f"{lead:+.3g} without the loaded bonus, not more than the margin {BINDING_MARGIN:g}"))


def schedule_phase(agent: Agent, policy: CrewSchedulingPolicy, rule: Rule, models: list[Model],
                   providers: Mapping[str, Provider], options: Options,
                   avoid_providers: frozenset[str] = frozenset(),
                   held: tuple[str, str] | None = None) -> PhaseBinding:
    """`held`: the phase's current binding (Model name, provider), kept unless beaten by more
    than BINDING_MARGIN."""
    bias = None if rule.prefer else effective_bias(agent, policy.quality_bias)
    admitted = [m for m in models if m.ready and rule.require.matches(m.labels)]
    if not admitted:
        return PhaseBinding(rule.phase, None, (), (
            f"no Model matches require selectors {rule.require.describe()}"))
    scored: list[Scored] = []
    rejected: list[str] = []
    for model in admitted:
        provider, why = feasibility(model, providers, options)
        if provider is None:
            rejected.append(why)
            continue
        scored.append(score(model, provider, rule, bias, policy.strategy))
    qualities = [(m, quality_score(m, rule, bias)[0]) for m in admitted]
    if not scored:
        return PhaseBinding(rule.phase, None, candidate_list(qualities, None), (
            f"{len(admitted)} Model(s) match require selectors {rule.require.describe()} but "
            f"none is feasible: " + "; ".join(rejected)))
    scored.sort(key=Scored.rank_key)
    chosen = keep_held(scored, held)
    spread_note = None
    if avoid_providers:
        elsewhere = [s for s in scored if s.provider.name not in avoid_providers]
        if elsewhere:
            chosen = keep_held(elsewhere, held)
        elif policy.spread and policy.spread.when_unsatisfiable == "DoNotSchedule":
            return PhaseBinding(rule.phase, None, candidate_list(qualities, None), (
                f"topology spread: every feasible Model for {rule.phase} is on a provider "
                f"already bound for another phase ({', '.join(sorted(avoid_providers))})"))
        else:
            spread_note = "topology spread unsatisfiable: ScheduleAnyway"
    if spread_note:
        chosen = Scored(chosen.model, chosen.provider, chosen.quality, chosen.total,
                        (*chosen.reasons, spread_note))
    return PhaseBinding(rule.phase, chosen, candidate_list(qualities, chosen.model.identifier))


def schedule_agent(agent: Agent, policy: CrewSchedulingPolicy, models: list[Model],
                   providers: Mapping[str, Provider], options: Options,
                   held: Mapping[str, tuple[str, str]] | None = None
                   ) -> dict[str, PhaseBinding]:
    """Every phase of the policy; spread phases bound in phaseKeys order on distinct
    providers when the policy asks for it. `held`: phase -> its current binding (Model name,
    provider), for a live binder."""
    spread = policy.spread
    spread_phases = set(spread.phase_keys) if spread and spread.topology_key == "provider" \
        else set()
    order = sorted(policy.rules, key=lambda r: (
        list(spread.phase_keys).index(r.phase) if spread and r.phase in spread.phase_keys
        else len(spread.phase_keys) if spread else 0))
    used: set[str] = set()
    out: dict[str, PhaseBinding] = {}
    for rule in order:
        avoid = frozenset(used) if rule.phase in spread_phases else frozenset()
        binding = schedule_phase(agent, policy, rule, models, providers, options, avoid,
                                 (held or {}).get(rule.phase))
        out[rule.phase] = binding
        if binding.chosen is not None and rule.phase in spread_phases:
            used.add(binding.chosen.provider.name)
    return out


def candidates_json(binding: PhaseBinding | None) -> str:
    if binding is None:
        return "[]"
    entries = []
    for ident, quality, mib in binding.candidates:
        entry: dict[str, object] = {"model": ident, "score": number(quality)}
        if mib is not None:
            entry["vramMib"] = mib
        entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


def number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def chosen_json(binding: PhaseBinding, digits: int | None = None) -> dict[str, Any] | None:
    """The model and provider a phase is bound to; `digits` rounds the score (a binding
    compared for changes must not move with float noise)."""
    chosen = binding.chosen
    if chosen is None:
        return None
    score = chosen.total if digits is None else number(round(chosen.total, digits))
    return {"model": chosen.model.identifier, "modelRef": chosen.model.name,
            "provider": chosen.provider.name, "endpoint": chosen.provider.endpoint,
            "score": score, "reasons": list(chosen.reasons)}


def agent_env(bindings: Mapping[str, PhaseBinding]) -> dict[str, str]:
    """The Deployment env the Agent reconciler would template."""
    env: dict[str, str] = {}
    mulling = bindings.get("mulling")
    triage = bindings.get("triage")
    if mulling and mulling.chosen:
        env["KUBEMOOT_MODEL_MODEL"] = mulling.chosen.model.identifier
        env["KUBEMOOT_MODEL_ENDPOINT"] = mulling.chosen.provider.endpoint
    if triage and triage.chosen:
        env["KUBEMOOT_TRIAGE_MODEL_MODEL_ID"] = triage.chosen.model.identifier
        env["KUBEMOOT_TRIAGE_MODEL_ENDPOINT"] = triage.chosen.provider.endpoint
    env["KUBEMOOT_MODEL_CANDIDATES_MULLING"] = candidates_json(mulling)
    env["KUBEMOOT_MODEL_CANDIDATES_TRIAGE"] = candidates_json(triage)
    return env
