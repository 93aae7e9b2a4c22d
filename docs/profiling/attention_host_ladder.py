"""Where the attention forward's host time goes (issue 10, and the short causal forward of issue
11: at B2 16/4 S1024 the paired kernel alone runs at 309 TF/s, the public function at 147-173,
run 80): gqa's public forward, then each step of its eager path alone, in one process, bf16,
inputs requiring grad, next to SDPA's cuDNN and flash forwards.
`python docs/profiling/attention_host_ladder.py`

Every row is microseconds per call of back-to-back calls (the best of 5 rounds of 400). At the
tiny shape (B1 S128 32/8 D128 causal) the GPU finishes a call before the host queues the next, so
a row is host time; at the model's shape (B2 16/4 S1024) the public rows are max(host, GPU) and
the "kernel alone" row is the GPU's time."""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generated.gqa import autograd as ga  # noqa: E402
from host_timing import per_call  # noqa: E402


def report(name, fn):
    print(f"{name:66s} {per_call(fn, rounds=5):8.1f} us", flush=True)


def ladder(b, h, kv, s, d=128, dt=torch.bfloat16):
    q = torch.randn(b, s, h, d, device="cuda", dtype=dt, requires_grad=True)
    k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(2))
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    # What the public function passes on: check_inputs takes the user's arguments (window None,
    # scale None), the eager path apply_op's (window 0, the scale resolved).
    checked = (True, None, "bshd", None)
    args = (True, 0, "bshd", ga.default_softmax_scale(d))
    ga.gqa(q, k, v, True).sum().backward()  # builds the variant's kernels
    plan = ga.call_plan(qd, kd, *args)
    o, lse = qd.new_empty(qd.shape), qd.new_empty(plan.lse_shape, dtype=torch.float32)

    class EmptyFunction(torch.autograd.Function):
        """The autograd machinery and the outputs' allocation (o, lse), no launch."""

        @staticmethod
        def forward(ctx, q, k, v):
            out = q.new_empty(q.shape)
            ctx.save_for_backward(q, k, v, out, q.new_empty(plan.lse_shape, dtype=torch.float32))
            return out

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    print(f"# gqa B{b} {h}/{kv} S{s} D{d} bf16 causal, forward per call (us)")
    for backend, label in ((SDPBackend.CUDNN_ATTENTION, "cuDNN"), (SDPBackend.FLASH_ATTENTION, "flash")):
        with sdpa_kernel(backend):
            report(f"SDPA {label} (grad-requiring inputs)",
                   lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True))
    report("ga.gqa (public)", lambda: ga.gqa(q, k, v, True))
    report("ga.apply_op (no autocast, dense, input checks)", lambda: ga.apply_op(q, k, v, *args))
    report("ga.EagerFunction.apply", lambda: ga.EagerFunction.apply(q, k, v, *args))
    report("EmptyFunction.apply (Function + o, lse; no launch)", lambda: EmptyFunction.apply(q, k, v))
    report("plan.fwd(q, k, v, o, lse): the kernel alone (entry point)", lambda: plan.fwd(qd, kd, vd, o, lse))
    report("ga.run_forward with its plan (allocations + launch)",
           lambda: ga.run_forward(qd, kd, vd, *args, plan))
    print("# steps alone")
    report("ga.autocast_inputs", lambda: ga.autocast_inputs(q, k, v))
    report("ga.dense x3", lambda: (ga.dense(q), ga.dense(k), ga.dense(v)))
    report("ga.check_new_inputs (metadata known)", lambda: ga.check_new_inputs(q, k, v, *checked))
    report("ga.check_inputs", lambda: ga.check_inputs(q, k, v, *checked))
    report("ga.eager(q)", lambda: ga.eager(q))
    report("ga.aligned_start x3", lambda: (ga.aligned_start(q), ga.aligned_start(k), ga.aligned_start(v)))
    report("ga.call_plan", lambda: ga.call_plan(q, k, *args))
    report("ga.on_device(q)", lambda: ga.on_device(q))
    report("q.new_empty x2 (o, lse)",
           lambda: (qd.new_empty(qd.shape), qd.new_empty(plan.lse_shape, dtype=torch.float32)))


ladder(1, 32, 8, 128)
ladder(2, 16, 4, 1024)
