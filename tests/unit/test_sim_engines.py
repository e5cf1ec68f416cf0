"""Which of Ollama's engines the simulator runs a model on before 0.30, by version
(sim_engine.own_engine): NewLlamaServer takes Ollama's own engine when OLLAMA_NEW_ENGINE is set
or the architecture is in OllamaEngineRequired (fs/ggml/ggml.go), if the model registry
(`model.Register` under model/models/) has the model, "<arch>_embed" for a pooled one from
0.12.0 (v0.12.6 llm/server.go:149-169, v0.24.0 :144-164). The boundaries are the tags whose
lists first name each architecture (Ollama's source, read at every tag v0.11.5 to
v0.25.0-rc0)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from loadtest.sim_engine import (
    ENGINE_MODELS,
    ENGINE_REQUIRED,
    NO_EMBEDDING_MODEL,
    commits_before_read,
    embedding_refusal,
    own_engine,
    version_tuple,
)
from loadtest.sim_model import CATALOG

MIRROR = Path("/work/.mirror/ollama+ollama/repo")


@pytest.mark.parametrize(("arch", "embedding", "before", "since"), [
    ("nomic-bert", True, "0.13.0", "0.13.1"),  # v0.13.1 fs/ggml/ggml.go:254
    ("olmo3", False, "0.13.3", "0.13.4"),  # v0.13.4 :256, model/models/olmo3/model.go:222
    ("qwen3vl", False, "0.12.6", "0.12.7"),  # v0.12.7 :251, qwen3vl/model.go:202
    ("qwen3vlmoe", False, "0.12.6", "0.12.7"),
    ("deepseek2", False, "0.12.11", "0.13.0"),  # v0.13.0 :253
    ("bert", True, "0.13.4", "0.13.5"),  # v0.13.5 :244; bert_embed registered from 0.12.0
    ("bert", False, "0.13.4", "0.13.5"),
    ("glm4moelite", False, "0.14.2", "0.14.3"),  # v0.14.3 :272
    ("lfm2", False, "0.14.2", "0.14.3"),
    ("qwen3next", False, "0.15.4", "0.15.5"),  # v0.15.5 :271
    ("qwen35", False, "0.17.0", "0.17.1"),  # v0.17.1 :293
    ("nemotron_h", False, "0.17.0", "0.17.1"),
    ("gemma4", False, "0.19.0", "0.20.0"),  # v0.20.0 :284
    ("laguna", False, "0.21.2", "0.22.0"),  # v0.22.0 :286
    ("qwen3moe", False, "0.12.1", "0.12.2"),  # v0.12.2 :247
    ("qwen3", False, "0.11.11", "0.12.0"),  # v0.12.0 :246
])
def test_an_architecture_takes_ollamas_own_engine_from_the_tag_that_requires_it(
        arch: str, embedding: bool, before: str, since: str) -> None:
    assert not own_engine(arch, embedding, False, before)
    assert own_engine(arch, embedding, False, since)
    assert own_engine(arch, embedding, False, "0.24.0")
    assert own_engine(arch, embedding, False, "0.25.0")


def test_qwen3_ran_on_the_llama_engine_in_0_12_5_only() -> None:
    """v0.12.5's OllamaEngineRequired has no qwen3 (fs/ggml/ggml.go:243-250), v0.12.6 has it
    again (:246)."""
    assert [own_engine("qwen3", False, False, v) for v in ("0.12.4", "0.12.5", "0.12.6")] == \
        [True, False, True]
    assert own_engine("qwen3moe", False, False, "0.12.5")


@pytest.mark.parametrize(("arch", "version"), [
    ("gemma3n", "0.12.6"),  # gemma3n required, no gemma3n_embed registered
    ("gemma3n", "0.24.0"),
    ("mistral3", "0.24.0"),
    ("nomic-bert-moe", "0.24.0"),  # nomic-bert-moe_embed registered (0.13.3), not required
])
def test_a_pooled_model_without_an_embed_registration_stays_on_the_llama_engine(
        arch: str, version: str) -> None:
    assert not own_engine(arch, True, False, version)


def test_before_0_12_0_a_pooled_model_is_looked_up_by_its_bare_name() -> None:
    """v0.11.10's NewTextProcessor asks getTextProcessor for the bare architecture
    (model/model.go:141-143); modelForArch adds "_embed" from v0.12.0 (:145-149)."""
    assert own_engine("gemma3n", True, False, "0.11.11")
    assert not own_engine("gemma3n", True, False, "0.12.0")


def test_ollama_new_engine_takes_every_registered_model_from_its_registration() -> None:
    assert own_engine("llama", False, True, "0.12.6")
    assert not own_engine("llama", False, False, "0.24.0")
    assert not own_engine("phi3", False, True, "0.24.0")  # never registered
    assert not own_engine("deepseek2", False, True, "0.12.2")  # deepseek2/model.go:323
    assert own_engine("deepseek2", False, True, "0.12.3")
    assert not own_engine("nomic-bert", True, True, "0.12.11")  # nomicbert/model.go:169
    assert own_engine("nomic-bert", True, True, "0.13.0")
    assert own_engine("nomic-bert-moe", True, True, "0.13.3")  # nomicbert/model.go:243


def test_a_split_projector_goes_to_the_llama_engine_from_0_11_11() -> None:
    """v0.11.11 llm/server.go:151-154: "split vision models aren't supported"."""
    assert own_engine("gemma3", False, False, "0.11.10", split_projector=True)
    assert not own_engine("gemma3", False, False, "0.11.11", split_projector=True)
    assert not own_engine("gemma3", False, False, "0.24.0", split_projector=True)
    assert own_engine("gemma3", False, False, "0.24.0")


def test_there_is_no_ollamarunner_from_0_30() -> None:
    assert not own_engine("qwen3", False, False, "0.30.0")
    assert not own_engine("qwen3", False, True, "0.33.0")


def test_every_required_architecture_is_registered_when_it_is_required() -> None:
    for arch, toggles in ENGINE_REQUIRED.items():
        assert arch in ENGINE_MODELS, arch
        assert ENGINE_MODELS[arch] <= toggles[0], arch


def test_the_catalogs_embedder_commits_before_reading_from_0_13_1() -> None:
    nomic = next(m for m in CATALOG if m.arch == "nomic-bert")
    assert not commits_before_read(nomic.arch, nomic.embedding, "0.13.0", False)
    assert commits_before_read(nomic.arch, nomic.embedding, "0.13.1", False)
    assert commits_before_read(nomic.arch, nomic.embedding, "0.24.0", False)
    assert not commits_before_read(nomic.arch, nomic.embedding, "0.30.0", False)


def test_ollamarunner_refuses_every_embedding_before_0_11_10() -> None:
    """v0.11.5 runner/ollamarunner/runner.go:1031-1033; v0.11.10 :898-905 reads pooling."""
    assert embedding_refusal("gemma3", True, "0.11.9", False, False) == \
        (500, NO_EMBEDDING_MODEL)
    assert embedding_refusal("gemma3", True, "0.11.10", False, False) is None
    assert embedding_refusal("gemma3", False, "0.13.3", False, False) == \
        (501, NO_EMBEDDING_MODEL)
    assert embedding_refusal("nomic-bert", True, "0.13.1", False, False) is None


def tag_lists(tag: str) -> tuple[set[str], set[str]]:
    """OllamaEngineRequired's names and the registry's at an Ollama tag, from the mirror."""
    def show(path: str) -> str:
        return subprocess.run(["git", "-C", str(MIRROR), "show", f"{tag}:{path}"],
                              capture_output=True, text=True, check=True).stdout
    ggml = show("fs/ggml/ggml.go")
    body = ggml[ggml.index("func (kv KV) OllamaEngineRequired"):]
    required = set(re.findall(r'"([^"]+)"', body[:body.index("\n}")]))
    packages = re.findall(r'ollama/model/models/([^"]+)"', show("model/models/models.go"))
    files = subprocess.run(["git", "-C", str(MIRROR), "ls-tree", "-r", "--name-only", tag,
                            "model/models/"], capture_output=True, text=True,
                           check=True).stdout.split()
    registered: set[str] = set()
    for name in files:
        parts = name.split("/")
        if name.endswith(".go") and not name.endswith("_test.go") and parts[2] in packages:
            registered.update(re.findall(r'\bRegister\("([^"]+)"', show(name)))
    return required, registered


@pytest.mark.skipif(not MIRROR.exists(), reason="Ollama's source mirror is not here")
@pytest.mark.parametrize("tag", ["v0.11.5", "v0.11.10", "v0.12.0", "v0.12.2", "v0.12.3",
                                 "v0.12.5", "v0.12.6", "v0.12.7", "v0.13.0", "v0.13.1",
                                 "v0.13.3", "v0.13.4", "v0.13.5", "v0.14.3", "v0.15.5",
                                 "v0.17.1", "v0.20.0", "v0.22.0", "v0.24.0", "v0.25.0-rc0"])
def test_the_tables_hold_each_tags_lists(tag: str) -> None:
    required, registered = tag_lists(tag)
    v = version_tuple(tag[1:])
    assert {a for a, toggles in ENGINE_REQUIRED.items()
            if sum(at <= v for at in toggles) % 2} == required
    assert {name for name, since in ENGINE_MODELS.items() if since <= v} == registered
