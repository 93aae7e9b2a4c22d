"""matmul's backward GEMMs (dA = dC @ B^T, dB = A^T @ dC) at the shipped tiling with what a spec
or template change could still move, each kernel alone (CUDA events), next to cuBLAS doing the same
product, bf16 at 4096^3 and 8192^3:
  - the threadblock swizzle: panel sizes and the column order (which blocks share L2 tiles);
  - dB with m static instead of symbolic (its pipelined loop of unknown trip count);
  - dA and dB on two streams at once (the second kernel fills the first one's last wave).
Each variant's output is checked against cuBLAS's first (relative Frobenius error).

    python docs/profiling/matmul_bwd_probe.py
"""
import contextlib
import os
import sys
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "docs", "profiling"))
import tilelang.language as T
import torch

from kernel_probe import compile_all, ms

A = __import__("generated.matmul.autograd", fromlist=["x"])
K = __import__("generated.matmul.kernels", fromlist=["x"])
SIZES = tuple(int(s) for s in os.environ.get("SIZES", "4096 8192").split())
PHASES = os.environ.get("PHASES", "da db").split()
DTYPE = "bfloat16"
TILING = dict(K.DA_TILING)
# (label, swizzle panel, swizzle order, static m)
# PANELS="10 16 ...": the shipped kernel and those panels instead of the list below.
VARIANTS = ([
    ("shipped", K.SWIZZLE_PANEL, "row", False),
] + [(f"panel {p}", int(p), "row", False) for p in os.environ["PANELS"].split()]) if os.environ.get("PANELS") else [
    ("shipped", K.SWIZZLE_PANEL, "row", False),
    ("panel 4", 4, "row", False),
    ("panel 8", 8, "row", False),
    ("panel 16", 16, "row", False),
    ("panel 32", 32, "row", False),
    ("column 8", 8, "column", False),
    ("column 16", 16, "column", False),
    ("static m", K.SWIZZLE_PANEL, "row", True),
]


@contextlib.contextmanager
def swizzle(panel, order):
    """The kernels' swizzle panel and order while one kernel is traced."""
    saved_panel, saved_fn = K.SWIZZLE_PANEL, T.use_swizzle
    K.SWIZZLE_PANEL = panel
    T.use_swizzle = lambda panel_size, order_=order, **kw: saved_fn(panel_size, order=order_)
    try:
        yield
    finally:
        K.SWIZZLE_PANEL, T.use_swizzle = saved_panel, saved_fn


def prim_of(phase, n, panel, order, static_m):
    """The phase's kernel traced afresh (the factories' get_tir keeps the first trace of a key)."""
    m = n if static_m else K.runtime_rows()
    with swizzle(panel, order):
        if phase == "fwd":
            return K._gemm(m, n, n, False, False, DTYPE, False, **TILING)
        if phase == "da":
            return K._gemm(m, n, n, False, True, DTYPE, False, **TILING)
        return K._gemm(n, n, m, True, False, DTYPE, False, **TILING)


def main():
    t0 = time.perf_counter()
    jobs = {}
    for n in SIZES:
        for phase in PHASES:
            factory = {"fwd": K.matmul_fwd, "da": K.matmul_bwd_da, "db": K.matmul_bwd_db}[phase]
            for label, panel, order, static_m in VARIANTS:
                if static_m and phase != "db":
                    continue  # the reduction of fwd (k) and dA (n) is already static
                try:
                    jobs[(phase, n, label)] = (factory, prim_of(phase, n, panel, order, static_m))
                except Exception as exc:
                    print("NO TIR", phase, n, label, str(exc).splitlines()[-1][:160])
    built = compile_all(jobs, A.entry_point)
    print(f"# {torch.cuda.get_device_name()}; built {len(built)} kernels in {time.perf_counter() - t0:.0f} s",
          flush=True)
    for n in SIZES:
        torch.manual_seed(0)
        a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        dc = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
        flops = 2 * n**3
        refs = {"fwd": lambda: torch.mm(a, b), "da": lambda: torch.mm(dc, b.t()),
                "db": lambda: torch.mm(a.t(), dc)}
        refs = {p: refs[p] for p in PHASES}
        calls = {}
        for phase, ref_fn in refs.items():
            ref = ref_fn().float()
            cublas = ms(ref_fn)
            print(f"{n}^3 {phase} cuBLAS {cublas:7.3f} ms {flops / cublas / 1e9:6.0f} TF/s", flush=True)
            for label, *_ in VARIANTS:
                fn = built.get((phase, n, label))
                if fn is None:
                    continue
                if not callable(fn):
                    print(f"    {label:10s}: {fn}")
                    continue
                out = torch.full((n, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                operands = {"fwd": (a, b), "da": (dc, b), "db": (a, dc)}[phase]
                call = lambda fn=fn, out=out, x=operands: fn(*x, out)
                call()
                torch.cuda.synchronize()
                err = ((out.float() - ref).norm() / ref.norm()).item()
                if not err < 1e-2:
                    print(f"    {label:10s}: WRONG rel err {err:.3g}")
                    continue
                t_ms = ms(call)
                calls[(phase, label)] = call
                print(f"    {label:10s}: {t_ms:7.3f} ms {flops / t_ms / 1e9:6.0f} TF/s "
                      f"{cublas / t_ms:5.3f}x cuBLAS", flush=True)
        # dA then dB, one stream (what the package does) and two streams (dB beside dA)
        da, db = calls.get(("da", "shipped")), calls.get(("db", "shipped"))
        if da and db:
            side = torch.cuda.Stream()

            def two_streams():
                main = torch.cuda.current_stream()
                side.wait_stream(main)
                da()
                with torch.cuda.stream(side):
                    db()
                main.wait_stream(side)

            cublas_pair = ms(lambda: (torch.mm(dc, b.t()), torch.mm(a.t(), dc)))
            one = ms(lambda: (da(), db()))
            two = ms(two_streams)
            print(f"{n}^3 dA+dB: cuBLAS {cublas_pair:.3f} ms; opgen one stream {one:.3f} ms "
                  f"({cublas_pair / one:.3f}x), two streams {two:.3f} ms ({cublas_pair / two:.3f}x)", flush=True)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
