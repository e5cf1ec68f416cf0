"""What a simulated Ollama server is: one GPU, a model catalog and Ollama's knobs.

Pure data and arithmetic shared by the HTTP simulator and the fleet presets. Models carry
their architecture (what /api/show's model_info gives), and what a copy takes of the GPU
follows it (sim_engine.py).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from .sim_cloud import CloudStub
from .sim_engine import (
    INPUT_TOO_LONG,
    LAST_POOLING,
    MIB,
    MINIMUM_MEMORY_MIB,
    NUM_KEEP,
    ONE_SLOT_FAMILIES,
    PROMPT_TOO_LONG,
    attention_batch,
    attention_cells,
    attention_scores_bytes,
    batch_surcharge_mib,
    context_shift_limit,
    default_num_ctx,
    kv_cache_bytes,
    own_engine,
    predict_server_vram,
    runner_cache_type,
    runs_flash_attention,
    version_tuple,
    windowed_cells,
)

IMAGE_TOKENS = 768  # what Ollama counts for each image in a chat message (server/prompt.go)
CURRENT_VERSION = "0.33.0"
DEFAULT_MODELS_PER_GPU = 3  # server/sched.go:86
THINKING_ARCHS = ("qwen3",)  # of the catalog's, the ones that think as Ollama serves them


BLOBS_DIR = "/root/.ollama/models/blobs"  # where Ollama's image keeps the model blobs


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def weights_of(name: str) -> str:
    """The sha256 of the weights file of a model named `name` that has one of its own (the
    simulator's files are made up: drawn from the name, the same in every run)."""
    return sha256_hex(f"weights of {name}")


def blob_path(weights: str) -> str:
    """A model blob's path, its ModelPath (server/images.go:586-592)."""
    return f"{BLOBS_DIR}/sha256-{weights}"


# Encoders that keep no KV cache on either engine: llama.cpp's create_memory gives them none
# (llama/llama.cpp/src/llama-model.cpp, v0.12.6:19576-19588, v0.24.0:7126-7140), and
# Ollama's own bert has no cache (v0.12.6 model/models/bert/embed.go)
CACHELESS_ARCHS = frozenset(("bert", "nomic-bert", "nomic-bert-moe", "jina-bert-v2",
                             "jina-bert-v3", "neo-bert"))


# general.file_type as the GGUF writes it (llama_ftype; Ollama's fs/ggml/type.go FileType)
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "MXFP4": 4, "Q8_0": 7, "Q5_0": 8,
              "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14,
              "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18, "BF16": 32}


# Bytes per weight of a table at the file's type (a Q4_K_M file's tables are Q4_K: 144 B a
# block of 256)
TABLE_BYTES_PER_WEIGHT = {"F32": 4.0, "F16": 2.0, "BF16": 2.0, "Q8_0": 34 / 32}


# ggml's types as the simulator's tensors use them: (values a block, bytes a block)
# (ggml/src/ggml.c type_traits; Ollama's fs/ggml/type.go TypeSize / BlockSize)
GGML_BLOCKS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q8_0": (32, 34),
               "Q4_K": (256, 144), "Q6_K": (256, 210)}


def tensor_bytes(tensor: dict[str, Any]) -> int:
    """A tensor's size in the file, as Ollama's Tensor.Size reads it (elements x type size /
    block size, v0.12.6 fs/ggml/gguf.go)."""
    block, size = GGML_BLOCKS[tensor["type"]]
    return math.prod(tensor["shape"]) * size // block


# What Ollama's estimator counts a KV cache element at (kvCacheBytesPerElement, v0.12.6
# fs/ggml/ggml.go:904-915): q8_0 1 byte, q4_0 half, anything else f16's 2
ESTIMATE_KV_BYTES = {"q8_0": 1.0, "q4_0": 0.5, "f32": 4.0}
# The llama engine's estimate before 0.12.11 is llm/memory.go's (deleted by f560bd077)
MEMORY_GO_UNTIL = (0, 12, 11)
# From 0.13.3 an embedding model's batch is its context (v0.24.0 llm/server.go:552-555)
EMBEDDING_BATCH_SINCE = (0, 13, 3)


@dataclass(frozen=True)
class LlamaEstimate:
    """Ollama's estimate of a copy on the llama engine before 0.30, in bytes (what /api/ps
    reports and the fit check uses; not what llama.cpp allocates).

    `layers` W_i + KV_i of each blk.i; `output` output_norm + output (token_embd when tied);
    `buffer` blk.0's W_0 + KV_0 once more; `full`/`partial` GraphSize's graphFullOffload and
    graphPartialOffload; `minimum` CUDA's MinimumMemory (457 MiB, v0.12.6 discover/gpu.go:
    67-69; v0.24.0 ml/device.go:353-358); `memory_go` 0.12.6-0.12.10 (llm/memory.go)."""

    layers: tuple[int, ...]
    output: int
    buffer: int
    full: int
    partial: int
    minimum: int
    memory_go: bool

    @property
    def reported_bytes(self) -> int:
        """VRAMSize = TotalSize of a copy fully on the GPU: 0.12.6-0.12.10 the GPU's
        allocations, MinimumMemory + the buffer layer + layers + output + full graph
        (v0.12.6 llm/memory.go:306-337, 342-356, 364-374, 386, 423); 0.12.11-0.29 the layers,
        output and graph only (v0.24.0 llm/server.go:576-693, MemorySize :1895-1921)."""
        core = sum(self.layers) + self.output + self.full
        return core + self.minimum + self.buffer if self.memory_go else core

    @property
    def required_bytes(self) -> int:
        """What a load beside other models needs free (requireFull), OLLAMA_GPU_OVERHEAD aside:
        MinimumMemory + the buffer layer + layers + output + the larger graph (v0.12.6
        llm/memory.go:324, 349; v0.24.0 llm/server.go:563-566, 1004, 1184)."""
        return self.minimum + self.buffer + sum(self.layers) + self.output + \
            max(self.partial, self.full)

    def fits(self, free_bytes: int) -> bool:
        """0.12.6-0.12.10: every layer and the output strictly under the free memory
        (llm/memory.go:349 `FreeMemory > overhead+used+memoryLastLayer`, all layers needed,
        :92); from 0.12.11 the layers up to it (v0.24.0 llm/server.go:1184 `<=`)."""
        need = self.required_bytes
        return free_bytes > need if self.memory_go else free_bytes >= need


