"""Ollama's engine rules as the simulator applies them, written from Ollama's Go source
(ollama/ollama HEAD fb30760 and tag v0.12.6), not from the sidecar: the simulator is the
independent Ollama the sidecar is tested against. Each function names its Go original.

Memory a runner really takes (what HEAD's /api/ps measures from llama-server's buffers):
the weights on the GPU, the KV cache (context x slots x per-layer KV heads x key + value
length x the cache type's bytes) and the compute buffers (a base plus what the batch size,
chosen by context x slots, adds; without flash attention at least a batch's attention scores,
runs_flash_attention). Ollama's own estimate before a load (PredictServerVRAM)
is coarser: the file size plus an f16 KV cache reckoned from embedding / heads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

MIB = 1 << 20
GIB = 1024  # in MiB
SERVER_BUSY = "server busy, please try again.  maximum pending requests exceeded"
PROMPT_TOO_LONG = ("the prompt is longer than the context length currently available to the "
                   "model; shorten the prompt, adjust the context length in settings, or use "
                   "a model with a longer context length")
INPUT_TOO_LONG = "the input length exceeds the context length"
NO_EMBEDDING_SERVER = "This server does not support embeddings. Start it with `--embeddings`"
NO_EMBEDDING_MODEL = "this model does not support embeddings"
# What the qwen3.5 parser says of a tool call whose <parameter> is closed by </function>
# (model/parsers/qwen3coder.go:233-238 parseToolCall: encoding/xml's error)
PARSE_ERROR = "XML syntax error on line 5: element <parameter> closed by </function>"
DEFAULT_EMBEDDING_BATCH = 2048  # llm/llama_server.go:78
LAST_POOLING = 3  # llama.cpp's LLAMA_POOLING_TYPE_LAST
NUM_KEEP = 4  # api.DefaultOptions NumKeep
MINIMUM_MEMORY_MIB = 457  # v0.12.6 discover/gpu.go: what the estimator keeps for CUDA
# ggml block sizes: q8_0 34 bytes and q4_0 18 bytes per 32 values.
CACHE_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
ONE_SLOT_FAMILIES = ("mllama", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen3next",
                     "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe", "nemotron_h_omni")
NO_CONTEXT_SHIFT = ("deepseek2",)  # resolveContextShift (sched.go:137-147)
Version = tuple[int, int, int]
# The architectures Ollama runs on its own engine whatever OLLAMA_NEW_ENGINE says
# (fs/ggml/ggml.go OllamaEngineRequired), each with the tags at which it enters the list and,
# after, leaves and re-enters it (qwen3 left in 0.12.5), read at every tag v0.11.5 to
# v0.25.0-rc0: v0.11.5:177-183, v0.12.0:246 qwen3, v0.12.2:247 qwen3moe, v0.12.5 (no qwen3),
# v0.12.6:241-253, v0.12.7:251 qwen3vl(moe), v0.13.0:252-253 deepseekocr deepseek2,
# v0.13.1:254 nomic-bert, v0.13.4:256 olmo3, v0.13.5:244 bert, v0.14.3:272-273 glm4moelite
# lfm2, v0.15.5:271,274 qwen3next glmocr, v0.17.1:288,293,299 nemotron_h(_moe) qwen35(moe)
# lfm2moe, v0.20.0:284 gemma4, v0.22.0:286,290 laguna nemotron_h_omni; v0.24.0:277-303 and
# v0.25.0-rc0 hold the same 29 names. No entry left the list from 0.12.6 on.
ENGINE_REQUIRED: dict[str, tuple[Version, ...]] = {
    "gemma3": ((0, 11, 5),), "gemma3n": ((0, 11, 5),), "mistral3": ((0, 11, 5),),
    "llama4": ((0, 11, 5),), "mllama": ((0, 11, 5),), "qwen25vl": ((0, 11, 5),),
    "gptoss": ((0, 11, 5),), "gpt-oss": ((0, 11, 5),),
    "qwen3": ((0, 12, 0), (0, 12, 5), (0, 12, 6)), "qwen3moe": ((0, 12, 2),),
    "qwen3vl": ((0, 12, 7),), "qwen3vlmoe": ((0, 12, 7),),
    "deepseek2": ((0, 13, 0),), "deepseekocr": ((0, 13, 0),),
    "nomic-bert": ((0, 13, 1),), "olmo3": ((0, 13, 4),), "bert": ((0, 13, 5),),
    "glm4moelite": ((0, 14, 3),), "lfm2": ((0, 14, 3),),
    "qwen3next": ((0, 15, 5),), "glmocr": ((0, 15, 5),),
    "nemotron_h": ((0, 17, 1),), "nemotron_h_moe": ((0, 17, 1),), "qwen35": ((0, 17, 1),),
    "qwen35moe": ((0, 17, 1),), "lfm2moe": ((0, 17, 1),),
    "gemma4": ((0, 20, 0),), "laguna": ((0, 22, 0),), "nemotron_h_omni": ((0, 22, 0),),
}
# The names Ollama's model registry holds (each model's `model.Register("<name>", ...)` in a
# package model/models/models.go imports), from the first tag that registers it; none was
# ever removed (v0.11.5 to v0.25.0-rc0). v0.11.5: gemma2/model.go:212, gemma3/model.go:151,
# gemma3n/model.go:50, gptoss/model.go:277-278, llama/model.go:174, llama4/model.go:185,
# mistral3/model.go:168, mllama/model.go:117, qwen2/model.go:173, qwen25vl/model.go:149,
# qwen3/model.go:231-232; v0.11.10 gemma3/model.go:150 gemma3_embed; v0.12.0
# bert/embed.go:179-180 bert bert_embed, qwen3/model.go:240 qwen3_embed; v0.12.3
# deepseek2/model.go:323; v0.12.7 qwen3vl/model.go:202-203; v0.13.0 deepseekocr/model.go:125,
# nomicbert/model.go:168-169 nomic-bert(_embed); v0.13.3 nomicbert/model.go:242-243
# nomic-bert-moe(_embed); v0.13.4 olmo3/model.go:222; v0.14.3 glm4moelite/model.go:303,
# lfm2/model.go:252; v0.15.5 glmocr/model.go:234, qwen3next/model.go:382; v0.17.1
# lfm2/model.go:747 lfm2moe, nemotronh/model.go:310-311, qwen3next/model.go:623-624 qwen35(moe);
# v0.20.0 gemma4/model.go:264; v0.22.0 laguna/model.go:441, nemotronh/model_omni.go:238.
ENGINE_MODELS: dict[str, Version] = {
    **dict.fromkeys(("gemma2", "gemma3", "gemma3n", "gptoss", "gpt-oss", "llama", "llama4",
                     "mistral3", "mllama", "qwen2", "qwen25vl", "qwen3", "qwen3moe"),
                    (0, 11, 5)),
    "gemma3_embed": (0, 11, 10),
    "bert": (0, 12, 0), "bert_embed": (0, 12, 0), "qwen3_embed": (0, 12, 0),
    "deepseek2": (0, 12, 3),
    "qwen3vl": (0, 12, 7), "qwen3vlmoe": (0, 12, 7),
    "deepseekocr": (0, 13, 0), "nomic-bert": (0, 13, 0), "nomic-bert_embed": (0, 13, 0),
    "nomic-bert-moe": (0, 13, 3), "nomic-bert-moe_embed": (0, 13, 3),
    "olmo3": (0, 13, 4),
    "glm4moelite": (0, 14, 3), "lfm2": (0, 14, 3),
    "glmocr": (0, 15, 5), "qwen3next": (0, 15, 5),
    "lfm2moe": (0, 17, 1), "nemotron_h": (0, 17, 1), "nemotron_h_moe": (0, 17, 1),
    "qwen35": (0, 17, 1), "qwen35moe": (0, 17, 1),
    "gemma4": (0, 20, 0),
    "laguna": (0, 22, 0), "nemotron_h_omni": (0, 22, 0),
}
FIRST_ENGINE_TABLE = (0, 11, 5)  # versions before it are given v0.11.5's lists
EMBED_LOOKUP = (0, 12, 0)  # NewTextProcessor looks a pooled model up as "<arch>_embed"
SPLIT_PROJECTOR_REFUSED = (0, 11, 11)  # NewLlamaServer: "split vision models aren't supported"
POOLED_EMBEDDING = (0, 11, 10)  # ollamarunner embeds with a pooled model (runner.go:898-905)


def version_tuple(text: str) -> tuple[int, int, int]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2]), int(match[3])) if match else (999, 0, 0)


def embedding_too_long(version: str, legacy: bool) -> tuple[int, str]:
    """Status and message of an embedding input over the context that Ollama does not cut:
    /api/embed with `truncate: false`, and the legacy /api/embeddings, which never cuts and
    answers any runner error with 500 (server/routes.go:1084-1088; v0.12.6 :789-791).
    0.30+: /api/embed 400 (server/routes.go:928-939), a legacy input llama-server's refusal
    as normalized (llm/llama_server.go:2435-2444). 0.12: /api/embed 400 "input exceeds
    maximum context length" (v0.12.6 server/routes.go:679-683); a legacy input fails in the
    runner (v0.12.6 runner/ollamarunner/runner.go:949-952, its sequences never cut an
    embedding, :114,136)."""
    if version_tuple(version) >= (0, 30, 0):
        return (500 if legacy else 400), INPUT_TOO_LONG
    if legacy:
        return 500, f"failed to create new sequence: {INPUT_TOO_LONG}"
    return 400, "input exceeds maximum context length"


def default_num_ctx(version: str, total_vram_mib: int) -> int:
    """envconfig.ContextLength's default, and from 0.15.5 Serve()'s VRAM tiers
    (server/routes.go:2043-2058: total memory summed over GPUs)."""
    v = version_tuple(version)
    if v < (0, 6, 7):
        return 2048
    if v < (0, 15, 5):
        return 4096
    if total_vram_mib >= 47 * GIB:
        return 262144
    return 32768 if total_vram_mib >= 23 * GIB else 4096


@dataclass(frozen=True)
class LoadOptions:
    """api.Runner as a request resolves it, with HEAD's "automatic" flags."""

    num_ctx: int
    num_ctx_auto: bool
    num_batch: int
    num_batch_auto: bool
    num_gpu: int = -1
    main_gpu: int | None = None
    use_mmap: bool | None = None
    num_thread: int = 0
    shift: bool = True
    use_mmap_auto: bool = False  # HEAD: Ollama chose use_mmap itself at the load
    adapter: str = ""  # the model's ADAPTER file (its Model.AdapterPaths), "" none
    # 0.30+: how many tokens its DRAFT model drafts a step; 0 runs none (api.Runner)
    draft_num_predict: int = 0


