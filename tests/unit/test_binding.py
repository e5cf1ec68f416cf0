"""Live bindings, pure: the providers' live state over the documents, an agent's binding,
what counts as a change, and a discussion's pinned binding."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loadtest.sim_model import CATALOG
from proxy.core.types import ModelInfo
from proxy.operator import binding as b
from proxy.operator import candidates
from proxy.operator import scheduling as s
from proxy.operator.scheduling import Options
from proxy.service.codec import ProviderState
from proxy.service.prober import model_info
from tests.binding_docs import AGENT, NAMESPACE, state, write_documents

NOW = 1_700_000_000.0
STALE_S = 15.0


def live(tmp_path: Path, states: dict[str, object], **weights: object) -> candidates.Documents:
    write_documents(tmp_path, **weights)
    docs = candidates.load([str(tmp_path)])
    return replace(docs, providers=b.live_providers(docs.providers, states, NOW,  # type: ignore[arg-type]
                                                     STALE_S))


def bind(docs: candidates.Documents) -> dict[str, object]:
    agent, crew = docs.agents[0]
    return b.agent_binding(agent, crew, docs, Options())


def test_keys_are_kv_safe_and_agent_keys_never_look_like_thread_keys() -> None:
    assert b.agent_key("crew", "tooler") == "crew=2Ftooler"
    assert b.thread_key("t.1 x", "mulling") == "thread.t=2E1=20x.mulling"
    assert "." not in b.agent_key("a.b", "c.d")
    assert b.thread_subject("t.1", "triage") == "kubemoot.scheduling.t=2E1.triage"


def test_live_state_decides_readiness_and_capacity(tmp_path: Path) -> None:
    fresh = state("gpu-a", NOW - 1)
    old = state("gpu-b", NOW - STALE_S - 1)
    docs = live(tmp_path, {"gpu-a": replace(fresh, loaded_mib={"qwen3:14b": 9000}),
                           "gpu-b": old})
    a, b_ = docs.providers["gpu-a"], docs.providers["gpu-b"]
    assert a.ready and a.vram_used_mib == 9000 and a.loaded == ("qwen3:14b",)
    assert a.endpoint == "http://gpu-a:11434" and a.on_disk == {"qwen3:14b", "qwen3:8b"}
    assert not b_.ready and b_.not_ready == "state 16 s old"


def test_a_provider_nobody_publishes_for_is_not_ready(tmp_path: Path) -> None:
    docs = live(tmp_path, {"gpu-b": state("gpu-b", NOW)})
    binding = bind(docs)
    # the 14B model's provider has no state: the 8B one is preferred, the 14B still listed
    assert binding["preferred"] == "qwen3:8b"
    assert [c["model"] for c in binding["candidates"]["mulling"]] == ["qwen3:8b", "qwen3:14b"]


def test_the_agent_binding_names_preferred_candidates_and_unschedulable_phases(
        tmp_path: Path) -> None:
    docs = live(tmp_path, {"gpu-a": state("gpu-a", NOW)})  # gpu-b (triage's only) is silent
    binding = bind(docs)
    assert binding["preferred"] == "qwen3:14b"
    assert binding["phases"]["mulling"]["provider"] == "gpu-a"
    assert binding["candidates"]["mulling"] == [
        {"model": "qwen3:14b", "score": 100, "vramMib": 9300},
        {"model": "qwen3:8b", "score": 50, "vramMib": 5200}]
    assert binding["phases"]["triage"] is None
    [failed] = binding["unschedulable"]
    assert failed["phase"] == "triage" and "gpu-b not Ready (no state published)" in \
        failed["reason"] and failed["crewSchedulingPolicy"] == "crew-policy"


def test_a_model_missing_from_the_providers_disk_is_not_feasible(tmp_path: Path) -> None:
    without = replace(state("gpu-a", NOW), available_mib={"qwen3:8b": 5200})
    binding = bind(live(tmp_path, {"gpu-a": without, "gpu-b": state("gpu-b", NOW)}))
    assert binding["preferred"] == "qwen3:8b"


def test_a_new_score_alone_is_no_change_a_new_order_is(tmp_path: Path) -> None:
    states = {"gpu-a": state("gpu-a", NOW), "gpu-b": state("gpu-b", NOW)}
    first = bind(live(tmp_path, states))
    loaded = replace(states["gpu-a"], loaded_mib={"qwen3:8b": 5000})  # capacity moves
    second = bind(live(tmp_path, {**states, "gpu-a": loaded}))
    assert first["phases"]["mulling"]["score"] != second["phases"]["mulling"]["score"]
    assert b.substance(first) == b.substance(second)
    flipped = bind(live(tmp_path, states, big=20, small=100))
    assert b.substance(first) != b.substance(flipped)


def test_next_stale_at_is_the_earliest_fresh_state_turning_stale() -> None:
    states = {"a": state("a", NOW - 10), "b": state("b", NOW - 2), "c": state("c", NOW - 99)}
    assert b.next_stale_at(states, NOW, STALE_S) == NOW - 10 + STALE_S
    assert b.next_stale_at({}, NOW, STALE_S) is None


def _discussion(docs: candidates.Documents, current: dict[str, object] | None
                ) -> dict[str, dict[str, object]]:
    agent, crew = docs.agents[0]
    who = b.agent_id(NAMESPACE, AGENT)
    ask = b.Ask("t1", "mulling", NAMESPACE, AGENT, NOW)
    return b.discussion_agents([ask], current, {who: bind(docs)}, {who: (agent, crew)},
                               docs, Options())


def test_a_discussion_keeps_its_model_through_a_rescore_and_rebinds_when_it_is_lost(
        tmp_path: Path) -> None:
    states = {"gpu-a": state("gpu-a", NOW), "gpu-b": state("gpu-b", NOW)}
    who = b.agent_id(NAMESPACE, AGENT)
    first = _discussion(live(tmp_path, states), None)
    assert first[who]["model"] == "qwen3:14b" and first[who]["provider"] == "gpu-a"
    assert first[who]["reason"] == "bound when the thread asked"
    current = {"agents": first}
    # the policy now prefers the 8B: the agent's binding moves, the discussion does not
    rescored = live(tmp_path, states, big=20, small=100)
    assert bind(rescored)["preferred"] == "qwen3:8b"
    assert _discussion(rescored, current) == first
    # the 14B's provider drops: the discussion is re-bound to the agent's binding of now
    dropped = live(tmp_path, {**states, "gpu-a": replace(states["gpu-a"], ready=False)},
                   big=20, small=100)
    moved = _discussion(dropped, current)
    assert moved[who]["model"] == "qwen3:8b"
    assert moved[who]["reason"].startswith("re-bound: big: provider gpu-a not Ready")
    assert [c["model"] for c in moved[who]["candidates"]] == ["qwen3:8b", "qwen3:14b"]


def test_a_discussion_ignores_asks_of_agents_the_documents_do_not_have(tmp_path: Path) -> None:
    docs = live(tmp_path, {"gpu-a": state("gpu-a", NOW), "gpu-b": state("gpu-b", NOW)})
    ask = b.Ask("t1", "mulling", "other", "stranger", NOW)
    assert b.discussion_agents([ask], None, {}, {}, docs, Options()) == {}


def _configmap_update(volume: Path, files: dict[str, str], version: int) -> None:
    """What the kubelet does to a mounted ConfigMap: a new timestamped directory, the
    `..data` symlink swapped to it, each file a symlink through `..data`."""
    target = volume / f"..2026_12_01_00_00_0{version}"
    target.mkdir()
    for name, text in files.items():
        (target / name).write_text(text)
    staged = volume / "..data_tmp"
    staged.symlink_to(target.name)
    staged.replace(volume / "..data")
    for name in files:
        link = volume / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_a_mounted_configmap_is_read_once_and_again_when_its_content_changes(
        tmp_path: Path) -> None:
    from proxy.operator.binder import DocumentSource
    from tests.binding_docs import documents

    _configmap_update(tmp_path, {"crew.yaml": documents()}, 1)
    source = DocumentSource([str(tmp_path)])
    assert source.poll() and source.docs is not None
    assert len(source.docs.agents) == 1 and len(source.docs.models) == 2  # not twice
    assert not source.poll()  # nothing changed
    _configmap_update(tmp_path, {"crew.yaml": documents(big=20, small=100)}, 2)
    assert source.poll()
    policy = source.docs.policies[0]
    assert [p.weight for p in policy.rules[0].prefer] == [20, 100]
    # a broken edit keeps the last good documents in force
    _configmap_update(tmp_path, {"crew.yaml": "kind: [unclosed"}, 3)
    assert source.poll() and source.error and "malformed YAML" in source.error
    assert source.docs.policies[0] is policy


ROOT = Path(__file__).resolve().parents[2]
PROD_DISK = {"qwen3:32b": 20200, "qwen3:14b": 9300, "qwen3:8b": 5200}


def shown() -> dict[str, ModelInfo]:
    """The simulator's models as the publisher reads their /api/show."""
    return {m.name: model_info({"model_info": m.model_info(),
                                "details": {"family": m.model_family}})
            for m in CATALOG if m.name in PROD_DISK}


