"""matmul's three GEMMs (fwd C = A @ B, dA = dC @ B^T, dB = A^T @ dC) at other tilings, each kernel
alone (CUDA events over back-to-back launches), next to cuBLAS doing the same product, at issue
11's shapes (4096^3 and 8192^3, bf16). Which tile (block_m x block_n x block_k, threads, stages) a
spec change alone buys. Every tiling's output is checked against cuBLAS's first (relative
Frobenius error); a tiling that does not build or is wrong is reported and skipped.

On the H200: `python docs/profiling/matmul_tiling_probe.py` (the kernels build in 16 threads
first; ~2-3 min). `--quick`: only the shipped tiling and TileLang's sm90 default (128x256x64).
"""
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "docs", "profiling"))
import torch

from kernel_probe import compile_all, ms

A = __import__("generated.matmul.autograd", fromlist=["x"])
K = __import__("generated.matmul.kernels", fromlist=["x"])
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
DTYPE = "bfloat16"
# (block_m, block_n, block_k, threads, num_stages); the first is what the spec ships.
TILINGS = [
    (128, 128, 64, 256, 3),
    (128, 256, 64, 256, 3),
    (128, 256, 64, 256, 2),
    (256, 128, 64, 256, 3),
    (128, 128, 64, 256, 4),
    (128, 256, 32, 256, 4),
    (128, 128, 128, 256, 2),
    (64, 256, 64, 128, 4),
    (128, 256, 64, 128, 3),
]
if "--quick" in sys.argv:
    TILINGS = TILINGS[:2]
KEYS = ("block_m", "block_n", "block_k", "threads", "num_stages")
PHASES = {"fwd": K.matmul_fwd, "da": K.matmul_bwd_da, "db": K.matmul_bwd_db}


def fits(t):
    block_m, block_n, block_k, threads, stages = t
    smem = stages * (block_m * block_k + block_k * block_n) * 2 + block_m * block_n * 2
    return smem <= 227 * 1024 and block_m * block_n // threads <= 128


def args_of(phase, n, k):
    return (n, k, DTYPE, False) if phase == "fwd" else (n, k, DTYPE)


def main():
    t0 = time.perf_counter()
    jobs = {}
    for m, n, k in SHAPES:
        for phase, factory in PHASES.items():
            for t in filter(fits, TILINGS):
                tiling = dict(zip(KEYS, t))
                key = (phase, n, k, t)
                if key not in jobs:
                    try:
                        jobs[key] = (factory, factory.get_tir(*args_of(phase, n, k), **tiling))
                    except Exception as exc:
                        print("NO TIR", key, str(exc).splitlines()[-1][:160])
    built = compile_all(jobs, A.entry_point)
    print(f"built {len(built)} kernels in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = []
    for m, n, k in SHAPES:
        torch.manual_seed(0)
        a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(k, n, dtype=torch.bfloat16, device="cuda")
        dc = torch.randn(m, n, dtype=torch.bfloat16, device="cuda")
        flops = 2 * m * n * k
        refs = {"fwd": (lambda: torch.mm(a, b)), "da": (lambda: torch.mm(dc, b.t())),
                "db": (lambda: torch.mm(a.t(), dc))}
        for phase, ref_fn in refs.items():
            ref = ref_fn().float()
            cublas = ms(ref_fn)
            print(f"{m}x{n}x{k} {phase:3s} cuBLAS {cublas:7.3f} ms {flops / cublas / 1e9:6.0f} TF/s", flush=True)
            rows.append((m, phase, "cuBLAS", cublas, 1.0))
            for t in filter(fits, TILINGS):
                fn = built.get((phase, n, k, t))
                if not callable(fn):
                    print(f"    {t}: {fn}")
                    continue
                if phase == "fwd":
                    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                    call = lambda: fn(a, b, out)
                elif phase == "da":
                    out = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
                    call = lambda: fn(dc, b, out)
                else:
                    out = torch.empty(k, n, dtype=torch.bfloat16, device="cuda")
                    call = lambda: fn(a, dc, out)
                out.fill_(float("nan"))
                call()
                torch.cuda.synchronize()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    print(f"    {t}: WRONG rel err {err:.3g}")
                    continue
                t_ms = ms(call)
                print(f"    {t}: {t_ms:7.3f} ms {flops / t_ms / 1e9:6.0f} TF/s {cublas / t_ms:5.2f}x cuBLAS (err {err:.1e})", flush=True)
                rows.append((m, phase, t, t_ms, cublas / t_ms))
    print("\nbest per (shape, phase):")
    for m in sorted({r[0] for r in rows}):
        for phase in PHASES:
            mine = [r for r in rows if r[0] == m and r[1] == phase and r[2] != "cuBLAS"]
            if mine:
                best = max(mine, key=lambda r: r[4])
                print(f"  {m}^3 {phase:3s} {best[2]} {best[3]:.3f} ms {best[4]:.2f}x cuBLAS")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
