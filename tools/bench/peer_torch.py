"""The PyTorch side of the peer benchmark (tools/bench/peer.py): one Llama-family model trained in
three forms a user of today's PyTorch would pick, each from the same weights on the same rows with
the same AdamW:

  eager         a hand-written Llama in plain PyTorch: nn.Linear, F.scaled_dot_product_attention
                (causal), autocast to bf16 for a bf16 configuration
  compile       the same module with each decoder layer and the loss head torch.compile'd (inductor,
                CPU; "regional compilation", PyTorch's advice for repeated blocks); the compilation
                happens in warm-up steps that are not timed
  transformers  Hugging Face's LlamaForCausalLM (attn_implementation="sdpa") with the same weights,
                its own causal-LM loss, autocast for bf16

The optimizer is torch.optim.AdamW(fused=True) where this torch has the fused CPU kernel (2.4 and
later), else foreach=True; weight decay on the matrices only, as strata does; global-norm clipping
at 1.0. Shapes: B micro-batch, T tokens, C hidden, H heads, KV kv heads, D head dim, V vocab.
"""

import re
import time

LR, WD, CLIP, SEED = 1e-4, 0.01, 1.0, 1234
FORMS = ("eager", "compile", "transformers")


def build_model(c):
    """The eager model, seeded: every matrix N(0, 0.02), norms 1."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    C, D, H, KV = c["hidden"], c["head_dim"], c["heads"], c["kv"]

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):  # HF's LlamaRMSNorm: in f32, back to the input's dtype, times the weight
            xf = x.float()
            return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(C), RMSNorm(C)
            self.q_proj = nn.Linear(C, H * D, bias=False)
            self.k_proj = nn.Linear(C, KV * D, bias=False)
            self.v_proj = nn.Linear(C, KV * D, bias=False)
            self.o_proj = nn.Linear(H * D, C, bias=False)
            self.gate_proj = nn.Linear(C, c["inter"], bias=False)
            self.up_proj = nn.Linear(C, c["inter"], bias=False)
            self.down_proj = nn.Linear(c["inter"], C, bias=False)

        def forward(self, x, cos, sin):  # x (B, T, C); cos, sin (T, D)
            B, T, _ = x.shape
            h = self.input_layernorm(x)
            q = self.q_proj(h).view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
            k = self.k_proj(h).view(B, T, KV, D).transpose(1, 2)  # (B, KV, T, D)
            v = self.v_proj(h).view(B, T, KV, D).transpose(1, 2)

            def rope(t):  # HF's rotate-half layout
                t1, t2 = t[..., : D // 2], t[..., D // 2:]
                return t * cos + torch.cat((-t2, t1), dim=-1) * sin

            q, k = rope(q), rope(k)
            k = k.repeat_interleave(H // KV, dim=1)  # (B, H, T, D), as HF's repeat_kv
            v = v.repeat_interleave(H // KV, dim=1)
            if hasattr(F, "scaled_dot_product_attention"):  # torch 2.0 and later
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
            else:  # Debian's torch 1.13 (the fallback): the product, a causal mask and softmax
                att = (q @ k.transpose(-1, -2)) * (D ** -0.5)
                att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
                y = torch.softmax(att.float(), dim=-1).to(q.dtype) @ v
            x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, H * D))
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Head(nn.Module):
        """Final norm, lm_head and the causal-LM loss (mean over the B (T - 1) predicted tokens)."""

        def __init__(self, embed):
            super().__init__()
            self.norm = RMSNorm(C)
            self.lm_head = None if c["tied"] else nn.Linear(C, c["vocab"], bias=False)
            self.embed = [embed]  # the tied weight, not registered twice

        def forward(self, x, ids):
            x = self.norm(x)
            w = self.embed[0].weight if self.lm_head is None else self.lm_head.weight
            logits = F.linear(x, w)  # (B, T, V)
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c["vocab"], C)
            self.layers = nn.ModuleList([Layer() for _ in range(c["layers"])])
            self.head = Head(self.embed_tokens)

        def forward(self, ids):  # ids (B, T) -> the mean loss
            T = ids.shape[1]
            inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
            f = torch.outer(torch.arange(T, dtype=torch.float32), inv)
            emb = torch.cat((f, f), dim=-1)  # (T, D)
            x = self.embed_tokens(ids)
            dt = torch.bfloat16 if c["dtype"] == "bf16" else x.dtype  # the dtype autocast gives q and k
            cos, sin = emb.cos().to(dt), emb.sin().to(dt)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.head(x, ids)

    torch.manual_seed(SEED)
    m = Model()
    with torch.no_grad():
        for _, p in m.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return m


def hf_names(model):
    """(Hugging Face name, tensor) of the eager model's parameters: the model directory's names."""
    out = []
    for name, p in model.named_parameters():
        if name.startswith("head.lm_head"):
            out.append(("lm_head.weight", p))
            continue
        n = "model." + name.replace("head.norm.", "norm.")
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            n = n.replace("." + proj + ".", ".self_attn." + proj + ".")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            n = n.replace("." + proj + ".", ".mlp." + proj + ".")
        out.append((n, p))
    return out


def build_hf(hf_cfg, named):
    """transformers' LlamaForCausalLM from the config.json dict, with the eager model's weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**{k: v for k, v in hf_cfg.items() if k not in ("architectures", "model_type", "torch_dtype")},
                      attn_implementation="sdpa")
    m = LlamaForCausalLM(cfg).float()
    missing, unexpected = m.load_state_dict({n: t.detach().clone() for n, t in named}, strict=False)
    if unexpected or [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]:
        raise SystemExit(f"peer: transformers' Llama did not take the weights: missing {missing}, "
                         f"unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        m.tie_weights()
    return m


def compile_regions(model):
    """Each decoder layer and the head compiled in place (inductor); the loop over layers stays in Python."""
    for layer in model.layers:
        layer.compile()
    model.head.compile()
    return model


def make_optimizer(model):
    import torch
    decay = [p for p in model.parameters() if p.dim() == 2]
    other = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": WD}, {"params": other, "weight_decay": 0.0}]
    try:
        return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, fused=True), "fused"
    except (RuntimeError, TypeError, ValueError):  # torch before 2.4: no fused CPU AdamW
        return torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.999), eps=1e-8, foreach=True), "foreach"


