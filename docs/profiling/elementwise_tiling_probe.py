"""The backward tilings of scaled_silu (fp16 8192 x 8192, scalar fp32 w) and rmsnorm (bf16, its
three bench shapes; rows copied asynchronously since session 23) timed as kernels alone (dw
buffer preallocated; the bench's back-to-back stream_ms), each checked against the package's own
tiling first. Run 109's ncu: scaled_silu's backward holds 93 registers a thread at 32 elements a
thread, so 2 blocks (25% occupancy) per SM and 72% of DRAM bandwidth; rmsnorm's 65536 x 1024
backward ran faster with split partials than with its 4096 atomic adds per dw address. Each
package's BWD_TILING is swapped in its autograd module (the CallPlans and kernels rebuilt). On the
H200:

    python docs/profiling/elementwise_tiling_probe.py
"""
import importlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
import torch

SILU = [dict(block_rows=1, block_cols=c, threads=t)
        for c, t in ((8192, 256), (4096, 256), (4096, 512), (8192, 512), (2048, 256), (8192, 1024),
                     (16384, 512), (4096, 128), (2048, 128))]
RMS = [dict(block_rows=r, block_channels=c, threads=t)
       for r, c, t in ((16, 1024, 256), (32, 1024, 256), (64, 1024, 256), (8, 1024, 256),
                       (32, 1024, 128), (32, 512, 128), (64, 512, 128), (32, 2048, 256))]
CASES = [("scaled_silu", torch.float16, 8192, 8192, SILU)] + [
    ("rmsnorm", torch.bfloat16, r, c, RMS) for r, c in ((16384, 4096), (4096, 8192), (65536, 1024))]


def with_tiling(A, tiling):
    A.BWD_TILING = tiling
    A.PLANS.clear()


T0 = time.perf_counter()
for name, dtype, rows, cols, tilings in CASES:
    A = importlib.import_module(f"generated.{name}.autograd")
    bench = importlib.import_module(f"generated.{name}.bench_{name}")
    own = dict(A.BWD_TILING)
    torch.manual_seed(0)
    x = torch.randn(rows, cols, device="cuda", dtype=dtype)
    w = torch.randn((cols,) if name == "rmsnorm" else (), device="cuda").to(A.weight_dtype(x))
    dy = torch.randn_like(x)
    saved = A.run_forward(x, w, True)[1] if name == "rmsnorm" else None
    args = (A.call_plan(x, w, saved is not None).args, "atomic")

    def build(tiling):
        try:
            return A.kernel(A.__dict__[f"{name}_bwd"], *args[0], args[1], **tiling)
        except Exception as exc:  # a tiling that does not build is reported
            return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:100]}"

    with ThreadPoolExecutor(8) as pool:
        built = list(pool.map(build, tilings))
    print(f"# {name} {rows}x{cols}: built {len(built)} in {time.perf_counter() - T0:.0f} s", flush=True)
    with_tiling(A, own)
    dx0, dw0 = A.run_backward(x, saved, w, dy, "atomic")
    moved = 3 * x.numel() * x.element_size()
    for tiling, entry in zip(tilings, built):
        if isinstance(entry, str):
            print(f"  {tiling}: {entry}")
            continue
        with_tiling(A, tiling)
        dx, dw = A.run_backward(x, saved, w, dy, "atomic")
        ok = (dx.float() - dx0.float()).abs().max().item() < 0.05 and torch.allclose(
            dw.float(), dw0.float(), rtol=1e-2, atol=1e-1)
        buf = A.alloc_dw(x, "atomic")
        out = torch.empty_like(x)
        t = bench.stream_ms(lambda: A.launch_backward(x, saved, w, dy, out, buf, "atomic"))
        print(f"  {tiling}: {t:.4f} ms {moved / t / 1e6:6.0f} GB/s{'' if ok else ' WRONG'}", flush=True)
    with_tiling(A, own)
print(f"done in {time.perf_counter() - T0:.0f} s")
