#!/usr/bin/env python3
"""Writes the weights of the tiny chat model bundled for the SFT example.

recipes/sft-tiny/models/tiny/ holds config.json and the tokenizer files; this script adds
model.safetensors: a freshly initialised Llama (as transformers initialises one: matrices
N(0, initializer_range), norms 1) in bf16, so `strata train recipes/sft-tiny/recipe.toml`
fine-tunes "an HF model dir" end to end. Deterministic (torch.manual_seed).

    /usr/bin/python3 tools/make_sft_tiny_model.py
"""
import json
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "recipes", "sft-tiny", "models", "tiny")


def main():
    cfg = json.load(open(os.path.join(MODEL, "config.json")))
    torch.manual_seed(20261122)
    c, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or c // h
    std = cfg.get("initializer_range", 0.02)

    def mat(rows, cols):
        return torch.randn(rows, cols) * std

    tensors = {"model.embed_tokens.weight": mat(v, c)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = torch.ones(c)
        tensors[p + "self_attn.q_proj.weight"] = mat(h * hd, c)
        tensors[p + "self_attn.k_proj.weight"] = mat(kv * hd, c)
        tensors[p + "self_attn.v_proj.weight"] = mat(kv * hd, c)
        tensors[p + "self_attn.o_proj.weight"] = mat(c, h * hd)
        tensors[p + "post_attention_layernorm.weight"] = torch.ones(c)
        tensors[p + "mlp.gate_proj.weight"] = mat(f, c)
        tensors[p + "mlp.up_proj.weight"] = mat(f, c)
        tensors[p + "mlp.down_proj.weight"] = mat(c, f)
    tensors["model.norm.weight"] = torch.ones(c)
    if not cfg.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = mat(v, c)

    # safetensors: u64 header length, JSON header, then the data (bf16 little-endian)
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        data = t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(MODEL, "model.safetensors"), "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text)
        for b in blobs:
            out.write(b)
    print(f"wrote {MODEL}/model.safetensors: {sum(t.numel() for t in tensors.values())} parameters")


if __name__ == "__main__":
    main()
