"""The `candidates` command's shell: read Kubernetes YAML, run the operator-side scheduling,
print bindings, candidate lists and env vars per agent."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from proxy.operator import scheduling as s

KINDS = {"Model", "ModelProvider", "CrewSchedulingPolicy", "Agent", "MootArchetype"}
CREW_LABEL = "kubemoot.ai/crew"


class DocumentError(Exception):
    """One line naming the file and the document: what is wrong with it."""


@dataclass
class Documents:
    models: list[s.Model] = field(default_factory=list)
    providers: dict[str, s.Provider] = field(default_factory=dict)
    policies: list[s.CrewSchedulingPolicy] = field(default_factory=list)
    agents: list[tuple[s.Agent, str | None]] = field(default_factory=list)  # agent, crew
    archetypes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    policy_archetype: dict[str, str] = field(default_factory=dict)


def files(paths: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Hidden entries skipped: a mounted ConfigMap keeps every file twice, once in
            # its timestamped `..<date>` directory behind the `..data` symlink.
            out.extend(sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml")
                              and not any(part.startswith(".")
                                          for part in p.relative_to(path).parts)))
        elif path.is_file():
            out.append(path)
        else:
            raise DocumentError(f"{raw}: no such file or directory")
    return out


def _map(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a mapping")
    return value


def _labels(value: Any, where: str) -> dict[str, str]:
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v)
            for k, v in _map(value, where).items()}


def _selector(value: Any, where: str) -> s.Selector:
    data = _map(value, where)
    expressions = []
    for i, expr in enumerate(data.get("matchExpressions") or []):
        expr = _map(expr, f"{where}.matchExpressions[{i}]")
        if "key" not in expr or "operator" not in expr:
            raise ValueError(f"{where}.matchExpressions[{i}] needs key and operator")
        expressions.append(s.Requirement(str(expr["key"]), str(expr["operator"]),
                                         tuple(str(v) for v in expr.get("values") or ())))
    return s.Selector(_labels(data.get("matchLabels"), f"{where}.matchLabels"),
                      tuple(expressions))


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _add(docs: Documents, doc: dict[str, Any]) -> None:
    kind = doc.get("kind")
    meta = _map(doc.get("metadata"), "metadata")
    name = str(meta.get("name") or "")
    if not name:
        raise ValueError("metadata.name is required")
    namespace = str(meta.get("namespace") or "default")
    spec = _map(doc.get("spec"), "spec")
    status = _map(doc.get("status"), "status")
    if kind == "Model":
        if "model" not in spec or "providerRef" not in spec:
            raise ValueError("spec.model and spec.providerRef are required")
        docs.models.append(s.Model(
            name, str(spec["model"]), _labels(meta.get("labels"), "metadata.labels"),
            str(spec["providerRef"]), _int_or_none(spec.get("vramMib")),
            bool(status.get("ready", True))))
    elif kind == "ModelProvider":
        capacity = _map(status.get("capacity"), "status.capacity")
        loaded = tuple(str(m.get("name")) for m in capacity.get("loadedModels") or []
                       if isinstance(m, dict))
        scheduling = _map(spec.get("scheduling"), "spec.scheduling")
        docs.providers[name] = s.Provider(
            name, str(spec.get("endpoint") or ""), bool(status.get("ready", False)),
            _int_or_none(capacity.get("vramTotalMiB")), _int_or_none(capacity.get("vramUsedMiB")),
            _int_or_none(capacity.get("maxParallel")), int(capacity.get("agentCount") or 0),
            loaded, float(scheduling.get("weight", 100)))
    elif kind == "CrewSchedulingPolicy":
        rules = []
        for i, rule in enumerate(spec.get("rules") or []):
            rule = _map(rule, f"spec.rules[{i}]")
            if "phase" not in rule:
                raise ValueError(f"spec.rules[{i}].phase is required")
            prefer = tuple(
                s.Preference(float(_map(p, f"spec.rules[{i}].prefer[{j}]").get("weight", 0)),
                             _selector(p.get("selector"), f"spec.rules[{i}].prefer[{j}].selector"))
                for j, p in enumerate(rule.get("prefer") or []))
            rules.append(s.Rule(str(rule["phase"]),
                                _selector(rule.get("require"), f"spec.rules[{i}].require"),
                                prefer))
        spread = None
        if spec.get("topologySpread"):
            ts = _map(spec["topologySpread"], "spec.topologySpread")
            mode = str(ts.get("whenUnsatisfiable", "ScheduleAnyway"))
            if mode not in ("ScheduleAnyway", "DoNotSchedule"):
                raise ValueError(f"spec.topologySpread.whenUnsatisfiable: unknown {mode!r}")
            spread = s.Spread(mode, str(ts.get("topologyKey", "provider")),
                              tuple(str(p) for p in ts.get("phaseKeys") or ()))
        strategy = str(spec.get("strategy", "spread"))
        if strategy not in ("spread", "binpack"):
            raise ValueError(f"spec.strategy: unknown {strategy!r} (spread or binpack)")
        docs.policies.append(s.CrewSchedulingPolicy(
            name, namespace, tuple(rules),
            {str(k): str(v) for k, v in _map(spec.get("qualityBias"), "spec.qualityBias").items()},
            spread, strategy, str(spec["crewRef"]) if spec.get("crewRef") else None,
            None if spec.get("candidateTolerance") is None
            else float(spec["candidateTolerance"])))
        if spec.get("archetypeRef"):
            docs.policy_archetype[name] = str(spec["archetypeRef"])
    elif kind == "Agent":
        crew = spec.get("crewRef") or _labels(meta.get("labels"), "metadata.labels").get(
            CREW_LABEL)
        docs.agents.append((s.Agent(name, namespace, tuple(str(c) for c in
                                                          spec.get("capabilities") or ())),
                            str(crew) if crew else None))
    elif kind == "MootArchetype":
        phases = spec.get("phases") or []
        docs.archetypes[name] = tuple(
            str(p.get("name") if isinstance(p, dict) else p) for p in phases)
    else:
        raise ValueError(f"unknown kind {kind!r} (expected one of {', '.join(sorted(KINDS))})")


def load(paths: Iterable[str]) -> Documents:
    docs = Documents()
    for path in files(paths):
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise DocumentError(f"{path}: malformed YAML{at}: "
                                f"{getattr(exc, 'problem', None) or exc}") from None
        for index, doc in enumerate(loaded, 1):
            if doc is None:
                continue
            label = f"{path}: document {index}"
            if not isinstance(doc, dict):
                raise DocumentError(f"{label}: not a mapping")
            meta = doc.get("metadata")
            name = meta.get("name", "?") if isinstance(meta, dict) else "?"
            label += f" ({doc.get('kind')}/{name})"
            try:
                _add(docs, doc)
            except (ValueError, TypeError, s.SelectorError) as exc:
                raise DocumentError(f"{label}: {exc}") from None
    return docs


def validate_phases(docs: Documents) -> list[str]:
    """CrewSchedulingPolicy phases outside their archetype's vocabulary."""
    problems = []
    for policy in docs.policies:
        archetype = docs.policy_archetype.get(policy.name)
        if archetype is None:
            continue
        vocabulary = docs.archetypes.get(archetype)
        if vocabulary is None:
            problems.append(f"CrewSchedulingPolicy/{policy.name}: archetype {archetype} "
                            "not found")
            continue
        for rule in policy.rules:
            if rule.phase not in vocabulary:
                problems.append(f"CrewSchedulingPolicy/{policy.name}: phase {rule.phase!r} is "
                                f"not in archetype {archetype} ({', '.join(vocabulary)})")
    return problems


