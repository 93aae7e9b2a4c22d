"""Where the memory-bound backwards lose bandwidth (issue 11: >= 90% of a copy's): rmsnorm's
(bf16, its three bench shapes) and scaled_silu's (fp16 8192 x 8192, scalar fp32 w), each timed
four ways in one process, the bench's back-to-back method throughout (stream_ms):
  public    torch.autograd.grad(y, (x, w), dy, retain_graph=True), as the bench times it
  run_bwd   the package's run_backward on the main thread (dy made dense, dx and dw allocated,
            dw zeroed for the atomic adds, the kernel, dw cast)
  kernel    the kernel alone into preallocated buffers (launch_backward)
  split     the kernel alone with split dw partials (no atomics)
next to torch.add(x, dy, out=dx) (the same bytes: two tensors read, one written) and a copy.
GB/s count x, dy and dx. On the H200:

    python docs/profiling/elementwise_bwd_probe.py
"""
import importlib
import os
import sys

sys.path.insert(0, os.getcwd())
import torch

CASES = [("rmsnorm", torch.bfloat16, 16384, 4096), ("rmsnorm", torch.bfloat16, 4096, 8192),
         ("rmsnorm", torch.bfloat16, 65536, 1024), ("scaled_silu", torch.float16, 8192, 8192)]


def timed(name, case, fn, moved):
    bench = importlib.import_module(f"generated.{name}.bench_{name}")
    t = bench.stream_ms(fn)
    print(f"  {case:10s} {t:.4f} ms  {moved / t / 1e6:6.0f} GB/s", flush=True)
    return t


for name, dtype, rows, cols in CASES:
    A = importlib.import_module(f"generated.{name}.autograd")
    op = importlib.import_module(f"generated.{name}").__dict__[name]
    torch.manual_seed(0)
    x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
    w_shape = (cols,) if name == "rmsnorm" else ()
    w = torch.randn(w_shape, device="cuda").to(A.weight_dtype(x)).requires_grad_()
    dy = torch.randn_like(x)
    moved = 3 * x.numel() * x.element_size()
    print(f"# {name} {rows}x{cols} {dtype}", flush=True)
    y = op(x, w)
    timed(name, "public", lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True), moved)
    xd, wd = x.detach(), w.detach()
    saved = None
    if name == "rmsnorm":
        _, saved = A.run_forward(xd, wd, True)
    timed(name, "run_bwd", lambda: A.run_backward(xd, saved, wd, dy, "atomic"), moved)
    dx = torch.empty_like(xd)
    for reduction in ("atomic", "split"):
        dw = A.alloc_dw(xd, reduction)
        timed(name, "kernel" if reduction == "atomic" else "split",
              lambda: A.launch_backward(xd, saved, wd, dy, dx, dw, reduction), moved)
    timed(name, "add", lambda: torch.add(xd, dy, out=dx), moved)
    timed(name, "copy", lambda: dx.copy_(xd), 2 * x.numel() * x.element_size())