@dataclass(frozen=True)
class Tokenizer:
    """A family's vocabulary as its GGUF carries it (tokenizer.ggml.* and <arch>.vocab_size):
    the published tokenizers' sizes and special tokens; the tokens themselves made up."""

    model: str  # tokenizer.ggml.model: "gpt2" (byte-level BPE), "llama" (SentencePiece), "bert"
    vocab: int
    bos: int
    eos: int
    unknown: int = -1  # SentencePiece's and WordPiece's <unk>; -1: none
    add_bos: bool = False
    add_eos: bool = False

    def model_info(self, verbose: bool) -> dict[str, Any]:
        info: dict[str, Any] = {
            "tokenizer.ggml.model": self.model,
            "tokenizer.ggml.bos_token_id": self.bos,
            "tokenizer.ggml.eos_token_id": self.eos,
            "tokenizer.ggml.add_bos_token": self.add_bos,
            "tokenizer.ggml.add_eos_token": self.add_eos,
            "tokenizer.ggml.tokens": self.tokens() if verbose else None,
            "tokenizer.ggml.token_type": self.token_types() if verbose else None,
        }
        if self.unknown >= 0:
            info["tokenizer.ggml.unknown_token_id"] = self.unknown
        if self.model == "llama":  # SentencePiece scores its pieces; BPE has merges instead
            info["tokenizer.ggml.scores"] = [0.0] * self.vocab if verbose else None
        return info

    def tokens(self) -> list[str]:
        return [f"<tok{i}>" for i in range(self.vocab)]

    def token_types(self) -> list[int]:
        """1 normal, 2 unknown, 3 control (the special tokens)."""
        special = {self.bos: 3, self.eos: 3, **({self.unknown: 2} if self.unknown >= 0 else {})}
        return [special.get(i, 1) for i in range(self.vocab)]


# The catalog's families: vocabulary sizes and special tokens of their published tokenizers
# (Qwen3's 151936 with <|endoftext|> / <|im_end|>, Llama 3's 128256, Phi-3 mini's 32064 as
# Ollama's converter test data has it, Gemma 3's 262144, BERT's 30522, ...)
TOKENIZERS: dict[str, Tokenizer] = {
    "qwen3": Tokenizer("gpt2", 151936, bos=151643, eos=151645),
    "llama": Tokenizer("gpt2", 128256, bos=128000, eos=128009, add_bos=True),
    "phi3": Tokenizer("llama", 32064, bos=1, eos=32000, unknown=0),
    "nomic-bert": Tokenizer("bert", 30522, bos=101, eos=102, unknown=100, add_bos=True,
                            add_eos=True),
    "gemma3": Tokenizer("llama", 262144, bos=2, eos=1, unknown=3, add_bos=True),
    "gemma3n": Tokenizer("llama", 262144, bos=2, eos=1, unknown=3, add_bos=True),
    "gpt-oss": Tokenizer("gpt2", 201088, bos=199998, eos=200002),
    "cohere2": Tokenizer("gpt2", 256000, bos=5, eos=255001, add_bos=True),
    "olmo3": Tokenizer("gpt2", 100278, bos=100257, eos=100257),
    "lfm2": Tokenizer("gpt2", 65536, bos=1, eos=7, add_bos=True),
}
DEFAULT_TOKENIZER = TOKENIZERS["qwen3"]


