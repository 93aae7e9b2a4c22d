"""Host time of the layers of a tiny call (rmsnorm [8, 1024], matmul 64^3, bf16), and a cProfile of
rmsnorm's public fwd+bwd: where the time over eager PyTorch goes (issue 10)."""
import cProfile
import os
import pstats
import sys

import torch

sys.path.insert(0, os.getcwd())
from generated.rmsnorm import autograd as ra  # noqa: E402
from generated.matmul import autograd as ma  # noqa: E402
from host_timing import NullFunction as Null  # noqa: E402
from host_timing import report  # noqa: E402


dt = torch.bfloat16
x = torch.randn(8, 1024, device="cuda", dtype=dt, requires_grad=True)
w = torch.randn(1024, device="cuda", dtype=dt, requires_grad=True)
xd, wd = x.detach(), w.detach()
dy = torch.randn_like(x)
ra.rmsnorm(x, w).backward(dy)
torch.cuda.synchronize()


def eager_rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w


report("rmsnorm eager fwd", lambda: eager_rms(x, w))
report("rmsnorm eager fwd+bwd (autograd.grad)", lambda: torch.autograd.grad(eager_rms(x, w), (x, w), dy))
report("rmsnorm public fwd", lambda: ra.rmsnorm(x, w))
report("rmsnorm public fwd+bwd (autograd.grad)", lambda: torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy))
report("rmsnorm public fwd+bwd (.backward)", lambda: ra.rmsnorm(x, w).backward(dy))
report("rmsnorm public fwd, no-grad inputs", lambda: ra.rmsnorm(xd, wd))
report("rmsnorm check_inputs", lambda: ra.check_inputs(x, w))
report("rmsnorm eager(t)", lambda: ra.eager(x))
report("rmsnorm EagerFunction.apply", lambda: ra.EagerFunction.apply(x, w, True, "atomic"))
report("rmsnorm forward_op (custom op)", lambda: ra.forward_op(x, w, True, "atomic"))
report("rmsnorm run_forward", lambda: ra.run_forward(xd, wd, True))
fwd = ra.kernel(ra.rmsnorm_fwd, 1024, "bfloat16", "bfloat16", ra.EPS, True, **ra.FWD_TILING)
print("entry point type:", type(fwd), flush=True)
y = torch.empty_like(xd)
rstd = torch.empty(8, dtype=torch.float32, device="cuda")
report("rmsnorm kernel() lookup", lambda: ra.kernel(ra.rmsnorm_fwd, 1024, "bfloat16", "bfloat16", ra.EPS, True, **ra.FWD_TILING))
report("rmsnorm entry call alone", lambda: fwd(xd, wd, y, rstd))
report("rmsnorm run_backward", lambda: ra.run_backward(xd, rstd, wd, dy, "atomic"))
report("torch.empty_like", lambda: torch.empty_like(xd))
report("torch.zeros 1024 fp32", lambda: torch.zeros(1024, dtype=torch.float32, device="cuda"))
report("tensor.to(bf16) of bf16", lambda: dy.contiguous().to(dt))

a = torch.randn(64, 64, device="cuda", dtype=dt, requires_grad=True)
b = torch.randn(64, 64, device="cuda", dtype=dt, requires_grad=True)
dc = torch.randn(64, 64, device="cuda", dtype=dt)
ma.matmul(a, b, None).backward(dc)
report("matmul torch fwd", lambda: a @ b)
report("matmul torch fwd+bwd", lambda: torch.autograd.grad(a @ b, (a, b), dc))
report("matmul public fwd", lambda: ma.matmul(a, b, None))
report("matmul public fwd+bwd", lambda: torch.autograd.grad(ma.matmul(a, b, None), (a, b), dc))
report("matmul check_inputs", lambda: ma.check_inputs(a, b, None))
report("matmul run_forward", lambda: ma.run_forward(a.detach(), b.detach(), None))
print("matmul KERNELS:", len(ma.KERNELS), [type(v).__name__ for v in ma.KERNELS.values()], flush=True)


report("null autograd.Function fwd", lambda: Null.apply(x, w))
report("null autograd.Function fwd+bwd (autograd.grad)", lambda: torch.autograd.grad(Null.apply(x, w), (x,), dy))
bwd = ra.kernel(ra.rmsnorm_bwd, 1024, "bfloat16", "bfloat16", ra.EPS, True, "atomic", **ra.BWD_TILING)
dx, dwb = torch.empty_like(xd), torch.zeros(1024, dtype=torch.float32, device="cuda")
report("rmsnorm bwd entry call alone", lambda: bwd(xd, rstd, wd, dy, dx, dwb))
report("tensor.to(bf16) of 1024 fp32", lambda: dwb.to(dt))
report("tensor.view(8, 1024)", lambda: xd.view(8, 1024))
report("matmul run_da + run_db", lambda: (ma.run_da(dc, b.detach(), a.shape), ma.run_db(a.detach(), dc)))
report("matmul torch mm (one launch)", lambda: torch.mm(dc, b.detach()))

for name, fn in (("rmsnorm fwd+bwd", lambda: torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy)),
                 ("matmul fwd+bwd", lambda: torch.autograd.grad(ma.matmul(a, b, None), (a, b), dc))):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(2000):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    print(f"\n# cProfile of 2000 x {name}, by tottime")
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)

# Attention at the overhead table's tiny shape (B1 S128 H16 D128 fp16, causal): the layers of its
# backward, and whether the GPU or the host bounds the fwd+bwd loop (torch.profiler: kernel times).
from generated.attention import autograd as aa  # noqa: E402

q, k, v = (torch.randn(1, 128, 16, 128, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
do = torch.randn_like(q)
o, lse = aa.run_forward(q.detach(), k.detach(), v.detach(), True, None, "bshd", 128 ** -0.5)
report("attention public fwd", lambda: aa.attention(q, k, v, causal=True))
report("attention public fwd+bwd", lambda: torch.autograd.grad(aa.attention(q, k, v, causal=True), (q, k, v), do))
report("attention run_forward", lambda: aa.run_forward(q.detach(), k.detach(), v.detach(), True, None, "bshd", 128 ** -0.5))
report("attention run_backward", lambda: aa.run_backward(q.detach(), k.detach(), v.detach(), o, lse, do, True, None, "bshd", 128 ** -0.5))
report("SDPA fwd+bwd (default backend)", lambda: torch.autograd.grad(
    torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True),
    (q, k, v), do.transpose(1, 2)))
from torch.profiler import profile, ProfilerActivity  # noqa: E402
with profile(activities=[ProfilerActivity.CUDA]) as p:
    for _ in range(20):
        torch.autograd.grad(aa.attention(q, k, v, causal=True), (q, k, v), do)
    torch.cuda.synchronize()
print("\n# GPU kernels of 20 x attention fwd+bwd (tiny shape)")
print(p.key_averages().table(sort_by="cuda_time_total", row_limit=10))
prof = cProfile.Profile()
prof.enable()
for _ in range(2000):
    torch.autograd.grad(aa.attention(q, k, v, causal=True), (q, k, v), do)
torch.cuda.synchronize()
prof.disable()
print("\n# cProfile of 2000 x attention fwd+bwd, by tottime")
pstats.Stats(prof).sort_stats("tottime").print_stats(22)
