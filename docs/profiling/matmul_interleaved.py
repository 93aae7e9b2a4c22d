"""matmul's public function against cuBLAS (torch.addmm) with the two timed in turns, round after
round, so that both see the same clocks: at these sizes the H100 runs at its power limit and its
clock drifts over seconds, so the same kernel timed first and last in one process can differ by
10% (run 226). Forward and fwd+bwd (autograd, the backward's dA, dB and dbias), bf16, bias on;
per round the median of its timed calls, then the median over rounds of each ratio.

    python docs/profiling/matmul_interleaved.py
"""
import os
import statistics
import sys

sys.path.insert(0, os.getcwd())
import torch

from generated.matmul import matmul

sys.path.insert(0, os.path.join(os.getcwd(), "docs", "profiling"))
from matmul_bwd_kernels import square_inputs  # noqa: E402

ROUNDS, REPS = 15, 10


def batch_ms(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / REPS


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for n in (4096, 8192):
        a, b, bias, grad = square_inputs(n)
        ours_fn, theirs_fn = (lambda: matmul(a, b, bias)), (lambda: torch.addmm(bias, a, b))
        cases = {
            "fwd": (lambda: ours_fn().detach(), lambda: theirs_fn().detach()),
            "fwd+bwd": (lambda: torch.autograd.grad(ours_fn(), (a, b, bias), grad),
                        lambda: torch.autograd.grad(theirs_fn(), (a, b, bias), grad)),
        }
        with torch.no_grad():
            ref = torch.addmm(bias, a, b).float()
            err = ((matmul(a, b, bias).float() - ref).norm() / ref.norm()).item()
        print(f"## bf16 {n}^3 + bias (forward rel err {err:.1e})")
        for label, (ours, theirs) in cases.items():
            flops = 2 * n**3 * (3 if label == "fwd+bwd" else 1)
            for fn in (ours, theirs, ours, theirs):
                fn()
            torch.cuda.synchronize()
            o, t, r = [], [], []
            for i in range(ROUNDS):
                # alternate which goes first within a round
                if i % 2:
                    tt, oo = batch_ms(theirs), batch_ms(ours)
                else:
                    oo, tt = batch_ms(ours), batch_ms(theirs)
                o.append(oo)
                t.append(tt)
                r.append(tt / oo)
            om, tm = statistics.median(o), statistics.median(t)
            print(f"  {label:8s} opgen {om:.3f} ms ({flops / om / 1e9:.0f} TF/s), cuBLAS {tm:.3f} ms "
                  f"({flops / tm / 1e9:.0f} TF/s): median of the rounds' ratios {statistics.median(r):.3f}x "
                  f"(min {min(r):.3f}, max {max(r):.3f})", flush=True)


if __name__ == "__main__":
    main()
