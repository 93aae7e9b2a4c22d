"""Model-level benchmark: one training step of a small Llama-style decoder, with attention,
RMSNorm and the SwiGLU activation either from PyTorch (`baseline`: SDPA + eager) or from the
generated TileLang packages (`opgen`: generated/gqa, generated/rmsnorm, generated/swiglu).

    python examples/model_step.py                          # both impls, S = 256 1024 2048 (CUDA)
    python examples/model_step.py --check                  # 1 step of each from one set of weights
    python examples/model_step.py --device cpu --impl baseline --tiny     # CPU smoke test

Both impls build the same modules from the same seed, so they hold the same weights; only the
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
CONFIGS = {
    "default": dict(vocab=32000, hidden=2048, heads=16, kv_heads=4, head_dim=128,
                    intermediate=5632, layers=4),
    "tiny": dict(vocab=1000, hidden=256, heads=4, kv_heads=2, head_dim=64,
                 intermediate=512, layers=2),
}
# generated/rmsnorm has eps fixed at 1e-6 (autograd.EPS) and a plain weight y = x * rstd * w,
# so the baseline uses the same.
EPS = 1e-6
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---- the three swappable ops: q, k, v are [B, S, heads, D] ("bshd"), contiguous ----

def baseline_ops(sdpa_backend):
    def attention(q, k, v):
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

    def rmsnorm(x, w):
        # As Llama-style models do it: statistics and scaling in fp32, then cast back.
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)

    return SimpleNamespace(attention=attention, rmsnorm=rmsnorm,
                           swiglu=lambda a, b: F.silu(a) * b)


def opgen_ops(device, dtype):
    if device.type != "cuda":
        sys.exit("model_step: --impl opgen needs a CUDA GPU (TileLang kernels); "
                 "on CPU run --impl baseline")
    if dtype not in (torch.float16, torch.bfloat16):
        sys.exit(f"model_step: the generated packages take float16/bfloat16, not {dtype}")
    # Imported here, not at the top, so the CPU baseline runs without TileLang GPU support.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: generated/
    from generated.gqa import gqa
    from generated.rmsnorm import rmsnorm
    from generated.swiglu import swiglu

    return SimpleNamespace(attention=lambda q, k, v: gqa(q, k, v, causal=True, layout="bshd"),
                           rmsnorm=rmsnorm, swiglu=swiglu)


# ---- the model: identical modules for both impls; `ops` picks the three kernels ----

class RMSNorm(nn.Module):
    def __init__(self, dim, ops):
        super().__init__()
        self.weight, self.ops = nn.Parameter(torch.ones(dim)), ops

    def forward(self, x):
        return self.ops.rmsnorm(x, self.weight)


class Block(nn.Module):
    def __init__(self, c, ops):
        super().__init__()
        h, d = c["hidden"], c["head_dim"]
        self.heads, self.kv_heads, self.head_dim, self.ops = c["heads"], c["kv_heads"], d, ops
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
        # Linear outputs are contiguous, so these views are the contiguous bshd gqa() wants.
        q = self.q(y).view(B, S, self.heads, self.head_dim)
        k = self.k(y).view(B, S, self.kv_heads, self.head_dim)
        v = self.v(y).view(B, S, self.kv_heads, self.head_dim)
        x = x + self.o(self.ops.attention(q, k, v).reshape(B, S, -1))
        y = self.mlp_norm(x)
        return x + self.down(self.ops.swiglu(self.gate(y), self.up(y)))


class Decoder(nn.Module):
    def __init__(self, c, ops):
        super().__init__()
        self.embed = nn.Embedding(c["vocab"], c["hidden"])
        self.layers = nn.ModuleList(Block(c, ops) for _ in range(c["layers"]))
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


def make_ops(impl, args):
    return opgen_ops(args.device, args.dtype) if impl == "opgen" else baseline_ops(args.sdpa)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(impl, seq_len, cfg, args):
    model = build(cfg, make_ops(impl, args), args.device, args.dtype, args.seed)
    fused = args.device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    fwd = torch.compile(model) if args.compile else model
    inputs, targets = batch_of(cfg, args.batch, seq_len, args.device, args.seed)

    def step():
        fwd(inputs, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # The first step compiles the TileLang kernels (and torch.compile graphs): timed apart.
    sync(args.device)
    t0 = time.perf_counter()
    step()
    sync(args.device)
    first_s = time.perf_counter() - t0
    for _ in range(args.warmup - 1):
        step()
    sync(args.device)
    if args.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(args.steps)]
        for start, end in events:
            start.record()
            step()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in events]
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        times = []
        for _ in range(args.steps):
            t = time.perf_counter()
            step()
            times.append((time.perf_counter() - t) * 1e3)
        peak = None  # no allocator statistics on CPU
    ms = statistics.median(times)
    del model, opt, fwd
    if args.device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(seq_len=seq_len, impl=impl, first_step_s=first_s, step_ms=ms,
                tokens_per_s=args.batch * seq_len / ms * 1e3, peak_gib=peak)


def check(cfg, args):
    """One forward + backward of each impl from the same weights and tokens."""
    seq_len = args.seq_lens[0]
    inputs, targets = batch_of(cfg, args.batch, seq_len, args.device, args.seed)
    runs = {}
    for impl in ("baseline", "opgen"):
        model = build(cfg, make_ops(impl, args), args.device, args.dtype, args.seed)
        loss = model(inputs, targets)
        loss.backward()
        runs[impl] = (loss.detach(), {n: p.grad for n, p in model.named_parameters()})
    (lb, gb), (lo, go) = runs["baseline"], runs["opgen"]
    rel = lambda a, b: ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
    print(f"check (S={seq_len}): loss baseline {lb.item():.6f} opgen {lo.item():.6f} "
          f"rel diff {rel(lo, lb):.2e}")
    last = cfg["layers"] - 1
    for name in ("embed.weight", "layers.0.attn_norm.weight", "layers.0.q.weight",
                 "layers.0.k.weight", f"layers.{last}.mlp_norm.weight", f"layers.{last}.down.weight",
                 "norm.weight", "lm_head.weight"):
        print(f"  grad {name:32s} max rel diff {rel(go[name], gb[name]):.2e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=["both", "baseline", "opgen"], default="both")
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
    cfg = CONFIGS["tiny" if args.tiny else "default"]
    if args.device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("model_step: no CUDA device here; for a CPU smoke test use "
                 "--device cpu --impl baseline --tiny")
    impls = ["baseline", "opgen"] if args.impl == "both" or args.check else [args.impl]
    if "opgen" in impls:
        opgen_ops(args.device, args.dtype)  # fail early, with a clear message, where it cannot run
    if args.check:
        return check(cfg, args)

    print(f"config {cfg} batch {args.batch} dtype {args.dtype} device {args.device} "
          f"compile {args.compile} steps {args.steps} (median) after {args.warmup} warm-up")
    results = [measure(impl, s, cfg, args) for s in args.seq_lens for impl in impls]
    base = {r["seq_len"]: r["step_ms"] for r in results if r["impl"] == "baseline"}
    for r in results:  # > 1: opgen is faster than the baseline
        r["speedup_vs_baseline"] = base[r["seq_len"]] / r["step_ms"] if r["seq_len"] in base else None
    print(f"{'seq_len':>7} {'impl':>8} {'first step s':>12} {'step ms':>9} {'tok/s':>10} "
          f"{'peak GiB':>8} {'opgen/baseline':>14}")
    for r in results:
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        ratio = f"{r['speedup_vs_baseline']:.3f}x" if r["impl"] == "opgen" and r[
            "speedup_vs_baseline"] else ""
        print(f"{r['seq_len']:>7} {r['impl']:>8} {r['first_step_s']:>12.2f} {r['step_ms']:>9.2f} "
              f"{r['tokens_per_s']:>10.0f} {peak:>8} {ratio:>14}")
    if args.json:
        meta = dict(config=cfg, batch=args.batch, dtype=str(args.dtype), compile=args.compile,
                    steps=args.steps, warmup=args.warmup, sdpa=args.sdpa, torch=torch.__version__,
                    gpu=torch.cuda.get_device_name() if args.device.type == "cuda" else "cpu")
        Path(args.json).write_text(json.dumps(dict(meta=meta, results=results), indent=2) + "\n")


if __name__ == "__main__":
    main()