@dataclass(frozen=True)
class SimModel:
    """A model on disk: what `/api/tags` and `/api/show` describe."""

    name: str
    disk_mib: int  # the GGUF file
    arch: str = "qwen3"
    block_count: int = 36
    embedding_length: int = 4096
    head_count: int = 32
    head_count_kv: int = 8
    key_length: int = 0  # 0: not in the file (embedding / heads)
    value_length: int = 0
    trained_ctx: int = 32768
    family: str = ""  # details.family; the architecture when empty
    parameter_size: str = "8B"
    quantization: str = "Q4_K_M"
    modelfile_num_ctx: int = 0  # PARAMETER num_ctx in its Modelfile
    system: str = ""  # SYSTEM in its Modelfile: another manifest, no other runner option
    # Runner PARAMETERs in its Modelfile (num_batch, num_gpu, main_gpu, use_mmap,
    # num_thread): its calls' defaults, which needsReload compares
    parameters: tuple[tuple[str, int | bool], ...] = ()
    adapter: str = ""  # the sha256 of an ADAPTER (a LoRA) in its Modelfile; "" none
    embedding: bool = False  # has <arch>.pooling_type: one slot, /api/embed only
    pooling: int = 1  # its <arch>.pooling_type (1 mean, 2 CLS, 3 last), when `embedding`
    vision: bool = False
    tools: bool = True  # its template renders tools (the "tools" capability)
    # Its template has `.Suffix` (the "insert" capability, server/images.go:251-253): none of
    # the catalog's (qwen3's, llama3.2's and phi3's templates on ollama.com have none)
    insert: bool = False
    # The compute buffers a batch of 512 needs with flash attention; 0: llama.cpp's for its
    # shape (`base_compute_mib`)
    compute_base_mib: int = 0
    # Its output layer reuses the token embedding table (no output.weight in the file: Llama
    # 3.2 3B, Gemma 3, Command R7B tie them; Qwen3 8B+, Phi-3 do not)
    tied_embeddings: bool = False
    # Sliding-window attention: the window (<arch>.attention.sliding_window) and the period of
    # the full layers among windowed ones (gemma3 6, gpt-oss 2, cohere2 and olmo3 4, gemma3n
    # 5); 0: every layer full
    sliding_window: int = 0
    full_layer_period: int = 0
    # The last layers that read an earlier layer's cache and keep none (gemma3n's
    # <arch>.attention.shared_kv_layers)
    shared_kv_layers: int = 0
    # The sha256 of its model blob, the GGUF file Ollama keys its runners by (ModelPath):
    # when left empty, one of its own from its name. `dataclasses.replace(m, name=...)`
    # keeps m's, as `ollama cp` and `ollama create` FROM m keep m's model layer; pass
    # weights="" for a model with a file of its own.
    weights: str = ""
    # A DRAFT model in its Modelfile (its own GGUF, manifest.MediaTypeImageDraft, 0.30+): HEAD's
    # llama-server runs it beside the model for speculative decoding; None none
    draft: SimModel | None = None
    # An MTP head in its weights file (<arch>.nextn_predict_layers; its weights in disk_mib): 0.30+
    # runs it as the draft while draft_num_predict > 0 (llm/llama_server.go:837-842, 901-907),
    # with its KV cache and compute as this model's (disk_mib 0); None none
    mtp: SimModel | None = None
    # <arch>.feed_forward_length (the published config's intermediate size); 0: 4 x embedding
    feed_forward_length: int = 0
    # KV heads layer by layer, when the file lists them (<arch>.attention.head_count_kv as an
    # array: lfm2's 0 for a short-convolution layer, which keeps no KV cache; convert/
    # convert_lfm2.go:124-143); () every layer head_count_kv
    kv_heads_per_layer: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.weights:
            object.__setattr__(self, "weights", weights_of(self.name))

    @property
    def blob_path(self) -> str:
        """Its ModelPath: what /api/show's FROM line names, and what Ollama sorts its victims
        by among equal keep-alives."""
        return blob_path(self.weights)

    @property
    def digest(self) -> str:
        """Its manifest's digest (/api/tags, /api/ps): the same for names that differ in
        nothing else (`ollama cp`), another for a model whose Modelfile changes anything."""
        layers = tuple(getattr(self, f.name) for f in fields(self)
                       if f.name != "name"
                       and not (f.name in ("draft", "mtp") and getattr(self, f.name) is None))
        return sha256_hex(repr(layers))

    @property
    def model_family(self) -> str:
        return self.family or self.arch

    @property
    def thinks(self) -> bool:
        """Reports the "thinking" capability: `think` is refused (400) by models without."""
        return self.arch in THINKING_ARCHS and not self.embedding

    def slots(self, num_parallel: int, version: str) -> int:
        """sched.go:497-510: one slot for embedding models and some families."""
        if self.embedding:
            return 1
        one_slot = ONE_SLOT_FAMILIES if version_tuple(version) >= (0, 30, 0) else ("mllama",)
        return 1 if self.model_family in one_slot else max(num_parallel, 1)

    def head_dims(self) -> tuple[int, int]:
        """Its key and value head dims (EmbeddingHeadCountK/V)."""
        default = self.embedding_length // self.head_count
        return self.key_length or default, self.value_length or default

    def footprint_mib(self, num_ctx: int, slots: int, cache_type: str = "f16",
                      batch: int = 512, version: str = CURRENT_VERSION,
                      window_batch: int = 0, flash_attention: bool = True,
                      new_engine: bool = False) -> int:
        """What a runner really holds of the GPU (HEAD's measured size); a windowed layer
        holds `window_batch` (else `batch`, else 512) more than its window. Its compute
        buffers: compute_mib."""
        key, value = self.head_dims()
        compute = self.compute_mib(num_ctx, slots, batch, version, window_batch,
                                   flash_attention, new_engine)
        if self.kv_heads_per_layer:  # (no family in the catalog has both this and a window)
            kv = sum(kv_cache_bytes(1, heads, key, value, num_ctx * slots, cache_type)
                     for heads in self.kv_heads_per_layer)
            return math.ceil(self.gpu_weights_mib + kv / MIB + compute)
        windowed = self.windowed_layers
        kv = kv_cache_bytes(self.kv_layers - windowed, self.head_count_kv, key, value,
                            num_ctx * slots, cache_type)
        if windowed:
            cells = windowed_cells(self.arch, self.sliding_window, num_ctx, slots, version,
                                   window_batch or batch or 512,
                                   own_engine(self.arch, self.embedding, False, version))
            kv += kv_cache_bytes(windowed, self.head_count_kv, key, value, cells, cache_type)
        return math.ceil(self.gpu_weights_mib + kv / MIB + compute)

    def compute_mib(self, num_ctx: int, slots: int, batch: int = 512,
                    version: str = CURRENT_VERSION, window_batch: int = 0,
                    flash_attention: bool = True, new_engine: bool = False) -> int:
        """A copy's compute buffers: with flash attention base_compute_mib and the batch's
        surcharge (`batch`, 0 for an embedding model); without, at least the scores of the
        runner's batch (`window_batch`, else `batch`, else 512) against its cache
        (sim_engine.attention_scores_bytes), or against the batch itself for an encoder
        without a cache."""
        with_flash = self.base_compute_mib + batch_surcharge_mib(batch)
        if flash_attention:
            return with_flash
        own = own_engine(self.arch, self.embedding, new_engine, version)
        tokens = attention_batch(version, own, self.embedding, window_batch or batch or 512,
                                 num_ctx, slots)
        cells = attention_cells(version, own, num_ctx, slots) if self.kv_layers else tokens
        scores = attention_scores_bytes(tokens, cells, self.embedding_length, self.head_count)
        return max(with_flash, math.ceil(scores / MIB))

    @property
    def base_compute_mib(self) -> int:
        """The compute buffers of a batch of 512 with flash attention, unless set: at least
        the batch's logits and hidden states in f32, 4 x 512 x (embedding + vocabulary) B
        (llama.cpp reserves 258.5 MiB for Llama 3 8B's 128256 tokens; 523 MiB for gemma3's
        262144), and 256 MiB for a small vocabulary or an encoder, which computes no logits
        (the attention and feed-forward scratch, not measured here)."""
        if self.compute_base_mib:
            return self.compute_base_mib
        if self.embedding:
            return 256
        logits = 4 * 512 * (self.embedding_length + self.tokenizer.vocab)
        return max(256, math.ceil(logits / MIB))

    @property
    def token_embedding_mib(self) -> float:
        """The file's token embedding table (vocabulary x embedding length) at its type:
        Q4_K in a Q4_K_M build (llama-quant.cpp's default type, v0.12.6 llama/llama.cpp/src/
        llama-quant.cpp:557), else the file's own."""
        per_weight = TABLE_BYTES_PER_WEIGHT.get(self.quantization, 144 / 256)
        return self.tokenizer.vocab * self.embedding_length * per_weight / MIB

    @property
    def gpu_weights_mib(self) -> float:
        """What of the file a copy puts on the GPU: all but the token embedding table, which
        llama.cpp's input layer keeps on the CPU (v0.12.6 llama/llama.cpp/src/
        llama-model.cpp:2180-2182); a tied output layer loads the table again onto the
        GPU (TENSOR_DUPLICATED, :3247-3250), so such a model's whole file is there."""
        if self.tied_embeddings:
            return float(self.disk_mib)
        return max(0.0, self.disk_mib - self.token_embedding_mib)  # an MTP head: in its model's

    def draft_mib(self, num_ctx: int, slots: int, batch: int = 512,
                  version: str = CURRENT_VERSION, window_batch: int = 0,
                  flash_attention: bool = True) -> int:
        """What its DRAFT model adds to a copy that drafts (0.30+: llama-server's
        --spec-draft-model, llm/llama_server.go:807-823, 382): the draft's weights, a KV cache
        of its own for every slot's context, at llama.cpp's draft cache type (f16: Ollama
        passes only --cache-type-k/-v, :390-393) and its compute buffers, under the server's
        one --flash-attn (:398)."""
        draft = self.draft or self.mtp  # a DRAFT is run, not the head (:901-907)
        if draft is None:
            return 0
        return draft.footprint_mib(num_ctx, slots, "f16", batch, version, window_batch,
                                   flash_attention)

    @property
    def file_mib(self) -> int:
        """Its manifest's layers on disk (/api/tags `size`, manifest.Size: the DRAFT's
        file too)."""
        return self.disk_mib + (self.draft.file_mib if self.draft else 0)

    @property
    def kv_layers(self) -> int:
        """Layers with a cache of their own: all but the shared ones; none for a BERT-like
        encoder, which neither engine gives a cache (CACHELESS_ARCHS)."""
        if self.arch in CACHELESS_ARCHS:
            return 0
        return self.block_count - self.shared_kv_layers

    @property
    def windowed_layers(self) -> int:
        """Layers with a sliding window and a cache: all but every `full_layer_period`-th."""
        if not (self.sliding_window and self.full_layer_period):
            return 0
        return self.kv_layers - self.kv_layers // self.full_layer_period

    @property
    def kv_per_layer(self) -> list[int]:
        """Each layer's KV heads, as the file has them."""
        return list(self.kv_heads_per_layer) or [self.head_count_kv] * self.block_count

    @property
    def window_pattern(self) -> list[bool]:
        """Which layers are windowed, as Ollama's converter lists them (gemma3n)."""
        return [(i + 1) % self.full_layer_period != 0 for i in range(self.block_count)]

    def estimate_mib(self, num_ctx: int, slots: int) -> int:
        """Ollama's own estimate before loading it (PredictServerVRAM: the fewest KV heads
        of any layer, HeadCountKVMin, llm/llama_server.go:2689)."""
        return math.ceil(predict_server_vram(
            self.disk_mib * MIB, self.block_count, min(self.kv_per_layer),
            self.embedding_length,
            self.head_count, num_ctx * slots) / MIB)

    def llama_estimate(self, num_ctx: int, slots: int, batch: int, cache_type: str,
                       version: str) -> LlamaEstimate:
        """Ollama's estimate of a copy on the llama engine before 0.30 (LlamaEstimate): the
        output layer as /api/show lists it (tensors()), the layers what of the file the GPU
        holds beside it; `num_ctx` each slot's (capped at the trained
        context), `batch` the call's num_batch (512 by default), `cache_type` the copy's.

        GraphSize (v0.12.6 fs/ggml/ggml.go:550-797; v0.24.0 :600-): each layer's KV is
        context x slots x (key + value head dims) x its KV heads x the cache type's bytes
        (none for a layer without KV heads, as lfm2's convolutions); the batch is min(num_ctx,
        num_batch) (v0.12.6 llm/memory.go:210; v0.24.0 llm/server.go:173), an embedding
        model's at least its context from 0.13.3 (v0.24.0 :552-555). "llama": full =
        max(4b(1+4E+c(1+H)), 4b(E+V)), partial = 4bE + max(4b(1+E+max(c,E)) + E*E*9/16 +
        4c(bH + d*Hkv), 4b(E+V) + E*V*105/128) (v0.12.6 :614-625; v0.24.0 :664-).
        Architectures without a case (phi3, cohere2, olmo3, lfm2, nomic-bert) get 0, which
        memory.go / Load set to
        HeadCountMax / HeadCountKVMin (0 taken as 1) x all the KV / 6 (v0.12.6 llm/memory.go:
        221-231; v0.24.0 llm/server.go:631-641)."""
        tensors = self.tensors()
        groups: dict[str, int] = {}
        for t in tensors:
            name = t["name"]
            group = ".".join(name.split(".")[:2]) if name.startswith("blk.") else \
                name.split(".")[0]
            groups[group] = groups.get(group, 0) + tensor_bytes(t)
        v = version_tuple(version)
        context = num_ctx * slots
        b = min(num_ctx, batch)
        if self.embedding and v >= EMBEDDING_BATCH_SINCE:
            b = max(b, num_ctx)
        key, value = self.head_dims()
        per_element = ESTIMATE_KV_BYTES.get(cache_type, 2.0)
        heads_kv = self.kv_per_layer
        kv = [int(context * (key + value) * h * per_element) if h else 0 for h in heads_kv]
        output = groups.get("output_norm", 0) + groups.get("output", groups.get("token_embd", 0))
        # The listed tensors are a made-up dense layout, smaller than the file: the layers
        # hold what of the file the GPU takes beside the output layer (gpu_weights_mib)
        layer_weights = max(0, int(self.gpu_weights_mib * MIB) - output) // \
            max(self.block_count, 1)
        layers = tuple(layer_weights + kv[i] for i in range(self.block_count))
        E, H, V = self.embedding_length, self.head_count, self.tokenizer.vocab
        if self.arch == "llama":
            h_kv, d = max(heads_kv), E // H
            full = max(4 * b * (1 + 4 * E + context * (1 + H)), 4 * b * (E + V))
            partial = 4 * b * E + max(
                4 * b * (1 + E + max(context, E)) + E * E * 9 // 16
                + 4 * context * (b * H + d * h_kv),
                4 * b * (E + V) + E * V * 105 // 128)
        else:
            gqa = H // (min(heads_kv) or 1)
            full = partial = gqa * sum(kv) // 6
        memory_go = v < MEMORY_GO_UNTIL
        return LlamaEstimate(layers=layers, output=output, buffer=layers[0] if layers else 0,
                             full=full, partial=partial,
                             minimum=MINIMUM_MEMORY_MIB * MIB, memory_go=memory_go)

    @property
    def tokenizer(self) -> Tokenizer:
        return TOKENIZERS.get(self.arch, DEFAULT_TOKENIZER)

    def model_info(self, verbose: bool = False) -> dict[str, Any]:
        """The GGUF's key-values as /api/show gives them (server/routes.go GetModelInfo, less
        general.name and the chat template); without `verbose` every non-empty array is
        null, as Ollama reads the file with maxArraySize 0 (getModelData, server/routes.go
        v0.12.6:1152-1157, HEAD:1600-1605; fs/ggml/gguf.go newArray keeps no values above it
        and array.MarshalJSON marshals them: v0.12.6:397-406, HEAD:465-483), every version
        the simulator models."""
        arch = self.arch
        info: dict[str, Any] = {
            "general.architecture": arch,
            "general.parameter_count": int(float(self.parameter_size.rstrip("BM")) * 1e9),
            f"{arch}.context_length": self.trained_ctx,
            f"{arch}.block_count": self.block_count,
            f"{arch}.embedding_length": self.embedding_length,
            f"{arch}.feed_forward_length": self.feed_forward_length or 4 * self.embedding_length,
            f"{arch}.vocab_size": self.tokenizer.vocab,
            f"{arch}.attention.head_count": self.head_count,
            f"{arch}.attention.head_count_kv": list(self.kv_heads_per_layer)
            or self.head_count_kv,
        }
        if self.quantization in FILE_TYPES:
            info["general.file_type"] = FILE_TYPES[self.quantization]
        if self.arch in CACHELESS_ARCHS or self.arch == "cohere2":  # LayerNorm, not RMSNorm
            info[f"{arch}.attention.layer_norm_epsilon"] = 1e-12 if self.arch in \
                CACHELESS_ARCHS else 1e-5
        else:
            info[f"{arch}.attention.layer_norm_rms_epsilon"] = \
                1e-5 if self.arch in ("llama", "phi3") else 1e-6
        if self.arch not in CACHELESS_ARCHS:
            info[f"{arch}.rope.dimension_count"] = self.head_dims()[0]
        if self.key_length:
            info[f"{arch}.attention.key_length"] = self.key_length
        if self.value_length:
            info[f"{arch}.attention.value_length"] = self.value_length
        if self.embedding:
            info[f"{arch}.pooling_type"] = self.pooling
        if self.sliding_window:
            info[f"{arch}.attention.sliding_window"] = self.sliding_window
        if self.shared_kv_layers:
            info[f"{arch}.attention.shared_kv_layers"] = self.shared_kv_layers
            info[f"{arch}.attention.sliding_window_pattern"] = self.window_pattern
        if self.mtp:
            info[f"{arch}.nextn_predict_layers"] = self.mtp.block_count
        info.update(self.tokenizer.model_info(verbose))
        if verbose:
            return info
        return {k: None if isinstance(v, list) and v else v for k, v in info.items()}

    def tensors(self) -> list[dict[str, Any]]:
        """/api/show `tensors` (verbose or not: ShowResponse.Tensors, server/routes.go): a
        dense transformer's layout, Q4_K with Q6_K output as Ollama's Q4_K_M builds
        (the simulator's files are made up; norms at F32)."""
        emb, ffn = self.embedding_length, self.feed_forward_length or 4 * self.embedding_length
        key, value = self.head_dims()
        weight = {"F16": "F16", "F32": "F32", "Q8_0": "Q8_0", "BF16": "BF16"}.get(
            self.quantization, "Q4_K")

        def tensor(name: str, kind: str, *shape: int) -> dict[str, Any]:
            return {"name": name, "type": kind, "shape": list(shape)}

        out = [tensor("token_embd.weight", weight, emb, self.tokenizer.vocab)]
        for i, kv_heads in enumerate(self.kv_per_layer):
            blk = f"blk.{i}"
            out += [tensor(f"{blk}.attn_norm.weight", "F32", emb),
                    tensor(f"{blk}.attn_q.weight", weight, emb, self.head_count * key),
                    tensor(f"{blk}.attn_k.weight", weight, emb, kv_heads * key),
                    tensor(f"{blk}.attn_v.weight", weight, emb, kv_heads * value),
                    tensor(f"{blk}.attn_output.weight", weight, self.head_count * value, emb),
                    tensor(f"{blk}.ffn_norm.weight", "F32", emb),
                    tensor(f"{blk}.ffn_up.weight", weight, emb, ffn),
                    tensor(f"{blk}.ffn_down.weight", weight, ffn, emb)]
        out.append(tensor("output_norm.weight", "F32", emb))
        if not (self.embedding or self.tied_embeddings):  # a tied output reads token_embd
            out.append(tensor("output.weight", "Q6_K" if weight == "Q4_K" else weight,
                              emb, self.tokenizer.vocab))
        return out

    @property
    def embeds_whole(self) -> bool:
        """0.30+: llama-server must take an embedding input in one batch (its pooling reads
        every token; llama.cpp's server `can_split` splits only last-token pooling)."""
        return self.embedding and self.pooling != LAST_POOLING


@dataclass(frozen=True)
class SimConfig:
    """One `ollama serve` on one simulated GPU, or on `gpu_count` of equal size."""

    name: str = "sim"
    total_vram_mib: int = 24576
    models: tuple[SimModel, ...] = ()
    num_parallel: int = 1  # OLLAMA_NUM_PARALLEL
    max_loaded_models: int = 3  # OLLAMA_MAX_LOADED_MODELS; 0: automatic, 3 per GPU
    gpu_count: int = 1  # the GPUs this one `ollama serve` sees, total_vram_mib split evenly
    sched_spread: bool = False  # OLLAMA_SCHED_SPREAD: every load over all the GPUs
    # What llama-server's fit keeps free on each GPU it uses (0.30+; llama.cpp's own default
    # is 1024, sim_gpus.LLAMA_FIT_TARGET_MIB): 0 by default, which fits a copy into all the
    # free memory, as the simulator did before it had several GPUs
    fit_target_mib: int = 0
    # OLLAMA_GPU_OVERHEAD (in MiB here; Ollama takes bytes): off each GPU's total for the
    # default context; before 0.30 each load's layout keeps it free (sim_sched.fit_margin_mib)
    gpu_overhead_mib: int = 0
    context_length: int = 0  # OLLAMA_CONTEXT_LENGTH; 0 = Ollama's default for its version
    kv_cache_type: str = "f16"  # OLLAMA_KV_CACHE_TYPE (what a copy runs with: cache_type_for)
    flash_attention: bool | None = None  # OLLAMA_FLASH_ATTENTION; None: unset
    # Hardware: the GPUs run flash attention (Ollama's FlashAttentionSupported)
    gpu_flash_attention: bool = True
    max_queue: int = 512  # OLLAMA_MAX_QUEUE: loads that may wait
    new_engine: bool = False  # OLLAMA_NEW_ENGINE (0.12: Ollama's own engine where it can)
    keep_alive_s: float = 300.0  # OLLAMA_KEEP_ALIVE
    # Hardware, not Ollama's: a load is the runner's start-up (process spawn, backend and
    # CUDA init) and then the read of the weights file (/api/tags `size`, not the footprint:
    # the KV cache is allocated, not read) at this rate
    startup_s: float = 1.0
    load_mib_per_s: float = 1024.0
    # Hardware: how long the driver takes to give a killed runner's memory back (what 0.12's
    # wait for freed memory sees), and a bootstrap GPU discovery's time (HEAD's, when no other
    # runner can report the free memory; Ollama caps it at 3 s)
    vram_release_s: float = 0.3
    discovery_s: float = 0.5
    seed: int = 0  # the order Go's map iteration gives the runners (HEAD's recovery wait)
    tokens_per_s: float = 50.0
    prompt_tokens_per_s: float = 4000.0
    # An answer's own length in tokens when the call does not say (sim_output.ANSWER_TOKENS);
    # num_predict only caps it
    answer_tokens: int = 16
    chars_per_token: float = 4.0
    image_tokens: int = IMAGE_TOKENS  # a vision model's own cost per image (qwen2.5vl: more)
    time_scale: float = 1.0  # multiplies every simulated duration; tests use 0.001-0.01
    # multiplies keep-alives instead, when set: 1.0 runs them in real time, as a sidecar
    # reading a call's keep_alive counts them
    keep_alive_scale: float | None = None
    version: str = CURRENT_VERSION
    # What each more sequence in a runner's batch adds to its decode step (a hardware figure:
    # a step is memory-bound, so one more sequence adds its KV-cache reads, not the weights')
    batch_cost: float = 0.1
    # Runners decoding at once time-slice the card (OllamaSim.token_period_s); False: every
    # slot decodes alone at full speed, whatever else runs
    share_gpu: bool = True
    cloud_stubs: tuple[CloudStub, ...] = ()  # stubs of cloud models in the store (sim_cloud.py)
    no_cloud: bool = False  # OLLAMA_NO_CLOUD

    def model(self, name: str) -> SimModel | None:
        wanted = normalise_name(name)
        for m in self.models:
            if normalise_name(m.name) == wanted:
                return m
        return None

    @property
    def max_runners(self) -> int:
        """OLLAMA_MAX_LOADED_MODELS, or when 0 the automatic 3 per GPU (server/sched.go:86,
        265-290)."""
        return self.max_loaded_models or DEFAULT_MODELS_PER_GPU * max(self.gpu_count, 1)

    def default_context(self) -> int:
        """What a request that sets no num_ctx gets: OLLAMA_CONTEXT_LENGTH, else Ollama's
        default for this version (and this card's memory)."""
        return self.context_length or default_num_ctx(
            self.version, self.total_vram_mib - self.gpu_overhead_mib * self.gpu_count)

    def provider_entry(self, endpoint: str) -> dict[str, Any]:
        """This GPU as an operator lists it for the sidecar: its memory and the OLLAMA_*
        settings it runs with (no contextLength when OLLAMA_CONTEXT_LENGTH is unset)."""
        entry: dict[str, Any] = {"name": self.name, "endpoint": endpoint,
                                 "totalVramMiB": self.total_vram_mib,
                                 "maxParallel": self.num_parallel,
                                 "maxLoadedModels": self.max_loaded_models,
                                 "kvCacheType": self.kv_cache_type}
        if self.context_length:
            entry["contextLength"] = self.context_length
        if self.flash_attention is not None:
            entry["flashAttention"] = self.flash_attention
        if self.gpu_count > 1:
            entry["gpus"] = self.gpu_count
        if self.gpu_overhead_mib:
            entry["gpuOverheadBytes"] = self.gpu_overhead_mib * MIB
        return entry

    def flash_attention_for(self, model: SimModel) -> bool:
        """Whether a copy of `model` runs with flash attention (sim_engine.runs_flash_attention)."""
        return runs_flash_attention(self.version, model.arch, model.embedding,
                                    model.head_dims(),
                                    own_engine(model.arch, model.embedding, self.new_engine,
                                               self.version),
                                    self.flash_attention, self.gpu_flash_attention)

    def cache_type_for(self, model: SimModel) -> str:
        """The KV cache type a copy of `model` runs with (sim_engine.runner_cache_type)."""
        return runner_cache_type(self.version,
                                 own_engine(model.arch, model.embedding, self.new_engine,
                                            self.version),
                                 self.flash_attention, self.flash_attention_for(model),
                                 self.kv_cache_type)


# Ollama's WaitUntilRunning polls the runner's /health at once, then after each 250 ms sleep
# (llm/llama_server.go:1368-1381; v0.12.6 llm/server.go:1323): a load is seen ready on that grid
READY_POLL_S = 0.25


def load_seconds(startup_s: float, file_mib: int, mib_per_s: float) -> float:
    """A load from its start to the runner seen ready: the runner's start-up, then the read
    of the weights file (the KV cache is allocated, never read), rounded up to the readiness
    poll's grid. Start-up and read rate are hardware figures, not Ollama's."""
    raw = startup_s + file_mib / mib_per_s
    # round() first: a figure on the grid must not go up a step for a float's last digit
    return math.ceil(round(raw / READY_POLL_S, 9)) * READY_POLL_S


# waitForVRAMRecovery reads free memory on a 250 ms ticker (server/sched.go:1467; v0.12.6
# :656) and gives up after 5 s (:101; v0.12.6 :654)
POLL_S = 0.25
RECOVERY_TIMEOUT_S = 5.0
RECOVERED_SHARE = 0.75  # done once free memory rose by more than this x the victim's VRAM
DISCOVERY_CAP_S = 3.0  # a bootstrap discovery's own timeout (discover/runner.go:340)


def accounted_free_mib(free_at_load_mib: int, vram_mib: int) -> int:
    """The card's free memory by a runner's own static accounting (HEAD's GetDeviceInfos,
    llm/llama_server.go:2600-2636): what was free at its load less its VRAM, floored at 0;
    blind to every load and unload since its own."""
    return max(0, free_at_load_mib - vram_mib)


def in_map_order(runners: Sequence[OnGpu], rng: random.Random) -> list[OnGpu]:
    """The runners with memory on the GPU in the order Go's map of s.loaded gives (random;
    `rng` for it, reproducibly): HEAD's free-memory readings ask the first of them
    (discover/runner.go:285-331)."""
    on_gpu = [r for r in runners if r.vram_mib > 0]
    rng.shuffle(on_gpu)
    return on_gpu


class OnGpu(Protocol):
    """A loaded runner as HEAD's free-memory readings see it."""

    @property
    def vram_mib(self) -> int: ...

    @property
    def accounted_free_mib(self) -> int:
        """Its own static accounting of the card's free memory (accounted_free_mib)."""
        ...


def recovery_s(victim: OnGpu, loaded: Sequence[OnGpu], rng: random.Random,
               discovery_s: float) -> float:
    """HEAD's wait for freed memory after unloading `victim` (waitForVRAMRecovery,
    server/sched.go:1441-1497): `loaded` is s.loaded as processCompleted snapshots it before
    the kill (:454-457), the victim among them, in any fixed order; `rng` stands for Go's map
    order. No wait for a runner with nothing on the GPU. The baseline and each 250 ms tick
    read the first runner on the GPU in map order (discover/runner.go:285-331), the victim
    included for the baseline (its GPUs are cleared at the unload, :1377): the same survivor
    for both readings sees no change (5 s); the victim's baseline against a survivor's tick is
    done at once when the survivor's figure is lower (uint64 wraps) or more than 0.75 x the
    victim's VRAM above it, else 5 s; with no survivor a bootstrap discovery reads the real
    memory (a tick and its discovery time, at most 3 s)."""
    if victim.vram_mib <= 0:
        return 0.0
    on_gpu = in_map_order(loaded, rng)
    survivor = next((r for r in on_gpu if r is not victim), None)
    if survivor is None:
        return POLL_S + min(discovery_s, DISCOVERY_CAP_S)
    if on_gpu[0] is survivor:
        return RECOVERY_TIMEOUT_S
    freed = survivor.accounted_free_mib - victim.accounted_free_mib
    if freed < 0 or freed > RECOVERED_SHARE * victim.vram_mib:
        return POLL_S
    return RECOVERY_TIMEOUT_S


def driver_recovery_s(release_s: float) -> float:
    """0.12's wait for freed memory (v0.12.6 server/sched.go:628-684), which reads the
    driver's figure: the first tick after the driver gave the memory back `release_s` after
    the kill, at most 5 s."""
    return min(RECOVERY_TIMEOUT_S, POLL_S * max(1, math.ceil(release_s / POLL_S - 1e-9)))


def decode_step_s(tokens_per_s: float, speed: float, sequences: int, batch_cost: float
                  ) -> float:
    """One decode step of a runner whose batch holds `sequences` (>= 1) sequences: each
    decoding sequence gains one token a step (one batch per step, docs/engine.md)."""
    return (1 + batch_cost * (max(sequences, 1) - 1)) / (tokens_per_s * speed)


# Ollama's model names (types/model/name.go:101-176 ParseName, 344-376 isValidPart; the
# same rules at v0.12.6 :135, :319): [[scheme://]host/][namespace/]model[:tag], host
# registry.ollama.ai, namespace library and tag latest when missing (:39-41); a separator with
# nothing beside it spoils the name. The simulator keeps its own copy: it ships without the sidecar.
NAME_DEFAULTS = ("registry.ollama.ai", "library", "", "latest")
# From 0.15.5 /api/chat finds the model under any spelling; before, only as the store spells
# it (v0.12.6 server/routes.go:1826 GetModel(req.Model), 0.15.5 :1980 GetModel(name.String()))
ANY_SPELLING_SINCE = (0, 15, 5)
_NAME_LENGTHS = (350, 80, 80, 80)
_NAME_EXTRA = ("-_.:", "-_", "-_.", "-_.")
_MISSING = "!MISSING!"
INVALID_MODEL_NAME = "invalid model name"  # server/routes.go:66-75 writeModelRefParseError


def _cut(text: str, sep: str) -> tuple[str, str, bool]:
    before, found, after = text.rpartition(sep)
    return (before or _MISSING, after or _MISSING, True) if found else (text, "", False)


def name_parts(name: str) -> tuple[str, str, str, str]:
    """Host, namespace, model and tag as ParseName reads them, the defaults filled in."""
    host = namespace = tag = ""
    rest = name
    if rest.rfind(":") > rest.rfind("/"):
        rest, tag, _ = _cut(rest, ":")
    rest, model, promised = _cut(rest, "/")
    if not promised:
        model = rest
    else:
        rest, namespace, promised = _cut(rest, "/")
        if not promised:
            namespace = rest
        else:
            scheme, sep, host = rest.partition("://")
            host = host if sep else scheme
    given = (host, namespace, model, tag)
    return tuple(g or d for g, d in zip(given, NAME_DEFAULTS, strict=True))  # type: ignore[return-value]


def _word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "_")


