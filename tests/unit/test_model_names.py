"""Model names as Ollama reads them (types/model/name.go), the sidecar's and the simulator's
copies alike; the tables are Ollama's own (types/model/name_test.go) where they apply."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from loadtest import sim_cloud
from loadtest.sim_model import CATALOG, SimConfig, name_parts, valid_name
from proxy.core.models import (
    CACHED_NAME_CHARS,
    CallModels,
    ModelRef,
    _normalise,
    _normalised,
    cloud_echo,
    is_valid_model_name,
    model_key,
    model_ref,
    normalise_model,
    ollama_name_parts,
    resolve_model,
    split_source,
)
from proxy.core.types import Candidate

P80, P350 = "8" * 80, "3" * 350

# name_test.go:15-141 TestParseNameParts, with ParseName's defaults (:39-41) filled in
PARTS = [
    ("registry.ollama.ai/library/dolphin-mistral:7b-v2.6-dpo-laser-q6_K",
     ("registry.ollama.ai", "library", "dolphin-mistral", "7b-v2.6-dpo-laser-q6_K")),
    ("scheme://host:port/namespace/model:tag", ("host:port", "namespace", "model", "tag")),
    ("host/namespace/model:tag", ("host", "namespace", "model", "tag")),
    ("host:port/namespace/model:tag", ("host:port", "namespace", "model", "tag")),
    ("host/namespace/model", ("host", "namespace", "model", "latest")),
    ("host:port/namespace/model", ("host:port", "namespace", "model", "latest")),
    ("namespace/model", ("registry.ollama.ai", "namespace", "model", "latest")),
    ("model", ("registry.ollama.ai", "library", "model", "latest")),
    ("h/nn/mm:t", ("h", "nn", "mm", "t")),
    (f"{P80}/{P80}/{P80}:{P80}", (P80, P80, P80, P80)),
    (f"{P350}/{P80}/{P80}:{P80}", (P350, P80, P80, P80)),
]


@pytest.mark.parametrize(("name", "parts"), PARTS)
def test_the_parts_of_a_name(name: str, parts: tuple[str, ...]) -> None:
    assert tuple(ollama_name_parts(name).values()) == parts
    assert name_parts(name) == parts


# name_test.go:143-190 testCases (ParseNameBare(s).IsValid()), the entries whose answer
# ParseName's defaults do not change, and the defaults' own: a missing part is filled in
VALID = {
    "_why/_the/_lucky:_stiff": True, "h/n/m:t": True, "host/namespace/model:tag": True,
    f"{P80}/{P80}/{P80}:{P80}": True, f"{P350}/{P80}/{P80}:{P80}": True, "h/nn/mm:t": True,
    "host:https/namespace/model:tag": True,
    "": False, "n/m:": False, "@t": False, "m@d": False, "^": False, "mm:": False,
    "/nn/mm": False, "//": False, "//mm": False, "hh//": False, "//mm:@": False, "00@": False,
    "@": False, "-hh/nn/mm:tt": False, "hh/-nn/mm:tt": False, "hh/nn/-mm:tt": False,
    "hh/nn/mm:-tt": False, "host/name:space/model:tag": False,
    # what ParseName's defaults complete (name_test.go:193-201), and what is too long
    "model": True, "h/n/m": True, "namespace/model": True, "Qwen3:8B": True,
    f"{'3' * 351}/n/m:t": False, f"{'8' * 81}": False, "my.team/m": False, "qwen3:8b!": False,
}


@pytest.mark.parametrize(("name", "valid"), VALID.items())
def test_which_names_ollama_takes(name: str, valid: bool) -> None:
    assert is_valid_model_name(name) is valid
    assert valid_name(name) is valid


# name_test.go:292-309 TestDisplayShortest, and the defaults filled in first
@pytest.mark.parametrize(("name", "shortest"), [
    ("registry.ollama.ai/library/model:latest", "model:latest"),
    ("registry.ollama.ai/library/model:tag", "model:tag"),
    ("registry.ollama.ai/namespace/model:tag", "namespace/model:tag"),
    ("host/namespace/model:tag", "host/namespace/model:tag"),
    ("host/library/model:tag", "host/library/model:tag"),
    ("library/qwen3:8b", "qwen3:8b"), ("qwen3", "qwen3:latest"),
    ("REGISTRY.ollama.ai/Library/Qwen3:8B", "Qwen3:8B"),  # EqualFold on host and namespace
    ("hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M", "hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M"),
])
def test_the_name_as_ollama_lists_it(name: str, shortest: str) -> None:
    assert normalise_model(name) == shortest


SPELLINGS = ("qwen3:8b", "Qwen3:8B", "library/qwen3:8b", "registry.ollama.ai/library/qwen3:8b",
             "REGISTRY.OLLAMA.AI/LIBRARY/QWEN3:8B")


@pytest.mark.parametrize("name", SPELLINGS)
def test_every_spelling_of_a_model_is_the_one_the_fleet_lists(name: str) -> None:
    assert model_key(name) == "qwen3:8b"
    assert resolve_model(name, ("phi3:mini", "qwen3:8b")) == "qwen3:8b"
    models = CallModels((Candidate("qwen3:8b", 2.0), Candidate("phi3:mini", 1.0)), "phi3:mini")
    assert [c.model for c in models.for_call("mulling", name) or ()] == \
        ["qwen3:8b", "phi3:mini"]
    assert models.for_call("triage", name) == (Candidate("qwen3:8b"),)


def test_a_model_the_fleet_spells_in_capitals_keeps_its_spelling() -> None:
    known = ("hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M",)
    assert resolve_model("hf.co/unsloth/qwen3-8b-gguf:q4_k_m", known) == known[0]
    assert resolve_model("nomic-embed-text", known) == "nomic-embed-text:latest"


@pytest.mark.parametrize("name", [*SPELLINGS, "NOMIC-EMBED-TEXT"])
def test_the_simulator_finds_every_spelling(name: str) -> None:
    config = SimConfig(name="gpu", total_vram_mib=24576, models=CATALOG)
    found = config.model(name)
    assert found is not None
    assert model_key(found.name) == model_key(name)


# modelref_test.go TestParseRef: (name, base, source); the simulator's copy reads it alike
SOURCES = [
    ("gpt-oss:20b:cloud", "gpt-oss:20b", "cloud"),
    ("gpt-oss:20b-cloud", "gpt-oss:20b", "cloud"),
    ("qwen3:8b:local", "qwen3:8b", "local"),
    ("llama3.2", "llama3.2", ""),
    ("my-cloud-model", "my-cloud-model", ""),
    ("foo:bar-cloud/baz", "foo:bar-cloud/baz", ""),
    ("gpt-oss:CLOUD", "gpt-oss", "cloud"),
    ("  qwen3:8b:local ", "qwen3:8b", "local"),
]


@pytest.mark.parametrize(("name", "base", "source"), SOURCES)
def test_the_source_a_name_asks_for(name: str, base: str, source: str) -> None:
    assert model_ref(name) == ModelRef(base, source)
    assert split_source(name) == (base if source == "local" else name, source)
    assert split_source(name, reads_source=False)[0] == name
    assert cloud_echo(name) == (base if source == "cloud" else name)
    routed = sim_cloud.route(name, "0.18.0", ())
    assert routed == (sim_cloud.ToCloud(base, base) if source == "cloud" else base)
    assert sim_cloud.route(name, "0.17.7", ()) == name  # before 0.18: a name like any other


@pytest.mark.parametrize("name", ["foo:cloud:local", "qwen3:8b:local:cloud", "x:8b-cloud:local"])
def test_a_name_that_asks_for_two_sources_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="use either :local or :cloud, not both"):
        model_ref(name)
    assert sim_cloud.route(name, "0.18.0", ()) == sim_cloud.Refused(
        400, f'use either :local or :cloud, not both: "{name}"')


@pytest.mark.parametrize(("name", "placed", "source"), [
    ("registry.example.com:5000/ns/model:9b", "registry.example.com:5000/ns/model:9b", ""),
    ("registry.example.com:5000/ns/some-model", "registry.example.com:5000/ns/some-model", ""),
    ("host:5000/ns/model-cloud", "host:5000/ns/model-cloud", ""),
    ("localhost:11434/library/foo:cloud", "localhost:11434/library/foo:cloud", "cloud"),
    ("host:5000/ns/model:local", "host:5000/ns/model", "local"),
])
def test_a_colon_in_the_host_is_no_source_suffix(name: str, placed: str, source: str) -> None:
    """modelref.go reads only what follows the last colon: a registry's port never names a
    source (modelref_test.go TestHasExplicitTag, TestNormalizePullName)."""
    assert split_source(name) == (placed, source)
    assert is_valid_model_name(model_ref(name).base)
    assert cloud_echo(name) == (model_ref(name).base if source == "cloud" else name)


@given(st.text(max_size=700))
def test_a_remembered_name_reads_as_a_fresh_one(name: str) -> None:
    assert normalise_model(name) == _normalise(name)
    assert normalise_model(name) == _normalise(name)  # the second answer is the cache's


def test_names_longer_than_ollama_allows_are_not_remembered() -> None:
    _normalised.cache_clear()
    normalise_model("qwen3:8b")
    for n in range(20):
        normalise_model("x" * (CACHED_NAME_CHARS + 1) + str(n))
    assert _normalised.cache_info().currsize == 1
    assert normalise_model("a/b/" + P350) == _normalise("a/b/" + P350)
