"""Where matmul's backward time goes on the GPU, kernel by kernel (torch.profiler over a few
backwards through the public functions, torch.autograd.grad with retain_graph): opgen's dA, dB
and dbias kernels next to eager PyTorch's (cuBLAS GEMMs and the bias sum), bf16, at the bench
shapes (4096^3 and 8192^3).

    python docs/profiling/matmul_bwd_kernels.py
"""
import collections
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from generated.matmul import matmul  # noqa: E402

CALLS = 5


def kernel_times(out, inputs, grad):
    torch.autograd.grad(out, inputs, grad, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            torch.autograd.grad(out, inputs, grad, retain_graph=True)
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name] += event.time_range.elapsed_us() / CALLS
    return totals


def square_inputs(n):
    """a, b [n, n] and bias [n] (bf16, requiring grad) and an upstream gradient [n, n]."""
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    return a, b, bias, torch.randn(n, n, device="cuda", dtype=torch.bfloat16)


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for n in (4096, 8192):
        a, b, bias, grad = square_inputs(n)
        flops = 2 * 2 * n**3  # dA and dB
        print(f"## bf16 {n}^3, bias on")
        for label, fn in (("opgen", lambda: matmul(a, b, bias)),
                          ("eager (cuBLAS)", lambda: torch.addmm(bias, a, b))):
            totals = kernel_times(fn(), (a, b, bias), grad)
            total = sum(totals.values())
            print(f"  {label}: {total:.1f} us on the GPU a backward ({flops / total / 1e6:.0f} TF/s)")
            for name, us in sorted(totals.items(), key=lambda kv: -kv[1]):
                print(f"    {us:9.1f} us  {name[:110]}")
        print(flush=True)


if __name__ == "__main__":
    main()