def valid_name(name: str) -> bool:
    """Name.IsValid: every part present, within its length and of its characters."""
    return all(1 <= len(part) <= size and _word(part[0]) and
               all(c in extra or _word(c) for c in part[1:])
               for part, size, extra in zip(name_parts(name), _NAME_LENGTHS, _NAME_EXTRA,
                                            strict=True))


def normalise_name(name: str) -> str:
    """What Ollama matches a name by: its four parts, defaults filled in, case folded
    (server/routes.go:1222-1245 getExistingName compares each part with EqualFold)."""
    return "/".join(name_parts(name)).lower()


DIGITS = "0123456789"


def tokens_for_text(text: str, chars_per_token: float) -> int:
    """ASCII text at `chars_per_token`, but every digit and every non-ASCII character a token
    of its own, as Qwen's tokenizer splits numbers into digits and byte-level tokenizers
    spend one or more on each CJK character."""
    if not text:
        return 0
    dense = sum(map(text.count, DIGITS))
    if not text.isascii():
        dense += sum(1 for c in text if not c.isascii())
    return math.ceil((len(text) - dense) / chars_per_token) + dense


@dataclass
class PromptTokens:
    """A prompt as the engine counts it: per-message tokens plus the tool schema."""

    messages: list[int] = field(default_factory=list)
    system_flags: list[bool] = field(default_factory=list)
    fixed: int = 0  # tools and other never-dropped parts
    images: int = 0
    # The prompt as the prompt cache compares it: (digest of a part's content, its tokens)
    # in the order the template renders them (sim_cache.py)
    blocks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.fixed + sum(self.messages)


