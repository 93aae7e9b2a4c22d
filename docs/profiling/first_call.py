"""First fwd+bwd of one attention variant in a fresh process, then new lengths: compile counts."""
import time
t0 = time.perf_counter()
import sys, os
sys.path.insert(0, os.getcwd())
import torch
from generated.gqa import autograd as ga
t_import = time.perf_counter() - t0


def step(b, s):
    q = torch.randn(b, s, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, s, 4, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    ga.gqa(q, k, v, causal=True).sum().backward()
    torch.cuda.synchronize()


t = time.perf_counter()
step(2, 1000)
first = time.perf_counter() - t
print(f"import {t_import:.1f} s; first fwd+bwd (B2 S1000 H16/4 D128 bf16 causal) {first:.2f} s; kernels {len(ga.KERNELS)}", flush=True)
for b, s in ((1, 4097), (3, 333), (2, 2048), (1, 77), (4, 1500)):
    t = time.perf_counter()
    step(b, s)
    print(f"  B{b} S{s}: {time.perf_counter() - t:.3f} s, kernels {len(ga.KERNELS)}, tilelang fwd cache {len(ga.gqa_fwd._kernel_cache)}", flush=True)
