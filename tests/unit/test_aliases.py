"""Names of one model (one manifest digest): placed under one name in every sidecar, sent to
each card under a name it has (core/aliases.py, StateView, the relay)."""

from __future__ import annotations

import orjson

from proxy.adapters.ollama import OllamaClient
from proxy.api.relay import payload_for
from proxy.core.aliases import canonical_names, fold, names_here
from proxy.service.routing import Attempt

QWEN3, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_names_of_one_manifest_on_any_card_are_placed_under_the_first() -> None:
    cards = [{"qwen3:8b": QWEN3, "phi3:mini": OTHER},
             {"qwen3:latest": QWEN3, "my-qwen:latest": QWEN3, "llama3.2:3b": ""}]
    assert canonical_names(cards) == {"qwen3:latest": "my-qwen:latest",
                                      "qwen3:8b": "my-qwen:latest"}
    # a name of its own, or a digest no card gave, is no alias
    assert canonical_names([{"qwen3:8b": QWEN3}, {"llama3.2:3b": ""}, {"x:1": ""}]) == {}
    # a name that is another manifest on another card is no alias (nor are the others
    # of its digest on its account)
    assert canonical_names([{"tiny:latest": OTHER},
                            {"tiny:latest": QWEN3, "onlyb:latest": QWEN3}]) == {}


def test_a_cards_figures_fold_to_the_placed_name_and_its_own_names_are_kept() -> None:
    canonical = {"qwen3:latest": "qwen3:8b"}
    assert fold({"qwen3:latest": 1, "phi3:mini": 2}, canonical) == {"qwen3:8b": 1,
                                                                     "phi3:mini": 2}
    # both names on the card: the placed name's own entry
    assert fold({"qwen3:latest": 1, "qwen3:8b": 5}, canonical) == {"qwen3:8b": 5}
    assert names_here("qwen3:8b", ["qwen3:latest", "phi3:mini"], canonical) == \
        ("qwen3:latest",)
    assert names_here("qwen3:8b", ["qwen3:latest", "qwen3:8b"], canonical) == \
        ("qwen3:8b", "qwen3:latest")


def test_a_call_goes_to_a_card_under_the_name_asked_if_it_has_it_else_its_own() -> None:
    client = OllamaClient("http://127.0.0.1:1")
    on_both = Attempt("p", client, "qwen3:8b", "warm", any_spelling=True,
                      names_here=("qwen3:8b", "qwen3:latest"))
    only_alias = Attempt("p", client, "qwen3:8b", "warm", any_spelling=True,
                         names_here=("qwen3:latest",))

    def sent(attempt: Attempt, asked: str) -> str:
        return str(orjson.loads(payload_for(attempt, {"model": asked, "messages": []}))["model"])

    assert sent(on_both, "qwen3") == "qwen3"  # its own spelling, echoed back by Ollama
    assert sent(on_both, "qwen3:8b") == "qwen3:8b"
    assert sent(only_alias, "qwen3:8b") == "qwen3:latest"  # the card has no qwen3:8b
    assert sent(only_alias, "Qwen3") == "Qwen3"
    older = Attempt("p", client, "qwen3:8b", "warm", names_here=("qwen3:latest",))
    assert sent(older, "Qwen3") == "qwen3:latest"  # an engine that wants its own spelling


def test_the_digests_go_through_the_shared_state_and_an_older_entry_has_none() -> None:
    from proxy.service.codec import ProviderState

    state = ProviderState("gpu", "http://gpu:11434", True, 1.0e9,
                          available_mib={"qwen3:8b": 5000, "qwen3:latest": 5000},
                          digests={"qwen3:8b": QWEN3, "qwen3:latest": QWEN3})
    assert ProviderState.decode(state.encode()).digests == state.digests
    older = orjson.loads(state.encode())
    del older["availableModelDigests"]
    assert ProviderState.decode(orjson.dumps(older)).digests == {}  # nothing folded