def mmap_default(loaded: LoadOptions) -> LoadOptions:
    """HEAD's applyLlamaServerMmapDefaults at a load (server/sched.go:572, 1138-1156): a call
    without use_mmap that keeps the model off the GPU (num_gpu 0, :1162-1163) gets use_mmap
    false, marked as Ollama's own choice (useMMapAuto). Its other reasons (Windows CUDA, Metal
    partial offload, host memory pressure, :1165-1175, 1200-1240) are outside the simulated
    Linux CUDA server."""
    if loaded.use_mmap is None and loaded.num_gpu == 0:
        return replace(loaded, use_mmap=False, use_mmap_auto=True)
    return loaded


def _int_option(options: dict[str, Any], key: str) -> int | None:
    value = options.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


DEFAULT_NUM_BATCH = 512  # api.DefaultOptions' NumBatch
# api.DefaultOptions' DraftNumPredict (api/types.go:1119), kept only for a model with a DRAFT
# unless its Modelfile or the call sets one (server/routes.go:136-156)
DEFAULT_DRAFT_NUM_PREDICT = 4


def auto_batch(num_ctx: int, num_parallel: int) -> int:
    """The automatic num_batch (sched.go:859-868) by context x slots."""
    tokens = num_ctx * num_parallel
    return 2048 if tokens > 32768 else 1024 if tokens > 4096 else 512


