"""The attention backward's memory-bound passes at other tilings, kernel alone: the preprocess
(Delta = rowsum(O * dO), the fp32 dQ accumulator zeroed) and the postprocess (dQ's scale and
cast), each launched back to back on the buffers of one real backward, at the gpt-oss shape and
two D128 ones. Every tiling's output is checked against the spec's (Delta to fp32 rounding, the
accumulator all zeros, the cast dQ bit for bit) before it is timed.

    python docs/profiling/prepost_tiling_probe.py

GB/s counts each pass's bytes once: preprocess O and dO read, Delta written, the accumulator
(padded rows) written; postprocess the accumulator read, dQ written.
"""
import importlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.getcwd())

# (label, package, batch, heads, kv_heads, seq_len, head_dim, dtype, causal, window)
CASES = [
    ("gpt-oss B1 S4096 64/8 D64 w128", "attention_sink", 1, 64, 8, 4096, 64, torch.bfloat16, True, 128),
    ("MHA B4 S4096 H16 D128 full", "attention", 4, 16, 16, 4096, 128, torch.float16, False, None),
    ("sinks B2 S4096 32/8 D128 causal", "attention_sink", 2, 32, 8, 4096, 128, torch.bfloat16, True, None),
]
PRE = [(32, 128), (16, 128), (64, 128), (64, 256), (128, 256), (128, 512), (32, 256)]
POST = [(64, 128), (32, 128), (128, 128), (64, 256), (128, 256), (256, 256), (32, 64)]


def timed(fn, launches=100, rounds=5):
    """us a launch: the median of rounds of back-to-back launches (CUDA events)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / launches)
    return statistics.median(times)


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for label, name, b, h, kv, s, d, dtype, causal, window in CASES:
        pkg = importlib.import_module(f"generated.{name}.autograd")
        kernels = importlib.import_module(f"generated.{name}.kernels")
        torch.manual_seed(0)
        q = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
        k = torch.randn(b, s, kv, d, device="cuda", dtype=dtype)
        o = torch.randn_like(q)
        do = torch.randn_like(q)
        scale = d**-0.5
        args = (q, k, causal, window, "bshd", scale)
        plan = pkg.call_plan(*args)
        calls = pkg.variant_calls(h, kv, d, causal, window, "bshd", pkg.DTYPE_NAMES[dtype], scale,
                                  *pkg.reductions(h, kv))
        lse_shape = plan.lse_shape
        dk = torch.empty(plan.dk_buffer[0], dtype=plan.dk_buffer[1], device="cuda")
        dv = torch.empty(plan.dv_buffer[0], dtype=plan.dv_buffer[1], device="cuda")
        accum_bytes = torch.Size(plan.dq_accum_shape).numel() * 4
        print(f"## {label} ({name}; preprocess {calls['preprocess'][2]}, "
              f"postprocess {calls['postprocess'][2]})", flush=True)

        # Every tiling's two kernels built at once, in threads (as a package's first call does).
        try:
            pkg.prebuild([(f, a, {**t, "block_m": m, "threads": n})
                          for phase, tilings in (("preprocess", PRE), ("postprocess", POST))
                          for f, a, t in [calls[phase]] for m, n in tilings])
        except Exception as exc:  # noqa: BLE001 - each tiling is built (and reported) below
            print(f"  prebuild failed: {str(exc).splitlines()[0][:100]}")
        factory, pre_args, base = calls["preprocess"]
        want_delta = None
        for block_m, threads in PRE:
            tiling = {**base, "block_m": block_m, "threads": threads}
            try:
                pre = pkg.kernel(factory, *pre_args, **tiling)
            except Exception as exc:  # noqa: BLE001 - a tiling the kernel refuses
                print(f"  preprocess  {block_m:4d} rows {threads:4d} threads: build failed: "
                      f"{str(exc).splitlines()[0][:100]}")
                continue
            delta = torch.full(lse_shape, float("nan"), device="cuda")
            accum = torch.full(plan.dq_accum_shape, float("nan"), device="cuda")
            pre(o, do, delta, accum, dk, dv)
            torch.cuda.synchronize()
            if want_delta is None:
                want_delta = delta[..., :s].clone()
            ok = (torch.allclose(delta[..., :s], want_delta, rtol=1e-5, atol=1e-4)
                  and not accum.any().item())
            us = timed(lambda: pre(o, do, delta, accum, dk, dv))
            gbs = (2 * o.numel() * o.element_size() + accum_bytes + delta.numel() * 4) / us / 1e3
            print(f"  preprocess  {block_m:4d} rows {threads:4d} threads: {us:8.1f} us "
                  f"{gbs:7.0f} GB/s {'ok' if ok else 'WRONG'}", flush=True)

        factory, post_args, base = calls["postprocess"]
        accum = torch.randn(plan.dq_accum_shape, device="cuda")
        want_dq = None
        for block_m, threads in POST:
            tiling = {**base, "block_m": block_m, "threads": threads}
            try:
                post = pkg.kernel(factory, *post_args, **tiling)
            except Exception as exc:  # noqa: BLE001
                print(f"  postprocess {block_m:4d} rows {threads:4d} threads: build failed: "
                      f"{str(exc).splitlines()[0][:100]}")
                continue
            dq = torch.full_like(q, float("nan"))
            if plan.finish_dkv:
                fin = (torch.empty(k.shape, dtype=dtype, device="cuda"),
                       torch.empty(k.shape, dtype=dtype, device="cuda"))
                launch = lambda: post(accum, dq, dk, fin[0], dv, fin[1])  # noqa: E731
            else:
                launch = lambda: post(accum, dq)  # noqa: E731
            launch()
            torch.cuda.synchronize()
            if want_dq is None:
                want_dq = dq.clone()
            ok = torch.equal(dq, want_dq)
            us = timed(launch)
            gbs = (accum_bytes + dq.numel() * dq.element_size()) / us / 1e3
            print(f"  postprocess {block_m:4d} rows {threads:4d} threads: {us:8.1f} us "
                  f"{gbs:7.0f} GB/s {'ok' if ok else 'WRONG'}"
                  + (" (dK/dV finished too)" if plan.finish_dkv else ""), flush=True)
    print("done")


if __name__ == "__main__":
    main()
