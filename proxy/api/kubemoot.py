"""The sidecar's own endpoints: plans, explain (dry run) and state."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from proxy.api import wire
from proxy.api.errors import JSON, error_response
from proxy.api.routes import (
    OFF_LOOP_BYTES,
    PHASES,
    BodyTooSlow,
    RequestTooLarge,
    answer_cap,
    can_wait_header,
    measure,
    off_loop,
    read_capped,
)
from proxy.core.affinity import expected_cached
from proxy.core.models import split_source
from proxy.core.occupancy import index_providers, loaded_limit
from proxy.core.placement import explain
from proxy.core.types import CallSpec, Decision, Verdict
from proxy.core.waitline import slack_s
from proxy.ports import MODEL_DEMAND
from proxy.service.demand import DemandBoard
from proxy.service.plans import PlanBook
from proxy.service.routing import CLOUD, Attempt, CallRequest
from proxy.service.scheduler import Scheduler
from proxy.service.snapshot import StateView


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type=JSON)


def verdict_json(v: Verdict) -> dict[str, Any]:
    length = {} if v.call_length is None else {
        "callSeconds": round(v.call_length.seconds, 3), "callSource": v.call_length.source}
    return {"provider": v.provider, "model": v.model, "feasible": v.feasible,
            "reason": v.reason, "terms": {k: round(x, 4) for k, x in v.terms.items()},
            "cost_s": round(v.cost_s, 4) if v.feasible else None, **dict(v.sizing), **length}


def decision_json(d: Decision) -> dict[str, Any]:
    p = d.placement
    return {
        "outcome": d.outcome, "reason": d.reason,
        "placement": None if p is None else {
            "provider": p.provider, "model": p.model, "kind": p.kind, "step": p.step,
            "footprintMiB": p.footprint_mib, "cost_s": round(p.cost_s, 4),
            "evicts": dict(p.evicts), "contextLength": p.context_length,
            "numCtx": p.num_ctx, "ollamaEstimateMiB": p.estimate_mib,
            **({"copyOf": p.copy} if p.copy else {})},
        "queueOption_s": d.queue_option_s, "unloadOption_s": d.unload_option_s,
    }


# Smaller caps by design, under KUBEMOOT_MAX_REQUEST_BYTES when that is smaller still.
PLAN_REQUEST_BYTES = 64 * 1024  # a plan is four short fields
EXPLAIN_REQUEST_BYTES = 16 * 1024 * 1024  # a call's body with a long history
MAX_PARAM_DIGITS = 9  # 999,999,999 characters or tokens: more than any prompt


def _int_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > MAX_PARAM_DIGITS:
        raise wire.BadRequest(f"query parameter '{name}' must be a whole number of at most "
                              f"{MAX_PARAM_DIGITS} digits", name)
    return int(raw)


def _phase_param(request: Request) -> str:
    """The `phase` query parameter, read as the X-Kubemoot-Phase header is (empty is the
    default, mulling): any other value is refused, not ignored."""
    phase = request.query_params.get("phase", "").strip().lower() or "mulling"
    if phase not in PHASES:
        raise wire.BadRequest(f"query parameter 'phase': {phase!r} is not a phase; use one "
                              f"of {', '.join(PHASES)}", "phase")
    return phase


def _model_param(request: Request) -> str | None:
    model = request.query_params.get("model") or None
    if model is not None and len(model) > wire.MAX_ID_LENGTH:
        raise wire.BadRequest(f"query parameter 'model' must be at most {wire.MAX_ID_LENGTH} "
                              "characters", "model")
    if model is not None:
        wire.check_name(model)
    return model


class KubemootApi:
    def __init__(self, scheduler: Scheduler, plans: PlanBook, view: StateView,
                 demand: DemandBoard, max_request_bytes: int, default_can_wait: bool = True
                 ) -> None:
        self.scheduler = scheduler
        self.default_can_wait = default_can_wait
        self.plans = plans
        self.view = view
        self.demand = demand
        self.max_request_bytes = max_request_bytes

    async def _json_body(self, request: Request, own_cap: int, what: str
                         ) -> dict[str, Any] | Response:
        """The request's JSON object under the smaller of its own cap and the sidecar's."""
        return await _json_body(request, min(own_cap, self.max_request_bytes), what,
                                own_cap > self.max_request_bytes)

    def mount(self, app: FastAPI) -> None:
        app.router.add_route("/kubemoot/v1/plans", self.create_plan, methods=["POST"])
        app.router.add_route("/kubemoot/v1/plans/{thread:path}", self.delete_plan,
                             methods=["DELETE"])
        app.router.add_route("/kubemoot/v1/explain", self.explain, methods=["GET"])
        app.router.add_route("/kubemoot/v1/explain", self.explain_call, methods=["POST"])
        app.router.add_route("/kubemoot/v1/state", self.state, methods=["GET"])

    async def create_plan(self, request: Request) -> Response:
        body = await self._json_body(request, PLAN_REQUEST_BYTES, "plan")
        if isinstance(body, Response):
            return body
        try:
            plan = wire.validate(wire.PlanRequest, body)
        except wire.BadRequest as exc:
            return error_response(400, "bad-request", str(exc), wire.named_model(body))
        phase = plan.phase or "mulling"
        if cloud := self._cloud_attempt(plan.model, phase):
            return _json({"thread": plan.thread, "planned": False, "reason": f"Ollama's cloud "
                          f"runs {cloud.model}: nothing of the fleet to plan"})
        model = split_source(plan.model)[0] if plan.model else plan.model
        result = await self.plans.create(plan.thread, phase, model, plan.promptChars)
        if result.get("refusal"):  # over this agent's plans, or the fleet's share for them
            return error_response(429, result["refusal"], result["reason"], plan.model,
                                  retry_after_s=30)
        return _json(result, 201 if result.get("planned") else 200)

    async def delete_plan(self, request: Request) -> Response:
        thread = request.path_params["thread"]
        released = await self.plans.release(thread)
        return _json({"thread": thread, "released": released})

    async def explain(self, request: Request) -> Response:
        try:
            model = _model_param(request)
        except wire.BadRequest as exc:
            asked = request.query_params.get("model") or ""
            return error_response(400, "bad-request", str(exc),
                                  asked if len(asked) <= wire.MAX_ID_LENGTH else None)
        try:
            prompt_chars = _int_param(request, "promptChars") or 0
            num_ctx = _int_param(request, "numCtx")
            phase = _phase_param(request)
        except wire.BadRequest as exc:
            return error_response(400, "bad-request", str(exc), model)
        thread = request.query_params.get("thread") or None
        if thread is not None and len(thread) > wire.MAX_ID_LENGTH:
            return error_response(400, "bad-request", f"query parameter 'thread' must be at "
                                  f"most {wire.MAX_ID_LENGTH} characters", model)
        try:
            can_wait = can_wait_header(request, self.default_can_wait)
        except wire.BadRequest as exc:
            return error_response(400, "bad-request", str(exc), model)
        if cloud := self._cloud(model, phase):
            return cloud
        model = split_source(model)[0] if model else model
        result = self.scheduler.explain(phase, model, prompt_chars, num_ctx, thread, can_wait)
        if result is None:
            return error_response(400, "bad-request", "field 'model': a model is required")
        decision, verdicts, spec = result
        return _json({
            "candidates": [{"model": c.model, "score": c.score} for c in spec.candidates],
            "binding": self.scheduler.bindings.resolve(phase, thread).json()
            if self.scheduler.bindings else {"source": "env", "revision": None},
            "tolerance": spec.tolerance,
            "promptTokens": spec.prompt_tokens,
            "charsPerToken": round(self.scheduler.learning.ratio.chars_per_token, 3),
            "fixedPromptTokens": round(self.scheduler.learning.ratio.fixed_tokens, 1),
            "tokensPerDenseChar": round(self.scheduler.learning.ratio.tokens_per_dense, 3),
            "waitSlack": self._wait_slack(spec),
            "decision": decision_json(decision),
            "verdicts": [verdict_json(v) for v in verdicts],
        })

    def _cloud_attempt(self, model: str | None, phase: str) -> Attempt | None:
        """How a call for `model` (None: the phase's bound one) would go to Ollama's cloud
        through a provider (core/cloud.py); None: it is placed."""
        granted = self.scheduler.cloud_attempt(CallRequest(
            "/api/chat", model, phase, source=split_source(model)[1] if model else ""))
        return granted.attempt if granted else None

    def _cloud(self, model: str | None, phase: str) -> Response | None:
        """Explain's answer for a model Ollama's cloud runs: sent on as it came, nothing
        placed; None for any other model."""
        attempt = self._cloud_attempt(model, phase)
        if attempt is None:
            return None
        model, provider = attempt.model, attempt.provider
        return _json({
            "candidates": [{"model": model, "score": 0.0}],
            "decision": {"outcome": CLOUD, "reason": f"Ollama's cloud runs {model}: sent on "
                         f"through {provider}'s Ollama, on no GPU of the fleet",
                         "provider": provider},
            "verdicts": []})

    def _wait_slack(self, spec: CallSpec) -> dict[str, Any]:
        """Where the call would stand among the calls waiting for its model: its turn comes
        this long after its arrival (core/waitline.py), from this expected length."""
        length = self.scheduler.work(spec)
        return {"seconds": round(slack_s(length), 3),
                "lengthSeconds": None if length is None else round(length.seconds, 3),
                "lengthSource": "unknown" if length is None else length.source}

    async def explain_call(self, request: Request) -> Response:
        """Explain for a call's own body (a chat or generate request, as the agent would send
        it): its conversation's prefill on each copy, and the tokens each copy is expected
        to hold of it (`expectedCachedTokens`)."""
        body = await self._json_body(request, EXPLAIN_REQUEST_BYTES, "explain")
        if isinstance(body, Response):
            return body
        model = wire.named_model(body)
        if model is None:
            return error_response(400, "bad-request", "field 'model': a model is required")
        try:
            wire.check_name(model)
            phase = _phase_param(request)
            wire.check_options(body.get("options"))
        except wire.BadRequest as exc:
            return error_response(400, "bad-request", str(exc), model)
        if cloud := self._cloud(model, phase):
            return cloud
        model = split_source(model)[0]
        candidates = self.scheduler.candidates(phase, model)
        if not candidates:
            return error_response(400, "bad-request", "field 'model': a model is required",
                                  model)
        try:
            can_wait = can_wait_header(request, self.default_can_wait)
        except wire.BadRequest as exc:
            return error_response(400, "bad-request", str(exc), model)
        body = await off_loop(request.state.large_body, wire.nested_as_go_binds, body)
        size, digests, shared, _ = await off_loop(request.state.large_body, measure, body)
        call = CallRequest("/api/chat", model, phase, prompt=size,
                           can_wait=can_wait, num_ctx=wire.requested_num_ctx(body),
                           num_predict=answer_cap(None, body), conversation=digests,
                           shared_prompt=shared)
        spec = self.scheduler.spec(call, candidates)
        snapshot = self.scheduler.snapshot(self.scheduler.clock.now())
        decision, verdicts = explain(spec, snapshot, self.scheduler.policy)
        indexes = index_providers(snapshot, self.scheduler.policy)
        cached = {(v.provider, v.model): expected_cached(indexes[v.provider], v.model, spec,
                                                          snapshot)
                  for v in verdicts if v.provider in indexes}
        return _json({
            "candidates": [{"model": c.model, "score": c.score} for c in spec.candidates],
            "promptTokens": spec.prompt_tokens,
            "conversation": len(digests),
            "waitSlack": self._wait_slack(spec),
            "prefillTokensPerS": {v.provider: round(snapshot.prefill.rate(v.provider, v.model))
                                  for v in verdicts if v.model == model},
            "decision": {**decision_json(decision), "provider": None if decision.placement
                         is None else decision.placement.provider},
            "verdicts": [{**verdict_json(v),
                          "expectedCachedTokens": cached.get((v.provider, v.model), 0)}
                         for v in verdicts],
        })

    async def state(self, request: Request) -> Response:
        snap = self.scheduler.snapshot(self.scheduler.clock.now())
        return _json({
            "providers": [{
                "name": v.name, "ready": v.ready, "totalVramMiB": v.total_vram_mib,
                "contextLength": v.context_length, "maxParallel": v.max_parallel,
                "maxLoadedModels": loaded_limit(v.max_loaded, v.gpus),
                "residents": [{"model": r.model, "footprintMiB": r.footprint_mib,
                               "contextLength": r.context_length,
                               **({"leaving": True} if r.leaving else {})}
                              for r in v.residents],
                "circuit": snap.health[v.name].circuit.value if v.name in snap.health else None,
            } for v in snap.providers],
            "tickets": [{"id": t.ticket_id, "provider": t.provider, "model": t.model,
                         "footprintMiB": t.footprint_mib, "cold": t.cold,
                         "evicts": dict(t.evicts), "holder": t.holder,
                         **({"crew": t.crew} if t.crew else {}),
                         "expiresIn_s": round(t.expires_at - snap.now, 1)}
                        for t in snap.tickets],
            "demand": {m: {"waiters": d.waiters, "intents": d.intents,
                           "recentUse": round(d.recent_use, 3),
                           "predicted": round(d.predicted, 3)}
                       for m, d in sorted(snap.demand.items())},
            "demandEntries": len(self.view.store.view(MODEL_DEMAND)),
            "plans": sorted(self.plans.plans),
            "sharedStateConnected": self.view.store.connected,
        })


async def _json_body(request: Request, limit: int, what: str, the_setting: bool
                     ) -> dict[str, Any] | Response:
    """The request's JSON object, or the error to answer: malformed, over `limit` bytes (the
    setting's, or the request's own), or too slow to arrive."""
    try:
        raw = await read_capped(request, limit)
        request.state.large_body = len(raw) > OFF_LOOP_BYTES
        return await off_loop(request.state.large_body, wire.parse_body, raw)
    except wire.BadRequest as exc:
        return error_response(400, "bad-request", str(exc))
    except RequestTooLarge:
        cap = f"the sidecar's limit of {limit} bytes (KUBEMOOT_MAX_REQUEST_BYTES)" \
            if the_setting else f"its own limit of {limit} bytes"
        return error_response(413, "request-too-large", f"the {what} request's body exceeds "
                              f"{cap}")
    except BodyTooSlow:
        return error_response(408, "request-timeout", f"the {what} request's body was slow")