def call_num_ctx(body: dict[str, Any], modelfile_num_ctx: int, env_num_ctx: int,
                 default_ctx: int) -> tuple[int, bool]:
    """The call's own num_ctx, routes.go:129-150 (request > Modelfile > env > default), and
    whether it is Ollama's automatic one: before the scheduler's floors and the trained cap,
    which apply to the scheduler's copy of the options."""
    options = body.get("options") if isinstance(body.get("options"), dict) else {}
    assert isinstance(options, dict)
    requested = _int_option(options, "num_ctx")
    if requested is not None:
        return requested, False
    if modelfile_num_ctx:
        return modelfile_num_ctx, False
    if env_num_ctx:
        return env_num_ctx, False
    return default_ctx, True


def resolve_options(body: dict[str, Any], modelfile_num_ctx: int, env_num_ctx: int,
                    default_ctx: int, trained: int, vision: bool, family: str,
                    num_parallel: int, modelfile: Mapping[str, Any] | None = None,
                    draft: bool = False) -> LoadOptions:
    """The call's num_ctx, the floors of sched.go:169-177 and the automatic batch; the
    trained cap comes at load. `modelfile`: the model's own runner PARAMETERs, under the
    call's options (routes.go modelOptions: the Modelfile's, then the request's; a
    num_batch from either is no automatic one, usesAutomaticNumBatch). `draft`: the model
    has a DRAFT model, which drafts unless draft_num_predict is set to 0."""
    requested = body.get("options") if isinstance(body.get("options"), dict) else {}
    assert isinstance(requested, dict)
    options = {**(modelfile or {}), **requested}
    num_ctx, auto = call_num_ctx(body, modelfile_num_ctx, env_num_ctx, default_ctx)
    num_ctx = max(num_ctx, 4)
    if vision:
        num_ctx = max(num_ctx, 2048)
    batch = _int_option(options, "num_batch")
    num_gpu = _int_option(options, "num_gpu")
    use_mmap = options.get("use_mmap")
    shift = body.get("shift")
    drafted = _int_option(options, "draft_num_predict")
    return LoadOptions(
        num_ctx=num_ctx, num_ctx_auto=auto,
        num_batch=batch if batch is not None else auto_batch(min(num_ctx, trained or num_ctx),
                                                             num_parallel),
        num_batch_auto=batch is None,
        num_gpu=-1 if num_gpu is None else num_gpu,
        main_gpu=_int_option(options, "main_gpu"),
        use_mmap=use_mmap if isinstance(use_mmap, bool) else None,
        num_thread=_int_option(options, "num_thread") or 0,
        shift=(shift is not False) and family not in NO_CONTEXT_SHIFT,
        draft_num_predict=drafted if drafted is not None else
        DEFAULT_DRAFT_NUM_PREDICT if draft else 0)


