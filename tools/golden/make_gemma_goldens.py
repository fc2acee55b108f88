#!/usr/bin/env python3
"""Writes the golden fixtures of Gemma 3 (text) and OLMo 2 (tests/golden/gemma3/, tests/golden/olmo2/)
from transformers' own modeling classes (Gemma3ForCausalLM, Olmo2ForCausalLM) run in float64.

Each case is a tiny random model with odd sizes, written as a Hugging Face directory in two
shards (config.json, model-0000k-of-00002.safetensors, model.safetensors.index.json; gemma3 in
BF16, olmo2 in F32), a batch (batch.json, B=2, T=11), and the reference: expected.json (loss,
tokens, grad_norm), grads.safetensors (d loss / d parameter, F32 of the float64 values; the tied
embedding holds the summed gradient) and generate.json (greedy continuations of two prompts, with
the smallest top-1 / top-2 logit gap met on the way, so that f32 and f64 agree on every choice).

The gemma3 case exercises: (1 + w) norms (random w), the four norms per layer, the sqrt(hidden)
embedding scale (hidden 40: not exact in f32), GeGLU with the tanh GELU, per-head q/k norms,
query_pre_attn_scalar 24 != head_dim 12, sliding layers (sliding_window 4 < T, so local layers
differ from global ones) with their own RoPE base (rope_local_base_freq) interleaved by
sliding_window_pattern 3 (layers 0, 1, 3 slide, 2 is global), linear rope_scaling on the global
layer, tied embeddings. The olmo2 case: post-norms on each sublayer's output before the residual
add, q/k norms over the whole projection, no norm before the sublayers.

The environment needs torch and transformers 5.x (a venv with both from PyPI); the build and the
tests never run this. From the repository root:
    python tools/golden/make_gemma_goldens.py
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import safetensors_write_blobs  # noqa: E402

import transformers  # noqa: E402
from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, Olmo2Config, Olmo2ForCausalLM,  # noqa: E402
                          Qwen2Config, Qwen2ForCausalLM)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_ROOT = os.path.join(REPO_ROOT, "tests", "golden")
BATCH, SEQ, IGNORE = 2, 11, -100
# greedy prompts: the two of these candidates whose continuations keep the widest top-2 gaps
GEN_CANDIDATES = [[3, 17, 29, 8, 41], [12, 5, 33], [7, 7, 50, 2, 19, 23], [44, 9], [30, 11, 60, 4],
                  [25, 38, 14, 1, 6, 55, 20], [16, 48, 27], [58, 21, 36, 10, 13]]
GEN_NEW = 8
MIN_GAP = 0.02  # every greedy step's top-1 minus top-2 logit must exceed this

CASES = [
    {
        "name": "gemma3",
        "seed": 5005,
        "disk_dtype": "BF16",
        "cls": (Gemma3TextConfig, Gemma3ForCausalLM),
        "config": {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "attn_logit_softcapping": None,
            "bos_token_id": 2,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "final_logit_softcapping": None,
            "head_dim": 12,
            "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 40,
            "intermediate_size": 58,
            "max_position_embeddings": 512,
            "num_attention_heads": 4,
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "query_pre_attn_scalar": 24,
            "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 100.0,
            "rope_scaling": {"factor": 2.0, "rope_type": "linear"},
            "rope_theta": 10000.0,
            "sliding_window": 4,
            "sliding_window_pattern": 3,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "vocab_size": 67,
        },
    },
    {
        "name": "olmo2",
        "seed": 6006,
        "disk_dtype": "F32",
        "cls": (Olmo2Config, Olmo2ForCausalLM),
        "config": {
            "architectures": ["Olmo2ForCausalLM"],
            "model_type": "olmo2",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": None,
            "eos_token_id": 1,
            "pad_token_id": 0,
            "hidden_act": "silu",
            "hidden_size": 36,
            "intermediate_size": 50,
            "max_position_embeddings": 2048,
            "num_attention_heads": 6,
            "num_hidden_layers": 3,
            "num_key_value_heads": 3,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "vocab_size": 71,
        },
    },
    {
        # transformers' sliding window on a dense family: qwen2 with use_sliding_window, layer 0
        # full (max_window_layers 1), layers 1 and 2 sliding over 5 tokens
        "name": "qwen2_window",
        "seed": 7007,
        "disk_dtype": "F32",
        "cls": (Qwen2Config, Qwen2ForCausalLM),
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "attention_dropout": 0.0,
            "bos_token_id": 5,
            "eos_token_id": 7,
            "hidden_act": "silu",
            "hidden_size": 32,
            "intermediate_size": 44,
            "max_position_embeddings": 32768,
            "max_window_layers": 1,
            "num_attention_heads": 4,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "sliding_window": 5,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": transformers.__version__,
            "use_sliding_window": True,
            "vocab_size": 83,
        },
    },
]


def round_to(t, dtype):
    return {"F32": t.to(torch.float32), "BF16": t.to(torch.bfloat16)}[dtype].to(torch.float64)


def tensor_bytes(t, dtype):
    t = t.detach().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()


def build(case):
    """The model in float64 with random weights (rounded to the disk dtype); eager attention."""
    cfg_cls, model_cls = case["cls"]
    keys = {k: v for k, v in case["config"].items() if k not in ("architectures", "model_type", "torch_dtype",
                                                                 "transformers_version")}
    config = cfg_cls(**keys)
    config._attn_implementation = "eager"
    torch.manual_seed(case["seed"])
    model = model_cls(config).to(torch.float64)
    g = torch.Generator().manual_seed(case["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith("bias"):
                v = 0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            elif p.dim() == 1:  # norms: w around 0 for Gemma's (1 + w), around 1 for the others' w
                base = 0.0 if case["name"] == "gemma3" else 1.0
                v = base + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            elif "embed_tokens" in name:
                v = 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[1])
            else:
                v = torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[1])
            p.copy_(round_to(v, case["disk_dtype"]))
    model.eval()  # no dropout (there is none); gradients still flow
    return config, model


def batch(case):
    V = case["config"]["vocab_size"]
    g = torch.Generator().manual_seed(case["seed"] + 7)
    ids = torch.randint(0, V, (BATCH, SEQ), generator=g)
    labels = ids.clone()
    labels[0, :3] = IGNORE
    labels[1, 5] = IGNORE
    return ids, labels


def greedy(model, prompt):
    """Greedy continuation of one prompt, GEN_NEW tokens, recomputing the whole sequence each step
    (no cache: the plain definition); returns the tokens and the smallest top-1 / top-2 gap."""
    seq = list(prompt)
    gap = float("inf")
    with torch.no_grad():
        for _ in range(GEN_NEW):
            logits = model(torch.tensor([seq])).logits[0, -1]
            top = torch.topk(logits, 2).values
            gap = min(gap, float(top[0] - top[1]))
            seq.append(int(torch.argmax(logits)))
    return seq[len(prompt):], gap


def write_case(case):
    out = os.path.join(OUT_ROOT, case["name"])
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    config, model = build(case)
    ids, labels = batch(case)
    result = model(input_ids=ids, labels=labels)
    loss = result.loss
    loss.backward()
    tokens = int((labels[:, 1:] != IGNORE).sum())
    params = dict(model.named_parameters())
    # tied: lm_head.weight is the embedding (one parameter); the checkpoint has no lm_head
    names = [n for n in params if not (config.tie_word_embeddings and n == "lm_head.weight")]
    grads = {n: params[n].grad.detach().clone() for n in names}
    grad_norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    print("%s: loss %.12f (log V %.4f) tokens %d grad_norm %.6g" % (case["name"], loss.item(),
                                                                       math.log(config.vocab_size), tokens, grad_norm))
    if case["name"] in ("gemma3", "qwen2_window"):  # the window must matter: with no window the loss differs
        wide_cfg = dict(case, config=dict(case["config"], sliding_window=64))
        _, wide = build(wide_cfg)
        with torch.no_grad():
            wide_loss = wide(input_ids=ids, labels=labels).loss.item()
        print("  without the window (64 > T) the loss is %.9f (differs by %.3e)" % (wide_loss, abs(wide_loss - loss.item())))
        assert abs(wide_loss - loss.item()) > 1e-4, "the sliding window does not change the loss"

    # float32 rerun of the same modeling code: what an f32 implementation reaches
    m32 = model.to(torch.float32)
    m32.zero_grad()
    loss32 = m32(input_ids=ids, labels=labels).loss
    loss32.backward()
    worst = 0.0
    for n in names:
        g32 = dict(m32.named_parameters())[n].grad.double()
        worst = max(worst, float((g32 - grads[n]).norm() / grads[n].norm()))
    print("  float32 rerun: loss rel err %.2e, worst gradient rel L2 err %.2e" % (
        abs(loss32.item() - loss.item()) / abs(loss.item()), worst))
    model = model.to(torch.float64)

    # generation (float64), and the same in float32 must pick the same tokens
    scored = sorted(((greedy(model, p), p) for p in GEN_CANDIDATES), key=lambda r: -r[0][1])[:2]
    prompts = [p for _, p in scored]
    gens = [r[0] for r, _ in scored]
    gap = min(r[1] for r, _ in scored)
    m32 = model.to(torch.float32)
    for p, want in zip(prompts, gens):
        assert greedy(m32, p)[0] == want, "float32 picks other tokens: widen the gaps"
    model = model.to(torch.float64)
    print("  greedy: %s, smallest top-2 gap %.4f" % (gens, gap))
    assert gap > MIN_GAP, "a greedy step is too close to call"

    # files
    cfg = dict(sorted(case["config"].items()))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    state = {n: params[n].detach() for n in names}
    half = config.num_hidden_layers // 2
    first = [n for n in state if n == "model.embed_tokens.weight" or
             any(n.startswith("model.layers.%d." % i) for i in range(half))]
    shards = [first, [n for n in state if n not in first]]
    files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map, total = {}, 0
    for fname, shard in zip(files, shards):
        dt = case["disk_dtype"]
        total += safetensors_write_blobs(os.path.join(out, fname),
                                         [(n, dt, state[n].shape, tensor_bytes(state[n], dt)) for n in shard],
                                         metadata={"format": "pt"})
        for n in shard:
            weight_map[n] = fname
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    safetensors_write_blobs(os.path.join(out, "grads.safetensors"),
                            [(n, "F32", g.shape, tensor_bytes(g, "F32")) for n, g in grads.items()],
                            metadata={"format": "pt"})
    with open(os.path.join(out, "batch.json"), "w") as f:
        json.dump({"input_ids": ids.tolist(), "labels": labels.tolist()}, f)
        f.write("\n")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"loss": loss.item(), "tokens": tokens, "grad_norm": grad_norm}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generate.json"), "w") as f:
        json.dump({"prompts": prompts, "max_new_tokens": GEN_NEW, "tokens": gens, "min_top2_gap": gap}, f)
        f.write("\n")


def main():
    torch.set_num_threads(2)
    for case in CASES:
        write_case(case)


if __name__ == "__main__":
    main()
