#!/usr/bin/env python3
"""Writes the QLoRA goldens of the newer families (issue 40, part 3; tests/golden/qlora_grad/<case>/
for gemma3, olmo2, phi3, qwen3_moe and mixtral) from transformers, bitsandbytes and PEFT themselves.

For each committed tiny model (tests/golden/<case>, written by make_gemma_goldens.py,
make_phi3_goldens.py and make_moe_goldens.py):
1. transformers loads it with BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
   bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=bfloat16) and dtype=bfloat16 on the CPU:
   bitsandbytes quantizes what transformers hands it (every plain nn.Linear but lm_head). The
   names it quantized are written to expected.json ("quantized"), and so are the decoder-layer
   parameters it left as they were ("left_unquantized": the MoE experts, transformers 5's packed 3-D
   nn.Parameters, and the routers, which are not nn.Linear modules). The quantized weights'
   dequantize_4bit (flattened: bitsandbytes 0.50's 2-D CPU path misreads the absmax of rows shorter
   than a block, make_qlora_grad_goldens.py says more) is the base.
2. The same model is loaded again in float64 (eager attention and experts) and those weights are
   replaced by the dequantized ones; peft.get_peft_model puts LoRA on the case's target modules,
   A and B drawn nonzero and rounded to f32 (PEFT initialises B to 0, which leaves dA zero).
3. The loss (the cross-entropy taken in float64 here: transformers' loss function would cast the
   logits to float32; no MoE load-balancing loss) and its gradients with respect to every A and B.
   MoE cases also record the smallest gap between the k-th and (k+1)-th router logit on this base,
   so a float32 run routes the same way (the script fails below 1e-4).

Written per case: adapter/adapter_config.json, adapter/adapter_model.safetensors (F32, PEFT's
names), grads.safetensors (F32 of the float64 gradients, the same names) and expected.json (loss,
tokens, r, alpha, targets, quantized, left_unquantized, base_loss: the loss of the bf16 model
without adapters on the dequantized base).

Needs torch, transformers 5.x, peft and bitsandbytes (CPU) in a venv; the build and the tests never
run it. From the repository root:
    python tools/golden/make_qlora_family_goldens.py
"""

import json
import os
import sys

import bitsandbytes.functional as F
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_file import safetensors_write_blobs  # noqa: E402

import peft  # noqa: E402
from transformers import AutoModelForCausalLM, BitsAndBytesConfig  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_ROOT = os.path.join(REPO_ROOT, "tests", "golden", "qlora_grad")
IGNORE = -100
CASES = {  # case: (r, alpha, target_modules, adapter seed)
    "gemma3": (4, 8.0, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], 401),
    "olmo2": (3, 5.0, ["q_proj", "v_proj", "down_proj"], 402),
    "phi3": (3, 7.0, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], 403),
    "qwen3_moe": (2, 4.0, ["q_proj", "k_proj", "v_proj", "o_proj"], 404),
    "mixtral": (4, 6.0, ["q_proj", "v_proj", "o_proj"], 405),
}


def f32_bytes(t):
    return t.detach().contiguous().to(torch.float32).numpy().astype("<f4").tobytes()


def bnb_dequantized(model_dir):
    """{module name: dequantized weight (float64, the module's shape)} of what transformers +
    bitsandbytes quantize, and the decoder-layer parameters left in bf16."""
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    q = AutoModelForCausalLM.from_pretrained(model_dir, quantization_config=bnb, dtype=torch.bfloat16,
                                             device_map="cpu")
    deq, left = {}, []
    for name, module in q.named_modules():
        w = getattr(module, "weight", None)
        if w is not None and getattr(w, "quant_state", None) is not None:
            st = w.quant_state
            flat = F.QuantState(absmax=st.absmax, shape=torch.Size([st.shape.numel()]), code=st.code,
                                blocksize=st.blocksize, quant_type=st.quant_type, dtype=st.dtype,
                                offset=st.offset, state2=st.state2)
            deq[name] = F.dequantize_4bit(w.data, flat).to(torch.float64).view(st.shape)
    for name, p in q.named_parameters():
        if ".layers." in name and p.dim() >= 2 and not hasattr(p, "quant_state"):
            left.append(name)
    return deq, sorted(left)


