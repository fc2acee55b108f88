#!/usr/bin/python3
"""Writes what transformers + bitsandbytes save for a load_in_4bit model (issue 40, `strata
quantize` and reading pre-quantized dirs; tests/golden/bnb_nf4/).

A tiny random Llama (hidden 64, ffn 160, 2 layers, odd vocab 300, untied, bf16) is saved as a
Hugging Face dir (base/), then loaded by transformers with BitsAndBytesConfig(load_in_4bit=True,
bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=bfloat16, bnb_4bit_use_double_quant=True and
False) on the CPU and saved again (q4/ and q4_nodq/): every decoder-layer linear as `weight`
(uint8 codes, (n/2, 1)), `weight.absmax` (uint8 with double quantization, else float32),
`weight.quant_map`, with double quantization `weight.nested_absmax` and `weight.nested_quant_map`,
and `weight.quant_state.bitsandbytes__nf4` (a JSON string as uint8); embeddings, norms and lm_head
in bf16; config.json with its quantization_config. q4_dequantized.safetensors (and _nodq) hold
bitsandbytes' dequantize_4bit of every quantized weight (bf16), flattened (its 2-D CPU path
misreads the absmax of rows shorter than a block; make_qlora_grad_goldens.py says more).

The newer families the same way (`families`): the committed tiny phi3 and qwen3_moe
(tests/golden/phi3, tests/golden/qwen3_moe) loaded with double quantization and dtype=bfloat16 and
saved as phi3_q4/ and qwen3_moe_q4/: Phi-3's fused qkv_proj and gate_up_proj quantized, qwen3_moe's
attention quantized and its experts and routers left in bf16 (transformers 5 holds the experts as
packed 3-D parameters, not nn.Linear modules, so bitsandbytes never sees them).

Run from the repository root, with torch, transformers 5.x and bitsandbytes (CPU) installed:
    python3 tools/golden/make_bnb_nf4_dirs.py [llama | families]   (default both)
"""

import os
import shutil
import sys

import bitsandbytes.functional as F
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(REPO_ROOT, "tests", "golden", "bnb_nf4")


FAMILIES = ("phi3", "qwen3_moe")


def save_families():
    for case in FAMILIES:
        sub = os.path.join(OUT, case + "_q4")
        if os.path.isdir(sub):
            shutil.rmtree(sub)
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
        q = AutoModelForCausalLM.from_pretrained(os.path.join(REPO_ROOT, "tests", "golden", case), quantization_config=bnb,
                                                 dtype=torch.bfloat16, device_map="cpu")
        q.save_pretrained(sub)
        p = os.path.join(sub, "generation_config.json")
        if os.path.exists(p):
            os.remove(p)
        quantized = [n for n, m in q.named_modules() if getattr(getattr(m, "weight", None), "quant_state", None) is not None]
        print("%s_q4: %d quantized weights, files %s" % (case, len(quantized), sorted(os.listdir(sub))))


def main():
    torch.set_num_threads(1)
    what = sys.argv[1] if len(sys.argv) > 1 else "both"
    if what in ("families", "both"):
        save_families()
    if what == "families":
        return
    torch.manual_seed(40)
    for sub in ("base", "q4", "q4_nodq", "q4_dequantized.safetensors", "q4_nodq_dequantized.safetensors"):
        p = os.path.join(OUT, sub)
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=300, max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # norms away from 1, so a norm read as the wrong tensor shows
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p, dtype=torch.float32))
    model.save_pretrained(os.path.join(OUT, "base"))
    for double_quant, sub in ((True, "q4"), (False, "q4_nodq")):
        bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=double_quant,
                                 bnb_4bit_compute_dtype=torch.bfloat16)
        q = AutoModelForCausalLM.from_pretrained(os.path.join(OUT, "base"), quantization_config=bnb, device_map="cpu")
        q.save_pretrained(os.path.join(OUT, sub))
        deq = {}
        for name, module in q.named_modules():
            w = getattr(module, "weight", None)
            if w is not None and hasattr(w, "quant_state") and w.quant_state is not None:
                st = w.quant_state
                flat = F.QuantState(absmax=st.absmax, shape=torch.Size([st.shape.numel()]), code=st.code,
                                    blocksize=st.blocksize, quant_type=st.quant_type, dtype=st.dtype,
                                    offset=st.offset, state2=st.state2)
                deq[name + ".weight"] = F.dequantize_4bit(w.data, flat).contiguous()
        save_file(deq, os.path.join(OUT, sub + "_dequantized.safetensors"), metadata={"format": "pt"})
        for f in ("generation_config.json",):
            p = os.path.join(OUT, sub, f)
            if os.path.exists(p):
                os.remove(p)
        print("%s: %d quantized weights" % (sub, len(deq)))
    gen = os.path.join(OUT, "base", "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)


if __name__ == "__main__":
    main()
