"""A tiny llama-architecture GGUF for a real Ollama on CPU: 2 layers, hidden 64, 4 heads, a
267-token SentencePiece vocabulary (the 256 byte tokens, <unk>, <s>, </s> and a few words),
trained context 2048, random f32 weights (0.5 MB). Its output is gibberish; what a
differential check needs is that Ollama loads it, reports it and answers in its own shapes.
Needs the `gguf` package (PyPI). Run by loadtest/build_real_ollama.sh:

    python loadtest/real_ollama_tiny.py /tmp/real-ollama/tiny.gguf
"""

from __future__ import annotations

import sys

import gguf
import numpy as np

CONTEXT, EMBED, FFN, LAYERS, HEADS = 2048, 64, 128, 2, 4
WORDS = ("the", "a", "hello", "world", "is", "of", "and", "to")


def vocabulary() -> tuple[list[bytes], list[int], list[float]]:
    """Tokens, their types (2 unknown, 3 control, 6 byte, 1 normal) and scores."""
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [("\u2581" + w).encode() for w in WORDS]
    types = [2, 3, 3] + [6] * 256 + [1] * len(WORDS)
    scores = [0.0] * 259 + [-float(i) for i in range(len(WORDS))]
    return tokens, types, scores


def write(path: str) -> None:
    rng = np.random.default_rng(0)
    tokens, types, scores = vocabulary()
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny")
    w.add_context_length(CONTEXT)
    w.add_embedding_length(EMBED)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(EMBED // HEADS)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    def rand(name: str, *shape: int) -> None:  # numpy (rows, cols) = ggml (cols, rows)
        w.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    def ones(name: str) -> None:
        w.add_tensor(name, np.ones(EMBED, dtype=np.float32))

    rand("token_embd.weight", len(tokens), EMBED)
    ones("output_norm.weight")
    # Only the word tokens score (the others 0), so that the model says whole words, not
    # stray bytes a stream holds back until they make UTF-8.
    out = np.zeros((len(tokens), EMBED), dtype=np.float32)
    out[-len(WORDS):] = rng.standard_normal((len(WORDS), EMBED))
    w.add_tensor("output.weight", out)
    for i in range(LAYERS):
        ones(f"blk.{i}.attn_norm.weight")
        for part in ("q", "k", "v", "output"):
            rand(f"blk.{i}.attn_{part}.weight", EMBED, EMBED)
        ones(f"blk.{i}.ffn_norm.weight")
        rand(f"blk.{i}.ffn_gate.weight", FFN, EMBED)
        rand(f"blk.{i}.ffn_up.weight", FFN, EMBED)
        rand(f"blk.{i}.ffn_down.weight", EMBED, FFN)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    write(sys.argv[1])
