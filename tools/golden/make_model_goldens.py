#!/usr/bin/python3
"""Writes the golden fixtures for the `strata grad` tests (tests/golden/<case>/).

For four tiny, odd-sized models (llama, mistral, qwen2, qwen3) it writes a Hugging Face
model directory (config.json + safetensors weights), a batch (batch.json), and the
reference loss and gradients computed in float64 with torch autograd, following
transformers' modeling_llama / modeling_mistral / modeling_qwen2 / modeling_qwen3.

Only torch, numpy, json and struct are used: the model math and the safetensors format
are written out here by hand. A central finite-difference check of a few parameter
entries per case runs every time, and the script fails if it does not agree.

Run from the repository root:  /usr/bin/python3 tools/golden/make_model_goldens.py
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch

from safetensors_file import safetensors_write_blobs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_ROOT = os.path.join(REPO_ROOT, "tests", "golden")

BATCH = 2
SEQ = 11
IGNORE_INDEX = -100
FD_MAX_REL_ERR = 1e-6  # the script fails above this; typical values are ~1e-9


# ----------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------

def hf_config(keys):
    """A case's config.json: the keys every case shares and the case's own, in name order (as
    transformers writes them)."""
    cfg = {"attention_dropout": 0.0, "hidden_act": "silu", "initializer_range": 0.02, "use_cache": True}
    cfg.update(keys)
    return dict(sorted(cfg.items()))


# The keys the two tiny Qwen cases share.
QWEN_TINY = {
    "max_window_layers": 2,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
}

CASES = [
    {
        "name": "llama",
        "seed": 1001,
        "disk_dtype": "BF16",
        "sharded": False,
        "with_labels": True,
        "qk_norm": False,
        "qkv_bias": False,
        "config": hf_config({
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "bos_token_id": 1,
            "eos_token_id": [2, 3],
            "head_dim": 8,
            "hidden_size": 40,
            "intermediate_size": 72,
            "max_position_embeddings": 2048,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 5,
            "num_hidden_layers": 2,
            "num_key_value_heads": 1,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            # original_max_position_embeddings=256 puts the four head_dim-8 frequencies
            # in all three llama3 branches: wavelen 6.3 kept (< 64), 167 smoothed
            # (64..256), 4443 and 118563 divided by factor (> 256).
            "rope_scaling": {
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 256,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0",
            "vocab_size": 97,
        }),
    },
    {
        "name": "mistral",
        "seed": 2002,
        "disk_dtype": "F32",
        "sharded": True,
        "with_labels": True,
        "qk_norm": False,
        "qkv_bias": False,
        "config": hf_config({
            "architectures": ["MistralForCausalLM"],
            "bos_token_id": 1,
            "eos_token_id": 2,
            "head_dim": 6,
            "hidden_size": 36,
            "intermediate_size": 50,
            "max_position_embeddings": 32768,
            "model_type": "mistral",
            "num_attention_heads": 6,
            "num_hidden_layers": 3,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-05,
            "rope_theta": 10000.0,
            "sliding_window": 4096,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.45.0",
            "vocab_size": 61,
        }),
    },
    {
        "name": "qwen2",
        "seed": 3003,
        "disk_dtype": "F16",
        "sharded": False,
        "with_labels": True,
        "qk_norm": False,
        "qkv_bias": True,
        "config": hf_config({
            **QWEN_TINY,
            "architectures": ["Qwen2ForCausalLM"],
            "bos_token_id": 5,
            "eos_token_id": 7,
            "hidden_size": 32,
            "intermediate_size": 44,
            "max_position_embeddings": 32768,
            "model_type": "qwen2",
            "sliding_window": 32768,
            "torch_dtype": "float16",
            "transformers_version": "4.45.0",
            "vocab_size": 83,
        }),
    },
    {
        "name": "qwen3",
        "seed": 4004,
        "disk_dtype": "F32",
        "sharded": False,
        "with_labels": False,  # batch.json has no "labels": labels default to input_ids
        "qk_norm": True,
        "qkv_bias": False,
        "config": hf_config({
            **QWEN_TINY,
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "bos_token_id": 11,
            "eos_token_id": 12,
            "head_dim": 10,
            "hidden_size": 24,
            "intermediate_size": 40,
            "max_position_embeddings": 40960,
            "model_type": "qwen3",
            "sliding_window": None,
            "torch_dtype": "float32",
            "transformers_version": "4.51.0",
            "vocab_size": 71,
        }),
    },
]


# ----------------------------------------------------------------------------------------
# Safetensors writer (8-byte LE header length, JSON header space-padded to 8 bytes)
# ----------------------------------------------------------------------------------------

def tensor_to_bytes(t64, dtype):
    """Little-endian bytes of a float64 tensor stored as dtype (values must already be
    representable in dtype when dtype is BF16/F16)."""
    t64 = t64.detach().contiguous()
    if dtype == "F32":
        return t64.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t64.numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        bits = t64.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2")
        return bits.tobytes()
    raise ValueError(dtype)


def safetensors_write(path, tensors, dtype):
    """tensors: list of (name, float64 tensor); all are written as dtype."""
    return safetensors_write_blobs(path, [(name, dtype, t.shape, tensor_to_bytes(t, dtype)) for name, t in tensors],
                                   metadata={"format": "pt"})


def safetensors_read(path):
    """Reads back a file written above into {name: float64 tensor} (self-check)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    np_types = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(raw[base + b:base + e], dtype=np_types[info["dtype"]])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = torch.from_numpy(arr.astype(np.float64).reshape(info["shape"]))
    return out