@dataclass(frozen=True)
class Fitted:
    """What the engine does with a prompt in a context of `num_ctx` tokens."""

    tokens: int  # what it evaluates
    cut: bool  # it dropped or cut part of the prompt, and said nothing
    error: tuple[int, str] | None = None  # it refused the prompt (status, message)


def drop_old_messages(prompt: PromptTokens, num_ctx: int) -> tuple[int, bool]:
    """server/prompt.go chatPrompt: the longest run of the newest messages (the last one
    always, system messages always) whose tokens are at most num_ctx."""
    last = len(prompt.messages) - 1
    for first in range(len(prompt.messages)):
        kept = prompt.fixed + sum(t for i, t in enumerate(prompt.messages)
                                  if i >= first or prompt.system_flags[i])
        if kept <= num_ctx or first == last:
            return kept, first > 0
    return prompt.total, False


def fit_prompt(prompt: PromptTokens, num_ctx: int, version: str, *, chat: bool,
               truncate: bool = True, shift: bool = True, num_keep: int = NUM_KEEP,
               drop_ctx: int | None = None) -> Fitted:
    """Message dropping against `drop_ctx` (the runner's `num_ctx` unless given), then the
    runner's check (llm/llama_server.go:279-331 at HEAD: a
    prompt of num_ctx tokens or more is halved with context shift, keeping the call's
    `num_keep` tokens + BOS, all of it when negative, at most num_ctx - 1; else refused with
    400; with images or `truncate: false` llama-server refuses it; v0.12.6's runners keep
    num_keep tokens and fill the context exactly, or refuse with `truncate: false`)."""
    dropped_at = num_ctx if drop_ctx is None else drop_ctx
    tokens, cut = drop_old_messages(prompt, dropped_at) if chat and truncate else \
        (prompt.total, False)
    tokens += 1  # BOS
    if version_tuple(version) < (0, 30, 0):
        if tokens <= num_ctx:
            return Fitted(tokens, cut)
        if not truncate:
            return Fitted(tokens, cut, (400, INPUT_TOO_LONG))
        return Fitted(num_ctx, True)
    if tokens <= num_ctx - 1:
        return Fitted(tokens, cut)
    if truncate and not prompt.images:
        if shift:
            keep = tokens if num_keep < 0 else num_keep + 1  # + BOS (:301-307)
            return Fitted(context_shift_limit(num_ctx, keep), True)
        return Fitted(tokens, cut, (400, PROMPT_TOO_LONG))
    return Fitted(tokens, cut, (400, llama_server_refusal(tokens, num_ctx)))


