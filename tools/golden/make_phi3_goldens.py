#!/usr/bin/env python3
"""Writes the golden fixtures of Phi-3 (tests/golden/phi3/, phi3_long/, phi3_partial/) from
transformers' own Phi3ForCausalLM run in float64.

Each case is a tiny random model with odd sizes, written as a Hugging Face directory in shards
(config.json, model-0000k-of-0000n.safetensors, model.safetensors.index.json), a batch
(batch.json, B=2, T=11), and the reference: expected.json (loss, tokens, grad_norm),
grads.safetensors (d loss / d parameter, F32 of the float64 values; a tied embedding holds the
summed gradient) and generate.json (greedy continuations of two prompts by transformers' own
generate() with its KV cache, each prompt alone, with the smallest top-1 / top-2 logit gap met on
the way, so that f32 and f64 agree on every choice).

The checkpoint keeps Phi-3's fused projections (self_attn.qkv_proj: q, k, v rows; mlp.gate_up_proj:
gate, up rows). Both cases use LongRoPE (rope_scaling type "longrope", short and long factors per
frequency, the attention factor from max_position_embeddings / original_max_position_embeddings):
  phi3       F32 in three shards, original_max_position_embeddings 64 > T: the short factors;
             sliding_window 6 < T on every layer (the window changes the loss: checked here)
  phi3_long  BF16 in two shards, tied embeddings, original_max_position_embeddings 8 < T = 11: the
             long factors in training, and in generation (prompts of 9..11 tokens)
  phi3_partial  F32 in two shards, partial_rotary_factor 0.75 (Phi-4-mini's): RoPE turns the first
             int(16 * 0.75) = 12 dims of each 16-dim head, the last 4 pass; the LongRoPE factor lists
             hold 12 / 2 = 6 numbers (the short ones: original 64 > T); max_position_embeddings =
             original, so attention_factor is 1 (transformers scales only the rotated dims by it,
             which strata does not build yet: a factor != 1 with a partial rotary is refused)
pad_token_id is null: transformers' embedding would keep a zero gradient on the padding row,
which strata (like the Llama family's goldens) does not model.

The environment needs torch and transformers 5.x (a venv with both from PyPI); the build and the
tests never run this. From the repository root:
    python tools/golden/make_phi3_goldens.py
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import safetensors_write_blobs  # noqa: E402

import transformers  # noqa: E402
from transformers import Phi3Config, Phi3ForCausalLM  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_ROOT = os.path.join(REPO_ROOT, "tests", "golden")
BATCH, SEQ, IGNORE = 2, 11, -100
GEN_CANDIDATES = [[3, 17, 29, 8, 41], [12, 5, 33, 2, 9, 40], [7, 7, 50, 2, 19, 23, 1], [44, 9, 13, 6, 30],
                  [30, 11, 60, 4, 22], [25, 38, 14, 1, 6, 55, 20], [16, 48, 27, 3, 3], [58, 21, 36, 10, 13]]
# phi3_long's prompts are longer than its original_max_position_embeddings (8): the prefill and every
# decode step use the long table. (A prompt that crosses it while generating is not a golden:
# transformers' Phi3ForCausalLM.prepare_inputs_for_generation then drops its KV cache and recomputes
# the whole sequence with the long table, which strata's generator does not do.)
GEN_CANDIDATES_LONG = [torch.randint(3, 70, (9 + k % 3,), generator=torch.Generator().manual_seed(500 + k)).tolist()
                       for k in range(16)]
GEN_NEW = 8
MIN_GAP = 0.02  # every greedy step's top-1 minus top-2 logit must exceed this


def factors(seed, n, lo, hi):
    g = torch.Generator().manual_seed(seed)
    return [round(lo + (hi - lo) * float(x), 4) for x in torch.rand(n, generator=g, dtype=torch.float64)]


CASES = [
    {
        "name": "phi3",
        "seed": 8008,
        "disk_dtype": "F32",
        "shards": 3,
        "config": {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "embd_pdrop": 0.0,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 40,
            "intermediate_size": 54,
            "max_position_embeddings": 256,
            "num_attention_heads": 4,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "original_max_position_embeddings": 64,
            "pad_token_id": None,
            "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {"type": "longrope", "short_factor": factors(1, 5, 1.0, 1.5),
                             "long_factor": factors(2, 5, 1.0, 6.0)},
            "rope_theta": 10000.0,
            "sliding_window": 6,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "vocab_size": 73,
        },
    },
    {
        "name": "phi3_long",
        "seed": 9009,
        "disk_dtype": "BF16",
        "shards": 2,
        "config": {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "embd_pdrop": 0.0,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 48,
            "intermediate_size": 70,
            "max_position_embeddings": 40,
            "num_attention_heads": 6,
            "num_hidden_layers": 2,
            "num_key_value_heads": 3,
            "original_max_position_embeddings": 8,
            "pad_token_id": None,
            "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {"type": "longrope", "short_factor": factors(3, 4, 1.0, 1.3),
                             "long_factor": factors(4, 4, 1.5, 8.0)},
            "rope_theta": 500.0,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "vocab_size": 79,
        },
    },
    {
        "name": "phi3_partial",
        "seed": 7007,
        "disk_dtype": "F32",
        "shards": 2,
        "config": {
            "architectures": ["Phi3ForCausalLM"],
            "model_type": "phi3",
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "embd_pdrop": 0.0,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 48,
            "intermediate_size": 58,
            "max_position_embeddings": 64,
            "num_attention_heads": 3,
            "num_hidden_layers": 2,
            "num_key_value_heads": 1,
            "original_max_position_embeddings": 64,
            "pad_token_id": None,
            "partial_rotary_factor": 0.75,
            "resid_pdrop": 0.0,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {"type": "longrope", "short_factor": factors(5, 6, 1.0, 1.5),
                             "long_factor": factors(6, 6, 1.0, 6.0)},
            "rope_theta": 10000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": transformers.__version__,
            "use_cache": True,
            "vocab_size": 71,
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


def build(case, **override):
    """The model in float64 with random weights (rounded to the disk dtype); eager attention."""
    keys = {k: v for k, v in case["config"].items() if k not in ("architectures", "model_type", "torch_dtype",
                                                                 "transformers_version")}
    keys.update(override)
    config = Phi3Config(**keys)
    config._attn_implementation = "eager"
    torch.manual_seed(case["seed"])
    model = Phi3ForCausalLM(config).to(torch.float64)
    g = torch.Generator().manual_seed(case["seed"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # norms around 1
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            elif "embed_tokens" in name:
                v = 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[1])
            else:
                v = torch.randn(p.shape, generator=g, dtype=torch.float64) / math.sqrt(p.shape[1])
            p.copy_(round_to(v, case["disk_dtype"]))
    model.eval()
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
    """transformers' own greedy generate() (KV cache) of one prompt; the tokens and the smallest
    top-1 / top-2 logit gap."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=GEN_NEW, do_sample=False, min_new_tokens=GEN_NEW,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    gap = float("inf")
    for s in out.scores:
        top = torch.topk(s[0].double(), 2).values
        gap = min(gap, float(top[0] - top[1]))
    return out.sequences[0, len(prompt):].tolist(), gap