def needs_reload(loaded: LoadOptions, request: LoadOptions, trained: int, version: str
                 ) -> bool:
    """sched.go needsReload: HEAD caps the request's num_ctx at the trained context, skips
    num_ctx (num_batch) when both sides are automatic and use_mmap when the call leaves it
    out and Ollama chose the copy's (:1405-1407; a copy loaded with an explicit one is
    reloaded); v0.12.6 compares the struct as it is and never reloads for `shift`. From 0.30
    draft_num_predict is compared with the rest (api.Runner), never the DRAFT file itself
    (only AdapterPaths and ProjectorPaths, :1422-1423)."""
    if loaded.adapter != request.adapter:  # AdapterPaths (:1423; v0.12.6 :610)
        return True
    if version_tuple(version) < (0, 30, 0):
        def runner_part(o: LoadOptions) -> tuple[Any, ...]:
            # a call whose num_gpu is -1 takes the copy's (v0.12.6 :600-606); no batch is
            # automatic there: DefaultOptions' unless set
            num_gpu = -1 if request.num_gpu < 0 else o.num_gpu
            num_batch = DEFAULT_NUM_BATCH if o.num_batch_auto else o.num_batch
            return (o.num_ctx, num_batch, num_gpu, o.main_gpu or 0, o.use_mmap, o.num_thread)
        return runner_part(loaded) != runner_part(request)
    new_ctx = min(request.num_ctx, trained) if trained else request.num_ctx
    if loaded.num_ctx_auto and request.num_ctx_auto:
        new_ctx = loaded.num_ctx
    # The automatic batch is set at a load (sched.go:807-813): a call still carries
    # DefaultOptions' (api/types.go:1116), compared unless the copy's is automatic too
    new_batch = loaded.num_batch if loaded.num_batch_auto and request.num_batch_auto \
        else DEFAULT_NUM_BATCH if request.num_batch_auto else request.num_batch
    new_mmap = loaded.use_mmap if loaded.use_mmap_auto and request.use_mmap is None \
        else request.use_mmap
    new_gpu = -1 if request.num_gpu < 0 else request.num_gpu
    old_gpu = -1 if request.num_gpu < 0 else loaded.num_gpu
    if loaded.shift != request.shift:
        return True
    return (loaded.num_ctx, loaded.num_batch, old_gpu, loaded.main_gpu, loaded.use_mmap,
            loaded.num_thread, loaded.draft_num_predict) != (
                new_ctx, new_batch, new_gpu, request.main_gpu, new_mmap, request.num_thread,
                request.draft_num_predict)