def round_to_disk_dtype(t64, dtype):
    if dtype == "F32":
        return t64.to(torch.float32).to(torch.float64)
    if dtype == "F16":
        return t64.to(torch.float16).to(torch.float64)
    if dtype == "BF16":
        return t64.to(torch.bfloat16).to(torch.float64)
    raise ValueError(dtype)


# ----------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------

def case_dims(cfg):
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    return {
        "C": hidden,
        "H": heads,
        "Hk": cfg["num_key_value_heads"],
        "D": cfg.get("head_dim") or hidden // heads,
        "F": cfg["intermediate_size"],
        "L": cfg["num_hidden_layers"],
        "V": cfg["vocab_size"],
    }


def make_params(case):
    """Returns an ordered dict {hf_name: float64 tensor} of the stored parameters,
    already rounded to the on-disk dtype."""
    cfg = case["config"]
    d = case_dims(cfg)
    C, H, Hk, D, F, L, V = d["C"], d["H"], d["Hk"], d["D"], d["F"], d["L"], d["V"]
    g = torch.Generator().manual_seed(case["seed"])

    def randn(*shape, std):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def norm_weight(n):
        return 1.0 + randn(n, std=0.1)

    p = {}
    # the tied case reads its logits off the embedding too: a smaller scale keeps them ~O(1)
    embed_std = 0.25 if cfg["tie_word_embeddings"] else 0.5
    p["model.embed_tokens.weight"] = randn(V, C, std=embed_std)  # (V, C)
    for i in range(L):
        pre = "model.layers.%d." % i
        p[pre + "input_layernorm.weight"] = norm_weight(C)
        p[pre + "self_attn.q_proj.weight"] = randn(H * D, C, std=0.1)   # (H*D, C)
        p[pre + "self_attn.k_proj.weight"] = randn(Hk * D, C, std=0.1)  # (Hk*D, C)
        p[pre + "self_attn.v_proj.weight"] = randn(Hk * D, C, std=0.1)  # (Hk*D, C)
        if case["qkv_bias"]:
            p[pre + "self_attn.q_proj.bias"] = randn(H * D, std=0.1)
            p[pre + "self_attn.k_proj.bias"] = randn(Hk * D, std=0.1)
            p[pre + "self_attn.v_proj.bias"] = randn(Hk * D, std=0.1)
        p[pre + "self_attn.o_proj.weight"] = randn(C, H * D, std=0.1)   # (C, H*D)
        if case["qk_norm"]:
            p[pre + "self_attn.q_norm.weight"] = norm_weight(D)
            p[pre + "self_attn.k_norm.weight"] = norm_weight(D)
        p[pre + "post_attention_layernorm.weight"] = norm_weight(C)
        p[pre + "mlp.gate_proj.weight"] = randn(F, C, std=0.1)  # (F, C)
        p[pre + "mlp.up_proj.weight"] = randn(F, C, std=0.1)    # (F, C)
        p[pre + "mlp.down_proj.weight"] = randn(C, F, std=0.1)  # (C, F)
    p["model.norm.weight"] = norm_weight(C)
    if not cfg["tie_word_embeddings"]:
        p["lm_head.weight"] = randn(V, C, std=0.3)  # (V, C)
    return {k: round_to_disk_dtype(v, case["disk_dtype"]) for k, v in p.items()}


