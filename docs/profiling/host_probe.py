"""Host time of the layers of a tiny-shape call, per TileLang execution backend (for issue 10).

Run once per backend: TILELANG_EXECUTION_BACKEND=tvm_ffi|cython|nvrtc python docs/profiling/host_probe.py
"""
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
from generated.attention import autograd as aa  # noqa: E402
from generated.rmsnorm import autograd as ra  # noqa: E402

BACKEND = os.environ.get("TILELANG_EXECUTION_BACKEND", "auto")

from host_timing import per_call  # noqa: E402


def report(name, fn):
    print(f"[{BACKEND}] {name:58s} {per_call(fn):8.1f} us", flush=True)


def memo(factory):
    cache = {}

    def get(*args, **kwargs):
        key = (args, tuple(kwargs.items()))
        kernel = cache.get(key)
        if kernel is None:
            kernel = cache[key] = factory(*args, **kwargs)
        return kernel

    return get


dev = "cuda"
dt = torch.bfloat16
q, k, v = (torch.randn(1, 128, 4, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
qd, kd, vd = q.detach(), k.detach(), v.detach()
qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
do = torch.randn_like(q)
dot = do.transpose(1, 2).contiguous()
t0 = time.perf_counter()
aa.attention(q, k, v).backward(do)
torch.cuda.synchronize()
print(f"[{BACKEND}] first fwd+bwd (compile or disk cache) {time.perf_counter() - t0:.1f} s", flush=True)

report("sdpa fwd (grad inputs)", lambda: F.scaled_dot_product_attention(qt, kt, vt))
report("sdpa fwd+bwd", lambda: F.scaled_dot_product_attention(qt, kt, vt).backward(dot))
report("attention fwd public (grad inputs)", lambda: aa.attention(q, k, v))
report("attention fwd+bwd public", lambda: aa.attention(q, k, v).backward(do))
report("attention fwd, no-grad inputs", lambda: aa.attention(qd, kd, vd))
report("attention check_inputs", lambda: aa.check_inputs(q, k, v, False, None, "bshd"))
report("attention forward_op (custom op)", lambda: aa.forward_op(qd, kd, vd, False, 0, "bshd"))
report("attention run_forward", lambda: aa.run_forward(qd, kd, vd, False, None, "bshd"))
fwd_args = (1, 4, 4, 128, 64, False, 0, "bshd", "bfloat16")
report("factory lookup attention_fwd", lambda: aa.attention_fwd(*fwd_args, **aa.FWD_TILING))
kern = aa.attention_fwd(*fwd_args, **aa.FWD_TILING)
report("kernel object call (fwd)", lambda: kern(qd, kd, vd))
ad = kern.adapter
ex = ad._get_executable()
if hasattr(ad, "_ffi_callee_allocated_output_abi") and getattr(ad, "_ffi_callee_allocated_output_abi", False):
    report("tvm_ffi executable direct (callee alloc)", lambda: ex(qd, kd, vd, qd))
report("torch.empty small", lambda: torch.empty((1, 128, 4, 64), dtype=dt, device=dev))
report("torch.zeros small", lambda: torch.zeros((1, 128, 4, 64), dtype=torch.float32, device=dev))
report("torch.cuda.current_stream", lambda: torch.cuda.current_stream())
report("torch.compiler.is_compiling", lambda: torch.compiler.is_compiling())

# Prototype: a direct autograd.Function with memoized kernel objects.
for name in ("attention_fwd", "attention_bwd_preprocess", "attention_bwd", "attention_bwd_postprocess"):
    setattr(aa, name, memo(getattr(aa, name)))
report("run_forward, memo kernels", lambda: aa.run_forward(qd, kd, vd, False, None, "bshd"))


class Direct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        o, lse = aa.run_forward(q, k, v, False, None, "bshd")
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        return aa.run_backward(q, k, v, o, lse, do, False, None, "bshd")


def direct(q, k, v):
    aa.check_inputs(q, k, v, False, None, "bshd")
    return Direct.apply(q, k, v)


report("direct Function fwd, memo", lambda: direct(q, k, v))
report("direct Function fwd+bwd, memo", lambda: direct(q, k, v).backward(do))
report("custom op public fwd, memo", lambda: aa.attention(q, k, v))
report("custom op public fwd+bwd, memo", lambda: aa.attention(q, k, v).backward(do))


class Null(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


report("null autograd.Function fwd", lambda: Null.apply(q))

# rmsnorm
x = torch.randn(8, 1024, device=dev, dtype=dt, requires_grad=True)
w = torch.randn(1024, device=dev, dtype=dt, requires_grad=True)
ra.rmsnorm(x, w).sum().backward()
report("eager rms_norm fwd", lambda: F.rms_norm(x, (1024,), w, 1e-6))
report("eager rms_norm fwd+bwd", lambda: F.rms_norm(x, (1024,), w, 1e-6).sum().backward())
report("rmsnorm fwd public", lambda: ra.rmsnorm(x, w))
report("rmsnorm fwd+bwd public", lambda: ra.rmsnorm(x, w).sum().backward())
