"""The host-time measure the host probes share: microseconds per call of back-to-back calls at a
tiny shape (the GPU finishes each call before the host queues the next), the best of `rounds`."""
import time

import torch


def per_call(fn, n=400, rounds=3, warmup=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return best


def report(name, fn, width=60, prefix="", **timing):
    print(f"{prefix}{name:{width}s} {per_call(fn, **timing):8.1f} us", flush=True)


class NullFunction(torch.autograd.Function):
    """The autograd machinery alone: a Python Function whose phases launch nothing."""

    @staticmethod
    def forward(ctx, x, w):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g, None
