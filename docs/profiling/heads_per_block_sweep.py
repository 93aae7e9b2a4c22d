"""The short-window forward of generated/attention_sink (walks_heads: a block walks several query
heads) at every heads_per_block its grid allows, over sequence lengths and batches: where the
per-call rule `heads_per_block()` should stop adding heads. One compiled kernel per (head dim,
window): heads_per_block is a runtime argument.

1. Correctness: each heads_per_block's O and lse against the same variant's forward at a tiling
   that does not walk heads (block_n 64: three key blocks).
2. Kernel time (back-to-back launches) per heads_per_block, next to the rule's choice, the plain
   kernel and the probe that walks 8 heads with a compile-time count (fwd_multi_tile_probe.py,
   56.8 TF/s at the gpt-oss shape in run 65).
3. The public function's forward and FlexAttention's at the same shapes.

`python docs/profiling/heads_per_block_sweep.py` on the GPU; without one (TILELANG_DEFAULT_TARGET
set) it only builds the kernels."""
import os
import sys
import time

sys.path.insert(0, os.getcwd())
from generated.attention_sink import autograd as A  # noqa: E402
from generated.attention_sink import kernels as K  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fwd_multi_tile_probe import fwd_multi  # noqa: E402

T0 = time.perf_counter()
DT = "bfloat16"
# (batch, heads, kv_heads, seq_len, head_dim, window)
SHAPES = [(1, 64, 8, s, 64, 128) for s in (256, 512, 1024, 2048, 4096, 16384)]
SHAPES += [(2, 64, 8, 1000, 64, 128), (4, 64, 8, 2048, 64, 128), (1, 32, 8, 1024, 128, 128),
           (2, 32, 8, 4096, 128, 128), (1, 64, 8, 4096, 64, 16), (2, 16, 2, 2048, 64, 128)]
ODD = [(1, 64, 8, 1000, 64, 128), (2, 16, 2, 333, 64, 100), (1, 32, 8, 777, 128, 128), (3, 8, 1, 77, 64, 16)]


def call(h, kv, d, w, tiling=None):
    factory, args, committed = A.variant_calls(h, kv, d, True, w, "bshd", DT, d**-0.5, *A.reductions(h, kv))["fwd"]
    return factory, args, dict(tiling or committed)


variants = sorted({(h, kv, d, w) for _, h, kv, _, d, w in SHAPES + ODD})
walking = [call(*v) for v in variants]
for (h, kv, d, w), (_, _, t) in zip(variants, walking):
    assert K.walks_heads(w, t["block_m"], t["block_n"]), (h, kv, d, w, t)
plain = [call(*v, tiling=dict(block_m=128, block_n=64, threads=256, num_stages=2)) for v in variants]
A.prebuild(walking + plain)
probes = {(h, kv, d, w): fwd_multi(h, kv, d, w, DT, d**-0.5, 128, 128, 256, 2, 8)
          for _, h, kv, _, d, w in SHAPES if h % 8 == 0}
print(f"built {2 * len(variants) + len(probes)} kernels in {time.perf_counter() - T0:.0f} s", flush=True)

import torch  # noqa: E402

if not torch.cuda.is_available():
    sys.exit(0)
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

from generated.attention_sink import attention_sink  # noqa: E402
from generated.attention_sink import bench_attention_sink as B  # noqa: E402

SMS = torch.cuda.get_device_properties(0).multi_processor_count
entries = {v: (A.launcher(wk), A.launcher(pl), wk[2]) for v, wk, pl in zip(variants, walking, plain)}


def inputs(b, h, kv, s, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for n in (h, kv, kv))
    return q, k, v, torch.randn(h, device="cuda", generator=g)


def outputs(q):
    b, s, h, _ = q.shape
    return torch.empty_like(q), torch.full((b, h, K.padded_rows(s)), float("nan"), device="cuda")


def choices(h):
    return [p for p in (1, 2, 4, 8, 16) if h % p == 0]


bad = 0
for b, h, kv, s, d, w in ODD + SHAPES[:1]:
    q, k, v, sinks = inputs(b, h, kv, s, d, 1)
    walk, ref, _ = entries[(h, kv, d, w)]
    ref_o, ref_lse = outputs(q)
    ref(q, k, v, sinks, ref_o, ref_lse)
    for p in choices(h):
        o, lse = outputs(q)
        walk(q, k, v, sinks, o, lse, p)
        torch.cuda.synchronize()
        do = (o.float() - ref_o.float()).abs().max().item()
        dl = (lse[..., :s] - ref_lse[..., :s]).abs().max().item()
        ok = do < 2e-2 and dl < 1e-3 and torch.isfinite(o).all().item()
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} B{b} H{h}/{kv} S{s} D{d} window {w} x{p}: O {do:.2e} lse {dl:.2e}", flush=True)
print("all correct" if not bad else f"{bad} WRONG", flush=True)

print(f"\nkernel TF/s by heads per block ({SMS} SMs); * = the rule's choice; plain = block_n 64")
print("| case | grid at x1 | plain | probe x8 | x1 | x2 | x4 | x8 | x16 | public fwd | Flex fwd |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for b, h, kv, s, d, w in SHAPES:
    q, k, v, sinks = inputs(b, h, kv, s, d)
    walk, ref, t = entries[(h, kv, d, w)]
    flops = 4 * b * h * d * sum(min(i + 1, w) for i in range(s))
    o, lse = outputs(q)
    chosen = K.heads_per_block(b, h, s, t, SMS)
    row = [f"{flops / B.stream_ms(lambda: ref(q, k, v, sinks, o, lse)) / 1e9:.1f}"]
    probe = probes.get((h, kv, d, w))
    row.append(f"{flops / B.stream_ms(lambda: probe(q, k, v, sinks, o, lse)) / 1e9:.1f}" if probe else "-")
    for p in (1, 2, 4, 8, 16):
        if h % p:
            row.append("-")
            continue
        tf = flops / B.stream_ms(lambda: walk(q, k, v, sinks, o, lse, p)) / 1e9
        row.append(f"{tf:.1f}{'*' if p == chosen else ''}")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    pub = flops / B.stream_ms(lambda: attention_sink(q, k, v, sinks, causal=True, window=w)) / 1e9

    def mask(b_, h_, qi, ki):
        return (qi >= ki) & (qi - ki < w)

    bm = create_block_mask(mask, None, None, s, s, device="cuda")
    flex = torch.compile(flex_attention)

    def flex_call():
        return flex(qt, kt, vt, block_mask=bm, enable_gqa=True)

    try:
        fl = f"{flops / B.stream_ms(flex_call) / 1e9:.1f} (no sinks)"
    except Exception as exc:  # noqa: BLE001
        fl = type(exc).__name__
    blocks = -(-s // t["block_m"]) * h * b
    print(f"| B{b} H{h}/{kv} S{s} D{d} w{w} | {blocks} | " + " | ".join(row) + f" | {pub:.1f} | {fl} |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
