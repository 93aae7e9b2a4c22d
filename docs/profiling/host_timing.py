"""The host-time measure the host probes share: microseconds per call of back-to-back calls at a
tiny shape (the GPU finishes each call before the host queues the next), the best (or the median)
of `rounds`."""

import statistics
import time

import torch


def per_call(fn, n=400, rounds=3, warmup=30, statistic="best"):
    """Microseconds per call of fn: the best (or, statistic="median", the median) of `rounds`."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / n * 1e6)
    return min(times) if statistic == "best" else statistics.median(times)


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
