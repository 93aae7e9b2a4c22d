"""Model-level benchmark: one training step of a small decoder, with attention, RMSNorm and the
SwiGLU activation either from PyTorch or from the generated TileLang packages.

Two architectures (--arch):
  llama    causal GQA attention. baseline: SDPA + eager; flex: FlexAttention + eager;
           opgen: generated/gqa, generated/rmsnorm, generated/swiglu.
  gpt-oss  GPT-OSS-style attention: a learnable sink logit per head, and a 128-key sliding window
           on every other layer (the others full causal). baseline: the eager formula
           transformers runs for GPT-OSS (scores, the sink column, softmax, drop the column);
           flex: FlexAttention with the sinks folded in through its log-sum-exp; opgen:
           generated/attention_sink (+ rmsnorm, swiglu). The MLP is a dense SwiGLU (GPT-OSS's
           is a mixture of experts: not what is compared here).

    python examples/model_step.py                          # baseline and opgen, S = 256 1024 2048
    python examples/model_step.py --arch gpt-oss --impl all   # baseline, flex and opgen
    python examples/model_step.py --check                  # 1 step of each from one set of weights
    python examples/model_step.py --device cpu --impl baseline --tiny     # CPU smoke test

Every impl builds the same modules from the same seed, so they hold the same weights; only the
three ops differ. A step is forward + loss + backward + AdamW step + zero_grad.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn
import torch.nn.functional as F

# head_dim 128 is in generated/gqa HEAD_DIMS (64, 128); hidden 2048 is under rmsnorm's
# MAX_CHANNELS (16384); bf16 is a dtype all three packages take. Fits one H200 many times over.
# gpt-oss: GPT-OSS's attention shape (64 query / 8 KV heads of head_dim 64 there; 32 / 8 here, to
# keep the hidden size at 2048) and its window of 128 keys on every other layer.
CONFIGS = {
    ("llama", False): dict(vocab=32000, hidden=2048, heads=16, kv_heads=4, head_dim=128,
                           intermediate=5632, layers=4),
    ("llama", True): dict(vocab=1000, hidden=256, heads=4, kv_heads=2, head_dim=64,
                          intermediate=512, layers=2),
    ("gpt-oss", False): dict(vocab=32000, hidden=2048, heads=32, kv_heads=8, head_dim=64,
                             intermediate=5632, layers=4, sinks=True, window=128),
    ("gpt-oss", True): dict(vocab=1000, hidden=256, heads=4, kv_heads=2, head_dim=64,
                            intermediate=512, layers=2, sinks=True, window=16),
}
# generated/rmsnorm has eps fixed at 1e-6 (autograd.EPS) and a plain weight y = x * rstd * w,
# so the baseline uses the same.
EPS = 1e-6
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---- the three swappable ops: q, k, v are [B, S, heads, D] ("bshd"), contiguous; sinks is None
# or [heads]; window is None or the number of keys a query sees (itself included) ----

def eager_rmsnorm(x, w):
    # As Llama-style models do it: statistics and scaling in fp32, then cast back.
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def eager_swiglu(a, b):
    return F.silu(a) * b


def sdpa_attention(sdpa_backend):
    def attention(q, k, v, sinks=None, window=None):
        assert sinks is None and window is None, "SDPA has no sinks: --arch gpt-oss has no SDPA impl"
        # SDPA takes [B, H, S, D]; enable_gqa broadcasts the KV heads without a copy.
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if sdpa_backend == "default":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                       "efficient": SDPBackend.EFFICIENT_ATTENTION}[sdpa_backend]
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return o.transpose(1, 2)

    return attention


def visible(seq_len, window, device):
    """[S, S] bool: query i sees key j (causal, and within the window if any)."""
    i = torch.arange(seq_len, device=device).view(-1, 1)
    j = torch.arange(seq_len, device=device).view(1, -1)
    keep = j <= i
    return keep & (i - j < window) if window else keep


def eager_sinks_attention(q, k, v, sinks=None, window=None):
    """The eager attention transformers runs for GPT-OSS: scores in q's dtype, one more column per
    row holding the head's sink logit, softmax, the column dropped, times V."""
    heads, groups = q.shape[2], q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~visible(q.shape[2], window, q.device), float("-inf"))
    if sinks is not None:
        sink = sinks.to(scores.dtype).view(1, heads, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink], dim=-1)
    scores = scores - scores.max(dim=-1, keepdim=True).values
    probs = torch.softmax(scores, dim=-1, dtype=scores.dtype)
    if sinks is not None:
        probs = probs[..., :-1]
    return (probs @ v).transpose(1, 2)