def llama_server_refusal(tokens: int, num_ctx: int) -> str:
    """The body llama-server answers an over-long prompt with, which Ollama passes on as a
    string in `error`."""
    message = (f"request ({tokens} tokens) exceeds the available context size ({num_ctx} "
               "tokens), try increasing it")
    return ('{"error":{"code":400,"message":"' + message + '","type":"exceed_context_size_'
            f'error","n_prompt_tokens":{tokens},"n_ctx":{num_ctx}}}}}')


# The catalog: architectures from the models' published configs (qwen3, Llama 3.2), phi3
# mini's as Ollama's converter test data has it, file sizes of their Q4_K_M builds.
CATALOG: tuple[SimModel, ...] = (
    SimModel("qwen3:32b", disk_mib=20200, block_count=64, embedding_length=5120,
             head_count=64, head_count_kv=8, key_length=128, value_length=128,
             trained_ctx=40960, parameter_size="32.8B", feed_forward_length=25600),
    SimModel("qwen3:14b", disk_mib=9300, block_count=40, embedding_length=5120,
             head_count=40, head_count_kv=8, key_length=128, value_length=128,
             trained_ctx=40960, parameter_size="14.8B", feed_forward_length=17408),
    SimModel("qwen3:8b", disk_mib=5200, block_count=36, embedding_length=4096,
             head_count=32, head_count_kv=8, key_length=128, value_length=128,
             trained_ctx=40960, parameter_size="8.2B", feed_forward_length=12288),
    SimModel("llama3.2:3b", disk_mib=1926, arch="llama", block_count=28,
             embedding_length=3072, head_count=24, head_count_kv=8, key_length=128,
             value_length=128, trained_ctx=131072, parameter_size="3.2B",
             feed_forward_length=8192, tied_embeddings=True),
    SimModel("phi3:mini", disk_mib=2176, arch="phi3", block_count=32, embedding_length=3072,
             head_count=32, head_count_kv=32, trained_ctx=4096, parameter_size="3.8B",
             # its template has no tools: Ollama lists only "completion"
             feed_forward_length=8192, tools=False),
    SimModel("nomic-embed-text:latest", disk_mib=262, arch="nomic-bert", block_count=12,
             embedding_length=768, head_count=12, head_count_kv=12, trained_ctx=2048,
             parameter_size="137M", quantization="F16", embedding=True,
             feed_forward_length=3072),
    # A sliding-window model. gemma3 27B: Google's config (62 layers, hidden 5376, 32 heads,
    # 16 KV heads, head_dim 128, sliding_window 1024, every 6th layer global; Ollama's own
    # gemma3 code names the 62 layers, v0.12.6 model/models/gemma3/model_text.go:34), 17 GB
    # as ollama.com lists gemma3:27b; text only here (its vision is left out), no tools in
    # its template.
    SimModel("gemma3:27b", disk_mib=16590, arch="gemma3", block_count=62,
             embedding_length=5376, head_count=32, head_count_kv=16, key_length=128,
             value_length=128, trained_ctx=131072, parameter_size="27.4B", tools=False,
             sliding_window=1024, full_layer_period=6, feed_forward_length=21504,
             tied_embeddings=True),
)