def policy_for(agent: s.Agent, crew: str | None, policies: list[s.CrewSchedulingPolicy]
               ) -> s.CrewSchedulingPolicy | None:
    if crew:
        for policy in policies:
            if policy.crew == crew:
                return policy
    same_namespace = [p for p in policies if p.namespace == agent.namespace]
    if len(same_namespace) == 1:
        return same_namespace[0]
    return policies[0] if len(policies) == 1 else None


def schedule(docs: Documents, options: s.Options, now: datetime | None = None
             ) -> dict[str, Any]:
    observed_at = (now or datetime.now(UTC)).isoformat().replace("+00:00", "Z")
    agents = []
    for agent, crew in docs.agents:
        policy = policy_for(agent, crew, docs.policies)
        entry: dict[str, Any] = {"name": agent.name, "namespace": agent.namespace}
        if policy is None:
            entry.update(phases={}, candidates={}, env={}, unschedulable={
                "phase": None, "reason": "no CrewSchedulingPolicy applies to this agent",
                "observedAt": observed_at, "crewSchedulingPolicy": None})
            agents.append(entry)
            continue
        bindings = s.schedule_agent(agent, policy, docs.models, docs.providers, options)
        entry["crewSchedulingPolicy"] = policy.name
        entry["phases"] = {p: s.chosen_json(b) for p, b in bindings.items()}
        entry["candidates"] = {p: [{"model": m, "score": s.number(q)}
                                   for m, q, _ in b.candidates]
                               for p, b in bindings.items()}
        entry["env"] = s.agent_env(bindings)
        failed = [b for b in bindings.values() if b.unschedulable]
        entry["unschedulable"] = None if not failed else {
            "phase": failed[-1].phase, "reason": failed[-1].unschedulable,
            "observedAt": observed_at, "crewSchedulingPolicy": policy.name}
        agents.append(entry)
    return {"agents": agents}


def render(result: Mapping[str, Any], output: str) -> str:
    if output == "json":
        return json.dumps(result, indent=2)
    if output == "yaml":
        return yaml.safe_dump(dict(result), sort_keys=False)
    lines = []
    for agent in result["agents"]:
        lines.append(f"# {agent['namespace']}/{agent['name']}")
        if agent.get("unschedulable"):
            lines.append(f"# unschedulable: {agent['unschedulable']['reason']}")
        for key, value in agent.get("env", {}).items():
            lines.append(f"{key}={shlex.quote(value)}")
    return "\n".join(lines)
