"""The rmsnorm package's forward and backward kernels at a bench shape, for Nsight Compute (the
0.21x-eager backward of issue 11 at 4096 x 8192 and the 16384 x 4096 bench shape): two warm-up
rounds, then one forward and one backward launch. On the H200:

    ncu --clock-control none -k regex:"^(fwd|bwd)_kernel" --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis python docs/profiling/ncu_rmsnorm.py ROWS CHANNELS

With --time (and without ncu) it prints each phase's time (CUDA events, 20 calls) next to eager's."""

import importlib
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F


def ms(fn, n=20):
    """ms per call of fn: CUDA events over n calls after one warm-up (also rmsnorm_tiling_probe's
    and stage_o_probe's)."""
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


if __name__ == "__main__":
    A = importlib.import_module("generated.rmsnorm.autograd")
    rows, cols = (int(a) for a in sys.argv[1:3])
    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cols, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)

    for _ in range(2):
        y, rstd = A.run_forward(x, w, True)
        A.run_backward(x, rstd, w, dy, "atomic")
    torch.cuda.synchronize()
    y, rstd = A.run_forward(x, w, True)
    A.run_backward(x, rstd, w, dy, "atomic")
    torch.cuda.synchronize()
    if "--time" in sys.argv:
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        ye = F.rms_norm(xe, (cols,), we, 1e-6)
        moved = 2 * rows * cols * 3  # bwd reads x, dy and writes dx (bytes, bf16)
        for name, fn in [
            ("opgen fwd", lambda: A.run_forward(x, w, True)),
            ("opgen bwd", lambda: A.run_backward(x, rstd, w, dy, "atomic")),
            ("eager fwd", lambda: F.rms_norm(x, (cols,), w, 1e-6)),
            ("eager bwd", lambda: torch.autograd.grad(ye, (xe, we), dy, retain_graph=True)),
        ]:
            t = ms(fn)
            print(
                f"{rows}x{cols} {name}: {t:.3f} ms"
                + (f", {moved / t / 1e6:.0f} GB/s" if "bwd" in name else "")
            )
    print("done", rows, cols)
