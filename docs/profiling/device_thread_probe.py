"""Why Python costs more on autograd's CUDA device thread (issue 10; run 108: run_backward 71 us
there against 26 us on the main thread, a Function whose backward only launches one kernel 66 us
over the null Function's 62, the launch alone 5.8 us on the main thread).

The same calls, timed in a loop of N inside one context each, so that autograd's own per-node
cost is not in the figure:
  main      the main thread;
  thread    a plain threading.Thread (the main thread waits in join());
  device    inside one backward() on autograd's device thread (the main thread waits in
            torch.autograd.grad);
  inline    the same, with torch.autograd.set_multithreading_enabled(False): backward() on the
            calling thread.
Then the public fwd+bwd of rmsnorm and eager F.rms_norm with autograd's multithreading on and
off, and the Python threads alive (a thread that wants the GIL while the device thread runs
would make every GIL release there a handoff).

    python docs/profiling/device_thread_probe.py
"""
import os
import sys
import threading

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generated.rmsnorm import autograd as ra  # noqa: E402
from host_timing import per_call, report  # noqa: E402

N = 2000
dt = torch.bfloat16
x = torch.randn(8, 1024, device="cuda", dtype=dt, requires_grad=True)
w = torch.randn(1024, device="cuda", dtype=dt, requires_grad=True)
xd, wd = x.detach(), w.detach()
dy = torch.randn_like(x)
torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy)
_, rstd = ra.run_forward(xd, wd, True)
bwd = ra.kernel(ra.rmsnorm_bwd, 1024, "bfloat16", "bfloat16", ra.EPS, True, "atomic", **ra.BWD_TILING)
dx, buf = torch.empty_like(xd), ra.alloc_dw(xd, "atomic")
torch.cuda.synchronize()


def nothing():
    pass


CALLS = {
    "python no-op": nothing,
    "torch.empty_like(x)": lambda: torch.empty_like(xd),
    "torch.zeros(1024, fp32)": lambda: torch.zeros(1024, dtype=torch.float32, device="cuda"),
    "buf.to(bf16)": lambda: buf.to(dt),
    "torch.cuda.current_device()": torch.cuda.current_device,
    "bwd kernel entry point": lambda: bwd(xd, rstd, wd, dy, dx, buf),
    "run_backward (atomic dw)": lambda: ra.run_backward(xd, rstd, wd, dy, "atomic"),
}


def loop(fn):
    """us per call of N back-to-back calls, timed in one round where this runs (host_timing's
    measure; the GPU work of a call is far shorter than its host time at this shape)."""
    return per_call(fn, n=N, rounds=1, warmup=0)


def on_thread(fn):
    result = []
    t = threading.Thread(target=lambda: result.append(loop(fn)))
    t.start()
    t.join()
    return result[0]


class InBackward(torch.autograd.Function):
    """A Function whose backward times FN: autograd runs it on its device thread for CUDA."""

    fn = staticmethod(nothing)
    result = []

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        InBackward.result.append((loop(InBackward.fn), threading.current_thread().name))
        return g


def in_backward(fn):
    InBackward.fn, InBackward.result = staticmethod(fn), []
    torch.autograd.grad(InBackward.apply(x), (x,), dy)
    return InBackward.result[0]


print(f"switch interval {sys.getswitchinterval()} s; torch threads {torch.get_num_threads()}")
print("Python threads alive:", [t.name for t in threading.enumerate()], flush=True)
print(f"{'us per call':40s} {'main':>8s} {'thread':>8s} {'device':>8s} {'inline':>8s}")
for name, fn in CALLS.items():
    for _ in range(2):  # warm every context first
        main, thread = loop(fn), on_thread(fn)
        device, device_thread = in_backward(fn)
        torch.autograd.set_multithreading_enabled(False)
        try:
            inline, inline_thread = in_backward(fn)
        finally:
            torch.autograd.set_multithreading_enabled(True)
    print(f"{name:40s} {main:8.2f} {thread:8.2f} {device:8.2f} {inline:8.2f}   "
          f"(backward ran on {device_thread!r}; inline on {inline_thread!r})", flush=True)

print("\nThe public fwd+bwd, autograd multithreading on / off:")
for enabled in (True, False):
    torch.autograd.set_multithreading_enabled(enabled)
    try:
        report(f"opgen rmsnorm fwd+bwd, multithreading={enabled}",
               lambda: torch.autograd.grad(ra.rmsnorm(x, w), (x, w), dy), width=56, rounds=5)
        report(f"eager F.rms_norm fwd+bwd, multithreading={enabled}",
               lambda: torch.autograd.grad(F.rms_norm(x, (1024,), w, 1e-6), (x, w), dy), width=56,
               rounds=5)
    finally:
        torch.autograd.set_multithreading_enabled(True)
print("Python threads alive at the end:", [t.name for t in threading.enumerate()], flush=True)
