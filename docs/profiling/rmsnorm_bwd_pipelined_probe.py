"""The pipelined rmsnorm backward prototype (rmsnorm_bwd_pipelined.py, both builds) against the
package's backward at issue 11's three shapes (bf16, saved rstd, atomic dw): dx and dw checked
against the package's first, then both timed the same way, as run_backward runs them (dx
allocated, the fp32 dw buffer zeroed, the kernel, dw cast to w's dtype), CUDA events. GB/s
counts x, dy and dx. On the H200:

    timeout 300 python docs/profiling/rmsnorm_bwd_pipelined_probe.py
"""
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch

from ncu_rmsnorm import ms
from rmsnorm_bwd_pipelined import rmsnorm_bwd_pipelined, rmsnorm_bwd_pipelined_shared
from generated.attention.autograd import build_entry_point

A = __import__("generated.rmsnorm.autograd", fromlist=["x"])
SHAPES = [(4096, 8192), (16384, 4096), (65536, 1024)]
BUILDS = {"warp-specialized": rmsnorm_bwd_pipelined, "cp.async": rmsnorm_bwd_pipelined_shared}
# (block_rows, block_channels, threads, num_stages)
TILINGS = [(16, 1024, 256, 2), (32, 1024, 256, 2), (16, 1024, 256, 3), (8, 1024, 128, 2), (32, 2048, 256, 3)]


def fits(cols, tiling):
    """Shared memory: num_stages rows of x and dy, and w and the dw sums in fp32."""
    block_rows, block_channels, threads, stages = tiling
    width = -(-cols // block_channels) * block_channels
    return stages * 2 * cols * 2 + 2 * width * 4 <= 220 * 1024


def compile_one(factory, prim):
    """The kernel's entry point (as the packages call their kernels), or why it did not build."""
    try:
        return build_entry_point(factory, prim)
    except Exception as exc:  # a tiling that does not build is reported, the rest still run
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:120]}"


T0 = time.perf_counter()
# The cp.async build does not lower at 3 stages over the dynamic row count (TileLang 0.1.15:
# "Downcast from tirx.Sub to ir.IntImm failed"): two stages only.
jobs = {(name, cols, t): (factory, factory.get_tir(cols, "bfloat16", "bfloat16", A.EPS, *t))
        for name, factory in BUILDS.items() for _, cols in SHAPES for t in TILINGS
        if fits(cols, t) and (name != "cp.async" or t[3] == 2)}
with ThreadPoolExecutor(16) as pool:
    built = dict(zip(jobs, pool.map(lambda job: compile_one(*job), jobs.values())))
print(f"built {len(built)} kernels in {time.perf_counter() - T0:.0f} s", flush=True)

for rows, cols in SHAPES:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    _, rstd = A.run_forward(x, w, True)
    dx0, dw0 = A.run_backward(x, rstd, w, dy, "atomic")
    moved = 3 * rows * cols * 2
    package_ms = ms(lambda: A.run_backward(x, rstd, w, dy, "atomic"))
    print(f"\n# {rows}x{cols}: package {package_ms:.3f} ms, {moved / package_ms / 1e6:.0f} GB/s "
          f"(tiling {A.BWD_TILING})", flush=True)
    for (name, c, t), entry in built.items():
        if c != cols:
            continue
        if isinstance(entry, str):
            print(f"  {name} {t}: build failed {entry}")
            continue

        def call():
            dx = torch.empty_like(x)
            dw = torch.zeros(cols, dtype=torch.float32, device="cuda")
            entry(x, rstd, w, dy, dx, dw)
            return dx, dw.to(w.dtype)

        dx, dw = call()
        ok = ((dx.float() - dx0.float()).abs().max().item() < 0.05
              and (dw.float() - dw0.float()).abs().max().item() < 0.05 * dw0.float().abs().max().item() + 0.05)
        t_ms = ms(call)
        print(f"  {name} {t}: {t_ms:.3f} ms, {moved / t_ms / 1e6:.0f} GB/s, {package_ms / t_ms:.2f}x the package"
              f"{'' if ok else ' WRONG'}", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
