"""postprocess_vec.py (16-byte loads and stores) against the package's dQ postprocess, kernels
alone: the same fp32 accumulator in (random, in the bwd kernel's fragment layout), dQ out
compared for equality, then both timed back to back with CUDA events, interleaved rounds, the
best of each. GB/s counts the fp32 accumulator's rows read and dQ written.

    timeout 200 python docs/profiling/postprocess_vec_probe.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch

from ncu_rmsnorm import ms
from postprocess_vec import postprocess_vec
from generated.attention import autograd as A, kernels as K

# (batch, heads, seq_len, head_dim, dtype): the MHA bench shapes, an odd length, the gpt-oss shape.
CASES = [(4, 16, 4096, 128, "float16"), (4, 16, 4096, 64, "float16"), (2, 16, 1000, 128, "bfloat16"),
         (1, 64, 4096, 64, "bfloat16")]
TILINGS = [(64, 128), (128, 128), (64, 256), (128, 256)]  # (block_m, threads)
ROUNDS = 3

for b, h, s, d, dt in CASES:
    calls = A.variant_calls(h, h, d, False, 0, "bshd", dt, d ** -0.5, "direct", "direct")
    package = A.launcher(calls["postprocess"])
    dq = torch.randn(b, K.padded_rows(s), h, d, device="cuda", dtype=torch.float32)
    want = torch.empty(b, s, h, d, device="cuda", dtype=getattr(torch, dt))
    package(dq, want)
    out = torch.empty_like(want)
    runs = {"package": lambda: package(dq, out)}
    for block_m, threads in TILINGS:
        if block_m * d // 8 % threads:
            continue
        vec = postprocess_vec(h, d, dt, d ** -0.5, block_m, threads)
        out.zero_()
        vec(dq, out)
        torch.cuda.synchronize()
        if not torch.equal(out, want):
            print(f"  {(block_m, threads)}: WRONG (max diff {(out.float() - want.float()).abs().max().item():.3e})")
            continue
        runs[(block_m, threads)] = lambda vec=vec: vec(dq, out)
    best = {name: float("inf") for name in runs}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            best[name] = min(best[name], ms(run, n=50))
    moved = b * s * h * d * (4 + want.element_size())
    print(f"# B{b} H{h} S{s} D{d} {dt}", flush=True)
    for name, t in best.items():
        print(f"  {name}: {t * 1e3:.1f} us, {moved / t / 1e6:.0f} GB/s, {best['package'] / t:.2f}x the package",
              flush=True)
