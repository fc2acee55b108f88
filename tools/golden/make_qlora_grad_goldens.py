#!/usr/bin/python3
"""Writes the QLoRA golden fixtures for `strata grad --lora` on an NF4 base (issue 40;
tests/golden/qlora_grad/<case>/).

For the four tiny models of make_model_goldens.py (tests/golden/<case>/) and the LoRA adapters of
make_lora_grad_goldens.py (tests/golden/lora_grad/<case>/adapter, read back, not redrawn), every
decoder layer's linear weight (q, k, v, o, gate, up, down) is rounded to bf16 (the model loaded in
bf16, as transformers does for load_in_4bit with bnb_4bit_compute_dtype = bfloat16) and quantized
by bitsandbytes itself on the CPU: bitsandbytes.functional.quantize_4bit(blocksize=64,
quant_type="nf4", compress_statistics=double_quant), then dequantize_4bit (bf16). On that
dequantized base, with embeddings, norms, biases and lm_head as stored, the loss and the adapters'
gradients are computed in float64 with PEFT's LoRA math written by hand (peft.tuners.lora.Linear,
as make_lora_grad_goldens.py does: y = x W^T (+ b) + (alpha / r) (x A^T) B^T): what PEFT +
bitsandbytes' QLoRA computes, without the bf16 rounding of activations.

Output per case: grads.safetensors (double quantization) and grads_nodq.safetensors (plain
absmax), F32 of the float64 gradients under PEFT's names; expected.json (loss and loss_nodq, r,
alpha, targets, and the NF4 round trip's largest error as a fraction of its block's absmax).

A preference objective on the NF4 base (llama, double quantization): DPO (beta 0.3, TRL's sigmoid
loss) over tests/golden/preference/llama/batch.json (its pairs and reference log-prob sums,
make_preference_grad_goldens.py) with the same adapters, in float64: dpo_grads.safetensors and
expected.json's dpo_loss and dpo_beta.

Run from the repository root, with torch and bitsandbytes (CPU) installed:
    python3 tools/golden/make_qlora_grad_goldens.py
"""

import json
import os
import re
import sys

import bitsandbytes.functional as F
import torch

import make_lora_grad_goldens as lg
import make_model_goldens as mg

OUT_ROOT = os.path.join(mg.REPO_ROOT, "tests", "golden", "qlora_grad")
LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight$")


def nf4_base(params, double_quant):
    """params with every decoder-layer linear replaced by bitsandbytes' NF4 round trip (float64)."""
    out, worst = {}, 0.0
    for name, w in params.items():
        if not LINEAR.match(name):
            out[name] = w
            continue
        # flat: bitsandbytes 0.50's CPU dequantize_4bit takes an AVX512 path for 2-D weights whose
        # row count is a multiple of 16, and with rows shorter than a block (qwen2's 32 columns) it
        # reads the wrong block's absmax (-0.4238 came back as -0.1621). The blocks run over the
        # flattened weight either way, so the codes and absmax are the same.
        w_bf16 = w.to(torch.float32).to(torch.bfloat16).reshape(-1)
        q, state = F.quantize_4bit(w_bf16, blocksize=64, compress_statistics=double_quant, quant_type="nf4")
        deq = F.dequantize_4bit(q, state).to(torch.float64)
        blocks = torch.nn.functional.pad(w_bf16.to(torch.float64), (0, (-w.numel()) % 64)).view(-1, 64)
        absmax = blocks.abs().amax(dim=1).repeat_interleave(64)[: w.numel()]
        err = ((deq - w_bf16.to(torch.float64)).abs() / absmax.clamp_min(1e-30)).max().item()
        if err > 0.2:  # half the widest gap between NF4 values (0.152) plus the double quantization's
            sys.exit("%s: the NF4 round trip is off by %.3f of its block's absmax" % (name, err))
        deq = deq.view(w.shape)
        worst = max(worst, err)
        out[name] = deq
    return out, worst


DPO_CASE, DPO_BETA = "llama", 0.3


