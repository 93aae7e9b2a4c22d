"""The attention backward with dQ (and atomic dK/dV) reduce-added by TMA, one bulk add of a staged
fp32 tile per loop step (commit e86b7eb, reverted), against the backward with one fp32 atomic per
element and per thread, and against SDPA cuDNN, in one process.

Run 55 (docs/gpu-runs.md): correct (gradients equal to 1e-3, 277 generated tests passed) but
3-7% slower in every bench case but the gpt-oss shape (5% faster): one thread issues the reduce
and waits for the tile to be read before the next step may overwrite it.

To rerun: check out e86b7eb's generated/ (the TMA version) and put the packages to compare with
in .prof/baseline/<name>_base, their custom ops renamed (sed 's/"opgen::/"opgenbase::/g' on
autograd.py); then on the H200 `source .gpu/env.sh && python docs/profiling/dq_tma_probe.py`
(carry .gpu and .prof). Each case: the gradients of both versions compared (they differ only in
the order of fp32 adds), then the backward timed through the public function (stream_ms of
autograd.grad, host included). Odd lengths first (tails, windows, GQA).
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), ".prof", "baseline"))
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from generated.attention import autograd as new_mha, bench_attention as B
from generated.gqa import autograd as new_gqa
from generated.attention_sink import autograd as new_sink
import attention_base.autograd as old_mha
import gqa_base.autograd as old_gqa
import attention_sink_base.autograd as old_sink

T0 = time.perf_counter()
PACKAGES = {
    "mha": (new_mha, old_mha, new_mha.attention, old_mha.attention, torch.float16),
    "gqa": (new_gqa, old_gqa, new_gqa.gqa, old_gqa.gqa, torch.bfloat16),
    "sink": (new_sink, old_sink, new_sink.attention_sink, old_sink.attention_sink, torch.bfloat16),
}
# (package, batch, heads, kv_heads, seq_len, head_dim, causal, window); bench shapes and the
# issue's D64 anchor.
TIMED = [
    ("mha", 4, 16, 16, 4096, 128, False, None), ("mha", 4, 16, 16, 4096, 128, True, None),
    ("mha", 8, 16, 16, 2048, 64, False, None), ("mha", 8, 16, 16, 2048, 64, True, None),
    ("gqa", 2, 32, 8, 4096, 128, True, None), ("gqa", 2, 32, 8, 4096, 128, False, None),
    ("sink", 2, 32, 8, 4096, 128, True, None), ("sink", 2, 32, 8, 4096, 128, True, 1024),
    ("sink", 1, 64, 8, 4096, 64, True, 128),
]
ODD = [
    ("mha", 2, 16, 16, 333, 128, True, None), ("mha", 3, 16, 16, 77, 64, False, None),
    ("mha", 1, 16, 16, 4097, 128, True, None), ("gqa", 1, 32, 8, 1000, 128, True, None),
    ("gqa", 2, 32, 8, 333, 64, False, None), ("sink", 1, 32, 8, 1000, 64, True, 100),
    ("sink", 2, 32, 8, 333, 128, True, None),
]


def calls(pkg, case):
    _, _, h, kv, _, d, causal, window = case
    A = PACKAGES[case[0]][pkg]
    dtype = "float16" if case[0] == "mha" else "bfloat16"
    return A.variant_calls(h, kv, d, causal, window or 0, "bshd", dtype, d ** -0.5, *A.reductions(h, kv)).values()


# Every kernel of both versions built at once (threads per package and version).
threads = [
    threading.Thread(target=lambda p=p, i=i: PACKAGES[p][i].prebuild(
        [c for case in TIMED + ODD if case[0] == p for c in calls(i, case)]))
    for p in PACKAGES for i in (0, 1)
]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"built in {time.perf_counter() - T0:.0f} s", flush=True)


def inputs_of(case):
    p, b, h, kv, s, d, causal, window = case
    dtype = PACKAGES[p][4]
    torch.manual_seed(0)
    q = torch.randn(b, s, h, d, dtype=dtype, device="cuda", requires_grad=True)
    k = torch.randn(b, s, kv, d, dtype=dtype, device="cuda", requires_grad=True)
    v = torch.randn(b, s, kv, d, dtype=dtype, device="cuda", requires_grad=True)
    xs = [q, k, v]
    if p == "sink":
        xs.append(torch.randn(h, device="cuda", requires_grad=True))
    return xs, torch.randn_like(q)


def fn_of(p, which, case):
    _, _, _, _, _, _, causal, window = case
    f = PACKAGES[p][2 + which]
    if p == "sink":
        return lambda *xs: f(*xs, causal=causal, window=window)
    return lambda *xs: f(*xs, causal=causal)


def cudnn(case):
    causal = case[6]

    def run(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal,
                enable_gqa=q.shape[2] != k.shape[2])
        return o.transpose(1, 2)

    return run


print("# gradients, TMA version vs committed (max |diff| / max |committed|)")
worst = 0.0
for case in ODD + TIMED:
    xs, do = inputs_of(case)
    grads = [torch.autograd.grad(fn_of(case[0], w, case)(*xs), xs, do) for w in (0, 1)]
    errs = [((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
            for a, b in zip(*grads)]
    finite = all(torch.isfinite(g).all().item() for g in grads[0])
    worst = max(worst, *errs)
    print(case, "rel err", " ".join(f"{e:.1e}" for e in errs), "finite" if finite else "NOT FINITE", flush=True)
print(f"worst rel err {worst:.2e} ({'OK' if worst < 2e-2 else 'TOO LARGE'})", flush=True)

print("\n| case | new fwd ms | new bwd ms | committed bwd ms | cuDNN bwd ms | bwd speedup (committed / new) | new bwd TF/s | new speed vs cuDNN |")
print("|---|---|---|---|---|---|---|---|")
for case in TIMED:
    p, b, h, kv, s, d, causal, window = case
    xs, do = inputs_of(case)
    pairs = s * s if not causal else (s * (s + 1) // 2 if not window else sum(min(i + 1, window) for i in range(s)))
    bwd_flops = 2.5 * 4 * b * h * d * pairs
    row = []
    for which in (0, 1):
        f = fn_of(p, which, case)
        fwd_ms, bwd_ms = B.bench_one(f, xs, do)
        row.append((fwd_ms, bwd_ms))
    ref = "n/a"
    if p != "sink":
        try:
            ref = B.bench_one(cudnn(case), xs[:3], do)[1]
        except Exception as exc:
            ref = f"n/a ({str(exc)[:40]})"
    ratio = f"{ref / row[0][1]:.2f}" if isinstance(ref, float) else ""
    ref_s = f"{ref:.3f}" if isinstance(ref, float) else ref
    print(f"| {case[1:]} {p} | {row[0][0]:.3f} | {row[0][1]:.3f} | {row[1][1]:.3f} | {ref_s} | "
          f"{row[1][1] / row[0][1]:.3f}x | {bwd_flops / row[0][1] / 1e9:.0f} | {ratio} |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