def step_loss(form, model, batch, dtype):
    import torch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(dtype == "bf16")):
        if form == "transformers":
            return model(input_ids=batch, labels=batch).loss
        return model(batch)


def train(form, model, rows, c, steps, warmup):
    """Trains `steps` steps after `warmup` untimed ones (the first step of each run warms up; the
    compiled form's compilation happens there). Returns tokens/s of the timed steps, every step's
    loss and the optimizer kind. Rows: step s takes rows [s mb, (s + 1) mb) (wrapping)."""
    import torch
    opt, kind = make_optimizer(model)
    mb, T = c["mb"], c["T"]
    times, losses = [], []
    for s in range(warmup + steps):
        i = (s * mb) % len(rows)
        batch = torch.tensor((rows + rows)[i:i + mb], dtype=torch.long)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = step_loss(form, model, batch, c["dtype"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    opt.zero_grad(set_to_none=True)
    del opt
    return mb * (T - 1) * steps / sum(times[warmup:]), losses, kind


def profile(form, model, rows, c, top=14):
    """One training step under torch.profiler after a warm-up step: the ops with the most self CPU
    time, as (name, seconds) pairs (inductor's generated graphs summed as one), and the step's
    wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile as tprofile
    opt, _ = make_optimizer(model)
    batch = torch.tensor(rows[: c["mb"]], dtype=torch.long)

    def one():
        opt.zero_grad(set_to_none=True)
        loss = step_loss(form, model, batch, c["dtype"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()

    one()
    t0 = time.perf_counter()
    with tprofile(activities=[ProfilerActivity.CPU]) as prof:
        one()
    total = time.perf_counter() - t0
    seconds = {}
    for e in prof.key_averages():  # inductor's generated graphs (fused elementwise, norms, loss) as one entry
        key = "inductor graphs" if e.key.startswith("## Call CompiledFxGraph") else e.key
        seconds[key] = seconds.get(key, 0.0) + e.self_cpu_time_total / 1e6
    opt.zero_grad(set_to_none=True)
    return sorted(seconds.items(), key=lambda kv: -kv[1])[:top], total


def loss_at(form, model, rows, c):
    """The loss on the first micro-batch without a step (f32 unless the config is bf16)."""
    import torch
    with torch.no_grad():
        return float(step_loss(form, model, torch.tensor(rows[: c["mb"]], dtype=torch.long), c["dtype"]))


def versions():
    import torch
    out = {"torch": torch.__version__}
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    m = re.search(r"(?:MKL-DNN|oneDNN) v([0-9.]+)", torch.__config__.show())
    out["torch_onednn"] = m.group(1) if m else None
    out["torch_blas"] = "mkl" if torch.backends.mkl.is_available() else "other"
    out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else None
    return out