def dpo_loss(case, base, leaves, scale):
    """TRL's sigmoid DPO loss of the LoRA model on the NF4 base over the committed preference batch."""
    with open(os.path.join(mg.REPO_ROOT, "tests", "golden", "preference", case["name"], "batch.json")) as f:
        b = json.load(f)
    lora = {k: (a, bb, scale) for k, (a, bb) in leaves.items()}

    def logps(ids, labels):  # (rows) summed log-probs of the shifted labels, -100 ignored
        logits = mg.forward_logits(case, base, torch.tensor(ids), lora=lora)  # (B, T, V)
        logp = torch.log_softmax(logits[:, :-1], dim=-1)
        lab = torch.tensor(labels)[:, 1:]
        mask = lab != mg.IGNORE_INDEX
        return (torch.gather(logp, 2, lab.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask).sum(-1)
    sc = logps(b["chosen_input_ids"], b["chosen_labels"])
    sr = logps(b["rejected_input_ids"], b["rejected_labels"])
    rc = torch.tensor(b["ref_chosen_logps"], dtype=torch.float64)
    rr = torch.tensor(b["ref_rejected_logps"], dtype=torch.float64)
    return (-torch.nn.functional.logsigmoid(DPO_BETA * ((sc - sr) - (rc - rr)))).mean()


def write_case(case):
    name = case["name"]
    r, alpha, targets = lg.LORA[name]
    scale = alpha / r
    out_dir = os.path.join(OUT_ROOT, name)
    os.makedirs(out_dir, exist_ok=True)
    params = mg.make_params(case)
    input_ids, labels = mg.make_batch(case)
    stored = mg.safetensors_read(os.path.join(mg.REPO_ROOT, "tests", "golden", "lora_grad", name, "adapter",
                                              "adapter_model.safetensors"))
    adapters = {}
    for key in stored:
        module = key[len("base_model.model."):-len(".lora_A.weight")]
        if key.endswith(".lora_A.weight"):
            na, nb = lg.peft_names(module)
            adapters[module] = (stored[na], stored[nb])
    expected = {"r": r, "alpha": alpha, "targets": targets, "tokens": None}
    for double_quant, suffix in ((True, ""), (False, "_nodq")):
        base, worst = nf4_base(params, double_quant)
        leaves = {k: (a.clone().requires_grad_(True), b.clone().requires_grad_(True)) for k, (a, b) in adapters.items()}
        loss, tokens = lg.loss_of(case, base, leaves, scale, input_ids, labels)
        loss.backward()
        tensors = []
        for k in sorted(leaves):
            na, nb = lg.peft_names(k)
            tensors += [(na, leaves[k][0].grad.detach()), (nb, leaves[k][1].grad.detach())]
        mg.safetensors_write(os.path.join(out_dir, "grads%s.safetensors" % suffix), tensors, "F32")
        expected["loss" + suffix] = loss.item()
        expected["tokens"] = tokens
        expected["base_max_rel_change" + suffix] = worst
        print("case %s double_quant %s: loss %.12g, tokens %d, NF4 round trip max |dW| / block absmax %.3f"
              % (name, double_quant, loss.item(), tokens, worst))
        if name == DPO_CASE and double_quant:
            leaves = {k: (a.clone().requires_grad_(True), b.clone().requires_grad_(True)) for k, (a, b) in adapters.items()}
            loss = dpo_loss(case, base, leaves, scale)
            loss.backward()
            tensors = []
            for k in sorted(leaves):
                na, nb = lg.peft_names(k)
                tensors += [(na, leaves[k][0].grad.detach()), (nb, leaves[k][1].grad.detach())]
            mg.safetensors_write(os.path.join(out_dir, "dpo_grads.safetensors"), tensors, "F32")
            expected["dpo_loss"] = loss.item()
            expected["dpo_beta"] = DPO_BETA
            print("case %s DPO (beta %g) on the double-quantized base: loss %.12g" % (name, DPO_BETA, loss.item()))
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=2)
        f.write("\n")


def main():
    torch.set_num_threads(1)  # the double quantization's mean is torch's sum: 1 thread (kernels/cpu/nf4.h)
    for case in mg.CASES:
        write_case(case)


if __name__ == "__main__":
    main()