def make_batch(case):
    V = case["config"]["vocab_size"]
    g = torch.Generator().manual_seed(case["seed"] + 7)
    input_ids = torch.randint(0, V, (BATCH, SEQ), generator=g)
    if not case["with_labels"]:
        return input_ids, None
    labels = input_ids.clone()
    # prompt-style masking on row 0, scattered ignores on row 1 (incl. the last position)
    labels[0, :4] = IGNORE_INDEX
    labels[1, 2] = IGNORE_INDEX
    labels[1, 7] = IGNORE_INDEX
    labels[1, SEQ - 1] = IGNORE_INDEX
    return input_ids, labels


# ----------------------------------------------------------------------------------------
# Model math (float64), transformers-style
# ----------------------------------------------------------------------------------------

def rope_inv_freq(cfg, D, verbose=False):
    """inv_freq as transformers computes it (float32), llama3 scaling applied, then f64."""
    base = cfg["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, D, 2, dtype=torch.int64).to(torch.float32) / D))
    scaling = cfg.get("rope_scaling")
    if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling["factor"]
        low_freq_factor = scaling["low_freq_factor"]
        high_freq_factor = scaling["high_freq_factor"]
        old_context_len = scaling["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
            high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        scaled = torch.where(is_medium, smoothed, inv_freq_llama)
        n_kept = int((scaled == inv_freq).sum())
        n_medium = int(is_medium.sum())
        n_divided = int((wavelen > low_freq_wavelen).sum())
        if verbose:
            print("  llama3 rope: inv_freq %s -> %s (kept %d, smoothed %d, divided %d)" % (
                [float("%.6g" % v) for v in inv_freq.tolist()],
                [float("%.6g" % v) for v in scaled.tolist()], n_kept, n_medium, n_divided))
            assert n_medium >= 1 and n_divided >= 1, "llama3 scaling must change frequencies"
        inv_freq = scaled
    elif scaling is not None:
        raise ValueError("unsupported rope_scaling %r" % (scaling,))
    return inv_freq.to(torch.float64)


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward_loss(case, p, input_ids, labels, llama3_scaling=True, lora=None):
    """Returns (mean loss, number of counted tokens). p holds float64 tensors (or float32
    ones for the f32 tolerance probe; the math then runs in float32 throughout). lora: see
    forward_logits."""
    logits = forward_logits(case, p, input_ids, llama3_scaling, lora)  # (B, T, V)
    if labels is None:
        labels = input_ids
    shift_logits = logits[:, :-1].reshape(-1, logits.shape[-1])
    shift_labels = labels[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(
        shift_logits, shift_labels, ignore_index=IGNORE_INDEX, reduction="mean")
    tokens = int((shift_labels != IGNORE_INDEX).sum())
    return loss, tokens


def forward_logits(case, p, input_ids, llama3_scaling=True, lora=None):
    """The logits (B, T, V) of the transformers math (also used by
    make_preference_grad_goldens.py). lora: {module name: (A (r, in), B (out, r), scale)} adds
    PEFT's LoRA path scale * (x A^T) B^T to those linears (make_lora_goldens.py); a fourth entry
    (B, T, in), the dropout mask already divided by 1 - p, multiplies x on the LoRA path only
    (make_lora_grad_goldens.py)."""
    cfg = case["config"]
    d = case_dims(cfg)
    C, H, Hk, D, L = d["C"], d["H"], d["Hk"], d["D"], d["L"]
    eps = cfg["rms_norm_eps"]
    B, T = input_ids.shape

    dt = p["model.embed_tokens.weight"].dtype
    rope_cfg = cfg if llama3_scaling else dict(cfg, rope_scaling=None)
    inv_freq = rope_inv_freq(rope_cfg, D).to(dt)                     # (D/2,)
    pos = torch.arange(T, dtype=dt)
    freqs = pos[:, None] * inv_freq[None, :]                         # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)                          # (T, D)
    cos, sin = emb.cos(), emb.sin()
    causal = torch.ones(T, T, dtype=torch.bool).tril()               # (T, T)

    def linear(x, name):
        y = x @ p[name + ".weight"].t()
        if (name + ".bias") in p:
            y = y + p[name + ".bias"]
        if lora is not None and name in lora:
            a, b, scale = lora[name][:3]
            xa = x if len(lora[name]) == 3 else x * lora[name][3]  # LoRA dropout: mask / (1 - p)
            y = y + scale * ((xa @ a.t()) @ b.t())
        return y

    x = p["model.embed_tokens.weight"][input_ids]                    # (B, T, C)
    for i in range(L):
        pre = "model.layers.%d." % i
        n = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = linear(n, pre + "self_attn.q_proj").view(B, T, H, D)      # (B, T, H, D)
        k = linear(n, pre + "self_attn.k_proj").view(B, T, Hk, D)     # (B, T, Hk, D)
        v = linear(n, pre + "self_attn.v_proj").view(B, T, Hk, D)     # (B, T, Hk, D)
        if case["qk_norm"]:
            q = rms_norm(q, p[pre + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, p[pre + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, h, T, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = H // Hk
        k = k.repeat_interleave(groups, dim=1)                        # (B, H, T, D)
        v = v.repeat_interleave(groups, dim=1)                        # (B, H, T, D)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)             # (B, H, T, T)
        scores = scores.masked_fill(~causal, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v                       # (B, H, T, D)
        att = att.transpose(1, 2).reshape(B, T, H * D)                # (B, T, H*D)
        h = x + linear(att, pre + "self_attn.o_proj")
        n = rms_norm(h, p[pre + "post_attention_layernorm.weight"], eps)
        mlp = torch.nn.functional.silu(linear(n, pre + "mlp.gate_proj")) * linear(
            n, pre + "mlp.up_proj")
        x = h + linear(mlp, pre + "mlp.down_proj")
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["lm_head.weight"] if "lm_head.weight" in p else p["model.embed_tokens.weight"]
    return x @ head.t()                                               # (B, T, V)


# ----------------------------------------------------------------------------------------
# Finite-difference check
# ----------------------------------------------------------------------------------------

def fd_check(case, params, grads, input_ids, labels, n_entries=3):
    """Central differences (Richardson-extrapolated) on a few entries of every parameter
    tensor; returns the max relative error against autograd."""
    g = torch.Generator().manual_seed(case["seed"] + 99)
    worst = 0.0
    worst_name = ""
    checked = 0

    def loss_at(name, idx, value):
        q = dict(params)
        t = params[name].clone()
        t.view(-1)[idx] = value
        q[name] = t
        with torch.no_grad():
            return forward_loss(case, q, input_ids, labels)[0].item()

    for name, t in params.items():
        flat_grad = grads[name].view(-1)
        # pick among the entries with the largest gradients so the ratio is meaningful
        order = torch.argsort(flat_grad.abs(), descending=True)
        top = order[: max(8, flat_grad.numel() // 4)]
        picks = top[torch.randperm(top.numel(), generator=g)[:n_entries]]
        for idx in picks.tolist():
            x0 = t.view(-1)[idx].item()

            def central(hh):
                return (loss_at(name, idx, x0 + hh) - loss_at(name, idx, x0 - hh)) / (2 * hh)

            h = 1e-3
            fd = (4.0 * central(h / 2) - central(h)) / 3.0
            ad = flat_grad[idx].item()
            rel = abs(fd - ad) / max(abs(ad), 1e-12)
            checked += 1
            if rel > worst:
                worst, worst_name = rel, "%s[%d]" % (name, idx)
    return worst, worst_name, checked


# ----------------------------------------------------------------------------------------
# Writing one case
# ----------------------------------------------------------------------------------------

def write_case(case):
    name = case["name"]
    out_dir = os.path.join(OUT_ROOT, name)
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):  # stale files from an earlier layout
        if f.endswith(".safetensors") or f.endswith(".json"):
            os.remove(os.path.join(out_dir, f))
    print("case %s" % name)

    cfg = case["config"]
    params = make_params(case)
    input_ids, labels = make_batch(case)

    rope_inv_freq(cfg, case_dims(cfg)["D"], verbose=True)

    # reference loss and gradients
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    loss, tokens = forward_loss(case, leaves, input_ids, labels)
    loss.backward()
    grads = {k: v.grad.detach().clone() for k, v in leaves.items()}
    grad_norm = math.sqrt(sum(float((gr * gr).sum()) for gr in grads.values()))
    V = cfg["vocab_size"]
    print("  loss %.17g (log V = %.6f), tokens %d, grad_norm %.17g" % (
        loss.item(), math.log(V), tokens, grad_norm))

    worst, worst_name, checked = fd_check(case, params, grads, input_ids, labels)
    print("  finite-difference check: %d entries, max rel err %.3e at %s" % (
        checked, worst, worst_name))
    if worst > FD_MAX_REL_ERR:
        sys.exit("finite-difference check failed for %s: %.3e" % (name, worst))

    # the fixture must tell a wrong RoPE scaling apart from the right one
    if cfg.get("rope_scaling") is not None:
        with torch.no_grad():
            plain, _ = forward_loss(case, params, input_ids, labels, llama3_scaling=False)
        print("  loss without llama3 scaling %.6f (differs by %.3e)" % (
            plain.item(), abs(plain.item() - loss.item())))

    # what a float32 implementation of the same math reaches (sets the test tolerances)
    leaves32 = {k: v.to(torch.float32).requires_grad_(True) for k, v in params.items()}
    loss32, _ = forward_loss(case, leaves32, input_ids, labels)
    loss32.backward()
    worst32 = max(float((leaves32[k].grad.double() - grads[k]).abs().max()
                        / grads[k].abs().max()) for k in grads)
    print("  float32 autograd: loss rel err %.2e, worst per-tensor inf-norm rel err %.2e" % (
        abs(loss32.item() - loss.item()) / loss.item(), worst32))

    # config.json
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    # weights
    dtype = case["disk_dtype"]
    items = list(params.items())
    if case["sharded"]:
        L = cfg["num_hidden_layers"]
        first_layers = tuple("model.layers.%d." % i for i in range((L + 1) // 2))
        shard1 = [(k, v) for k, v in items
                  if k == "model.embed_tokens.weight" or k.startswith(first_layers)]
        shard1_names = {k for k, _ in shard1}
        shard2 = [(k, v) for k, v in items if k not in shard1_names]
        files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        total = 0
        weight_map = {}
        for fname, shard in zip(files, (shard1, shard2)):
            total += safetensors_write(os.path.join(out_dir, fname), shard, dtype)
            for k, _ in shard:
                weight_map[k] = fname
        index = {"metadata": {"total_size": total},
                 "weight_map": dict(sorted(weight_map.items()))}
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        back = {}
        for fname in files:
            back.update(safetensors_read(os.path.join(out_dir, fname)))
    else:
        safetensors_write(os.path.join(out_dir, "model.safetensors"), items, dtype)
        back = safetensors_read(os.path.join(out_dir, "model.safetensors"))
    assert set(back) == set(params)
    for k, v in params.items():
        assert torch.equal(back[k], v), "weights not exactly representable: " + k

    # batch.json
    batch = {"input_ids": input_ids.tolist()}
    if labels is not None:
        batch["labels"] = labels.tolist()
    with open(os.path.join(out_dir, "batch.json"), "w") as f:
        json.dump(batch, f)
        f.write("\n")

    # expected gradients (F32 of the float64 values) and scalars
    safetensors_write(os.path.join(out_dir, "grads.safetensors"), list(grads.items()), "F32")
    gback = safetensors_read(os.path.join(out_dir, "grads.safetensors"))
    for k, v in grads.items():
        assert torch.equal(gback[k], v.to(torch.float32).to(torch.float64)), k
    expected = {"loss": loss.item(), "tokens": tokens, "grad_norm": grad_norm}
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    return worst


def main():
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    worst = 0.0
    for case in CASES:
        worst = max(worst, write_case(case))
    total = 0
    for root, _, files in os.walk(OUT_ROOT):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print("wrote %s: %d bytes in all; worst finite-difference rel err %.3e" % (
        OUT_ROOT, total, worst))


if __name__ == "__main__":
    main()
