"""Which part of rmsnorm's eager path costs its host time (issue 10): a ladder of autograd.Functions
from the package's public function down to the leanest one over the same kernels, each timed
fwd+bwd at [8, 1024] bf16 in one process, then single steps inside a backward (where they run on
autograd's device thread) against a null backward. `python docs/profiling/eager_ladder_probe.py`"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generated.rmsnorm import autograd as ra  # noqa: E402
from host_timing import report as host_report  # noqa: E402


def report(name, fn):
    host_report(name, fn, width=66, rounds=5)


dt = torch.bfloat16
x = torch.randn(8, 1024, device="cuda", dtype=dt, requires_grad=True)
w = torch.randn(1024, device="cuda", dtype=dt, requires_grad=True)
x3 = x.detach().view(2, 4, 1024).requires_grad_()
dy = torch.randn_like(x)
torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy)
ARGS = (1024, "bfloat16", "bfloat16", ra.EPS, True)
FWD = ra.kernel(ra.rmsnorm_fwd, *ARGS, **ra.FWD_TILING)
BWD = ra.kernel(ra.rmsnorm_bwd, *ARGS, "atomic", **ra.BWD_TILING)


class RunPhases(torch.autograd.Function):
    """One output; the forward is the package's forward(), the backward its run_backward()."""

    @staticmethod
    def forward(ctx, x, w):
        y, rstd = ra.forward(x, w, True, "atomic")
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        return ra.run_backward(x, rstd, w, dy, "atomic")


class Resolved(torch.autograd.Function):
    """As RunPhases, both kernels looked up in the forward; views and buffers as the package's."""

    @staticmethod
    def forward(ctx, x, w):
        rows, cols = ra.matrix_dims(x)
        y = torch.empty_like(x)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        FWD(x.view(rows, cols), w, y.view(rows, cols), rstd)
        ctx.save_for_backward(x, w, rstd)
        ctx.bwd = BWD
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        rows, cols = ra.matrix_dims(x)
        dy = ra.dense(dy)
        dx = torch.empty_like(x)
        buffer = ra.alloc_dw(x, "atomic")
        ctx.bwd(x.view(rows, cols), rstd, w, dy.view(rows, cols), dx.view(rows, cols), buffer)
        return dx, buffer.to(w.dtype)


class Lean(torch.autograd.Function):
    """No views, no checks: allocate, launch, cast."""

    @staticmethod
    def forward(ctx, x, w):
        y = torch.empty_like(x)
        rstd = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        FWD(x, w, y, rstd)
        ctx.save_for_backward(x, w, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        buffer = torch.zeros(1024, dtype=torch.float32, device=x.device)
        dx = torch.empty_like(x)
        BWD(x, rstd, w, dy, dx, buffer)
        return dx, buffer.to(w.dtype)


def null_with(step):
    """A Function over (x, w) whose forward is a view and whose backward runs step() then returns
    (g, None): step's cost on autograd's device thread."""

    class Null(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            step()
            return g, None

    return Null


xd, wd = x.detach(), w.detach()
_, rstd = ra.run_forward(xd, wd, True)
dx, buf = torch.empty_like(xd), ra.alloc_dw(xd, "atomic")
steps = {
    "nothing": lambda: None,
    "torch.zeros(1024) fp32": lambda: torch.zeros(1024, dtype=torch.float32, device="cuda"),
    "empty_like(x)": lambda: torch.empty_like(xd),
    "3 views": lambda: (xd.view(8, 1024), xd.view(8, 1024), xd.view(8, 1024)),
    "buffer.to(bf16)": lambda: buf.to(dt),
    "bwd entry point": lambda: BWD(xd, rstd, wd, dy, dx, buf),
    "kernel() lookup": lambda: ra.kernel(ra.rmsnorm_bwd, *ARGS, "atomic", **ra.BWD_TILING),
    "run_backward": lambda: ra.run_backward(xd, rstd, wd, dy, "atomic"),
    "20 Python calls of len()": lambda: [len(ARGS) for _ in range(20)],
}
for rnd in range(2):
    print(f"# round {rnd}: fwd+bwd, torch.autograd.grad(y, (x, w), dy)", flush=True)
    report("eager F.rms_norm", lambda: torch.autograd.grad(F.rms_norm(x, (1024,), w, 1e-6), (x, w), dy))
    report("opgen public rmsnorm()", lambda: torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy))
    report("EagerFunction.apply direct", lambda: torch.autograd.grad(ra.EagerFunction.apply(x, w, True, "atomic"), (x, w), dy))
    report("RunPhases (one output, forward() / run_backward())", lambda: torch.autograd.grad(RunPhases.apply(x, w), (x, w), dy))
    report("Resolved (kernels in forward, views, dense, alloc_dw)", lambda: torch.autograd.grad(Resolved.apply(x, w), (x, w), dy))
    report("Lean", lambda: torch.autograd.grad(Lean.apply(x, w), (x, w), dy))
    report("eager F.rms_norm fwd only", lambda: F.rms_norm(x, (1024,), w, 1e-6))
    report("opgen public fwd only", lambda: ra.rmsnorm(x, w))
    report("RunPhases fwd only", lambda: RunPhases.apply(x, w))
    report("Resolved fwd only", lambda: Resolved.apply(x, w))
    report("Lean fwd only", lambda: Lean.apply(x, w))
    print("# one step in a backward (device thread) vs on the main thread", flush=True)
    for name, step in steps.items():
        fn = null_with(step)
        report(f"null + {name} (in backward)", lambda: torch.autograd.grad(fn.apply(x, w), (x,), dy))
        report(f"   {name} (main thread)", step)
