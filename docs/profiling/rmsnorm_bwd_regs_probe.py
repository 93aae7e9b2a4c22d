"""rmsnorm_bwd_regs.py (dw sums in registers, the whole row a pass) against the package's
backward kernel at issue 11's three shapes (bf16, saved rstd, atomic dw): dx and dw checked
against the package's run_backward, then both kernels timed into the same preallocated buffers
(launch_backward for the package; the dw sums and count are left at zero by each launch), CUDA
events over back-to-back launches, interleaved rounds, the best of each. GB/s counts x, dy, dx.

    timeout 200 python docs/profiling/rmsnorm_bwd_regs_probe.py
"""
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch

from ncu_rmsnorm import ms
from rmsnorm_bwd_regs import rmsnorm_bwd_regs
from generated.attention.autograd import build_entry_point

A = __import__("generated.rmsnorm.autograd", fromlist=["x"])
SHAPES = [(16384, 4096), (4096, 8192), (65536, 1024)]
# (block_rows, threads, row_stages); cols a multiple of 8 * threads, rows of block_rows.
TILINGS = [(64, 128, 2), (32, 128, 2), (64, 256, 2), (32, 256, 2), (16, 256, 2), (32, 512, 2), (64, 128, 3),
           (32, 256, 3)]
if os.environ.get("TILINGS"):  # "16x512s2,64x64s2": block_rows x threads s row_stages
    TILINGS = [tuple(int(v) for v in t.replace("s", "x").split("x")) for t in os.environ["TILINGS"].split(",")]
ROUNDS = 3


def fits(cols, tiling):
    block_rows, threads, stages = tiling
    return cols % (8 * threads) == 0 and cols // threads <= 64 and stages * 2 * cols * 2 <= 200 * 1024


def compile_one(factory, prim):
    """The kernel's entry point, or why it did not build."""
    try:
        return build_entry_point(factory, prim)
    except Exception as exc:  # a tiling that does not build is reported, the rest still run
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:120]}"


T0 = time.perf_counter()
jobs = {(cols, t): (rmsnorm_bwd_regs, rmsnorm_bwd_regs.get_tir(cols, "bfloat16", "bfloat16", *t))
        for _, cols in SHAPES for t in TILINGS if fits(cols, t)}
with ThreadPoolExecutor(16) as pool:
    built = dict(zip(jobs, pool.map(lambda job: compile_one(*job), jobs.values())))
print(f"built {len(built)} kernels in {time.perf_counter() - T0:.0f} s", flush=True)

for rows, cols in SHAPES:
    torch.manual_seed(0)
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    _, rstd = A.run_forward(x, w, True)
    dx0, dw0 = A.run_backward(x, rstd, w, dy, "atomic")
    moved = 3 * rows * cols * 2
    dx, dw_out = torch.empty_like(x), torch.empty_like(w)
    sums = torch.zeros(cols, dtype=torch.float32, device="cuda")
    done = torch.zeros(1, dtype=torch.int32, device="cuda")
    calls = {"package": lambda: A.launch_backward(x, rstd, w, dy, dx, dw_out, "atomic")}
    for (c, t), entry in built.items():
        if c != cols:
            continue
        if isinstance(entry, str):
            print(f"  {t}: build failed {entry}")
            continue
        dx.zero_()
        entry(x, rstd, w, dy, dx, sums, done, dw_out)
        torch.cuda.synchronize()
        ok = ((dx.float() - dx0.float()).abs().max().item() < 0.05
              and (dw_out.float() - dw0.float()).abs().max().item() < 0.02 * dw0.float().abs().max().item() + 0.05
              and sums.abs().max().item() == 0 and done.item() == 0)
        if not ok:
            print(f"  {t}: WRONG", flush=True)
            continue
        calls[t] = lambda entry=entry: entry(x, rstd, w, dy, dx, sums, done, dw_out)
    best = {name: float("inf") for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            best[name] = min(best[name], ms(call, n=50))
    # The tiling the package's kernel runs at this C (its tuned entry, else the base one).
    print(f"\n# {rows}x{cols} (package tiling {A.BWD_TILINGS.get(cols, A.BWD_TILING)})", flush=True)
    for name, t_ms in best.items():
        print(f"  {name}: {t_ms:.4f} ms, {moved / t_ms / 1e6:.0f} GB/s, {best['package'] / t_ms:.3f}x the package",
              flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