def router_gap(model, ids, k):
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True)
    gaps = []
    for logits in out.router_logits:
        top = torch.topk(logits, k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))
    return min(gaps)


def ce_loss(logits, labels):
    """The mean cross-entropy of the shifted labels (-100 ignored), in the logits' dtype."""
    v = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, v), labels[:, 1:].reshape(-1),
                                             ignore_index=IGNORE)


def write_case(name):
    r, alpha, targets, seed = CASES[name]
    model_dir = os.path.join(REPO_ROOT, "tests", "golden", name)
    out_dir = os.path.join(OUT_ROOT, name)
    deq, left = bnb_dequantized(model_dir)
    kw = {"attn_implementation": "eager"}
    if name in ("qwen3_moe", "mixtral"):
        kw["experts_implementation"] = "eager"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, **kw)
    modules = dict(model.named_modules())
    with torch.no_grad():
        for n, w in deq.items():
            assert modules[n].weight.shape == w.shape, n
            modules[n].weight.copy_(w)
    with open(os.path.join(model_dir, "batch.json")) as f:
        batch = json.load(f)
    ids = torch.tensor(batch["input_ids"])
    labels = torch.tensor(batch["labels"]) if "labels" in batch else ids.clone()
    with torch.no_grad():
        base_loss = ce_loss(model(input_ids=ids).logits, labels).item()
    model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets,
                                                       lora_dropout=0.0, bias="none"))
    model.eval()
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
    gap = None
    if name in ("qwen3_moe", "mixtral"):
        gap = router_gap(model, ids, model.config.num_experts_per_tok)
        if gap < 1e-4:
            sys.exit("%s: router logits within %.2e of a tie on the NF4 base: pick another adapter seed" % (name, gap))
    loss = ce_loss(model(input_ids=ids).logits, labels)
    loss.backward()
    tokens = int((labels[:, 1:] != IGNORE).sum())
    assert abs(loss.item() - base_loss) > 1e-3, "the adapters must change the loss"

    def peft_name(n):  # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight -> no ".default"
        return n.replace(".default.", ".")
    os.makedirs(os.path.join(out_dir, "adapter"), exist_ok=True)
    names = sorted(adapters)
    safetensors_write_blobs(os.path.join(out_dir, "adapter", "adapter_model.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n])) for n in names],
                            metadata={"format": "pt"})
    safetensors_write_blobs(os.path.join(out_dir, "grads.safetensors"),
                            [(peft_name(n), "F32", adapters[n].shape, f32_bytes(adapters[n].grad)) for n in names],
                            metadata={"format": "pt"})
    config = {"base_model_name_or_path": "tests/golden/" + name, "bias": "none", "lora_alpha": alpha,
              "lora_dropout": 0.0, "peft_type": "LORA", "r": r, "target_modules": targets, "task_type": "CAUSAL_LM"}
    with open(os.path.join(out_dir, "adapter", "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    expected = {"loss": loss.item(), "base_loss": base_loss, "tokens": tokens, "r": r, "alpha": alpha,
                "targets": targets, "quantized": sorted(n + ".weight" for n in deq), "left_unquantized": left}
    if gap is not None:
        expected["min_router_logit_gap"] = gap
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")
    print("%s: %d linears quantized, %d decoder-layer parameters left unquantized%s; loss %.12f (no adapters %.12f), "
          "%d tokens, %d adapter tensors%s" % (
              name, len(deq), len(left), (" (" + ", ".join(sorted({n.split(".layers.")[1].split(".", 1)[1] for n in left}))
                                          + ")") if left else "",
              loss.item(), base_loss, tokens, len(adapters), "" if gap is None else ", router gap %.2e" % gap))


def main():
    torch.set_num_threads(1)  # the double quantization's mean is torch's sum: 1 thread (kernels/cpu/nf4.h)
    for name in (sys.argv[1:] or list(CASES)):
        write_case(name)


if __name__ == "__main__":
    main()
