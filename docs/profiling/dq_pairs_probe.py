"""The attention backward with dQ's fp32 accumulator in a layout where each thread's two adjacent
columns are adjacent floats (each 8x8 block of dQ row-major), so that TileLang vectorizes the
dQ atomics to one 8-byte add per pair (16 a step per thread at D128 128x64, not 32), against the
package's layout (each 8x8 block in the GEMM fragment's order: one 4-byte add per element).

Each case: the package's CallPlan, and a copy of it whose bwd and postprocess kernels are built
from the same factories with `_dq_layout` replaced (both read the accumulator; the preprocess
zeroes it in any order). Gradients compared (dQ differs only in the order of fp32 adds), then the
whole backward (run_backward: preprocess, bwd, postprocess, host included) timed with the bench's
stream_ms, package and variant interleaved over 3 rounds, the best of each. On the H200:

    python docs/profiling/dq_pairs_probe.py
"""
import copy
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import tilelang.language as T
import torch

from generated.attention import autograd as MHA, kernels as MHA_K, bench_attention as B
from generated.attention_sink import autograd as SINK, kernels as SINK_K
from generated.gqa import autograd as GQA, kernels as GQA_K

T0 = time.perf_counter()
PACKAGES = {"mha": (MHA, MHA_K), "gqa": (GQA, GQA_K), "sink": (SINK, SINK_K)}
# (package, batch, heads, kv_heads, seq_len, head_dim, causal, dtype, window)
ODD = [("mha", 2, 16, 16, 333, 128, False, "float16", 0), ("mha", 1, 16, 16, 1000, 64, True, "float16", 0),
       ("gqa", 2, 32, 8, 333, 128, False, "bfloat16", 0), ("sink", 1, 64, 8, 1000, 64, True, "bfloat16", 128)]
CASES = [("mha", 4, 16, 16, 4096, 128, False, "float16", 0), ("mha", 4, 16, 16, 4096, 128, True, "float16", 0),
         ("mha", 4, 16, 16, 4096, 64, False, "float16", 0), ("mha", 8, 16, 16, 2048, 64, True, "float16", 0),
         ("gqa", 2, 32, 8, 4096, 128, True, "bfloat16", 0), ("gqa", 2, 32, 8, 4096, 128, False, "bfloat16", 0),
         ("sink", 2, 32, 8, 4096, 128, True, "bfloat16", 0), ("sink", 1, 64, 8, 4096, 64, True, "bfloat16", 128)]


def pairs_layout(layout, dQ):
    if layout == "bshd":
        return T.Layout(dQ.shape, lambda b, l, h, d: [b, l // 8, h, d // 8, 8 * (l % 8) + d % 8])
    return T.Layout(dQ.shape, lambda b, h, l, d: [b, h, l // 8, d // 8, 8 * (l % 8) + d % 8])


def tensors(p, b, h, kv, s, d, c, dt, w, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, dt)
    q, k, v = (torch.randn(b, s, n, d, device="cuda", dtype=dtype, generator=g) for n in (h, kv, kv))
    do = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    sinks = (torch.randn(h, device="cuda", generator=g),) if p == "sink" else ()
    return q, k, v, sinks, do


def plans(p, q, k, c, w, d):
    """The package's CallPlan and the variant's (a copy with the pairs-layout bwd and postprocess)."""
    A, K = PACKAGES[p]
    h, kv = q.shape[2], k.shape[2]
    reds = A.reductions(h, kv)
    plan = A.CallPlan(q, k, c, w, "bshd", d ** -0.5, *reds)
    calls = A.variant_calls(h, kv, d, c, w, "bshd", A.DTYPE_NAMES[q.dtype], d ** -0.5, *reds)
    shipped = K._dq_layout
    K._dq_layout = pairs_layout
    try:
        prims = {ph: (calls[ph][0], calls[ph][0].get_tir(*calls[ph][1], **calls[ph][2])) for ph in ("bwd", "postprocess")}
    finally:
        K._dq_layout = shipped
    variant = copy.copy(plan)
    variant.bwd, variant.postprocess = (A.build_entry_point(*prims[ph]) for ph in ("bwd", "postprocess"))
    return plan, variant, reds


def backward(p, plan, reds, q, k, v, sinks, o, lse, do, c, w, d):
    A = PACKAGES[p][0]
    return A.run_backward(q, k, v, *sinks, o, lse, do, c, w or None, "bshd", d ** -0.5, *reds, plan=plan)


def case_name(p, b, h, kv, s, d, c, dt, w):
    return f"{p} B{b} H{h}/{kv} S{s} D{d} {'causal' if c else 'full'}{f' window {w}' if w else ''} {dt}"


bad = 0
for case in ODD:
    p, b, h, kv, s, d, c, dt, w = case
    A = PACKAGES[p][0]
    q, k, v, sinks, do = tensors(*case, seed=1)
    plan, variant, reds = plans(p, q, k, c, w, d)
    o, lse = A.run_forward(q, k, v, *sinks, c, w or None, "bshd", d ** -0.5, plan=plan)
    ref = backward(p, plan, reds, q, k, v, sinks, o, lse, do, c, w, d)
    got = backward(p, variant, reds, q, k, v, sinks, o, lse, do, c, w, d)
    diffs = [(x.float() - y.float()).abs().max().item() for x, y in zip(got, ref)]
    ok = all(x <= 1e-2 for x in diffs) and diffs[1] == 0 and diffs[2] == 0
    bad += not ok
    print(f"{'ok ' if ok else 'BAD'} {case_name(*case)}: max diff dq dk dv{' dsinks' if sinks else ''} "
          + " ".join(f"{x:.1e}" for x in diffs), flush=True)
print("all correct" if not bad else f"{bad} WRONG", flush=True)

print("| case | package bwd ms | pairs bwd ms | pairs / package |\n|---|---|---|---|")
for case in CASES:
    p, b, h, kv, s, d, c, dt, w = case
    A = PACKAGES[p][0]
    q, k, v, sinks, do = tensors(*case)
    plan, variant, reds = plans(p, q, k, c, w, d)
    o, lse = A.run_forward(q, k, v, *sinks, c, w or None, "bshd", d ** -0.5, plan=plan)
    times = {"package": [], "pairs": []}
    for _ in range(3):
        for name, pl in (("package", plan), ("pairs", variant)):
            times[name].append(B.stream_ms(lambda: backward(p, pl, reds, q, k, v, sinks, o, lse, do, c, w, d)))
    a, z = min(times["package"]), min(times["pairs"])
    print(f"| {case_name(*case)} | {a:.3f} | {z:.3f} | {z / a:.3f} |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
