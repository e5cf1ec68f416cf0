"""Which of Ollama's engines runs a model, as far as it decides when `/api/ps` lists a copy.

From 0.11.5 to 0.24 Ollama's own engine (runner/ollamarunner) returns from its load once the
memory is committed and reads the weights after (`go s.loadModel()`), and the scheduler lists
the copy meanwhile; the llama engine's load waits for its runner, as every load does from
0.30 (docs/engine.md, "Loads, one at a time on every version"). Which models take Ollama's
own engine grows by version (paths and tags below are Ollama's). OLLAMA_NEW_ENGINE (every
model in its registry) is the server's setting, which the sidecar does not see: the models
it would move to Ollama's own engine are taken to run on the llama engine.
"""

from __future__ import annotations

from proxy.core.context import Version, parse_version
from proxy.core.types import ModelInfo

# `go s.loadModel()` in runner/ollamarunner/runner.go: v0.11.5 :982 to v0.24.0 :1354; 0.30
# has no ollamarunner. (Before 0.11.5 every runner joined s.loaded at its spawn, with another
# loader: v0.11.4 server/sched.go:470-486, 239-269; not modelled.)
EARLY_RETURN: tuple[Version, Version] = ((0, 11, 5), (0, 30, 0))

# fs/ggml/ggml.go OllamaEngineRequired (v0.11.5 :175, v0.12.6 :241, v0.24.0 :277), by the
# release that added each architecture; each is in that release's registry
# (model/models/models.go, `model.Register`).
REQUIRED_SINCE: tuple[tuple[Version, frozenset[str]], ...] = (
    ((0, 11, 5), frozenset(("gemma3", "gemma3n", "mistral3", "llama4", "mllama", "qwen25vl",
                            "gptoss", "gpt-oss"))),
    ((0, 12, 0), frozenset(("qwen3",))),
    ((0, 12, 2), frozenset(("qwen3moe",))),
    ((0, 12, 7), frozenset(("qwen3vl", "qwen3vlmoe"))),
    ((0, 13, 0), frozenset(("deepseek2", "deepseekocr"))),
    ((0, 13, 1), frozenset(("nomic-bert",))),
    ((0, 13, 4), frozenset(("olmo3",))),
    ((0, 13, 5), frozenset(("bert",))),
    ((0, 14, 3), frozenset(("glm4moelite", "lfm2"))),
    ((0, 15, 5), frozenset(("glmocr", "qwen3next"))),
    ((0, 17, 1), frozenset(("lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen35",
                            "qwen35moe"))),
    ((0, 20, 0), frozenset(("gemma4",))),
    ((0, 22, 0), frozenset(("laguna", "nemotron_h_omni"))),
)
# v0.12.5 ran qwen3 on the llama engine (3d32249c7, reverted for v0.12.6 by 18087f2ec)
NOT_REQUIRED_AT: dict[Version, frozenset[str]] = {(0, 12, 5): frozenset(("qwen3",))}

# A pooled (embedding) model is looked up as `<arch>_embed` (model/model.go modelForArch:
# v0.11.10 :107-108, v0.12.6 :146-149); of the required architectures only these have one,
# each registered by the time it is required (gemma3_embed v0.11.10, qwen3_embed and
# bert_embed v0.12.0, nomic-bert_embed v0.13.0).
POOLED_SUFFIX_SINCE: Version = (0, 11, 10)
EMBED_REGISTERED = frozenset(("gemma3", "qwen3", "bert", "nomic-bert"))

# A split projector (`projector_info` in /api/show) goes to the llama engine from v0.11.11
# (NewLlamaServer, v0.12.6 llm/server.go:153-160)
SPLIT_PROJECTOR_REFUSED_SINCE: Version = (0, 11, 11)


def required(architecture: str, version: Version) -> bool:
    """OllamaEngineRequired of `architecture` at `version`."""
    if architecture in NOT_REQUIRED_AT.get(version, ()):
        return False
    return any(since <= version and architecture in names for since, names in REQUIRED_SINCE)


def own_engine(info: ModelInfo, version: Version) -> bool:
    """Whether Ollama `version` runs the model on its own engine without OLLAMA_NEW_ENGINE
    (NewLlamaServer: required, in the registry, no split projector)."""
    architecture = info.architecture or info.family
    if not required(architecture, version):
        return False
    if info.split_projector and version >= SPLIT_PROJECTOR_REFUSED_SINCE:
        return False
    return not (info.embedding and version >= POOLED_SUFFIX_SINCE) or \
        architecture in EMBED_REGISTERED


def lists_before_read(version: str, info: ModelInfo | None) -> bool:
    """Whether `/api/ps` of an Ollama at `version` lists a copy of the model once its memory
    is committed, while its runner still reads the weights. An unknown version ("") gets the
    newest rules, an unknown model (no /api/show) none: no gap."""
    parsed = parse_version(version)
    first, last = EARLY_RETURN
    return info is not None and first <= parsed < last and own_engine(info, parsed)
