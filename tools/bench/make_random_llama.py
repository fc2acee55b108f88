#!/usr/bin/env python3
"""Writes a Llama-shaped model of random bf16 weights to disk, shard by shard, for manual runs
that need a large model without a training run's state (issue 40: the ~7B QLoRA run of
docs/benchmarks.md). Matrices N(0, 0.02), norms 1, Llama-2-7B's shape by default (hidden 4096,
ffn 11008, 32 layers, 32 heads, vocab 32000: 6.74B parameters, 13.5 GB). One tensor in memory
at a time (numpy only); a model.safetensors.index.json names each tensor's shard.

    python3 tools/bench/make_random_llama.py OUT_DIR [--layers 32] [--hidden 4096] [--ffn 11008]
"""
import argparse
import json
import os
import struct

import numpy as np

SHARD_BYTES = 2 << 30


def bf16_bytes(x):
    """float32 array -> bf16 bytes, rounded to nearest even."""
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16).tobytes()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=11008)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    c, f, L, V = a.hidden, a.ffn, a.layers, a.vocab
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": c, "intermediate_size": f,
           "num_hidden_layers": L, "num_attention_heads": a.heads, "num_key_value_heads": a.heads,
           "vocab_size": V, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    with open(os.path.join(a.out, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    shapes = [("model.embed_tokens.weight", (V, c))]
    for i in range(L):
        p = "model.layers.%d." % i
        shapes += [(p + "input_layernorm.weight", (c,)), (p + "self_attn.q_proj.weight", (c, c)),
                   (p + "self_attn.k_proj.weight", (c, c)), (p + "self_attn.v_proj.weight", (c, c)),
                   (p + "self_attn.o_proj.weight", (c, c)), (p + "post_attention_layernorm.weight", (c,)),
                   (p + "mlp.gate_proj.weight", (f, c)), (p + "mlp.up_proj.weight", (f, c)),
                   (p + "mlp.down_proj.weight", (c, f))]
    shapes += [("model.norm.weight", (c,)), ("lm_head.weight", (V, c))]
    rng = np.random.default_rng(40)
    shards, cur, size = [], [], 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        if cur and size + 2 * n > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, shape))
        size += 2 * n
    shards.append(cur)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape in shard:
            nbytes = 2 * int(np.prod(shape))
            header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = fname
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        with open(os.path.join(a.out, fname), "wb") as fh:
            fh.write(struct.pack("<Q", len(text)))
            fh.write(text)
            for name, shape in shard:
                if len(shape) == 1:
                    fh.write(bf16_bytes(np.ones(shape, np.float32)))
                else:
                    for r0 in range(0, shape[0], 1024):  # a block of rows at a time
                        rows = min(1024, shape[0] - r0)
                        fh.write(bf16_bytes(rng.standard_normal((rows, shape[1]), dtype=np.float32) * 0.02))
        total += offset
        print("wrote", fname, offset)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)


if __name__ == "__main__":
    main()
