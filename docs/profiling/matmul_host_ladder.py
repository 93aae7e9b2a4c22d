"""Where matmul's forward host time goes at 64^3 + bias (issue 10: 27.3 us against addmm's 15.5,
run 75): the public function, then each step of its eager path alone, in one process, bf16,
inputs requiring grad. `python docs/profiling/matmul_host_ladder.py`

Every row is microseconds per call of back-to-back calls (the best of 5 rounds of 400): at this
shape the GPU finishes a call before the host queues the next, so a row is host time. The steps
below the public function are timed alone, so their sum is roughly the public function's time."""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generated.matmul import autograd as mm  # noqa: E402
from host_timing import report as host_report  # noqa: E402


def report(name, fn):
    host_report(name, fn, width=66, rounds=5)


dt = torch.bfloat16
a = torch.randn(64, 64, device="cuda", dtype=dt, requires_grad=True)
b = torch.randn(64, 64, device="cuda", dtype=dt, requires_grad=True)
bias = torch.randn(64, device="cuda", dtype=dt, requires_grad=True)
ad, bd, biasd = a.detach(), b.detach(), bias.detach()
mm.matmul(a, b, bias)  # builds the kernel
plan = mm.call_plan(ad, bd, biasd)
c = ad.new_empty(plan.c_shape)


class EmptyFunction(torch.autograd.Function):
    """The autograd machinery and the output's allocation, no launch."""

    @staticmethod
    def forward(ctx, a, b, bias):
        ctx.save_for_backward(a, b)
        return a.new_empty((64, 64))

    @staticmethod
    def backward(ctx, g):
        return g, None, None


class PlanFunction(torch.autograd.Function):
    """EagerFunction's forward without the alignment check, the plan lookup and on_device."""

    @staticmethod
    def forward(ctx, a, b, bias):
        out = a.new_empty(plan.c_shape)
        plan.fwd(a, b, bias, out)
        ctx.save_for_backward(a, b)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, g):
        return g, None, None


print("# matmul 64^3 + bias, bf16, forward host time per call (us)")
report("torch.addmm(bias, a, b) (grad-requiring inputs)", lambda: torch.addmm(bias, a, b))
report("torch.addmm, detached inputs", lambda: torch.addmm(biasd, ad, bd))
report("mm.matmul (public)", lambda: mm.matmul(a, b, bias))
report("mm.apply_op (no check_inputs, no contiguous)", lambda: mm.apply_op(a, b, bias))
report("mm.EagerFunction.apply", lambda: mm.EagerFunction.apply(a, b, bias))
report("PlanFunction.apply (kernel + new_empty in a Function)", lambda: PlanFunction.apply(a, b, bias))
report("EmptyFunction.apply (Function + new_empty, no launch)", lambda: EmptyFunction.apply(a, b, bias))
report("mm.forward_op (the custom op)", lambda: mm.forward_op(a, b, bias))
print("# steps alone")
report("plan.fwd(a, b, bias, c): the kernel's entry point", lambda: plan.fwd(ad, bd, biasd, c))
report("plan.fwd with the grad-requiring tensors", lambda: plan.fwd(a, b, bias, c))
report("a.new_empty(c_shape)", lambda: ad.new_empty(plan.c_shape))
report("mm.check_inputs", lambda: mm.check_inputs(a, b, bias))
report("mm.check_new_inputs (metadata known)", lambda: mm.check_new_inputs(a, b, bias))
report("mm.contiguous", lambda: mm.contiguous(a, b, bias))
report("mm.eager(a)", lambda: mm.eager(a))
report("mm.check_aligned", lambda: mm.check_aligned(a, b, bias))
report("mm.call_plan", lambda: mm.call_plan(a, b, bias))
report("mm.on_device(a) enter/exit", lambda: mm.on_device(a).__enter__())
report("torch.empty(64, 64) (the launch-free floor)", lambda: torch.empty(64, 64, device="cuda"))

# One public call under torch.profiler, the rows with host time.
from torch.profiler import ProfilerActivity, profile  # noqa: E402

with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(50):
        mm.matmul(a, b, bias)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=20))
