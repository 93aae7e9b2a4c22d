"""swiglu fwd at the bench shapes: event timing through the public function (host included) vs
cupti (kernel only), and the host time of one call, to tell a slow kernel from a host-bound one."""
import os, sys, time
sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
from tilelang.profiler import do_bench
from generated.swiglu import swiglu
from generated.scaled_silu import scaled_silu

def host_us(fn, calls=200):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(calls): fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best

eager = lambda a, b: F.silu(a) * b
comp = torch.compile(eager)
for rows, cols in ((4096, 14336), (8192, 11008)):
    a, b = (torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    gb = rows * cols * 6 / 1e9
    src = torch.empty(rows * cols * 3 // 2, device="cuda", dtype=torch.bfloat16); dst = torch.empty_like(src)
    copy = do_bench(lambda: dst.copy_(src), backend="cupti", return_mode="median")
    print(f"{rows}x{cols}: copy cupti {copy*1e3:.1f} us = {gb/copy*1e3:.0f} GB/s")
    for name, fn in (("opgen", swiglu), ("compile", comp), ("eager", eager)):
        row = []
        for backend in ("event", "cupti"):
            for rep in range(2):
                ms = do_bench(lambda: fn(a, b), backend=backend, return_mode="median")
                row.append(f"{backend} {ms*1e3:.1f} us ({gb/ms/(gb/copy)*100:.0f}% copy)")
        print(f"  {name}: " + "; ".join(row) + f"; host/call back-to-back {host_us(lambda: fn(a, b)):.1f} us", flush=True)
# scaled_silu 64M fp16 fwd+bwd cupti vs event
x = torch.randn(64 * 2**20, device="cuda", dtype=torch.float16, requires_grad=True)
w = torch.ones(1, device="cuda", dtype=torch.float32, requires_grad=True)  # a scalar weight is fp32
dy = torch.randn_like(x)
for backend in ("event", "cupti"):
    f = do_bench(lambda: scaled_silu(x, w), backend=backend, return_mode="median")
    y = scaled_silu(x, w)
    bw = do_bench(lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True), backend=backend, return_mode="median")
    print(f"scaled_silu 64M fp16 scalar {backend}: fwd {f*1e3:.1f} us ({64*2**20*4/f/1e6:.0f} GB/s) bwd {bw*1e3:.1f} us ({64*2**20*6/bw/1e6:.0f} GB/s)")
