"""The models an agent's calls may run, as the binder last bound them (docs/binding.md).

The store's one watch on `kubemoot_bindings` keeps the bindings mirrored here, so a call reads
its agent's binding, or its discussion's, without a round trip, and a re-binding applies to
the next call. Without a binding (embedded state, no binder, a phase it leaves empty) the
environment's candidates apply, as they always did.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from proxy.core.models import CallModels, model_key, normalise_model
from proxy.core.types import Candidate
from proxy.observability.logging import get_logger
from proxy.ports import BINDINGS, SYSTEM_CLOCK, Clock, Entry, StateStore, StoreUnavailable
from proxy.service.codec import escape_key

log = get_logger("kubemoot.bindings")
ASK_AGAIN_S = 600.0  # a discussion still calling asks again, well within the binder's TTL
ASKS_REMEMBERED = 1024
DECODED_KEPT = 1024  # decoded bindings kept before those no longer in the bucket are dropped


@dataclass(frozen=True)
class Resolved:
    """The models of one call's phase, and where they came from."""

    models: CallModels
    tolerance: float
    source: str  # thread | agent | env
    revision: int | None = None  # the binding's generation
    unschedulable: str | None = None  # the binder's zero-match reason for the phase

    def label(self) -> str:
        return self.source if self.revision is None else f"{self.source}@{self.revision}"

    def json(self) -> dict[str, Any]:
        return {"source": self.source, "revision": self.revision,
                **({"unschedulable": self.unschedulable} if self.unschedulable else {})}


def _candidates(raw: Any) -> tuple[Candidate, ...]:
    out = []
    for entry in raw or ():
        if isinstance(entry, Mapping) and entry.get("model"):
            mib = entry.get("vramMib")
            out.append(Candidate(normalise_model(str(entry["model"])),
                                 float(entry.get("score") or 0.0),
                                 int(mib) if isinstance(mib, int) else None))
    return tuple(out)


