"""Does torch.compile(mode="reduce-overhead") make the generated ops faster? A tiny block
(rmsnorm -> gqa attention -> matmul), fwd+bwd per step, eager vs compiled, µs per step (issue 10)."""
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from generated.gqa import gqa  # noqa: E402
from generated.matmul import matmul  # noqa: E402
from generated.rmsnorm import rmsnorm  # noqa: E402

B, S, H, KV, D = 1, 128, 16, 4, 128
C = H * D
dt = torch.bfloat16
torch.manual_seed(0)
w_norm = torch.ones(C, device="cuda", dtype=dt, requires_grad=True)
w_q = (torch.randn(C, C, device="cuda", dtype=dt) / C**0.5).requires_grad_()
w_kv = (torch.randn(C, 2 * KV * D, device="cuda", dtype=dt) / C**0.5).requires_grad_()
params = [w_norm, w_q, w_kv]


def block(x):
    h = rmsnorm(x, w_norm)
    q = matmul(h, w_q, None).view(B, S, H, D)
    k, v = matmul(h, w_kv, None).view(B, S, 2, KV, D).unbind(2)
    return gqa(q, k.contiguous(), v.contiguous(), causal=True).reshape(B, S, C)


def step(fn, x):
    out = fn(x)
    grads = torch.autograd.grad(out.float().pow(2).mean(), [x] + params)
    return out, grads


def per_step(fn, x, n=200):
    for _ in range(20):
        step(fn, x)
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            step(fn, x)
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


x = torch.randn(B, S, C, device="cuda", dtype=dt, requires_grad=True)
eager_out, eager_grads = step(block, x)
results = {"eager": per_step(block, x)}
for mode in ("default", "reduce-overhead"):
    compiled = torch.compile(block, mode=mode)
    out, grads = step(compiled, x)
    err = max((a.float() - b.float()).abs().max().item() for a, b in zip((out, *grads), (eager_out, *eager_grads)))
    results[f"torch.compile {mode}"] = per_step(compiled, x)
    print(f"torch.compile {mode}: max abs diff vs eager {err:.2e}", flush=True)
print("| block (rmsnorm, 2 matmuls, gqa; B1 S128 16/4 heads D128 bf16) | µs per fwd+bwd step |")
print("|---|---|")
for name, us in results.items():
    print(f"| {name} | {us:.1f} |")