def flex_attention_op():
    """FlexAttention (compiled, one block mask per length and window); sinks folded in after it:
    a sink adds exp(sink) to a row's softmax denominator, so O is rescaled by
    sigmoid(lse - sink)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    flex = torch.compile(flex_attention, dynamic=False)
    masks = {}

    def block_mask(seq_len, window, device):
        key = (seq_len, window, device)
        if key not in masks:
            def mask_mod(b, h, q_idx, kv_idx):
                keep = q_idx >= kv_idx
                return keep & (q_idx - kv_idx < window) if window else keep
            masks[key] = create_block_mask(mask_mod, None, None, seq_len, seq_len, device=device)
        return masks[key]

    def attention(q, k, v, sinks=None, window=None):
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        mask = block_mask(q.shape[2], window, q.device)
        if sinks is None:
            return flex(q, k, v, block_mask=mask, enable_gqa=True).transpose(1, 2)
        o, lse = flex(q, k, v, block_mask=mask, enable_gqa=True, return_lse=True)
        scale = torch.sigmoid(lse - sinks.float().view(1, -1, 1)).unsqueeze(-1)
        return (o * scale.to(o.dtype)).transpose(1, 2)

    return attention


def baseline_ops(cfg, sdpa_backend):
    attention = eager_sinks_attention if cfg.get("sinks") else sdpa_attention(sdpa_backend)
    return SimpleNamespace(attention=attention, rmsnorm=eager_rmsnorm, swiglu=eager_swiglu)


def flex_ops(device):
    if device.type != "cuda":
        sys.exit("model_step: --impl flex needs a CUDA GPU; on CPU run --impl baseline")
    return SimpleNamespace(attention=flex_attention_op(), rmsnorm=eager_rmsnorm,
                           swiglu=eager_swiglu)


def opgen_ops(cfg, device, dtype):
    if device.type != "cuda":
        sys.exit("model_step: --impl opgen needs a CUDA GPU (TileLang kernels); "
                 "on CPU run --impl baseline")
    if dtype not in (torch.float16, torch.bfloat16):
        sys.exit(f"model_step: the generated packages take float16/bfloat16, not {dtype}")
    # Imported here, not at the top, so the CPU baseline runs without TileLang GPU support.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: generated/
    from generated.rmsnorm import rmsnorm
    from generated.swiglu import swiglu

    if cfg.get("sinks"):
        from generated.attention_sink import attention_sink

        def attention(q, k, v, sinks=None, window=None):
            return attention_sink(q, k, v, sinks, causal=True, window=window, layout="bshd")
    else:
        from generated.gqa import gqa

        def attention(q, k, v, sinks=None, window=None):
            return gqa(q, k, v, causal=True, layout="bshd")  # llama: no sinks, no window

    return SimpleNamespace(attention=attention, rmsnorm=rmsnorm, swiglu=swiglu)


# ---- the model: identical modules for both impls; `ops` picks the three kernels ----

class RMSNorm(nn.Module):
    def __init__(self, dim, ops):
        super().__init__()
        self.weight, self.ops = nn.Parameter(torch.ones(dim)), ops

    def forward(self, x):
        return self.ops.rmsnorm(x, self.weight)


class Block(nn.Module):
    def __init__(self, c, ops, index):
        super().__init__()
        h, d = c["hidden"], c["head_dim"]
        self.heads, self.kv_heads, self.head_dim, self.ops = c["heads"], c["kv_heads"], d, ops
        # GPT-OSS: a sliding window on the even layers, full causal attention on the odd ones.
        self.window = c["window"] if c.get("window") and index % 2 == 0 else None
        # One sink logit per query head (GPT-OSS learns them; random here, so they matter).
        self.sinks = nn.Parameter(torch.randn(c["heads"])) if c.get("sinks") else None
        self.attn_norm, self.mlp_norm = RMSNorm(h, ops), RMSNorm(h, ops)
        self.q = nn.Linear(h, c["heads"] * d, bias=False)
        self.k = nn.Linear(h, c["kv_heads"] * d, bias=False)
        self.v = nn.Linear(h, c["kv_heads"] * d, bias=False)
        self.o = nn.Linear(c["heads"] * d, h, bias=False)
        self.gate = nn.Linear(h, c["intermediate"], bias=False)
        self.up = nn.Linear(h, c["intermediate"], bias=False)
        self.down = nn.Linear(c["intermediate"], h, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        y = self.attn_norm(x)
        # Linear outputs are contiguous, so these views are the contiguous bshd the ops want.
        q = self.q(y).view(B, S, self.heads, self.head_dim)
        k = self.k(y).view(B, S, self.kv_heads, self.head_dim)
        v = self.v(y).view(B, S, self.kv_heads, self.head_dim)
        o = self.ops.attention(q, k, v, self.sinks, self.window)
        x = x + self.o(o.reshape(B, S, -1))
        y = self.mlp_norm(x)
        return x + self.down(self.ops.swiglu(self.gate(y), self.up(y)))


class Decoder(nn.Module):
    def __init__(self, c, ops):
        super().__init__()
        self.embed = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Block(c, ops, i) for i in range(c["layers"]))
        self.norm = RMSNorm(c["hidden"], ops)
        self.lm_head = nn.Linear(c["hidden"], c["vocab"], bias=False)

    def forward(self, tokens, targets):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build(cfg, ops, device, dtype, seed):
    """The one init path for both impls: same seed -> same weights."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = Decoder(cfg, ops)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
    return model.to(dtype)  # pure low-precision params: rmsnorm wants w in x's dtype


