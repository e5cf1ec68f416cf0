"""The `candidates` command's shell: read Kubernetes YAML, run the operator-side scheduling,
print bindings, candidate lists and env vars per agent."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from proxy import strict_yaml
from proxy.core.models import model_key
from proxy.operator import documents as d
from proxy.operator import scheduling as s

KINDS = frozenset(d.SCHEMAS)
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
    origins: dict[tuple[str, str, str], Origin] = field(default_factory=dict)  # kind, ns, name
    files: int = 0  # files read


def files(paths: Iterable[str]) -> list[Path]:
    """The YAML files under `paths`, each once: a file also named inside a directory given
    (`-f config -f config/crew/agents.yaml`) is read once, not found "declared twice"."""
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
    first: dict[Path, Path] = {}
    for path in out:
        first.setdefault(path.resolve(), path)
    return list(first.values())


@dataclass(frozen=True)
class Origin:
    """Where a document was read: for the messages that name two of them."""

    path: Path
    index: int
    item: int | None = None  # its place in a `kind: List` document's items

    def __str__(self) -> str:
        item = "" if self.item is None else f", item {self.item}"
        return f"{self.path}: document {self.index}{item}"


def _objects(path: Path, index: int, doc: Any) -> list[tuple[Origin, Any]]:
    """A document's objects: itself, or the items of a list (`kubectl get models,agents -o
    yaml` writes `kind: List`, the API `kind: ModelList`)."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    if isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list):
        return [(Origin(path, index, n), item) for n, item in enumerate(doc["items"], 1)]
    return [(Origin(path, index), doc)]


def _add(docs: Documents, kind: str, doc: dict[str, Any], origin: Origin) -> None:
    """One document, validated by its schema (ValidationError names the field)."""
    parsed = d.SCHEMAS[kind].model_validate(doc)
    meta: d.Metadata = parsed.metadata
    name, namespace = meta.name, meta.namespace
    if isinstance(parsed, d.ModelDocument):
        spec = parsed.spec
        _unique(docs, kind, (namespace, name), origin)
        docs.models.append(s.Model(name, spec.model, dict(meta.labels), spec.providerRef,
                                   spec.vramMib, parsed.status.ready, namespace))
    elif isinstance(parsed, d.ProviderDocument):
        # Keyed by name alone: that is all a Model's providerRef says.
        _unique(docs, kind, ("", name), origin)
        capacity = parsed.status.capacity
        docs.providers[name] = s.Provider(
            name, parsed.spec.endpoint, parsed.status.ready, capacity.vramTotalMiB,
            capacity.vramUsedMiB, capacity.maxParallel, capacity.agentCount,
            tuple(m.name for m in capacity.loadedModels), parsed.spec.scheduling.weight)
    elif isinstance(parsed, d.PolicyDocument):
        policy = parsed.spec
        _unique(docs, kind, (namespace, name), origin)
        rules = tuple(s.Rule(r.phase, r.require.to_core(),
                             tuple(s.Preference(p.weight, p.selector.to_core())
                                   for p in r.prefer))
                      for r in policy.rules)
        ts = policy.topologySpread
        spread = None if ts is None else s.Spread(ts.whenUnsatisfiable, ts.topologyKey,
                                                  tuple(ts.phaseKeys))
        docs.policies.append(s.CrewSchedulingPolicy(
            name, namespace, rules, dict(policy.qualityBias), spread, policy.strategy,
            policy.crewRef or None, policy.candidateTolerance))
        if policy.archetypeRef:
            docs.policy_archetype[name] = policy.archetypeRef
    elif isinstance(parsed, d.AgentDocument):
        _unique(docs, kind, (namespace, name), origin)
        crew = parsed.spec.crewRef or meta.labels.get(CREW_LABEL)
        docs.agents.append((s.Agent(name, namespace, tuple(parsed.spec.capabilities)),
                            crew or None))
    elif isinstance(parsed, d.ArchetypeDocument):
        _unique(docs, kind, ("", name), origin)
        docs.archetypes[name] = tuple(parsed.spec.phases)


def _unique(docs: Documents, kind: str, key: tuple[str, str], origin: Origin) -> None:
    """Two documents of a kind with one name: an error, never the last one winning."""
    first = docs.origins.setdefault((kind, *key), origin)
    if first is not origin:
        raise DocumentError(f"{origin}: {kind}/{key[1]} is declared twice "
                            f"(first in {first})")


def check_spellings(docs: Documents) -> None:
    """Two Models naming one model two ways (`qwen3:8b`, `Qwen3:8B`, `qwen3` and
    `qwen3:latest`: Ollama reads them as one) would be two candidate entries, which `serve`
    refuses: DocumentError naming both."""
    first: dict[str, s.Model] = {}
    for model in docs.models:
        other = first.setdefault(model_key(model.identifier), model)
        if other.identifier != model.identifier:
            raise DocumentError(
                f"{docs.origins[('Model', model.namespace, model.name)]} (Model/{model.name}): "
                f"spec.model {model.identifier!r} is {other.identifier!r} (Model/{other.name}, "
                f"{docs.origins[('Model', other.namespace, other.name)]}) spelled otherwise; "
                "Ollama reads them as one model: spell it one way")


def check_references(docs: Documents) -> list[str]:
    """Models whose providerRef names no ModelProvider document."""
    return [f"{docs.origins[('Model', m.namespace, m.name)]}: Model/{m.name}: "
            f"spec.providerRef {m.provider_ref!r} names no ModelProvider document"
            for m in docs.models if m.provider_ref not in docs.providers]


def load(paths: Iterable[str], *, references: bool = True) -> Documents:
    """The documents under `paths`; `references`: a Model naming a ModelProvider no document
    declares is an error (`bind` leaves it to the providers' live state)."""
    docs = Documents()
    for path in files(paths):
        try:
            loaded = strict_yaml.load_all(path.read_text())
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark is not None else ""
            raise DocumentError(f"{path}: malformed YAML{at}: "
                                f"{getattr(exc, 'problem', None) or exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise DocumentError(f"{path}: not readable: {exc}") from None
        for index, doc in enumerate(loaded, 1):
            if doc is None:
                continue
            for origin, item in _objects(path, index, doc):
                _read(docs, origin, item)
        docs.files += 1
    check_spellings(docs)
    if references:
        for problem in check_references(docs):
            raise DocumentError(problem)
    return docs


def _read(docs: Documents, origin: Origin, doc: Any) -> None:
    """One object of a file into `docs`; DocumentError naming it when it is wrong."""
    if not isinstance(doc, dict):
        raise DocumentError(f"{origin}: not a mapping")
    meta = doc.get("metadata")
    name = meta.get("name", "?") if isinstance(meta, dict) else "?"
    kind = doc.get("kind")
    label = f"{origin} ({kind}/{name})"
    if not isinstance(kind, str) or kind not in d.SCHEMAS:
        raise DocumentError(f"{label}: unknown kind {kind!r} "
                            f"(expected one of {', '.join(sorted(KINDS))}, or a List of them)")
    try:
        _add(docs, kind, doc, origin)
    except ValidationError as exc:
        raise DocumentError(f"{label}: {d.problem(exc)}") from None


def validate_phases(docs: Documents) -> list[str]:
    """CrewSchedulingPolicy phases outside their archetype's vocabulary, and spread phase
    keys that name no rule's phase (a typo there spread nothing, without a word)."""
    problems = []
    for policy in docs.policies:
        problems.extend(_ignored_settings(policy))
        ruled = [rule.phase for rule in policy.rules]
        for key in policy.spread.phase_keys if policy.spread else ():
            if key not in ruled:
                problems.append(f"CrewSchedulingPolicy/{policy.name}: topologySpread.phaseKeys "
                                f"names {key!r}, which no rule has ({', '.join(ruled)})")
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


def _ignored_settings(policy: s.CrewSchedulingPolicy) -> list[str]:
    """What the scheduling ignores as documented, said rather than ignored silently: a
    spread over another key than `provider` spreads nothing, a bias outside [0, 1] counts
    for nothing (0.7 typed as 7)."""
    where = f"CrewSchedulingPolicy/{policy.name}"
    problems = []
    if policy.spread and policy.spread.topology_key != "provider":
        problems.append(f"{where}: topologySpread.topologyKey {policy.spread.topology_key!r} "
                        "is not supported (only provider): nothing is spread")
    for key, value in policy.quality_bias.items():
        if s.parse_bias(value) is None:
            problems.append(f"{where}: qualityBias.{key} {value!r} is not a number from 0 "
                            "to 1: ignored")
    return problems


def policy_for(agent: s.Agent, crew: str | None, policies: list[s.CrewSchedulingPolicy]
               ) -> s.CrewSchedulingPolicy | None:
    """The policy of the agent's crew, else the only one in its namespace. Never another
    namespace's only policy, nor one naming another crew than the agent's (a mistyped
    `kubemoot.ai/crew`): the agent would run under another crew's rules silently."""
    if crew:
        for policy in policies:
            if policy.crew == crew:
                return policy
    same_namespace = [p for p in policies if p.namespace == agent.namespace
                      and not (crew and p.crew)]
    return same_namespace[0] if len(same_namespace) == 1 else None


def no_policy_reason(agent: s.Agent, crew: str | None,
                     policies: list[s.CrewSchedulingPolicy]) -> str:
    """Why `policy_for` found none, naming what was looked for."""
    here = [p.name for p in policies if p.namespace == agent.namespace]
    looked = f"no CrewSchedulingPolicy has crewRef {crew!r}; " if crew else ""
    found = (f"namespace {agent.namespace} has {len(here)} ({', '.join(sorted(here))}): "
             f"check the Agent's spec.crewRef or {CREW_LABEL} label") if here else \
        f"namespace {agent.namespace} has none"
    return f"no CrewSchedulingPolicy applies to this agent ({looked}{found})"


def schedule(docs: Documents, options: s.Options, now: datetime | None = None
             ) -> dict[str, Any]:
    observed_at = (now or datetime.now(UTC)).isoformat().replace("+00:00", "Z")
    agents = []
    for agent, crew in docs.agents:
        policy = policy_for(agent, crew, docs.policies)
        entry: dict[str, Any] = {"name": agent.name, "namespace": agent.namespace}
        if policy is None:
            entry.update(phases={}, candidates={}, env={}, unschedulable={
                "phase": None, "reason": no_policy_reason(agent, crew, docs.policies),
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


def command(paths: list[str], output: str, strict: bool, options: s.Options) -> int:
    """`kubemoot-proxy candidates`: 0, 1 with --strict when something is unschedulable,
    missing or invalid, 2 for a document that cannot be read."""
    def warn(message: str) -> None:
        print(f"kubemoot-proxy candidates: {message}", file=sys.stderr)

    try:
        docs = load(paths)
    except DocumentError as exc:
        warn(str(exc))
        return 2
    problems = validate_phases(docs)
    if not docs.agents:
        problems.append(f"no Agent document in {' '.join(paths)} ({docs.files} YAML file(s)):"
                        " nothing to bind")
    for problem in problems:
        warn(problem)
    result = schedule(docs, options)
    text = render(result, output)
    try:
        if text:
            print(text, flush=True)
    except BrokenPipeError:
        # The reader stopped (`| head -1`): what it did not read is not an error. Python
        # flushes stdout again at exit; pointing it at /dev/null keeps that quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    unschedulable = any(a.get("unschedulable") for a in result["agents"])
    return 1 if strict and (unschedulable or problems) else 0