def prod_fleet(loaded_on_a: dict[str, int], total_a: int = 32768,
               architectures: bool = False, disk_without: tuple[str, ...] = (),
               gpus_a: int = 1) -> candidates.Documents:
    """config/bundles/prod with live state: a 32 GiB and a 24 GiB card, every model on
    disk but `disk_without`; without `architectures` the declared vramMib decides the fit."""
    disk = {m: mib for m, mib in PROD_DISK.items() if m not in disk_without}
    docs = candidates.load([str(ROOT / "config" / "crew"), str(ROOT / "config" / "archetypes"),
                            str(ROOT / "config" / "bundles" / "prod")])
    models = shown() if architectures else {}
    states = {
        "ollama-a": ProviderState("ollama-a", "http://a:11434", True, NOW, total_a,
                                  max_parallel=1, gpus=gpus_a, loaded_mib=dict(loaded_on_a),
                                  available_mib=dict(disk), models=models),
        "ollama-b": ProviderState("ollama-b", "http://b:11434", True, NOW, 24576,
                                  max_parallel=2, available_mib=dict(disk),
                                  models=models)}
    return replace(docs, providers=b.live_providers(docs.providers, states, NOW, STALE_S))


def synthesizer(docs: candidates.Documents, current: dict[str, object] | None
                ) -> dict[str, object]:
    agent, crew = next(a for a in docs.agents if a[0].name == "synthesizer")
    return b.agent_binding(agent, crew, docs, Options(), current)


