"""Live bindings: the operator's filter -> score -> bind over the documents and the
providers' live state, as the binder publishes them to `kubemoot_bindings` (docs/binding.md).

Pure: the shell (`binder.py`) gathers the documents and the live state and writes what these
functions return. Bindings are JSON-ready dicts, because that is what travels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from proxy.core.models import model_key
from proxy.core.types import ProviderView
from proxy.operator import scheduling as s
from proxy.operator.candidates import Documents, no_policy_reason, policy_for
from proxy.ports import Entry
from proxy.service.codec import ProviderState, escape_key

# What a binding says beyond its substance: not compared, so a new score or "now" alone
# never rewrites a binding.
VOLATILE = ("generation", "observedAt")


def agent_id(namespace: str, agent: str) -> str:
    return f"{namespace}/{agent}"


def agent_key(namespace: str, agent: str) -> str:
    """`<namespace>/<agent>`, KV-safe (escaped keys have no dot, thread keys do)."""
    return escape_key(agent_id(namespace, agent))


def thread_key(thread: str, phase: str) -> str:
    return f"thread.{escape_key(thread)}.{escape_key(phase)}"


def ask_key(thread: str, phase: str, namespace: str, agent: str) -> str:
    return f"ask.{escape_key(thread)}.{escape_key(phase)}.{agent_key(namespace, agent)}"


def thread_subject(thread: str, phase: str) -> str:
    return f"kubemoot.scheduling.{escape_key(thread)}.{escape_key(phase)}"


# -- the providers as their live state shows them ----------------------------------------------

def live_providers(declared: Mapping[str, s.Provider], states: Mapping[str, ProviderState],
                   now: float, stale_s: float) -> dict[str, s.Provider]:
    """Every provider a document declares or the publisher reports. The live state decides
    readiness and capacity; a provider without fresh state is not Ready (its publisher stopped
    hearing from it, or never did). Weight and agent count stay the documents'."""
    out: dict[str, s.Provider] = {}
    for name in sorted(set(declared) | set(states)):
        doc = declared.get(name)
        state = states.get(name)
        if state is None or now - state.last_probed_at > stale_s:
            base = doc or s.Provider(name, state.endpoint if state else "")
            why = "no state published" if state is None else \
                f"state {now - state.last_probed_at:.0f} s old"
            out[name] = replace(base, ready=False, not_ready=why)
            continue
        on_disk = frozenset(model_key(m) for m in (*state.available_mib,
                                                          *state.loaded_mib))
        out[name] = s.Provider(
            name, (doc.endpoint if doc and doc.endpoint else state.endpoint), state.ready,
            state.total_vram_mib or (doc.vram_total_mib if doc else None),
            sum(state.loaded_mib.values()), state.max_parallel,
            doc.agent_count if doc else 0, tuple(sorted(state.loaded_mib)),
            doc.weight if doc else 100.0, on_disk,
            None if state.ready else "its probe failed", card_view(name, state))
    return out


def card_view(name: str, state: ProviderState) -> ProviderView:
    """What sizing reads of a provider's state, as the sidecar's snapshot has it."""
    return ProviderView(name, state.total_vram_mib, state.ready,
                        context_length=state.context_length, max_parallel=state.max_parallel,
                        disk_mib=state.available_mib, models=state.models,
                        observed=state.observed, kv_cache_type=state.kv_cache_type,
                        flash_attention=state.flash_attention, version=state.version,
                        gpus=state.gpus)


def next_stale_at(states: Mapping[str, ProviderState], now: float, stale_s: float
                  ) -> float | None:
    """When the next fresh state turns stale: a silent change the binder must wake for."""
    times = [st.last_probed_at + stale_s for st in states.values()
             if st.last_probed_at + stale_s > now]
    return min(times, default=None)


# -- an agent's binding -------------------------------------------------------------------------

def _candidates(binding: s.PhaseBinding) -> list[dict[str, Any]]:
    out = []
    for ident, quality, mib in binding.candidates:
        entry: dict[str, Any] = {"model": ident, "score": s.number(quality)}
        if mib is not None:
            entry["vramMib"] = mib
        out.append(entry)
    return out


def held_phases(current: Mapping[str, Any] | None) -> dict[str, tuple[str, str]]:
    """phase -> (Model name, provider) of a published binding, the choices to keep."""
    phases = (current or {}).get("phases")
    if not isinstance(phases, dict):
        return {}
    return {p: (str(c["modelRef"]), str(c["provider"])) for p, c in phases.items()
            if isinstance(c, dict) and "modelRef" in c and "provider" in c}