def commits_before_read(arch: str, embedding: bool, version: str, new_engine: bool) -> bool:
    """Whether Ollama's load of the model returns once its memory is committed, before the
    runner has read the weights: Ollama's own engine from 0.11.5 to 0.24 (checked at those
    tags). From 0.30 every GGUF model runs in llama-server, whose Load waits for it to be
    ready (llm/llama_server.go:1047-1061); before 0.11.5 (not modelled) every runner joined
    s.loaded at its spawn (v0.11.4 server/sched.go:445-482).

    v0.12.6 takes its own engine when OLLAMA_NEW_ENGINE is set or the architecture requires
    it, if its registry has the model (a split vision model aside: NewLlamaServer,
    llm/server.go:149-169); ollamaServer.Load returns after the commit (:827-841), whose
    handler reads the weights in the background (runner/ollamarunner/runner.go:1260-1262,
    1173-1184), where the llama engine's Load waits for the runner (llm/server.go:596-600).
    Each version's own lists decide (own_engine): qwen3 is required from 0.12.0 (not in
    0.12.5), nomic-bert from 0.13.1."""
    if not (0, 11, 5) <= version_tuple(version) < (0, 30, 0):
        return False
    return own_engine(arch, embedding, new_engine, version)


def own_engine(arch: str, embedding: bool, new_engine: bool, version: str,
               split_projector: bool = False) -> bool:
    """Whether the version runs the model on Ollama's own engine (ollamarunner):
    NewLlamaServer (v0.12.6 llm/server.go:149-169, v0.24.0 :144-164, the same code) takes it
    when OLLAMA_NEW_ENGINE is set or the architecture is in OllamaEngineRequired, if
    model.NewTextProcessor finds the model in the registry, which from 0.12.0 looks a pooled
    model up as "<arch>_embed" (modelForArch, v0.12.0 model/model.go:145-156, v0.24.0
    :167-178; v0.11.10's getTextProcessor, :141-143, looked up the bare name). From 0.11.11 a
    model whose projector is a file of its own goes to the llama engine (v0.11.11
    llm/server.go:151-154). 0.30+ has no ollamarunner (llama-server only)."""
    v = version_tuple(version)
    if v >= (0, 30, 0) or (split_projector and v >= SPLIT_PROJECTOR_REFUSED):
        return False
    v = max(v, FIRST_ENGINE_TABLE)
    name = f"{arch}_embed" if embedding and v >= EMBED_LOOKUP else arch
    since = ENGINE_MODELS.get(name)
    if since is None or v < since:
        return False
    if new_engine:
        return True
    toggles = ENGINE_REQUIRED.get(arch, ())
    return sum(1 for at in toggles if at <= v) % 2 == 1


def embedding_refusal(arch: str, embedding: bool, version: str, new_engine: bool,
                      legacy: bool) -> tuple[int, str] | None:
    """Status and message of Ollama's answer to an embedding with a model that cannot embed,
    once it has loaded it; None when it can. 0.30+: llama-server runs with `--embedding`
    only for a model with `<arch>.pooling_type` (llm/llama_server.go:866, 581-588) and
    otherwise answers 501 "This server does not support embeddings. Start it with
    `--embeddings`", which /api/embed passes on (normalizeEmbeddingError, :2435-2446;
    server/routes.go:1000-1007) and the legacy path answers 500 (:1084-1088). 0.12: Ollama's
    own engine refuses a model without pooling with 501 "this model does not support
    embeddings" (v0.12.6 runner/ollamarunner/runner.go:937-939), answered 500 on every path
    (v0.12.6 server/routes.go:733-734, 788-791) until 0.13.3 passed /api/embed's status on;
    before 0.11.10 it refuses every model, pooled or not (v0.11.5
    runner/ollamarunner/runner.go:1031-1033; pooling read from v0.11.10 :898-905). The llama
    engine embeds with any model."""
    v = version_tuple(version)
    if v >= (0, 30, 0):
        if embedding:
            return None
        status, message = 501, NO_EMBEDDING_SERVER
    elif own_engine(arch, embedding, new_engine, version) and \
            not (embedding and v >= POOLED_EMBEDDING):
        status, message = (501 if v >= (0, 13, 3) else 500), NO_EMBEDDING_MODEL
    else:
        return None
    return (500 if legacy else status), message


def embedding_batch(num_ctx: int) -> int:
    """HEAD's num_batch for an embedding model when neither its Modelfile nor the call sets
    one: min(2048, num_ctx) (llm/llama_server.go:75-104, server/routes.go:125-168)."""
    return min(DEFAULT_EMBEDDING_BATCH, num_ctx) if num_ctx > 0 else DEFAULT_EMBEDDING_BATCH


def kv_cache_bytes(block_count: int, heads_kv: int, key_length: int, value_length: int,
                   tokens: int, cache_type: str) -> int:
    """llama.cpp's real KV cache (what GraphSize models): every layer's KV heads x
    (key + value length) per token, at the cache type's bytes per element."""
    return int(block_count * heads_kv * (key_length + value_length) * tokens
               * CACHE_BYTES.get(cache_type, 2.0))


