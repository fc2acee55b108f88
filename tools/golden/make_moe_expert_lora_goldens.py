#!/usr/bin/env python3
"""Writes the LoRA goldens of the mixture-of-experts families' router and experts
(tests/golden/lora_grad/qwen3_moe_experts/, tests/golden/lora_grad/mixtral_experts/) from PEFT
itself: peft.get_peft_model on transformers' Qwen3MoeForCausalLM / MixtralForCausalLM with
target_parameters, run in float64.

transformers 5 keeps a MoE layer's experts as packed 3-D parameters (mlp.experts.gate_up_proj
(E, 2I, C), gate rows first; mlp.experts.down_proj (E, C, I)) and its router as a bare parameter
(mlp.gate.weight (E, C)). PEFT adapts them through target_parameters with its ParamWrapper: for a
3-D parameter one lora_A (E*r, in) and one lora_B (out, E*r), expert e's A the rows e*r .. e*r+r-1
and its B the columns k*E + e (PEFT reshapes B to (out, r, E)); the merged weight is
W_e + (alpha / r) B_e A_e. Two parameters of one module nest two wrappers: gate_up_proj (first in
the experts' parameter order) is the inner one, saved as mlp.experts.base_layer.lora_A/B, down_proj
the outer, mlp.experts.lora_A/B. The router's adapter is a plain A (r, C), B (E, r) on mlp.gate.

The models and batches are tests/golden/qwen3_moe and tests/golden/mixtral (make_moe_goldens.py).
A and B are drawn nonzero (PEFT initialises B to 0, which would leave dA zero) and rounded to f32;
a draw is kept only when every MoE layer's adapted router logits keep a margin between the k-th and
(k+1)-th expert on every token (so f32 and f64 route alike) and the greedy continuation a gap
between its top two logits at every step. Written: adapter/ (adapter_config.json with
target_parameters, adapter_model.safetensors in PEFT's names and layout, F32), grads.safetensors
(d loss / d A and B, F32 of the float64 values, the same names and layout) and expected.json (loss,
tokens, r, alpha, targets: target_modules then target_parameters, the margins, the greedy
continuation of the adapted model), as tests/models/test_lora_grad.cpp and
tests/models/test_moe_lora.cpp read them.

Needs torch, transformers 5.x and peft (a venv from PyPI); the build and the tests never run it.
From the repository root:
    python tools/golden/make_moe_expert_lora_goldens.py
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import safetensors_write_blobs  # noqa: E402

import peft  # noqa: E402
from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IGNORE = -100
MIN_ROUTER_GAP = 2e-3
MIN_GREEDY_GAP = 1e-3
CASES = {  # name -> (model dir, class, r, alpha, target_modules, target_parameters, seed)
    # all three: the two expert wrappers nest (gate_up_proj's saved under experts.base_layer); layer 1 dense
    "qwen3_moe_experts": ("qwen3_moe", Qwen3MoeForCausalLM, 2, 5.0, ["q_proj", "o_proj"],
                          ["mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.gate.weight"], 5150),
    # gate_up_proj alone (saved as experts.lora_A/B) and the router, beside an attention projection
    "mixtral_experts": ("mixtral", MixtralForCausalLM, 3, 4.0, ["v_proj"],
                        ["mlp.experts.gate_up_proj", "mlp.gate.weight"], 5151),
}


def f32_bytes(t):
    return t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()


def router_gap(model, ids, k):
    """The smallest gap between the k-th and (k+1)-th adapted router logit over every token of every
    MoE layer (transformers records the router module's logits: with PEFT's ParamWrapper active,
    those of W + s B A)."""
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True)
    gaps = []
    for logits in out.router_logits:
        top = torch.topk(logits, k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))
    return min(gaps), [lg.detach().clone() for lg in out.router_logits]


def greedy(model, prompt, steps):
    ids = prompt.clone()
    min_gap = float("inf")
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        top = torch.topk(logits, 2).values
        min_gap = min(min_gap, float(top[0] - top[1]))
        ids = torch.cat([ids, logits.argmax().view(1, 1)], dim=1)
    return ids[0, prompt.shape[1]:].tolist(), min_gap


def draw_adapters(model, seed):
    g = torch.Generator().manual_seed(seed)
    adapters = {}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" not in n:
                continue
            assert p.dtype == torch.float64, n
            scale = 1.0 / p.shape[1] ** 0.5
            p.copy_((scale * torch.randn(p.shape, generator=g, dtype=torch.float64)).to(torch.float32).to(torch.float64))
            adapters[n] = p
    return adapters


def check_layout(model, cfg):
    """PEFT's delta of each expert is (alpha / r) B_e A_e with A_e = A[e*r:(e+1)*r] and B_e = B[:, e::E]:
    the layout strata reorders at its PEFT boundary (offload/state/lora.h)."""
    for name, mod in model.named_modules():
        if type(mod).__name__ != "ParamWrapper" or mod.num_experts == 1:
            continue
        A = mod.lora_A["default"].weight
        B = mod.lora_B["default"].weight
        E = mod.num_experts
        r = A.shape[0] // E
        delta = mod.get_delta_weight("default")
        for e in range(E):
            want = mod.scaling["default"] * B[:, e::E] @ A[e * r:(e + 1) * r]
            assert torch.allclose(delta[e], want, rtol=0, atol=1e-12), (name, e)


def write_case(name):
    model_name, cls, r, alpha, targets, parameters, seed = CASES[name]
    model_dir = os.path.join(REPO_ROOT, "tests", "golden", model_name)
    out = os.path.join(REPO_ROOT, "tests", "golden", "lora_grad", name)
    with open(os.path.join(model_dir, "batch.json")) as f:
        batch = json.load(f)
    ids = torch.tensor(batch["input_ids"])
    labels = torch.tensor(batch["labels"]) if "labels" in batch else ids.clone()
    for attempt in range(seed, seed + 50):
        model = cls.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager",
                                    experts_implementation="eager")
        k = model.config.num_experts_per_tok
        model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                           target_parameters=parameters, lora_dropout=0.0,
                                                           bias="none"))
        model.eval()
        adapters = draw_adapters(model, attempt)
        gap, logits = router_gap(model, ids, k)
        with model.disable_adapter():
            _, base_logits = router_gap(model, ids, k)
        prompt = ids[:1, :4]
        gen, gen_gap = greedy(model, prompt, 6)
        if gap >= MIN_ROUTER_GAP and gen_gap >= MIN_GREEDY_GAP:
            break
        print(f"{name}: adapter seed {attempt} rejected (router gap {gap:.2e}, greedy gap {gen_gap:.2e})")
    else:
        sys.exit(f"{name}: no adapter draw with clear margins")
    if "mlp.gate.weight" in parameters:
        assert all(not torch.equal(a, b) for a, b in zip(logits, base_logits)), "the router adapter must change the logits"
    check_layout(model, model.config)

    model.zero_grad()
    logits_out = model(input_ids=ids).logits[:, :-1].reshape(-1, model.config.vocab_size)
    tgt = labels[:, 1:].reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits_out, tgt, ignore_index=IGNORE)  # float64 throughout
    loss.backward()
    tokens = int((tgt != IGNORE).sum())
    with torch.no_grad(), model.disable_adapter():
        base = torch.nn.functional.cross_entropy(
            model(input_ids=ids).logits[:, :-1].reshape(-1, model.config.vocab_size), tgt, ignore_index=IGNORE).item()
    print("%s: r %d alpha %g targets %s + %s: loss %.12f (base %.12f), tokens %d, %d adapter tensors, router gap "
          "%.2e, greedy %s gap %.2e" % (name, r, alpha, ",".join(targets), ",".join(parameters), loss.item(), base,
                                        tokens, len(adapters), gap, gen, gen_gap))
    assert abs(loss.item() - base) > 1e-3, "the adapters must change the loss"
    for n, p in adapters.items():
        assert p.grad is not None and float(p.grad.norm()) > 0, n

    def peft_name(n):  # ...experts.base_layer.lora_A.default.weight -> no ".default"
        return n.replace(".default.", ".")
    saved = peft.get_peft_model_state_dict(model)
    assert sorted(saved) == sorted(peft_name(n) for n in adapters), (sorted(saved), sorted(adapters))
    os.makedirs(os.path.join(out, "adapter"), exist_ok=True)
    names = sorted(adapters)
    safetensors_write_blobs(os.path.join(out, "adapter", "adapter_model.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n])) for n in names],
                            metadata={"format": "pt"})
    safetensors_write_blobs(os.path.join(out, "grads.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n].grad)) for n in names],
                            metadata={"format": "pt"})
    config = {"base_model_name_or_path": "tests/golden/" + model_name, "bias": "none", "lora_alpha": alpha,
              "lora_dropout": 0.0, "peft_type": "LORA", "r": r, "target_modules": targets,
              "target_parameters": parameters, "task_type": "CAUSAL_LM"}
    with open(os.path.join(out, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"model": model_name, "loss": loss.item(), "base_loss": base, "tokens": tokens, "r": r,
                   "alpha": alpha, "targets": targets + parameters, "adapter_seed": attempt,
                   "min_router_logit_gap": gap,
                   "generate": {"prompt": prompt[0].tolist(), "tokens": gen, "min_top2_logit_gap": gen_gap}},
                  f, indent=2)
        f.write("\n")


def main():
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    for name in CASES:
        write_case(name)


if __name__ == "__main__":
    main()