def agent_binding(agent: s.Agent, crew: str | None, docs: Documents, options: s.Options,
                  current: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One agent's binding over `docs` (their providers already live): the preferred model,
    each phase's choice and candidates, the tolerance and the unschedulable phases.
    `current`: the binding published now, whose choices are kept unless beaten by more than
    the margin (scheduling.BINDING_MARGIN)."""
    policy = policy_for(agent, crew, docs.policies)
    binding: dict[str, Any] = {"namespace": agent.namespace, "agent": agent.name}
    if policy is None:
        return {**binding, "crewSchedulingPolicy": None, "preferred": None, "phases": {},
                "candidates": {}, "tolerance": None, "unschedulable": [{
                    "phase": None, "reason": no_policy_reason(agent, crew, docs.policies),
                    "crewSchedulingPolicy": None}]}
    phases = s.schedule_agent(agent, policy, docs.models, docs.providers, options,
                              held_phases(current))
    mulling = phases.get("mulling")
    return {**binding, "crewSchedulingPolicy": policy.name,
            "preferred": mulling.chosen.model.identifier if mulling and mulling.chosen
            else None,
            "phases": {p: s.chosen_json(b, digits=3) for p, b in phases.items()},
            "candidates": {p: _candidates(b) for p, b in phases.items()},
            "tolerance": policy.candidate_tolerance,
            "unschedulable": [{"phase": p, "reason": b.unschedulable,
                               "crewSchedulingPolicy": policy.name}
                              for p, b in phases.items() if b.unschedulable]}


def substance(binding: Mapping[str, Any]) -> dict[str, Any]:
    """What decides whether a binding changed: the choices and lists, not their scores."""
    out = {k: v for k, v in binding.items() if k not in VOLATILE}
    if isinstance(out.get("phases"), dict):
        out["phases"] = {p: None if c is None else
                         {k: v for k, v in c.items() if k not in ("score", "reasons")}
                         for p, c in out["phases"].items()}
    if isinstance(out.get("agents"), dict):
        out["agents"] = {a: {k: v for k, v in e.items() if k != "reason"}
                         for a, e in out["agents"].items()}
    return out


def gone_agents(view: Mapping[str, Entry], present: set[str], namespaces: set[str]
                ) -> list[tuple[str, str]]:
    """(key, agent) of the agent bindings to delete: a binder's agent binding (its key is
    `<namespace>/<agent>` of the namespace and agent it carries, with a generation) in one
    of `namespaces` whose agent is not among `present`. Keys of another shape, values a
    binder does not write, and other namespaces (another crew's binder) are not ours."""
    out = []
    for key, entry in view.items():
        if key.startswith(("ask.", "thread.")):
            continue
        try:
            value = orjson.loads(entry.value)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(value, dict) or not isinstance(value.get("generation"), int):
            continue
        namespace, agent = value.get("namespace"), value.get("agent")
        if not isinstance(namespace, str) or not isinstance(agent, str) or \
                key != agent_key(namespace, agent) or "phases" not in value or \
                namespace not in namespaces:
            continue
        who = agent_id(namespace, agent)
        if who not in present:
            out.append((key, who))
    return sorted(out)


# -- a discussion's binding ---------------------------------------------------------------------

@dataclass(frozen=True)
class Ask:
    """A sidecar's request for a discussion binding: its agent, in a thread, in a phase."""

    thread: str
    phase: str
    namespace: str
    agent: str
    at: float  # when it last asked (wall clock)


def phase_entry(binding: Mapping[str, Any], phase: str, reason: str) -> dict[str, Any]:
    """An agent's part of a discussion binding: the agent binding's phase, as of now."""
    chosen = (binding.get("phases") or {}).get(phase)
    unschedulable = next((u["reason"] for u in binding.get("unschedulable") or ()
                          if u.get("phase") == phase), None)
    return {"model": chosen["model"] if chosen else None,
            "provider": chosen["provider"] if chosen else None,
            "candidates": list((binding.get("candidates") or {}).get(phase) or ()),
            "tolerance": binding.get("tolerance"), "unschedulable": unschedulable,
            "reason": reason}


def still_feasible(entry: Mapping[str, Any], agent: s.Agent, crew: str | None, phase: str,
                   docs: Documents, options: s.Options) -> str | None:
    """None while the discussion's pinned model can still run where it was bound (the
    policy's rule admits it and its provider is feasible); else why not."""
    model, provider = entry.get("model"), entry.get("provider")
    if not model or not provider:
        return "it had no model bound"
    policy = policy_for(agent, crew, docs.policies)
    rule = next((r for r in policy.rules if r.phase == phase), None) if policy else None
    if rule is None:
        return f"no rule for phase {phase} applies any more"
    matching = [m for m in docs.models if m.identifier == model and m.provider_ref == provider]
    if not matching:
        return f"no Model {model} on {provider} any more"
    reasons = []
    for candidate in matching:
        if not candidate.ready or not rule.require.matches(candidate.labels):
            reasons.append(f"{candidate.name}: no longer admitted by the phase's require")
            continue
        found, why = s.feasibility(candidate, docs.providers, options)
        if found is not None:
            return None
        reasons.append(why)
    return "; ".join(reasons)


def discussion_agents(asks: list[Ask], current: Mapping[str, Any] | None,
                      bindings: Mapping[str, Mapping[str, Any]],
                      agents: Mapping[str, tuple[s.Agent, str | None]], docs: Documents,
                      options: s.Options) -> dict[str, dict[str, Any]]:
    """The agents' entries of one (thread, phase) binding. Pinned: an agent keeps the model
    it was bound when its thread asked for as long as that model can run where it was bound,
    so a re-score (a model loading elsewhere, a policy edit) never switches models in the
    middle of a discussion; when capacity is lost (its provider drops, the model leaves the
    bundle or the disk) it is re-bound to the agent's binding of now."""
    before = dict((current or {}).get("agents") or {})
    out: dict[str, dict[str, Any]] = {}
    for ask in asks:
        who = agent_id(ask.namespace, ask.agent)
        binding = bindings.get(who)
        known = agents.get(who)
        if binding is None or known is None:
            continue  # not an agent of these documents
        agent, crew = known
        old = before.get(who)
        if old is not None:
            lost = still_feasible(old, agent, crew, ask.phase, docs, options)
            if lost is None:
                out[who] = old
                continue
            out[who] = phase_entry(binding, ask.phase, f"re-bound: {lost}")
        else:
            out[who] = phase_entry(binding, ask.phase, "bound when the thread asked")
    return out