def mulling(binding: dict[str, object]) -> tuple[str, float]:
    chosen = binding["phases"]["mulling"]  # type: ignore[index]
    return chosen["model"], chosen["score"]


def test_a_binding_does_not_follow_a_model_loading_and_unloading() -> None:
    # The 14B loaded on the 32 GiB card ties the 32B exactly (+10 loaded = the 70 - 60
    # quality gap); a tie used to go to the smaller model, and back at the next unload.
    fleets = [{}, {"qwen3:14b": 10240}, {}, {"qwen3:14b": 10240}, {"qwen3:8b": 6000},
              {"qwen3:14b": 10240}]
    current = None
    models = []
    for loaded in fleets:
        binding = synthesizer(prod_fleet(loaded), current)
        models.append(mulling(binding)[0])
        current = binding
    assert models == ["qwen3:32b"] * len(fleets)
    # the tie itself, without a binding to keep: the smaller model, as ranked
    first_14b, _ = mulling(synthesizer(prod_fleet({"qwen3:14b": 10240}), None))
    assert first_14b == "qwen3:14b"


def test_a_binding_moves_when_beaten_by_more_than_the_margin() -> None:
    fleet = prod_fleet({})
    held = synthesizer(fleet, None)
    held["phases"]["mulling"].update(model="qwen3:8b", modelRef="qwen3-8b-a")  # type: ignore[index]
    moved = synthesizer(fleet, held)
    assert mulling(moved)[0] == "qwen3:32b"  # 40 quality points above the 8B it held
    # bound at the tie (the 14B loaded), it gives way to the 32B, whose merit (the score
    # without the loaded bonus) leads by 10, and stays there
    at_tie = synthesizer(prod_fleet({"qwen3:14b": 10240}), None)
    assert mulling(at_tie)[0] == "qwen3:14b"
    moved = synthesizer(prod_fleet({"qwen3:14b": 10240}), at_tie)
    assert mulling(moved)[0] == "qwen3:32b"
    assert mulling(synthesizer(prod_fleet({"qwen3:14b": 10240}), moved))[0] == "qwen3:32b"