# gpt-oss 20B (OpenAI's config: 24 layers, hidden 2880, 64 heads, 8 KV heads, head_dim 64,
# sliding_window 128 on every other layer), 14 GB as ollama.com lists it; not in the catalog
# (its thinking and harmony format are not simulated)
GPT_OSS_20B = SimModel("gpt-oss:20b", disk_mib=13141, arch="gpt-oss", block_count=24,
                       embedding_length=2880, head_count=64, head_count_kv=8, key_length=64,
                       value_length=64, trained_ctx=131072, parameter_size="20.9B",
                       sliding_window=128, full_layer_period=2,
                       feed_forward_length=2880)
# Other windowed architectures, not in the catalog either, from their published configs and
# ollama.com's sizes: command-r7b (cohere2: 32 layers, hidden 4096, 32 heads, 8 KV heads,
# head_dim 128, sliding_window 4096, every 4th layer full; Ollama 0.12 runs it on the llama
# engine); olmo-3 7B (32 layers, hidden 4096, 32 heads and KV heads, sliding_window 4096,
# every 4th full); gemma3n E4B (35 layers, hidden 2048, 8 heads, 2 KV heads, head_dim 256,
# sliding_window 512, every 5th full, the last 15 reading the cache of earlier ones)
COMMAND_R7B = SimModel("command-r7b:latest", disk_mib=5100, arch="cohere2", block_count=32,
                       embedding_length=4096, head_count=32, head_count_kv=8, key_length=128,
                       value_length=128, trained_ctx=131072, parameter_size="8.0B",
                       sliding_window=4096, full_layer_period=4,
                       feed_forward_length=14336, tied_embeddings=True)
