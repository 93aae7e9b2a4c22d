"""What limits rmsnorm's and scaled_silu's backward through the public function (issue 11's 90% of
copy): per call of torch.autograd.grad(y, (x, w), dy, retain_graph=True), as the benches time it,

  stream  ms a call back to back (the bench's stream_ms): what a user sees;
  gpu     ms a call with the host far ahead: the calls queued behind a torch.cuda._sleep, CUDA
          events around them, so the GPU runs them with no wait on the host;
  host    ms a call of the host's own time: the same calls issued while the GPU sleeps, the
          host's clock from the first to the last (nothing waits on the GPU);

and GB/s of x, dy and dx (the bench's bytes) for each, with its share of this GPU's copy of the
same bytes (torch.add(x, dy, out=dx), timed as stream). stream is max(gpu, host) give or take: a
row whose host is above its gpu is bound by the host, which no kernel can move. Eager PyTorch's
rows the same way, for what its own autograd node costs.

    python docs/profiling/public_bwd_limit.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.getcwd())
from generated.rmsnorm import bench_rmsnorm as RB  # noqa: E402
from generated.scaled_silu import bench_scaled_silu as SB  # noqa: E402

CASES = [(RB, 16384, 4096), (RB, 4096, 8192), (RB, 65536, 1024), (SB, 8192, 8192)]
CALLS = 100


def sleep_cycles(ms):
    """torch.cuda._sleep's cycles for about ms milliseconds at the SM clock."""
    return int(ms * 1e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)


def gpu_and_host_ms(call, calls=CALLS):
    """(gpu, host) ms a call: calls queued behind a sleep long enough to hide the host's issue."""
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(sleep_cycles(2 + calls * 0.6))
    start.record()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - t0) * 1e3 / calls
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls, host


def main():
    print(f"# public backward: stream, GPU and host ms a call, {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}")
    print("| family | rows x C | implementation | stream ms | gpu ms | host ms | stream GB/s | gpu GB/s |"
          " bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for bench, rows, cols in CASES:
        torch.manual_seed(0)
        x, w = bench.make_x_and_w(rows, cols)
        dy = torch.randn_like(x)
        nbytes = 3 * x.numel() * x.element_size()
        out = torch.empty_like(x)
        copy_gbs = nbytes / bench.stream_ms(lambda: torch.add(x, dy, out=out)) / 1e6
        family = bench.__name__.split(".")[-1].removeprefix("bench_")
        for name, fn in list(bench.candidates().items())[:2]:  # opgen, eager
            y = fn(x, w)
            inputs = (x, w)

            def call():
                return torch.autograd.grad(y, inputs, dy, retain_graph=True)

            stream = bench.stream_ms(call)
            rounds = [gpu_and_host_ms(call) for _ in range(3)]
            gpu = min(r[0] for r in rounds)
            host = min(r[1] for r in rounds)
            bound = "host" if host > gpu else "GPU"
            print(f"| {family} | {rows} x {cols} | {name} | {stream:.4f} | {gpu:.4f} | {host:.4f} | "
                  f"{nbytes / stream / 1e6:.0f} ({nbytes / stream / 1e6 / copy_gbs:.0%}) | "
                  f"{nbytes / gpu / 1e6:.0f} ({nbytes / gpu / 1e6 / copy_gbs:.0%}) | {bound} |", flush=True)


if __name__ == "__main__":
    main()
