"""rmsnorm's atomic backward with dw finished in its launch (branch rmsnorm-fused-dw, scaled_silu's
too: the last block casts the fp32 sums into dw and zeroes them; no zeroing launch, no cast) next to main's
(zeroed fp32 buffer, atomics, cast), in one process, from the repository root on the H200:

    python docs/profiling/rmsnorm_fused_dw_probe.py

main's package was docs/profiling/baselines/rmsnorm_main: main's templates at 93abf23 rendered
from specs/rmsnorm.toml with `name = "rmsnorm_main"` (its own custom-op names, so both load in one
process). Run 115 measured it; it was removed once the fused dw was merged (d975233 has it).

1. Correctness, both packages through the public function at odd and bench shapes, both dtypes
   and saved rstd variants: dx bitwise equal, dw within an ulp of the dtype, both against the
   fp32 reference; the fused package's sums and count back at zero after every call; a second
   stream (its own sums); fwd+bwd captured in a CUDA graph and replayed three times.
2. Host time per call at [8, 1024] bf16 (fwd, fwd+bwd), eager F.rms_norm, main, fused,
   interleaved over 5 rounds (host_timing.per_call, best of each).
3. The public backward at the bench shapes (the bench's stream_ms), main vs fused, interleaved.
Exits 1 if a check failed."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "docs/profiling/baselines"))
from generated.rmsnorm import autograd as fused  # noqa: E402
from generated.rmsnorm import bench_rmsnorm as bench  # noqa: E402
from generated.rmsnorm.reference import rmsnorm_reference  # noqa: E402
from host_timing import per_call  # noqa: E402
from rmsnorm_main import autograd as main  # noqa: E402

failed = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failed.append(what)


def grads(fn, x, w, dy):
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xs, ws)
    return (y, *torch.autograd.grad(y, (xs, ws), dy))


def public(pkg, save=True, reduction="atomic"):
    """The public function's path with the variant's saved rstd and dw reduction."""
    return lambda x, w: pkg.apply_op(*pkg.contiguous(x, w), save, reduction)


for shape in [(3, 333, 77), (65, 8192), (37, 5000), (4097, 1024), (4096, 8192)]:
    for dtype in (torch.bfloat16, torch.float16):
        for save in (True, False):
            g = torch.Generator(device="cuda").manual_seed(0)
            x = (torch.randn(shape, device="cuda", generator=g) * 2).to(dtype)
            w = torch.randn(shape[-1], device="cuda", generator=g).to(dtype)
            dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
            y0, dx0, dw0 = grads(public(main, save), x, w, dy)
            y1, dx1, dw1 = grads(public(fused, save), x, w, dy)
            xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
            dxr, dwr = torch.autograd.grad(rmsnorm_reference(xr, wr), (xr, wr), dy.float())
            tag = f"{shape} {str(dtype)[6:]} save={save}"
            check(torch.equal(y0, y1) and torch.equal(dx0, dx1), f"y, dx bitwise equal {tag}")
            big = dw0.float().abs().max().item()
            check(torch.allclose(dw1.float(), dw0.float(), rtol=1e-2, atol=1e-2 * big),
                  f"dw fused vs main {tag}: max diff {(dw1.float() - dw0.float()).abs().max().item():.3g} (max {big:.3g})")
            err = ((dw1.float() - dwr).abs().max() / dwr.abs().max()).item()
            check(err < 2e-2, f"dw fused vs fp32 reference {tag}: rel err {err:.3g}")
            sums, done = fused.accumulator(x, shape[-1])
            check(torch.count_nonzero(sums).item() == 0 and done.item() == 0, f"sums and count back at zero {tag}")

# A second stream: its own sums; the same result.
x = torch.randn(4097, 1024, device="cuda", dtype=torch.bfloat16)
w, dy = torch.randn(1024, device="cuda", dtype=torch.bfloat16), torch.randn_like(x)
_, _, dw_default = grads(public(fused), x, w, dy)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    _, _, dw_side = grads(public(fused), x, w, dy)
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()
check(torch.allclose(dw_side.float(), dw_default.float(), rtol=1e-2, atol=1e-2 * dw_default.float().abs().max().item()),
      "a second stream gives the same dw")
check(len({k[1] for k in fused.ACCUMULATORS}) >= 2, "a second stream has sums of its own")

# A CUDA graph of fwd+bwd, replayed.
xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
for _ in range(2):  # warm up on a side stream, as torch.cuda.graph wants
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.autograd.grad(fused.apply_op(xs, ws, True, "atomic"), (xs, ws), dy)
    torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    g_dx, g_dw = torch.autograd.grad(fused.apply_op(xs, ws, True, "atomic"), (xs, ws), dy)
for i in range(3):
    graph.replay()
    torch.cuda.synchronize()
    check(torch.allclose(g_dw.float(), dw_default.float(), rtol=1e-2, atol=1e-2 * dw_default.float().abs().max().item()),
          f"CUDA graph replay {i}: dw as eager")

# 2. Host time at [8, 1024] bf16.
x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
dy = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
calls = {
    "eager": lambda: F.rms_norm(x, (1024,), w, 1e-6),
    "main": lambda: main.rmsnorm_main(x, w),
    "fused": lambda: fused.rmsnorm(x, w),
}
best = {}
for _ in range(5):
    for name, fn in calls.items():
        for what, call in (("fwd", fn), ("fwd+bwd", lambda fn=fn: torch.autograd.grad(fn(), (x, w), dy))):
            us = per_call(call, rounds=1)
            best[name, what] = min(best.get((name, what), us), us)
for what in ("fwd", "fwd+bwd"):
    print(f"host {what:8s} " + "  ".join(f"{n} {best[n, what]:7.1f} us" for n in calls)
          + f"   fused/eager {best['fused', what] / best['eager', what]:.2f}x, main/eager {best['main', what] / best['eager', what]:.2f}x")

# 3. The public backward at the bench shapes.
for rows, cols in [(16384, 4096), (4096, 8192), (65536, 1024)]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    out = {"main": main.rmsnorm_main(x, w), "fused": fused.rmsnorm(x, w)}
    times = {}
    for _ in range(3):
        for name, y in out.items():
            ms = bench.stream_ms(lambda y=y: torch.autograd.grad(y, (x, w), dy, retain_graph=True))
            times[name] = min(times.get(name, ms), ms)
    gbs = 3 * rows * cols * 2 / 1e6
    print(f"bwd {rows}x{cols}: main {times['main']:.4f} ms ({gbs / times['main']:.0f} GB/s), "
          f"fused {times['fused']:.4f} ms ({gbs / times['fused']:.0f} GB/s)", flush=True)
sys.exit(1 if failed else 0)