OLMO3_7B = SimModel("olmo-3:7b", disk_mib=4500, arch="olmo3", block_count=32,
                    embedding_length=4096, head_count=32, head_count_kv=32, trained_ctx=65536,
                    parameter_size="7.3B", tools=False, sliding_window=4096,
                    full_layer_period=4, feed_forward_length=11008)
GEMMA3N_E4B = SimModel("gemma3n:e4b", disk_mib=7500, arch="gemma3n", block_count=35,
                       embedding_length=2048, head_count=8, head_count_kv=2, key_length=256,
                       value_length=256, trained_ctx=32768, parameter_size="6.9B",
                       tools=False, sliding_window=512, full_layer_period=5,
                       shared_kv_layers=15, feed_forward_length=16384,
                       tied_embeddings=True)
WINDOWED_MODELS = (GPT_OSS_20B, COMMAND_R7B, OLMO3_7B, GEMMA3N_E4B)
# A model whose file lists its KV heads layer by layer (a non-verbose /api/show gives null for
# them): LFM2 1.2B (Liquid AI's config: 16 layers, hidden 2048, 32 heads, 8 KV heads in the 6
# attention layers 2, 5, 8, 10, 12 and 14, the others short convolutions; vocabulary 65536,
# 128000 trained context), about 700 MB at Q4_K_M; not in the catalog
LFM2_1_2B = SimModel("lfm2:1.2b", disk_mib=698, arch="lfm2", block_count=16,
                     embedding_length=2048, head_count=32, head_count_kv=8,
                     trained_ctx=128000, parameter_size="1.2B", tools=False,
                     feed_forward_length=8192, tied_embeddings=True,
                     kv_heads_per_layer=tuple(8 if i in (2, 5, 8, 10, 12, 14) else 0
                                              for i in range(16)))


def demo_fleet(time_scale: float = 1.0) -> list[SimConfig]:
    """Three cards, each configured differently, the whole catalog on each: a 32 GiB card on
    Ollama's default context (32768 there) with a q8_0 KV cache, a 24 GiB card at 8192 x 4
    slots, and a 16 GiB card on the default (4096 there) x 2 slots."""
    return [
        SimConfig(name="gpu-5090", total_vram_mib=32768, models=CATALOG, time_scale=time_scale,
                  kv_cache_type="q8_0"),
        SimConfig(name="gpu-4090", total_vram_mib=24564, models=CATALOG, time_scale=time_scale,
                  context_length=8192, num_parallel=4),
        SimConfig(name="gpu-4080", total_vram_mib=16376, models=CATALOG, time_scale=time_scale,
                  num_parallel=2),
    ]
