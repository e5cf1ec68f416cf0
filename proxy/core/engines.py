"""Which of Ollama's engines runs a model, as far as it decides when `/api/ps` lists a copy,
whether the model can embed, and how long an input its embedding takes.

From 0.11.5 to 0.24 Ollama's own engine (runner/ollamarunner) returns from its load once the
memory is committed and reads the weights after (`go s.loadModel()`), and the scheduler lists
the copy meanwhile; the llama engine's load waits for its runner, as every load does from
0.30 (docs/engine.md, "Loads, one at a time on every version"). Which models take Ollama's
own engine grows by version (paths and tags below are Ollama's). OLLAMA_NEW_ENGINE (every
model in its registry) is the server's setting, which the sidecar does not see: the models
it would move to Ollama's own engine are taken to run on the llama engine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from proxy.core.context import Version, parse_version
from proxy.core.types import Lack, ModelInfo

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

# From 0.12.0 NewLlamaServer's NewTextProcessor looks a pooled (embedding) model up as
# `<arch>_embed` (model/model.go modelForArch: v0.12.0 :145-156, v0.12.6 :146-149); before,
# by its bare architecture (v0.11.10 getTextProcessor :141-143; the `_embed` of :107-108 is
# the runner's model.New, which then fails to find one). Of the required architectures only
# these have one, each registered by the time it is required (gemma3_embed v0.11.10,
# qwen3_embed and bert_embed v0.12.0, nomic-bert_embed v0.13.0).
POOLED_SUFFIX_SINCE: Version = (0, 12, 0)
EMBED_REGISTERED = frozenset(("gemma3", "qwen3", "bert", "nomic-bert"))

# A split projector (`projector_info` in /api/show) goes to the llama engine from v0.11.11
# (NewLlamaServer, v0.12.6 llm/server.go:153-160)
SPLIT_PROJECTOR_REFUSED_SINCE: Version = (0, 11, 11)


def listed_by(table: Iterable[tuple[Version, frozenset[str]]], architecture: str,
              version: Version) -> bool:
    """Whether a table of architectures by the release that listed each has `architecture`
    at `version`."""
    return any(since <= version and architecture in names for since, names in table)


def required(architecture: str, version: Version) -> bool:
    """OllamaEngineRequired of `architecture` at `version`."""
    if architecture in NOT_REQUIRED_AT.get(version, ()):
        return False
    return listed_by(REQUIRED_SINCE, architecture, version)


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


# From 0.30 every GGUF model runs in llama-server, started with `--embedding` only for a
# model with `<arch>.pooling_type` (llm/llama_server.go:866, 941, 581-588): another answers
# an embedding with llama.cpp's 501, which Ollama passes on (normalizeEmbeddingError,
# :2381-2382, 2435-2446; EmbedHandler server/routes.go:1000-1007, the legacy handler 500,
# :1084-1088). The model is loaded first, and stays (scheduleRunner, :854, :1072).
LLAMA_SERVER_SINCE: Version = EARLY_RETURN[1]
NO_EMBEDDING_SERVER = "This server does not support embeddings. Start it with `--embeddings`"
# Ollama's own engine (0.11.5-0.24) refuses with 501 to embed with a model it does not pool:
# any model before 0.11.10 (runner/ollamarunner/runner.go v0.11.5:1032-1033), one without a
# pooling type from then (v0.11.10:902-903, v0.12.6:937-939). Ollama answered that 500 on
# every path (v0.12.6 server/routes.go:733-734, 788-791) until 0.13.3 passed the runner's
# status on from /api/embed (e082d60a2; v0.24.0 llm/server.go:1794-1799). The llama engine
# embeds with any model.
NO_EMBEDDING_MODEL = "this model does not support embeddings"
POOLED_EMBEDDING_SINCE: Version = (0, 11, 10)
RUNNER_STATUS_SINCE: Version = (0, 13, 3)
LEGACY_EMBEDDINGS = "/api/embeddings"  # answers any runner error 500

# At 0.30+ llama-server takes an embedding input in one physical batch (-ub) unless its
# pooling reads only the last token of a model with a KV cache (llama.cpp's server
# `can_split`): a longer input is refused, and Ollama says "the input length exceeds the
# context length" (llm/llama_server.go:2442-2443). The batch is the model's or the call's
# num_batch, else min(2048, num_ctx) (DefaultEmbeddingNumBatch, :75-104; server/routes.go:
# 125-168), at most num_ctx x 1 slot (embeddingBatchSize, llm/llama_server.go:561-569,
# 581-588). The sidecar never sends an agent's num_batch (it would reload the copy,
# server/sched.go:1402-1404, 1425), so the default is the batch.
DEFAULT_EMBEDDING_BATCH = 2048
LAST_POOLING = 3  # LLAMA_POOLING_TYPE_LAST


def embedding_refusal(info: ModelInfo | None, version: str, path: str) -> Lack | None:
    """Ollama's answer, at `version`, to an embedding of an input on `path` with a model that
    cannot embed there; None when it can, or the model is not known (no /api/show, or one
    that says neither its architecture nor its capabilities)."""
    if info is None or not (info.architecture or info.capabilities is not None):
        return None
    parsed = parse_version(version)
    if parsed >= LLAMA_SERVER_SINCE:
        if info.embedding:
            return None
        message, status = NO_EMBEDDING_SERVER, 501
    elif own_engine(info, parsed) and not (info.embedding and
                                           parsed >= POOLED_EMBEDDING_SINCE):
        message, status = NO_EMBEDDING_MODEL, 501 if parsed >= RUNNER_STATUS_SINCE else 500
    else:
        return None
    return Lack(message, 500 if path == LEGACY_EMBEDDINGS else status)


def embedding_window(info: ModelInfo | None, version: str, context: int) -> int:
    """The tokens an embedding input may take (with its BOS and EOS) in a copy whose slot has
    `context`: llama-server's batch where it must take the input whole, else the context."""
    if info is None or not info.embedding or info.pooling_type == LAST_POOLING or \
            parse_version(version) < LLAMA_SERVER_SINCE or context <= 0:
        return context
    return min(context, DEFAULT_EMBEDDING_BATCH)