def write_case(case):
    out = os.path.join(OUT_ROOT, case["name"])
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        os.remove(os.path.join(out, f))
    config, model = build(case)
    rope = model.model.rotary_emb
    print("%s: rope_type %s, attention_scaling %.9f" % (case["name"], rope.rope_type, rope.attention_scaling))
    ids, labels = batch(case)
    result = model(input_ids=ids, labels=labels)
    loss = result.loss
    loss.backward()
    tokens = int((labels[:, 1:] != IGNORE).sum())
    params = dict(model.named_parameters())
    names = [n for n in params if not (config.tie_word_embeddings and n == "lm_head.weight")]
    grads = {n: params[n].grad.detach().clone() for n in names}
    grad_norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
    print("  loss %.12f (log V %.4f) tokens %d grad_norm %.6g" % (loss.item(), math.log(config.vocab_size), tokens,
                                                                   grad_norm))
    # what each case is for must matter: the window, and which LongRoPE table
    with torch.no_grad():
        if case["config"]["sliding_window"]:
            _, wide = build(case, sliding_window=None)
            other = wide(input_ids=ids, labels=labels).loss.item()
            print("  without the window the loss is %.9f (differs by %.3e)" % (other, abs(other - loss.item())))
            assert abs(other - loss.item()) > 1e-4, "the sliding window does not change the loss"
        orig = case["config"]["original_max_position_embeddings"]
        swapped = dict(case["config"]["rope_scaling"])
        swapped["short_factor"], swapped["long_factor"] = swapped["long_factor"], swapped["short_factor"]
        _, sw = build(case, rope_scaling=swapped)
        other = sw(input_ids=ids, labels=labels).loss.item()
        which = "long" if SEQ > orig else "short"
        print("  the %s factors are used (T %d vs original %d); the other table's loss differs by %.3e" % (
            which, SEQ, orig, abs(other - loss.item())))
        assert abs(other - loss.item()) > 1e-4, "the LongRoPE table does not change the loss"
        if case["config"].get("partial_rotary_factor", 1.0) != 1.0:  # the rotated part matters: half of it
            half = dict(case["config"]["rope_scaling"])
            half["short_factor"], half["long_factor"] = half["short_factor"][:4], half["long_factor"][:4]
            half["partial_rotary_factor"] = 0.5  # transformers 5 validates the lists against the rope dict's
            _, hp = build(case, partial_rotary_factor=0.5, rope_scaling=half)
            assert hp.model.rotary_emb.inv_freq.numel() == 4
            assert model.model.rotary_emb.inv_freq.numel() == 6, "transformers rotates another part than 12 dims"
            other = hp(input_ids=ids, labels=labels).loss.item()
            print("  partial_rotary_factor 0.5 instead: the loss differs by %.3e" % abs(other - loss.item()))
            assert abs(other - loss.item()) > 1e-4, "the rotary part does not change the loss"

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

    candidates = GEN_CANDIDATES_LONG if case["name"] == "phi3_long" else GEN_CANDIDATES
    scored = sorted(((greedy(model, p), p) for p in candidates), key=lambda r: -r[0][1])[:2]
    prompts = [p for _, p in scored]
    gens = [r[0] for r, _ in scored]
    gap = min(r[1] for r, _ in scored)
    m32 = model.to(torch.float32)
    for p, want in zip(prompts, gens):
        assert greedy(m32, p)[0] == want, "float32 picks other tokens: widen the gaps"
    model = model.to(torch.float64)
    print("  greedy: %s from %s, smallest top-2 gap %.4f" % (gens, prompts, gap))
    assert gap > MIN_GAP, "a greedy step is too close to call"

    cfg = dict(sorted(case["config"].items()))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    state = {n: params[n].detach() for n in names}
    n_shards = case["shards"]
    L = config.num_hidden_layers

    def shard_of(n):
        if n.startswith("model.layers."):
            return min(n_shards - 1, int(n.split(".")[2]) * n_shards // L)
        return 0 if "embed_tokens" in n else n_shards - 1
    files = ["model-%05d-of-%05d.safetensors" % (k + 1, n_shards) for k in range(n_shards)]
    weight_map, total = {}, 0
    for k, fname in enumerate(files):
        dt = case["disk_dtype"]
        shard = [n for n in state if shard_of(n) == k]
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
        json.dump({"loss": loss.item(), "tokens": tokens, "grad_norm": grad_norm,
                   "attention_factor": rope.attention_scaling}, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "generate.json"), "w") as f:
        json.dump({"prompts": prompts, "max_new_tokens": GEN_NEW, "tokens": gens, "min_top2_gap": gap}, f)
        f.write("\n")


def main():
    torch.set_num_threads(1)
    only = sys.argv[1:]  # case names to write (default: all)
    for case in CASES:
        if not only or case["name"] in only:
            write_case(case)


if __name__ == "__main__":
    main()