def test_a_binding_comes_back_once_its_model_does() -> None:
    """A fallback while the 32B was gone from the disk is not kept by the 14B's being
    loaded (its bound agents keep it so): the 32B's merit leads by 10 points."""
    bound = synthesizer(prod_fleet({}), None)
    assert mulling(bound)[0] == "qwen3:32b"
    gone = prod_fleet({"qwen3:14b": 10240}, disk_without=("qwen3:32b",))
    fallback = synthesizer(gone, bound)
    assert mulling(fallback)[0] == "qwen3:14b"
    back = synthesizer(prod_fleet({"qwen3:14b": 10240}), fallback)
    assert mulling(back)[0] == "qwen3:32b"


def test_the_operator_sizes_a_model_as_the_sidecar_does() -> None:
    # The sidecar's explain on this card: "needs 29467 MiB at context 32768, card has
    # 28836 MiB usable" (20200 MiB of file + 307 MiB of logits for a batch of 512, no copy
    # seen, + 8192 MiB of KV + 768 MiB for the larger batch)
    binding = synthesizer(prod_fleet({}, architectures=True), None)
    assert mulling(binding)[0] == "qwen3:14b"
    fleet = prod_fleet({}, architectures=True)
    big = next(m for m in fleet.models if m.name == "qwen3-32b")
    provider, why = s.feasibility(big, fleet.providers, Options())
    assert provider is None
    assert why == ("qwen3-32b: needs 29467 MiB at context 32768 + 3932 MiB overhead, "
                   "ollama-a has 32768 MiB")
    # without the architecture, the declared 20480 MiB + the overhead fits: what was bound
    assert mulling(synthesizer(prod_fleet({}), None))[0] == "qwen3:32b"
    # a 48 GiB card takes it (at its trained context, 40960: 32488 MiB)
    roomy = prod_fleet({}, total_a=49152, architectures=True)
    assert s.feasibility(big, roomy.providers, Options())[0] is not None


def test_the_operator_keeps_the_reserve_on_each_gpu_of_a_provider() -> None:
    # 24 GiB over three 8 GiB GPUs keeps 3 x 2048 MiB, as the sidecar does
    # (Policy.reserve_mib): the 32B's declared 20480 MiB fit one 24 GiB card, not this
    one_card = prod_fleet({}, total_a=24576)
    big = next(m for m in one_card.models if m.name == "qwen3-32b")
    assert s.feasibility(big, one_card.providers, Options())[0] is not None
    three = prod_fleet({}, total_a=24576, gpus_a=3)
    provider, why = s.feasibility(big, three.providers, Options())
    assert provider is None
    assert why == ("qwen3-32b: needs 20480 MiB + 6144 MiB overhead, ollama-a has 24576 MiB")
    state = three.providers["ollama-a"]
    assert state.view is not None and state.view.gpus == 3