def batch_of(cfg, batch, seq_len, device, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg["vocab"], (batch, seq_len + 1), generator=g).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def make_ops(impl, cfg, args):
    if impl == "opgen":
        return opgen_ops(cfg, args.device, args.dtype)
    if impl == "flex":
        return flex_ops(args.device)
    return baseline_ops(cfg, args.sdpa)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(step, device, warmup, steps):
    """(first step s, [ms of each timed step], peak GiB over them or None on the CPU) of step()
    run warmup times (the first timed apart: it builds the kernels, TileLang's and
    torch.compile's), then steps times."""
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    first_s = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    sync(device)
    if device.type != "cuda":
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e3)
        return first_s, times, None  # no allocator statistics on the CPU
    torch.cuda.reset_peak_memory_stats()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(steps)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return first_s, [s.elapsed_time(e) for s, e in events], torch.cuda.max_memory_allocated() / 2**30


def measure(impl, seq_len, cfg, args):
    model = build(cfg, make_ops(impl, cfg, args), args.device, args.dtype, args.seed)
    fused = args.device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    fwd = torch.compile(model) if args.compile else model
    inputs, targets = batch_of(cfg, args.batch, seq_len, args.device, args.seed)

    def step():
        fwd(inputs, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    first_s, times, peak = time_steps(step, args.device, args.warmup, args.steps)
    ms = statistics.median(times)
    del model, opt, fwd
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(seq_len=seq_len, impl=impl, first_step_s=first_s, step_ms=ms,
                tokens_per_s=args.batch * seq_len / ms * 1e3, peak_gib=peak)


def check(cfg, impls, args):
    """One forward + backward of each impl from the same weights and tokens, each compared with
    the baseline's."""
    seq_len = args.seq_lens[0]
    inputs, targets = batch_of(cfg, args.batch, seq_len, args.device, args.seed)
    runs = {}
    for impl in impls:
        model = build(cfg, make_ops(impl, cfg, args), args.device, args.dtype, args.seed)
        loss = model(inputs, targets)
        loss.backward()
        runs[impl] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    rel = lambda a, b: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
    last = cfg["layers"] - 1
    names = ["embed.weight", "layers.0.attn_norm.weight", "layers.0.q.weight",
             "layers.0.k.weight", f"layers.{last}.mlp_norm.weight", f"layers.{last}.down.weight",
             "norm.weight", "lm_head.weight"]
    if cfg.get("sinks"):
        names += ["layers.0.sinks", f"layers.{last}.sinks"]  # windowed and full layers
    lb, gb = runs["baseline"]
    for impl in impls[1:]:
        lo, go = runs[impl]
        print(f"check (S={seq_len}): loss baseline {lb.item():.6f} {impl} {lo.item():.6f} "
              f"rel diff {rel(lo, lb):.2e}")
        for name in names:
            print(f"  grad {name:32s} max rel diff {rel(go[name], gb[name]):.2e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=["llama", "gpt-oss"], default="llama")
    p.add_argument("--impl", choices=["both", "all", "baseline", "flex", "opgen"], default="both",
                   help="both: baseline and opgen; all: baseline, flex and opgen")
    p.add_argument("--seq-lens", type=int, nargs="+", default=None,
                   help="default 256 1024 2048 (tiny: 64 128)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 20, tiny: 1)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps, the first included "
                   "(default 3, tiny: 1)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=list(DTYPES), default=None,
                   help="default bfloat16 (float32 on CPU)")
    p.add_argument("--sdpa", choices=["default", "flash", "cudnn", "efficient"], default="default",
                   help="baseline SDPA backend (default: PyTorch's own choice)")
    p.add_argument("--tiny", action="store_true", help="tiny config for a quick smoke test")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (both impls)")
    p.add_argument("--check", action="store_true", help="compare 1 step of both impls and exit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also save the results as JSON")
    args = p.parse_args()
    args.device = torch.device(args.device)
    args.dtype = DTYPES[args.dtype or ("float32" if args.device.type == "cpu" else "bfloat16")]
    args.seq_lens = args.seq_lens or ([64, 128] if args.tiny else [256, 1024, 2048])
    args.steps = args.steps or (1 if args.tiny else 20)
    args.warmup = max(1, args.warmup or (1 if args.tiny else 3))
    cfg = CONFIGS[args.arch, args.tiny]
    if args.device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("model_step: no CUDA device here; for a CPU smoke test use "
                 "--device cpu --impl baseline --tiny")
    impls = {"both": ["baseline", "opgen"], "all": ["baseline", "flex", "opgen"]}.get(
        args.impl, [args.impl])
    for impl in impls:
        if impl != "baseline":  # fail early, with a clear message, where it cannot run
            make_ops(impl, cfg, args)
    if args.check:  # against the baseline: the impls asked for, else opgen
        compared = [i for i in impls if i != "baseline"] or ["opgen"]
        return check(cfg, ["baseline"] + compared, args)

    print(f"config {cfg} batch {args.batch} dtype {args.dtype} device {args.device} "
          f"compile {args.compile} steps {args.steps} (median) after {args.warmup} warm-up")
    results = [measure(impl, s, cfg, args) for s in args.seq_lens for impl in impls]
    base = {r["seq_len"]: r["step_ms"] for r in results if r["impl"] == "baseline"}
    for r in results:  # > 1: the impl is faster than the baseline
        r["speedup_vs_baseline"] = base[r["seq_len"]] / r["step_ms"] if r["seq_len"] in base else None
    print(f"{'seq_len':>7} {'impl':>8} {'first step s':>12} {'step ms':>9} {'tok/s':>10} "
          f"{'peak GiB':>8} {'vs baseline':>14}")
    for r in results:
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        ratio = f"{r['speedup_vs_baseline']:.3f}x" if r["impl"] != "baseline" and r[
            "speedup_vs_baseline"] else ""
        print(f"{r['seq_len']:>7} {r['impl']:>8} {r['first_step_s']:>12.2f} {r['step_ms']:>9.2f} "
              f"{r['tokens_per_s']:>10.0f} {peak:>8} {ratio:>14}")
    if args.json:
        meta = dict(arch=args.arch, config=cfg, batch=args.batch, dtype=str(args.dtype), compile=args.compile,
                    steps=args.steps, warmup=args.warmup, sdpa=args.sdpa, torch=torch.__version__,
                    gpu=torch.cuda.get_device_name() if args.device.type == "cuda" else "cpu")
        Path(args.json).write_text(json.dumps(dict(meta=meta, results=results), indent=2) + "\n")


if __name__ == "__main__":
    main()
