"""Golden fixtures for the mixture-of-experts families, from Hugging Face transformers itself
(Qwen3MoeForCausalLM, MixtralForCausalLM, eager attention) in float64.

For each case, tests/golden/<case>/ gets: the model directory as transformers' save_pretrained
writes it (config.json, Hub per-expert tensor names, sharded where asked), batch.json
(input_ids; labels default to input_ids), grads.safetensors (F32 of the float64 gradient of the
language-model loss, Hub names), grads_aux.safetensors (the same with the load-balancing loss,
output_router_logits=True, added by transformers as router_aux_loss_coef * aux) and
expected.json (loss, loss_aux, tokens, the f32-vs-f64 discrepancy, the routing margins, greedy
generation), and packed/ (the same weights in transformers 5's packed 3-D experts layout).

Every discrete choice is checked to be far from a tie, so f32 and f64 agree on it: on every token
of every MoE layer, the gap between the k-th and (k+1)-th router logit; at every greedy step, the
gap between the top two logits. A seed that fails is skipped for the next.

Run from the repository root with a Python that has torch and transformers 5.x:
    python tools/golden/make_moe_goldens.py
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
B, T = 2, 7
MIN_ROUTER_GAP = 2e-3  # logits: f32's error is ~1e-6 here
MIN_GREEDY_GAP = 1e-3

CASES = {
    # more experts (17) than tokens (14): some experts get no token; norm_topk_prob; a dense layer
    # (mlp_only_layers) between MoE layers; head_dim != hidden/heads; F32, four shards
    "qwen3_moe": dict(
        cls=(Qwen3MoeConfig, Qwen3MoeForCausalLM), disk=torch.float32, shard="40KB",
        cfg=dict(vocab_size=61, hidden_size=22, intermediate_size=18, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=6, num_experts=17,
                 num_experts_per_tok=3, moe_intermediate_size=9, norm_topk_prob=True,
                 mlp_only_layers=[1], router_aux_loss_coef=0.05, rms_norm_eps=1e-6,
                 tie_word_embeddings=False, max_position_embeddings=64)),
    # Mixtral: top-2 of 5 renormalised, GQA 3/1, BF16 on disk, one file, tied embeddings
    "mixtral": dict(
        cls=(MixtralConfig, MixtralForCausalLM), disk=torch.bfloat16, shard=None,
        cfg=dict(vocab_size=53, hidden_size=18, intermediate_size=14, num_hidden_layers=2,
                 num_attention_heads=3, num_key_value_heads=1, num_local_experts=5,
                 num_experts_per_tok=2, router_aux_loss_coef=0.05, tie_word_embeddings=True,
                 max_position_embeddings=64)),
}


def hub_grads(model, cfg, mixtral):
    """The model's parameter gradients under the Hub's per-expert names (transformers 5 keeps the
    experts packed: gate_up_proj (E, 2I, C) with gate first, down_proj (E, C, I))."""
    out = {}
    block = "block_sparse_moe" if mixtral else "mlp"
    names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for name, p in model.named_parameters():
        g = p.grad.detach().to(torch.float32).contiguous()
        if name.endswith("mlp.experts.gate_up_proj"):
            prefix = name[: -len("mlp.experts.gate_up_proj")]
            inter = g.shape[1] // 2
            for e in range(g.shape[0]):
                out[f"{prefix}{block}.experts.{e}.{names[0]}.weight"] = g[e, :inter].contiguous()
                out[f"{prefix}{block}.experts.{e}.{names[1]}.weight"] = g[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            prefix = name[: -len("mlp.experts.down_proj")]
            for e in range(g.shape[0]):
                out[f"{prefix}{block}.experts.{e}.{names[2]}.weight"] = g[e].contiguous()
        elif mixtral and ".mlp.gate.weight" in name:
            out[name.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = g
        else:
            out[name] = g
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def router_margins(model, input_ids, k):
    """The smallest gap between the k-th and (k+1)-th router logit over every token of every MoE
    layer, and how many experts got no token in each MoE layer."""
    with torch.no_grad():
        out = model(input_ids, output_router_logits=True)
    gaps, empty = [], []
    for logits in out.router_logits:
        top = torch.topk(logits, k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min().detach()))
        chosen = torch.topk(logits, k, dim=-1).indices.reshape(-1)
        empty.append(int(logits.shape[-1] - torch.unique(chosen).numel()))
    return min(gaps), empty


def greedy(model, prompt, steps):
    """Greedy continuation and the smallest top-two logit gap along it."""
    ids = prompt.clone()
    min_gap = float("inf")
    for _ in range(steps):
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
        top = torch.topk(logits, 2).values
        min_gap = min(min_gap, float(top[0] - top[1]))
        ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return ids[0, prompt.shape[1]:].tolist(), min_gap


def loss_and_grads(model, input_ids, cfg, mixtral, aux):
    """transformers' loss (labels = input_ids, shifted; plus router_aux_loss_coef * aux when aux),
    with the cross-entropy taken in the model's dtype (transformers' loss function casts the logits
    to float32 first, which would cap the float64 reference at f32 precision)."""
    model.zero_grad()
    out = model(input_ids, output_router_logits=aux)
    logits = out.logits[:, :-1].reshape(-1, cfg.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits, input_ids[:, 1:].reshape(-1))
    if aux:
        loss = loss + cfg.router_aux_loss_coef * out.aux_loss
    loss.backward()
    return float(loss), hub_grads(model, cfg, mixtral)


def build(name, case, seed):
    Cfg, Model = case["cls"]
    mixtral = name == "mixtral"
    torch.manual_seed(seed)
    cfg = Cfg(**case["cfg"], initializer_range=0.2, attn_implementation="eager", experts_implementation="eager")
    model = Model(cfg).to(torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif n.endswith("mlp.gate.weight"):
                p.copy_(1.5 * torch.randn_like(p))  # router logits spread: clear top-k margins
            p.copy_(p.to(case["disk"]).to(torch.float32))  # what the file will hold
    model.eval()
    input_ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed + 1))
    m64 = Model(cfg).to(torch.float64)
    m64.load_state_dict({k: v.to(torch.float64) for k, v in model.state_dict().items()})
    m64.eval()
    return cfg, model, m64, input_ids


def write_case(name, case):
    mixtral = name == "mixtral"
    k = case["cfg"]["num_experts_per_tok"]
    for seed in range(100, 200):
        cfg, model, m64, input_ids = build(name, case, seed)
        gap, empty = router_margins(m64, input_ids, k)
        prompt = input_ids[:1, :4]
        gen, gen_gap = greedy(m64, prompt, 6)
        if gap >= MIN_ROUTER_GAP and gen_gap >= MIN_GREEDY_GAP and (mixtral or min(empty) > 0):
            break
        print(f"{name}: seed {seed} rejected (router gap {gap:.2e}, greedy gap {gen_gap:.2e}, empty {empty})")
    else:
        sys.exit(f"{name}: no seed with clear margins")

    loss, grads = loss_and_grads(m64, input_ids, cfg, mixtral, aux=False)
    loss_aux, grads_aux = loss_and_grads(m64, input_ids, cfg, mixtral, aux=True)
    loss32, grads32 = loss_and_grads(model, input_ids, cfg, mixtral, aux=False)
    worst32 = max(float((grads32[n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in grads.items())
    gen32, _ = greedy(model, prompt, 6)
    assert gen32 == gen, "f32 and f64 greedy generations differ"
    # sanity: the saved per-expert names hold what the packed parameters hold
    assert set(grads) == set(grads_aux)

    out = os.path.join(ROOT, "tests", "golden", name)
    shutil.rmtree(out, ignore_errors=True)
    save_kwargs = {"max_shard_size": case["shard"]} if case["shard"] else {}
    model.to(case["disk"]).save_pretrained(out, **save_kwargs)
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    saved.pop("transformers_version", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    # the packed 3-D layout transformers 5 holds in memory (experts.gate_up_proj / experts.down_proj,
    # the router under mlp.gate), as a converted checkpoint would store it
    packed = os.path.join(out, "packed")
    os.makedirs(packed)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()
               if not (cfg.tie_word_embeddings and k == "lm_head.weight")},
              os.path.join(packed, "model.safetensors"))
    shutil.copy(os.path.join(out, "config.json"), packed)
    save_file(grads, os.path.join(out, "grads.safetensors"))
    save_file(grads_aux, os.path.join(out, "grads_aux.safetensors"))
    with open(os.path.join(out, "batch.json"), "w") as f:
        json.dump({"input_ids": input_ids.tolist()}, f)
        f.write("\n")
    expected = {
        "loss": loss, "loss_aux": loss_aux, "tokens": B * (T - 1), "seed": seed,
        "f32_loss_rel_err": abs(loss32 - loss) / abs(loss), "f32_worst_grad_rel_l2": worst32,
        "min_router_logit_gap": gap, "experts_without_tokens": empty,
        "generate": {"prompt": prompt[0].tolist(), "tokens": gen, "min_top2_logit_gap": gen_gap},
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print(f"{name}: seed {seed} loss {loss:.9f} (aux {loss_aux:.9f}) router gap {gap:.2e} empty experts {empty} "
          f"greedy {gen} gap {gen_gap:.2e}; f32 rerun: loss rel {expected['f32_loss_rel_err']:.1e}, "
          f"worst grad rel L2 {worst32:.1e}")


if __name__ == "__main__":
    for name, case in CASES.items():
        write_case(name, case)
