"""Where rmsnorm's training forward host time goes (issue 10: 1.73x eager in run 122, target
1.5x): each layer of the public call at [8, 1024] bf16, x and w requiring grad, beside eager
F.rms_norm; with generated/rmsnorm_recompute (the same spec with saved.rstd = "recompute", built
with `opgen build`) where it exists. Interleaved rounds, best of each:
`python docs/profiling/rmsnorm_fwd_host_probe.py`."""
import contextlib
import importlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
from generated.rmsnorm import autograd as ra  # noqa: E402
from host_timing import NullFunction  # noqa: E402
from host_timing import per_call  # noqa: E402

try:
    rr = importlib.import_module("generated.rmsnorm_recompute.autograd")
except ImportError:
    rr = None

dt = torch.bfloat16
x = torch.randn(8, 1024, device="cuda", dtype=dt, requires_grad=True)
w = torch.randn(1024, device="cuda", dtype=dt, requires_grad=True)
xd, wd = x.detach(), w.detach()
plan = ra.call_plan(xd, wd, True)
plan_no_save = ra.call_plan(xd, wd, False)
y, rstd = torch.empty_like(xd), torch.empty(8, dtype=torch.float32, device="cuda")
fwd_args = (ra.live(x), ra.live(w), True, "atomic")


class Ctx:
    """A stand-in ctx for EagerFunction.forward outside apply: keeps what it is given."""

    def save_for_backward(self, *tensors):
        self.saved = tensors


ctx = Ctx()
device = torch.cuda.current_device()
rows = {
    "eager F.rms_norm fwd (training)": lambda: F.rms_norm(x, (1024,), w, 1e-6),
    "eager F.rms_norm fwd (no grad)": lambda: F.rms_norm(xd, (1024,), wd, 1e-6),
    "opgen rmsnorm() fwd (training, rstd saved)": lambda: ra.rmsnorm(x, w),
    "opgen rmsnorm() fwd (no grad)": lambda: ra.rmsnorm(xd, wd),
    "apply_op (no input checks)": lambda: ra.apply_op(x, w, True, "atomic"),
    "EAGER_APPLY alone": lambda: ra.EAGER_APPLY(*fwd_args),
    "EagerFunction.forward, no apply": lambda: ra.EagerFunction.forward(ctx, *fwd_args),
    "run_forward(save) with its plan": lambda: ra.run_forward(xd, wd, True, plan),
    "run_forward(no save) with its plan": lambda: ra.run_forward(xd, wd, False, plan_no_save),
    "fwd entry point alone": lambda: plan.fwd(xd, wd, y, rstd),
    "null Function apply (fwd only)": lambda: NullFunction.apply(x, w),
    "torch.empty_like(x)": lambda: torch.empty_like(xd),
    "torch.empty(rows, fp32)": lambda: torch.empty(8, dtype=torch.float32, device=xd.device),
    "check_new_inputs (known metadata)": lambda: ra.check_new_inputs(x, w),
    "contiguous(x, w)": lambda: ra.contiguous(x, w),
    "check_aligned": lambda: ra.check_aligned(x, w),
    "call_plan lookup": lambda: ra.call_plan(xd, wd, True),
    "eager(x)": lambda: ra.eager(x),
    "on_device(x) enter and exit": lambda: contextlib.ExitStack().enter_context(ra.on_device(x)),
    "torch.cuda.current_device()": torch.cuda.current_device,
    "torch._C._cuda_getDevice()": torch._C._cuda_getDevice,
    "x.device.type == 'cpu'": lambda: x.device.type == "cpu",
}
if rr is not None:
    rows["opgen rmsnorm_recompute() fwd (training)"] = lambda: rr.rmsnorm_recompute(x, w)
    rows["rmsnorm_recompute apply_op"] = lambda: rr.apply_op(x, w, False, "atomic")
for fn in rows.values():  # build every kernel and plan before timing
    fn()
torch.cuda.synchronize()
best = {name: float("inf") for name in rows}
for _ in range(5):  # interleaved: a drift of the host's clock moves every row alike
    for name, fn in rows.items():
        best[name] = min(best[name], per_call(fn, rounds=1))
for name, us in best.items():
    print(f"{name:48s} {us:8.2f} us", flush=True)