def windowed_cells(arch: str, window: int, num_ctx: int, slots: int, version: str,
                   batch: int = 512, own: bool = True) -> int:
    """Tokens a sliding-window layer's cache holds, all slots together. 0.30+: llama.cpp's
    iSWA cache, one stream per slot (llama-server -np without --kv-unified), each the window
    and a ubatch (-ub num_batch, llm/llama_server.go:581-593) at most the slot's context,
    padded to 256 (llama-kv-cache-iswa.cpp). Before: Ollama's own engine (kvcache/causal.go
    Init, v0.12.6:136-186): a window per sequence (gpt-oss: 4096, gptoss/model.go:267-270),
    one more cell with several slots, and a batch, padded (256 with flash attention); the
    whole context when that is no smaller. The llama engine (`own` False: cohere2, gemma2)
    keeps the whole context (llama_context_default_params' swa_full)."""
    if version_tuple(version) >= (0, 30, 0):
        return slots * -(-min(num_ctx, window + batch) // 256) * 256
    if not own:
        return num_ctx * slots
    memory = 4096 if arch in ("gpt-oss", "gptoss") else window
    if slots > 1:
        memory = max(memory, window + 1)
    if memory >= num_ctx:
        return num_ctx * slots
    return -(-(slots * memory + batch) // 256) * 256


def predict_server_vram(file_bytes: int, block_count: int, heads_kv: int,
                        embedding_length: int, heads: int, tokens: int) -> int:
    """llm/llama_server.go:2681-2700: the file plus an f16 cache of embedding / heads."""
    head_dim = embedding_length // heads if heads else 0
    return file_bytes + 2 * block_count * max(heads_kv, 1) * head_dim * tokens * 2


def batch_surcharge_mib(batch: int) -> int:
    """sched.go:906-915: the compute a larger batch adds."""
    return 2048 if batch >= 2048 else 768 if batch >= 1024 else 0


# The architectures Ollama runs with flash attention when OLLAMA_FLASH_ATTENTION is unset
# (fs/ggml/ggml.go FlashAttention(): v0.12.6:893-901, v0.24.0:890-908), each from the first
# tag whose list has it; the simulator gives versions before 0.12.6 that tag's list
FLASH_ATTENTION_ARCHS: tuple[tuple[tuple[int, int, int], tuple[str, ...]], ...] = (
    ((0, 12, 6), ("gemma3", "gptoss", "gpt-oss", "qwen3", "qwen3moe")),
    ((0, 12, 8), ("qwen3vl", "qwen3vlmoe")),
    ((0, 13, 2), ("mistral3",)),
    ((0, 13, 4), ("olmo3",)),
    ((0, 13, 5), ("bert",)),
    ((0, 14, 3), ("glm4moelite", "lfm2")),
    ((0, 15, 5), ("glmocr", "qwen3next")),
    ((0, 17, 1), ("lfm2moe", "nemotron_h", "nemotron_h_moe", "qwen35", "qwen35moe")),
    ((0, 20, 4), ("gemma4",)),
    ((0, 22, 0), ("nemotron_h_omni",)),
)
LLAMA_FLASH_ATTENTION_AUTO = (0, 13, 4)  # commit bd6c1d6b4: the llama engine's auto mode
QUANTIZED_CACHE_TYPES = ("q8_0", "q4_0")  # SupportsKVCacheType (v0.12.6 fs/ggml/ggml.go:868)


def flash_attention_by_default(arch: str, version: str) -> bool:
    """Whether `arch` is in the version's FlashAttention() list."""
    v = max(version_tuple(version), FLASH_ATTENTION_ARCHS[0][0])
    return any(since <= v and arch in archs for since, archs in FLASH_ATTENTION_ARCHS)


def supports_flash_attention(arch: str, embedding: bool, key_length: int, value_length: int,
                             version: str) -> bool:
    """SupportsFlashAttention (v0.12.6 fs/ggml/ggml.go:876-891, v0.24.0:868-887): never for
    an embedding model (<arch>.pooling_type) nor gemma2 (nor grok from 0.19.0); always for
    qwen35, qwen35moe and qwen3next from 0.17.1; else key and value head dims equal and
    nonzero (EmbeddingHeadCountK/V: key_length / value_length, else embedding / heads,
    v0.12.6:118-131)."""
    v = version_tuple(version)
    if embedding:
        return False
    if v >= (0, 17, 1) and arch in ("qwen35", "qwen35moe", "qwen3next"):
        return True
    if arch == "gemma2" or (v >= (0, 19, 0) and arch == "grok"):
        return False
    return key_length != 0 and key_length == value_length


def runs_flash_attention(version: str, arch: str, embedding: bool, head_dims: tuple[int, int],
                         own: bool, setting: bool | None, gpu_supports: bool) -> bool:
    """Whether a copy runs with flash attention. `own`: on Ollama's own engine; `setting`:
    OLLAMA_FLASH_ATTENTION (None unset); `gpu_supports`: every GPU's FlashAttentionSupported
    (v0.12.6 discover/types.go:173-186).

    0.30+: llama-server's --flash-attn is the setting when set, else off on a GPU without
    support and auto, which llama.cpp turns on where the GPU runs the kernels
    (LlamaServerFlashAttention, HEAD llm/llama_server.go:596-621; llama-context.cpp's auto
    check, v0.24.0 llama/llama.cpp/src/llama-context.cpp:343-382). Otherwise Ollama decides
    (v0.12.6 llm/server.go:199-211, v0.24.0 :193-225): the setting, else the FlashAttention()
    list, off on a GPU or a model without support. From 0.13.4 the llama engine passes that
    only when the setting is set, else auto, which the simulator's GPUs turn on where
    supported (v0.24.0 llm/server.go:227-255). v0.24.0 also turns it off for gemma4 on a CUDA
    GPU before Turing (:213-223): the simulator's GPUs are Turing or later."""
    v = version_tuple(version)
    if v >= (0, 30, 0):
        return gpu_supports if setting is None else setting
    if setting is None and not own and v >= LLAMA_FLASH_ATTENTION_AUTO:
        return gpu_supports
    wanted = flash_attention_by_default(arch, version) if setting is None else setting
    return wanted and gpu_supports and supports_flash_attention(arch, embedding, *head_dims,
                                                                version)


def runner_cache_type(version: str, own: bool, setting: bool | None, flash_attention: bool,
                      kv_cache_type: str) -> str:
    """The KV cache type a copy runs with: OLLAMA_KV_CACHE_TYPE from 0.30 (llama-server's
    --cache-type-k/-v, HEAD llm/llama_server.go:393-396); before, only with flash attention
    on (v0.12.6 llm/server.go:213-228), else f16; from 0.13.4 the llama engine takes a
    quantized type only when OLLAMA_FLASH_ATTENTION turned it on (v0.24.0 llm/server.go:
    236-253)."""
    v = version_tuple(version)
    if v >= (0, 30, 0):
        return kv_cache_type
    if not flash_attention:
        return "f16"
    if not own and v >= LLAMA_FLASH_ATTENTION_AUTO and kv_cache_type in QUANTIZED_CACHE_TYPES:
        return kv_cache_type if setting else "f16"
    return kv_cache_type


def attention_batch(version: str, own: bool, embedding: bool, num_batch: int, num_ctx: int,
                    slots: int) -> int:
    """The tokens of the batch a copy's compute buffers are reserved for (llama.cpp's worst
    case: min(n_ctx, n_ubatch), llama-context.cpp v0.12.6:286, v0.24.0:284). 0.30+: -ub
    num_batch (HEAD llm/llama_server.go:580-594), n_batch at most the context
    (llama-context.cpp v0.24.0:132-134).
    Before, the runner's batch is at most num_ctx (v0.12.6 llm/server.go:178); Ollama's own
    engine reserves a graph of that many (runner/ollamarunner/runner.go reserveWorstCaseGraph,
    v0.12.6:1007-1012); the llama engine asks llama.cpp for a batch of it x slots with
    llama.cpp's default ubatch of 512 (v0.12.6 runner/llamarunner/runner.go:779,
    llama-context.cpp:101, 2269) until 0.13.3 makes the ubatch the batch itself and an
    embedding model's batch its context (commit 3475d915c: v0.24.0 llama/llama.go:125-126,
    llm/server.go Load)."""
    if version_tuple(version) >= (0, 30, 0):
        return min(num_batch, num_ctx * slots)
    batch = min(num_batch, num_ctx)
    if own:
        return batch
    if version_tuple(version) < (0, 13, 3):
        return min(512, batch * slots)
    return num_ctx if embedding else batch


def attention_cells(version: str, own: bool, num_ctx: int, slots: int) -> int:
    """The cache cells one stream's attention reads without flash attention: Ollama's own
    engine keeps one cache for all slots, padded to 32 cells (kvcache/causal.go Init, v0.12.6:
    179-185; CachePadding 32 without it, ml/backend/ggml/ggml.go:685-690); llama.cpp gives
    each slot a stream of its own (kv_unified false by default: llama_context_default_params,
    v0.12.6 llama-context.cpp:2296; llama-server -np), padded to 32 (v0.12.6
    llama-model.cpp:19643-19651, llama-kv-cache.cpp:2014-2017)."""
    cells = num_ctx * slots if own and version_tuple(version) < (0, 30, 0) else num_ctx
    return -(-cells // 32) * 32


def attention_scores_bytes(batch: int, cells: int, embedding_length: int, heads: int) -> int:
    """The compute graph of a batch without flash attention, as Ollama's estimate for the
    llama family counts it (GraphSize's fullOffload, v0.12.6 fs/ggml/ggml.go:613-617): the
    scores kq = [cells, batch, heads] in f32, which llama.cpp materialises
    (build_attn_mha, v0.12.6 llama/llama.cpp/src/llama-graph.cpp:1281-1383, kq at :1349) and
    Ollama's own engine too (ScaledDotProductAttention, v0.12.6 ml/backend/ggml/ggml.go:
    1533-1563, kq at :1552); the softmax runs in place (ggml_op_can_inplace, v0.12.6
    ml/backend/ggml/ggml/src/ggml-alloc.c:26-46), so one such buffer."""
    return 4 * batch * (1 + 4 * embedding_length + cells * (1 + heads))


def fits_in_80(estimate_mib: int, total_mib: int, used_mib: int) -> bool:
    """sched.go:547-561: beside loaded models, a load needs its estimate within 80 % of the
    free memory (integer arithmetic, strict >)."""
    return estimate_mib <= max(0, total_mib - used_mib) * 80 // 100


def context_shift_limit(num_ctx: int, num_keep: int) -> int:
    """llm/llama_server.go:321-331: what a halved prompt keeps."""
    num_keep = max(0, min(num_keep, num_ctx - 1))
    return num_ctx - max((num_ctx - num_keep) // 2, 1)


def call_num_keep(body: dict[str, Any]) -> int:
    """The call's num_keep (api.DefaultOptions' 4 unless its options set one)."""
    options = body.get("options")
    value = _int_option(options, "num_keep") if isinstance(options, dict) else None
    return NUM_KEEP if value is None else value



def reported_prompt_eval_count(version: str, total: int, cached: int) -> int:
    """prompt_eval_count as each version reports it: 0.12's runners the whole prompt
    (runner/ollamarunner/runner.go:181, 922 at v0.12.6: numPromptInputs, counted before the
    cache is looked up), 0.30.0 llama-server's prompt_n, the tokens it evaluated
    (llm/llama_server.go:1470 at v0.30.0), and from 0.30.1 cache_n + prompt_n, the whole
    prompt again (llm/llama_server.go:1511-1513 at HEAD). prompt_eval_duration is always the
    time spent evaluating (prompt_ms; processingDuration)."""
    return total - cached if version_tuple(version)[:3] == (0, 30, 0) else total


def parse_error_holds_slot(version: str) -> bool:
    """Before 0.32.15 a built-in parser's error mid-stream leaks the call's slot: the
    callback writes the error to an unbuffered channel, the handler answers it and returns
    (the scheduler's ref goes, server/sched.go:747-749), and the next chunk's callback blocks
    on that channel for good, so Completion never releases llama-server's semaphore
    (llm/llama_server.go:1536-1542 at v0.32.14): one slot fewer until the copy unloads.
    From 0.32.15 the completion is cancelled and the error reported after it returns
    (commit e0c95a5ff, server/routes.go ChatHandler and GenerateHandler)."""
    return version_tuple(version) < (0, 32, 15)


def left_out_duration(arch: str, embedding: bool, version: str, new_engine: bool,
                      tokens: int) -> str | None:
    """The metric an answer of one generated token leaves out, zero (api/types.go:383-385
    omitempty): the llama engine counts the first token's decode as the prompt's (v0.12.6
    runner/llamarunner/runner.go:483-488, v0.24.0 :520), so its eval_duration is 0 (seen on
    real 0.12.6 and 0.24.0). Ollama's own engine times the first token as the prompt's too
    (ollamarunner/runner.go:718-720) but subtracts sampling from a zero span: not zero, so
    sent; llama-server (0.30+) reports its own timings: both sent."""
    if tokens != 1 or not (0, 11, 5) <= version_tuple(version) < (0, 30, 0):
        return None
    return None if own_engine(arch, embedding, new_engine, version) else "eval_duration"