Served = tuple[tuple[Version, Version | None], ...]


def serves(served: Served, version: Version) -> bool:
    """Whether an Ollama of `version` has a path served in these ranges (() every one)."""
    return not served or any(low <= version and (high is None or version < high)
                             for low, high in served)


def served_words(served: Served) -> str:
    """The ranges as a sentence's part: "from 0.14.0", "from 0.20.0 to before 0.25.0"."""
    return " and ".join(f"from {dotted(low)}" + (f" to before {dotted(high)}" if high else "")
                        for low, high in served)


def dotted(version: Version) -> str:
    return ".".join(map(str, version))


# A call's think level (a string `think`, an OpenAI reasoning effort) needs, besides
# "thinking", this: before 0.17.7 Ollama refuses a level on any model but gpt-oss's harmony
# ones, before the capability check and before any load (v0.12.6 server/routes.go:323-327
# generate, :2017-2021 chat; `shouldUseHarmony` :54-64 reads the family).
THINK_LEVEL = "think-level"
THINK_LEVEL_ANY_MODEL_SINCE: Version = (0, 17, 7)
HARMONY_FAMILIES = frozenset(("gptoss", "gpt-oss"))


def has_capability(info: ModelInfo, capability: str, version_text: str) -> bool:
    """Whether the card's Ollama runs a call needing `capability` on this model: one its
    /api/show lists, or a think level where the card's version takes it on this model."""
    if capability == THINK_LEVEL:
        return parse_version(version_text) >= THINK_LEVEL_ANY_MODEL_SINCE or \
            info.family in HARMONY_FAMILIES or info.architecture in HARMONY_FAMILIES
    return info.capabilities is not None and capability in info.capabilities


def path_refusal(path: str, served: Served, version_text: str) -> Lack | None:
    """The router's 404 of an Ollama whose version lacks the call's path (Anthropic's
    messages before 0.14, say): in a fleet of mixed versions such a card cannot take the
    call, while another may. An unknown version ("") takes the newest rules."""
    version = parse_version(version_text)
    if serves(served, version):
        return None
    return Lack(f"POST {path} is served by Ollama {served_words(served)}; the providers "
                f"run {dotted(version)}", 404)


def body_refusal(refused_by: tuple[tuple[Version, str], ...], version_text: str,
                 check: Callable[[Version], str | None] | None = None) -> Lack | None:
    """The 400 of an Ollama whose version refuses the call's body where another version of
    the fleet takes it (`think: "max"` before 0.22, say): a version checked with the body,
    or one first heard since, which `check` checks it against. An unknown version ("") is
    none of those, so it is not left out."""
    if not version_text:
        return None
    version = parse_version(version_text)
    words = next((words for refusing, words in refused_by if refusing == version), None)
    if words is None and check is not None:
        words = check(version)
    return None if words is None else Lack(words)
