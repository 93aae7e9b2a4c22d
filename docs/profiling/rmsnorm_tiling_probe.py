"""rmsnorm's fwd and bwd kernels at other tilings, alone (CUDA events), next to eager, at the three
shapes of issue 11 (4096x8192, 16384x4096, 65536x1024, bf16): which block_rows / block_channels /
threads a spec change alone buys (run 40: the then shipped bwd ran 128 blocks of 32 rows at 4096
rows, 0.48 waves; run 42 of this probe chose the defaults the package ships now). Every tiling is checked against the shipped
one's output first; then the rows-in-flight backward prototype (rmsnorm_bwd_rows.py) the same
way. On the H200: `python docs/profiling/rmsnorm_tiling_probe.py` (~2-3 min: the kernels build
in threads first)."""
import itertools
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "docs", "profiling"))
import tilelang
import torch
import torch.nn.functional as F

from ncu_rmsnorm import ms
from rmsnorm_bwd_rows import rmsnorm_bwd_rows

A = __import__("generated.rmsnorm.autograd", fromlist=["x"])
K = __import__("generated.rmsnorm.kernels", fromlist=["x"])
SHAPES = [(4096, 8192), (16384, 4096), (65536, 1024)]
FWD = [dict(block_rows=r, block_channels=c, threads=t)
       for r, c, t in itertools.product((1, 2, 4, 8), (512, 1024, 2048), (128, 256))
       if 1 <= r * c // t <= 64 and c <= 8192]
BWD = [dict(block_rows=r, block_channels=c, threads=t)
       for r, c, t in itertools.product((4, 8, 16, 32), (1024, 2048), (128, 256))
       if 1 <= c // t <= 64]
# The prototype: (block_rows, block_channels, threads, rows_in_flight); its shared memory (the
# staged rows of x and dy, w and the dw sums) must fit 227 KB at the shape's C.
ROWS = [(8, 1024, 256, 4), (16, 1024, 256, 4), (16, 2048, 256, 4), (32, 1024, 256, 8),
        (16, 1024, 128, 4), (32, 2048, 256, 8)]


def rows_fit(cols, t):
    block_rows, block_channels, threads, group = t
    width = -(-cols // block_channels) * block_channels
    return (2 * group * width * 2 + 2 * width * 4 <= 220 * 1024
            and group * block_channels // threads <= 64)


T0 = time.perf_counter()


def job(factory, args, tiling):
    return A.kernel_key(factory, args, tiling), factory, factory.get_tir(*args, **tiling)


def compile_one(factory, prim):
    try:
        return A.entry_point(tilelang.compile(prim, out_idx=factory.out_idx,
                                              execution_backend=factory.execution_backend,
                                              target=factory.target))
    except Exception as exc:  # a tiling that does not build is reported, the rest still run
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:120]}"


calls = []
for rows, cols in SHAPES:
    calls += [(K.rmsnorm_fwd, (cols, "bfloat16", "bfloat16", A.EPS, True), t) for t in FWD]
    calls += [(K.rmsnorm_bwd, (cols, "bfloat16", "bfloat16", A.EPS, True, "atomic"), t) for t in BWD]
proto = {}
for rows, cols in SHAPES:
    for t in ROWS:
        if rows_fit(cols, t):
            proto[cols, t] = rmsnorm_bwd_rows.get_tir(cols, "bfloat16", "bfloat16", A.EPS, *t)
jobs = {}
for factory, args, tiling in calls:
    try:
        key, f, prim = job(factory, args, tiling)
        jobs.setdefault(key, (f, prim))
    except Exception as exc:
        print("NO TIR", factory.__name__ if hasattr(factory, "__name__") else factory, args, tiling,
              str(exc).splitlines()[-1][:120])
with ThreadPoolExecutor(16) as pool:
    built = dict(zip(jobs, pool.map(lambda j: compile_one(*j), jobs.values())))
    proto_built = dict(zip(proto, pool.map(lambda p: compile_one(rmsnorm_bwd_rows, p),
                                           proto.values())))
for key, entry in built.items():
    if isinstance(entry, str):
        print("BUILD FAILED", key[1:], entry)
    else:
        A.KERNELS[key] = entry
print(f"built {len(built)} kernels in {time.perf_counter() - T0:.0f} s", flush=True)


shipped_fwd, shipped_bwd = dict(A.FWD_TILING), dict(A.BWD_TILING)
for rows, cols in SHAPES:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    y0, rstd = A.run_forward(x, w, True)
    dx0, dw0 = A.run_backward(x, rstd, w, dy, "atomic")
    moved_fwd, moved_bwd = 2 * rows * cols * 2, 2 * rows * cols * 3  # bytes of x, y / x, dy, dx
    xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
    ye = F.rms_norm(xe, (cols,), we, A.EPS)
    print(f"\n# {rows}x{cols}: eager fwd {ms(lambda: F.rms_norm(x, (cols,), w, A.EPS)):.3f} ms, "
          f"bwd {ms(lambda: torch.autograd.grad(ye, (xe, we), dy, retain_graph=True)):.3f} ms")
    for phase, tilings in (("fwd", FWD), ("bwd", BWD)):
        rows_out = []
        for t in tilings:
            setattr(A, f"{phase.upper()}_TILING", t)
            try:
                if phase == "fwd":
                    y, r = A.run_forward(x, w, True)
                    ok = (y.float() - y0.float()).abs().max().item() < 0.05
                    fn = lambda: A.run_forward(x, w, True)
                    moved = moved_fwd
                else:
                    dx, dw = A.run_backward(x, rstd, w, dy, "atomic")
                    ok = ((dx.float() - dx0.float()).abs().max().item() < 0.05
                          and (dw.float() - dw0.float()).abs().max().item() < 0.05 * dw0.float().abs().max().item() + 0.05)
                    fn = lambda: A.run_backward(x, rstd, w, dy, "atomic")
                    moved = moved_bwd
                t_ms = ms(fn)
                rows_out.append((t_ms, t, ok, moved / t_ms / 1e6))
            except Exception as exc:
                print(f"  {phase} {t}: failed {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        setattr(A, "FWD_TILING", shipped_fwd)
        setattr(A, "BWD_TILING", shipped_bwd)
        for t_ms, t, ok, gbs in sorted(rows_out, key=lambda r: r[0])[:6]:
            mark = " (shipped)" if t == (shipped_fwd if phase == "fwd" else shipped_bwd) else ""
            print(f"  {phase} {t}: {t_ms:.3f} ms, {gbs:.0f} GB/s{'' if ok else ' WRONG'}{mark}", flush=True)
        shipped = [r for r in rows_out if r[1] == (shipped_fwd if phase == "fwd" else shipped_bwd)]
        if shipped:
            print(f"  {phase} shipped: {shipped[0][0]:.3f} ms, {shipped[0][3]:.0f} GB/s")
    for (c, t), entry in proto_built.items():
        if c != cols:
            continue
        if isinstance(entry, str):
            print(f"  bwd rows-in-flight {t}: build failed {entry}")
            continue
        dx, dw = torch.empty_like(x), torch.zeros(cols, device="cuda")

        def call():
            dw.zero_()
            entry(x, rstd, w, dy, dx, dw)

        call()
        ok = ((dx.float() - dx0.float()).abs().max().item() < 0.05
              and (dw - dw0.float()).abs().max().item() < 0.05 * dw0.float().abs().max().item() + 0.05)
        t_ms = ms(call)
        verdict = "" if ok else " WRONG"
        print(f"  bwd rows-in-flight {t}: {t_ms:.3f} ms, {moved_bwd / t_ms / 1e6:.0f} GB/s"
              f"{verdict} (dw zeroed in the call)", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