class Bindings:
    """Resolves a call's candidates: its discussion's binding, else its agent's, else the
    environment's."""

    def __init__(self, store: StateStore, namespace: str, agent: str, fallback: CallModels,
                 tolerance: float, shared: bool, clock: Clock = SYSTEM_CLOCK) -> None:
        self.store = store
        self.me = f"{namespace}/{agent}"
        self.namespace, self.agent = namespace, agent
        self.key = escape_key(self.me)
        self.env = Resolved(fallback, tolerance, "env")
        self.shared = shared  # only a shared store has a binder to ask
        self.clock = clock
        self._decoded: dict[str, tuple[int, dict[str, Any] | None]] = {}
        self._asked: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._used: OrderedDict[tuple[str, str | None], Resolved] = OrderedDict()
        self._background: set[asyncio.Task[None]] = set()
        self._warned: dict[str, int | None] = {}  # malformed bindings logged, by revision

    def _value(self, view: Mapping[str, Entry], key: str) -> dict[str, Any] | None:
        entry = view.get(key)
        if entry is None:
            return None
        hit = self._decoded.get(key)
        if hit is not None and hit[0] == entry.revision:
            return hit[1]
        try:
            value = orjson.loads(entry.value)
        except orjson.JSONDecodeError:
            value = None
        decoded = value if isinstance(value, dict) else None
        if len(self._decoded) >= DECODED_KEPT:  # discussions' keys the binder has pruned
            for gone in [k for k in self._decoded if k not in view]:
                del self._decoded[gone]
        self._decoded[key] = (entry.revision, decoded)
        return decoded

    def resolve(self, phase: str, thread: str | None = None) -> Resolved:
        view = self.store.view(BINDINGS)
        try:
            resolved = self._agent(self._value(view, self.key), phase)
        except (ValueError, TypeError, AttributeError) as exc:
            # (a binding written by hand, or by another version): the env's, not a 500 on
            # every call of the agent
            self._malformed(self.key, exc)
            resolved = self.env
        if thread:
            key = f"thread.{escape_key(thread)}.{escape_key(phase)}"
            discussion = self._value(view, key)
            try:
                mine = ((discussion or {}).get("agents") or {}).get(self.me)
                if isinstance(mine, dict):
                    resolved = self._discussion(resolved, mine, phase,
                                                (discussion or {}).get("generation"))
            except (ValueError, TypeError, AttributeError) as exc:
                self._malformed(key, exc)
        return resolved

    def _malformed(self, key: str, exc: Exception) -> None:
        hit = self._decoded.get(key)
        revision = hit[0] if hit else None
        if key not in self._warned or self._warned[key] != revision:  # once per revision
            if len(self._warned) >= DECODED_KEPT:
                self._warned.clear()
            self._warned[key] = revision
            log.warning("binding ignored: it does not decode", key=key, error=str(exc))

    def _agent(self, binding: dict[str, Any] | None, phase: str) -> Resolved:
        if binding is None:
            return self.env
        env = self.env.models
        phases = binding.get("phases") or {}
        lists = binding.get("candidates") or {}
        mulling = _candidates(lists.get("mulling"))
        triage = (phases.get("triage") or {}).get("model") or next(
            (c.model for c in _candidates(lists.get("triage"))), None)
        reason = next((u.get("reason") for u in binding.get("unschedulable") or ()
                       if isinstance(u, dict) and u.get("phase") in (phase, None)), None)
        given = mulling if phase != "triage" else triage
        if not given:  # the binder left this phase empty (zero match): the env's
            return replace(self.env, unschedulable=reason)
        tolerance = binding.get("tolerance")
        # the binding's list, best first, applies instead of the env's bound model
        models = CallModels(mulling or env.mulling, triage or env.triage_model,
                            None if mulling else env.preferred)
        return Resolved(models,
                        self.env.tolerance if tolerance is None else max(0.0, float(tolerance)),
                        "agent", _generation(binding), reason)

    def _discussion(self, base: Resolved, mine: dict[str, Any], phase: str,
                    generation: Any) -> Resolved:
        models = base.models
        if phase == "triage":
            if not mine.get("model"):
                return base
            models = replace(models, triage_model=str(mine["model"]))
        else:
            listed = _candidates(mine.get("candidates"))
            if not listed:
                return base
            models = replace(models, mulling=listed, preferred=None)
        tolerance = mine.get("tolerance")
        return Resolved(models, base.tolerance if tolerance is None else
                        max(0.0, float(tolerance)), "thread",
                        int(generation) if isinstance(generation, int) else None,
                        mine.get("unschedulable"))

    def for_call(self, phase: str, model: str | None, thread: str | None = None,
                 ask: bool = True) -> tuple[Candidate, ...] | None:
        """The call's candidates: the model it names first, unless that is the model the
        agent was deployed with, which follows the binding. Asks for a discussion binding
        when the call carries a thread (`ask` False: only looking, as explain does)."""
        if thread and ask:
            self.ask(thread, phase)
        resolved = self.resolve(phase, thread)
        self._used[(phase, thread)] = resolved
        self._used.move_to_end((phase, thread))
        while len(self._used) > ASKS_REMEMBERED:
            self._used.popitem(last=False)
        if model is not None and resolved.source != "env" and self._deployed(phase, model):
            model = None  # the model it was deployed with stands for its binding
        return resolved.models.for_call(phase, model)

    def _deployed(self, phase: str, model: str) -> bool:
        """Whether the call names the model the agent was deployed with (the environment's
        preferred model for the phase): what an agent that reads KUBEMOOT_MODEL_MODEL, or
        was configured with the same name, sends for "my bound model"."""
        env = self.env.models
        deployed = (env.triage_model or env.mulling_model) if phase == "triage" else \
            env.mulling_model
        return deployed is not None and model_key(deployed) == model_key(model)

    def used(self, phase: str, thread: str | None = None) -> Resolved:
        """The binding the last resolution for this phase and thread ran on: read at once
        after `for_call`, it is that call's (the scheduler keeps it with the attempt, as the
        binding may move while the call waits or runs)."""
        return self._used.get((phase, thread)) or self.resolve(phase, thread)

    def tolerance(self, phase: str, thread: str | None = None) -> float:
        return self.resolve(phase, thread).tolerance

    # -- asking the binder for a discussion binding ----------------------------------------
    def ask(self, thread: str, phase: str) -> None:
        """Once per thread and phase (again after ASK_AGAIN_S), in the background: the call
        does not wait for the binder. Only once the binder has bound this agent: it binds
        no discussion of an agent its documents do not declare, and an ask nobody answers
        stays in the bucket (no max age) for good, a key per thread the agent ever called."""
        if not self.shared or self.key not in self.store.view(BINDINGS):
            return
        now = self.clock.now()
        last = self._asked.get((thread, phase))
        if last is not None and now - last < ASK_AGAIN_S:
            return
        self._asked[(thread, phase)] = now
        self._asked.move_to_end((thread, phase))
        while len(self._asked) > ASKS_REMEMBERED:
            self._asked.popitem(last=False)
        key = (f"ask.{escape_key(thread)}.{escape_key(phase)}.{self.key}")
        value = orjson.dumps({"thread": thread, "phase": phase, "namespace": self.namespace,
                              "agent": self.agent, "at": now})
        self._spawn(lambda: self._put(key, value, thread, phase))

    async def _put(self, key: str, value: bytes, thread: str, phase: str) -> None:
        try:
            await self.store.put(BINDINGS, key, value)
        except StoreUnavailable as exc:
            self._asked.pop((thread, phase), None)  # ask again with the next call
            log.info("discussion binding not asked for", thread=thread, error=str(exc))

    def _spawn(self, make: Callable[[], Any]) -> None:
        with contextlib.suppress(RuntimeError):  # no loop: nothing to ask from
            task = asyncio.get_running_loop().create_task(make())
            self._background.add(task)
            task.add_done_callback(self._background.discard)


def _generation(binding: Mapping[str, Any]) -> int | None:
    generation = binding.get("generation")
    return generation if isinstance(generation, int) else None
