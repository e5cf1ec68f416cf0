"""Which models Ollama runs on its own engine, by version, so far as it decides whether
`/api/ps` lists a copy before its weights are read (proxy/core/engines.py; checked at Ollama's
tags v0.11.4 to v0.30.0: fs/ggml/ggml.go OllamaEngineRequired, model/models/models.go,
runner/ollamarunner/runner.go `go s.loadModel()`)."""

from __future__ import annotations

import pytest

from loadtest.sim_engine import commits_before_read
from loadtest.sim_model import CATALOG, SimModel
from proxy.core.engines import lists_before_read
from proxy.core.types import ModelInfo
from proxy.service.codec import decode_model_info, encode_model_info
from proxy.service.prober import model_info


def arch(name: str, embedding: bool = False, split_projector: bool = False) -> ModelInfo:
    return ModelInfo(architecture=name, embedding=embedding, split_projector=split_projector)


@pytest.mark.parametrize(("version", "info", "listed"), [
    ("0.12.6", arch("qwen3"), True),
    ("0.24.0", arch("qwen3"), True),  # the last release with ollamarunner
    ("0.30.0", arch("qwen3"), False),  # llama-server: listed once it runs
    ("", arch("qwen3"), False),  # unknown: the newest rules
    ("0.11.4", arch("gemma3"), False),  # no early return yet
    ("0.11.5", arch("gemma3"), True),
    ("0.11.11", arch("qwen3"), False),  # qwen3 required from 0.12.0
    ("0.12.0", arch("qwen3"), True),
    ("0.12.5", arch("qwen3"), False),  # that release ran qwen3 on the llama engine
    ("0.12.1", arch("qwen3moe"), False),  # required from 0.12.2
    ("0.12.2", arch("qwen3moe"), True),
    ("0.12.6", arch("llama"), False),  # llama3.2: the llama engine
    ("0.12.6", arch("phi3"), False),  # not in the registry
    ("0.13.0", arch("nomic-bert", embedding=True), False),  # required from 0.13.1
    ("0.13.1", arch("nomic-bert", embedding=True), True),  # nomic-bert_embed registered
    ("0.12.6", arch("qwen3", embedding=True), True),  # qwen3_embed
    ("0.12.6", arch("gemma3n", embedding=True), False),  # no gemma3n_embed
    ("0.11.9", arch("gemma3n", embedding=True), True),  # pooled looked up as itself then
    ("0.11.10", arch("gemma3", split_projector=True), True),  # not yet refused
    # the engine choice looks a pooled model up by its bare architecture until 0.12.0
    ("0.11.11", arch("gemma3n", embedding=True), True),
    ("0.12.0", arch("gemma3n", embedding=True), False),  # no gemma3n_embed
    ("0.11.11", arch("gemma3", split_projector=True), False),  # the llama engine
    ("0.20.0", arch("gemma4"), True),
    ("0.19.0", arch("gemma4"), False),
    ("0.12.6", ModelInfo(family="qwen3"), True),  # the family stands in for an unknown arch
    ("0.12.6", ModelInfo(family="qwen3", architecture="llama"), False),
    ("0.12.6", None, False),  # no /api/show: nothing known
])
def test_a_copy_is_listed_before_its_weights_are_read_on_the_own_engine_by_version(
        version: str, info: ModelInfo | None, listed: bool) -> None:
    assert lists_before_read(version, info) is listed


@pytest.mark.parametrize("version", ["0.12.5", "0.12.6", "0.13.0", "0.13.1", "0.24.0"])
@pytest.mark.parametrize("model", CATALOG, ids=lambda m: m.name)
def test_the_sidecar_and_the_simulator_agree_by_version(model: SimModel, version: str) -> None:
    """What the sidecar reads of the simulator's /api/show gives the simulator's own rule,
    which reads each version's lists (sim_engine.own_engine)."""
    info = model_info({"model_info": model.model_info(),
                       "details": {"family": model.model_family}})
    assert lists_before_read(version, info) is commits_before_read(
        model.arch, model.embedding, version, new_engine=False)


def test_the_architecture_and_a_split_projector_are_read_from_show_and_shared() -> None:
    show = {"model_info": {"general.architecture": "gemma3"}, "details": {"family": "gemma3"},
            "projector_info": {"general.architecture": "clip"}}
    info = model_info(show)
    assert (info.architecture, info.split_projector) == ("gemma3", True)
    assert not model_info({"model_info": {"general.architecture": "qwen3"}}).split_projector
    assert decode_model_info(encode_model_info(info)) == info
    older = decode_model_info({"trainedContext": 4096, "family": "qwen3"})  # an older writer
    assert (older.architecture, older.split_projector) == ("", False)


@pytest.mark.parametrize("version", ["0.11.5", "0.11.10", "0.11.11", "0.12.0", "0.12.5",
                                     "0.12.7", "0.13.0", "0.13.1", "0.13.4", "0.17.1",
                                     "0.24.0"])
@pytest.mark.parametrize("embedding", [False, True])
def test_the_sidecar_and_the_simulator_agree_on_every_listed_architecture(
        version: str, embedding: bool) -> None:
    """Each table was read from Ollama's source apart (proxy/core/engines.py,
    loadtest/sim_engine.py): they agree for every architecture either lists, pooled or not."""
    from loadtest.sim_engine import ENGINE_MODELS, ENGINE_REQUIRED
    names = {n.removesuffix("_embed") for n in ENGINE_MODELS} | set(ENGINE_REQUIRED) | {"phi3"}
    for name in sorted(names):
        assert lists_before_read(version, arch(name, embedding)) is commits_before_read(
            name, embedding, version, new_engine=False), name
