"""Where rmsnorm's backward host time goes (issue 10): run 45's bench timed the public backward
(torch.autograd.grad, retain_graph) flat at ~0.2 ms at all three shapes while its kernel alone takes
0.065-0.13 ms, so the public backward is host-bound. Host time per call of each layer at [8, 1024]
bf16, then torch.profiler (CPU, every thread: the backward runs on autograd's device thread) of
the public fwd+bwd: `python docs/profiling/rmsnorm_host_probe.py`."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
from generated.rmsnorm import autograd as ra  # noqa: E402
from host_timing import NullFunction as Null  # noqa: E402
from host_timing import report as host_report  # noqa: E402


def report(name, fn):
    host_report(name, fn, width=64, rounds=5)


dt = torch.bfloat16
x = torch.randn(8, 1024, device="cuda", dtype=dt, requires_grad=True)
w = torch.randn(1024, device="cuda", dtype=dt, requires_grad=True)
xd, wd = x.detach(), w.detach()
dy = torch.randn_like(x)
for reduction in ("atomic", "split"):
    torch.autograd.grad(ra.apply_op(x, w, True, reduction), (x, w), dy)
torch.cuda.synchronize()
_, rstd = ra.run_forward(xd, wd, True)
y = ra.rmsnorm(x, w)
ye = F.rms_norm(x, (1024,), w, 1e-6)


class BackwardOnly(torch.autograd.Function):
    """A Function whose forward launches nothing and whose backward is rmsnorm's run_backward."""

    @staticmethod
    def forward(ctx, x, w):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return ra.run_backward(xd, rstd, wd, g, "atomic")


report("eager F.rms_norm fwd", lambda: F.rms_norm(x, (1024,), w, 1e-6))
report("eager F.rms_norm fwd+bwd", lambda: torch.autograd.grad(F.rms_norm(x, (1024,), w, 1e-6), (x, w), dy))
report("eager F.rms_norm bwd alone (retain_graph, as the bench)", lambda: torch.autograd.grad(ye, (x, w), dy, retain_graph=True))
report("opgen public fwd", lambda: ra.rmsnorm(x, w))
report("opgen public fwd+bwd", lambda: torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy))
report("opgen bwd alone (retain_graph, as the bench)", lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True))
report("opgen public fwd+bwd, split dw", lambda: torch.autograd.grad(ra.apply_op(x, w, True, "split"), (x, w), dy))
report("null Function fwd+bwd", lambda: torch.autograd.grad(Null.apply(x, w), (x,), dy))
report("Function: nothing fwd, run_backward bwd", lambda: torch.autograd.grad(BackwardOnly.apply(x, w), (x, w), dy))
report("run_backward (main thread)", lambda: ra.run_backward(xd, rstd, wd, dy, "atomic"))
report("run_backward split (main thread)", lambda: ra.run_backward(xd, rstd, wd, dy, "split"))
report("  dense(dy)", lambda: ra.dense(dy))
report("  empty_like(x)", lambda: torch.empty_like(xd))
report("  alloc_dw atomic (zeros)", lambda: ra.alloc_dw(xd, "atomic"))
report("  alloc_dw split (empty)", lambda: ra.alloc_dw(xd, "split"))
dx, buf = torch.empty_like(xd), ra.alloc_dw(xd, "atomic")
report("  launch_backward", lambda: ra.launch_backward(xd, rstd, wd, dy, dx, buf, "atomic"))
bwd = ra.kernel(ra.rmsnorm_bwd, 1024, "bfloat16", "bfloat16", ra.EPS, True, "atomic", **ra.BWD_TILING)
report("  bwd entry point alone", lambda: bwd(xd, rstd, wd, dy, dx, buf))
report("  buffer.to(bf16)", lambda: buf.to(dt))
sbuf = ra.alloc_dw(xd, "split")
report("  split buffer.sum(0).to(bf16)", lambda: sbuf.sum(0).to(dt))
report("  split buffer.sum(0, dtype=bf16)", lambda: sbuf.sum(0, dtype=dt))



class Lean(torch.autograd.Function):
    """rmsnorm's formula with the least Python on autograd's device thread: the forward (main
    thread) looks up both kernels and zeroes the dw buffer; the backward allocates dx, launches
    the kernel and casts dw."""

    @staticmethod
    def forward(ctx, x, w):
        fwd = ra.kernel(ra.rmsnorm_fwd, 1024, "bfloat16", "bfloat16", ra.EPS, True, **ra.FWD_TILING)
        y, rstd = torch.empty_like(x), torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        fwd(x, w, y, rstd)
        ctx.save_for_backward(x, w, rstd)
        ctx.bwd = ra.kernel(ra.rmsnorm_bwd, 1024, "bfloat16", "bfloat16", ra.EPS, True, "atomic",
                            **ra.BWD_TILING)
        ctx.buf = ra.alloc_dw(x, "atomic") if ZERO_IN_FORWARD else None
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        buf = ctx.buf if ctx.buf is not None else torch.zeros(1024, dtype=torch.float32, device=x.device)
        dx = torch.empty_like(x)
        ctx.bwd(x, rstd, w, dy, dx, buf)
        return dx, buf.to(w.dtype)


class LaunchOnly(torch.autograd.Function):
    """A backward of one launch of the bwd kernel into buffers made in the forward (not a valid
    gradient: the floor of a Python backward that launches one kernel)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.args = (xd, rstd, wd, dy, torch.empty_like(xd), ra.alloc_dw(xd, "atomic"))
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        bwd(*ctx.args)
        return g, None


for ZERO_IN_FORWARD in (False, True):
    report(f"Lean fwd+bwd, dw zeroed in the forward={ZERO_IN_FORWARD}",
           lambda: torch.autograd.grad(Lean.apply(x, w), (x, w), dy))
report("LaunchOnly fwd+bwd", lambda: torch.autograd.grad(LaunchOnly.apply(x, w), (x,), dy))
report("opgen public fwd+bwd (again)", lambda: torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy))
report("eager F.rms_norm fwd+bwd (again)", lambda: torch.autograd.grad(F.rms_norm(x, (1024,), w, 1e-6), (x, w), dy))

from torch.profiler import ProfilerActivity, profile  # noqa: E402

for name, fn in (("opgen", lambda: torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy)),
                 ("eager", lambda: torch.autograd.grad(F.rms_norm(x, (1024,), w, 1e-6), (x, w), dy))):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
    print(f"\n# torch.profiler of 100 x {name} public fwd+bwd, by self CPU time")
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)
