"""Grouped dK/dV in the attention backward: two reductions side by side through the public
functions, in one process, with SDPA cuDNN beside the GQA cases.

Run 57 (docs/gpu-runs.md) compared the reductions the specs shipped then (gqa: split,
attention_sink: atomic) with in_block (one block per KV head walks every query head of its
group and sums dK/dV in registers), which they ship now. The second version of each package is
the shipped spec with [grads.dk] / [grads.dv] set to the reduction to compare and its name
suffixed _ib, built next to the repository's generated/ (`opgen build --no-compile --out
gpu_variants <specs>`); on the H200:
`PYTHONPATH=$PYTHONPATH:$PWD:$PWD/gpu_variants python docs/profiling/dkv_modes_probe.py`. Each
case: the gradients of both versions compared (they differ only in the order of fp32 adds),
then fwd and bwd timed with the package bench's bench_one (host included). The table's columns
read "shipped" and "in_block" as in run 57.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.join(os.getcwd(), "gpu_variants"))
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from generated.gqa import autograd as gqa, bench_gqa as B
from generated.attention_sink import autograd as sink
import gqa_ib.autograd as gqa_ib
import attention_sink_ib.autograd as sink_ib

T0 = time.perf_counter()
# name -> (shipped module, in_block module, shipped fn, in_block fn)
PACKAGES = {
    "gqa": (gqa, gqa_ib, gqa.gqa, gqa_ib.gqa_ib),
    "sink": (sink, sink_ib, sink.attention_sink, sink_ib.attention_sink_ib),
}
# (package, batch, heads, kv_heads, seq_len, head_dim, causal, window): the bench shapes.
TIMED = [
    ("gqa", 2, 32, 8, 4096, 128, True, None), ("gqa", 2, 32, 8, 4096, 128, False, None),
    ("gqa", 1, 32, 8, 16384, 128, True, None), ("gqa", 8, 16, 2, 2048, 64, True, None),
    ("sink", 2, 32, 8, 4096, 128, True, None), ("sink", 2, 32, 8, 4096, 128, True, 1024),
    ("sink", 1, 64, 8, 4096, 64, True, 128),
]
ODD = [
    ("gqa", 1, 32, 8, 1000, 128, True, None), ("gqa", 2, 32, 8, 333, 64, False, None),
    ("gqa", 1, 12, 3, 77, 64, True, None), ("sink", 1, 32, 8, 1000, 64, True, 100),
    ("sink", 2, 32, 8, 333, 128, True, None), ("sink", 1, 64, 8, 4097, 64, True, 128),
]


def calls(which, case):
    _, _, h, kv, _, d, causal, window = case
    A = PACKAGES[case[0]][which]
    return A.variant_calls(h, kv, d, causal, window or 0, "bshd", "bfloat16", d ** -0.5,
                           *A.reductions(h, kv)).values()


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
    torch.manual_seed(0)
    q = torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    k = torch.randn(b, s, kv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    v = torch.randn(b, s, kv, d, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    xs = [q, k, v]
    if p == "sink":
        xs.append(torch.randn(h, device="cuda", requires_grad=True))
    return xs, torch.randn_like(q)


def fn_of(which, case):
    p, causal, window = case[0], case[6], case[7]
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
                enable_gqa=True)
        return o.transpose(1, 2)

    return run


print("# gradients, in_block vs shipped (max |diff| / max |shipped|): dq dk dv (dsinks)")
worst = 0.0
for case in ODD + TIMED:
    xs, do = inputs_of(case)
    grads = [torch.autograd.grad(fn_of(w, case)(*xs), xs, do) for w in (0, 1)]
    errs = [((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()
            for a, b in zip(grads[1], grads[0])]
    finite = all(torch.isfinite(g).all().item() for g in grads[1])
    worst = max(worst, *errs)
    print(case, "rel err", " ".join(f"{e:.1e}" for e in errs), "finite" if finite else "NOT FINITE",
          flush=True)
print(f"worst rel err {worst:.2e} ({'OK' if worst < 2e-2 else 'TOO LARGE'})", flush=True)

print("\n| case | shipped fwd / bwd ms | in_block fwd / bwd ms | cuDNN fwd / bwd ms | bwd speedup "
      "(shipped / in_block) | in_block bwd TF/s | in_block bwd vs cuDNN |")
print("|---|---|---|---|---|---|---|")
for case in TIMED:
    p, b, h, kv, s, d, causal, window = case
    xs, do = inputs_of(case)
    pairs = s * s if not causal else (
        s * (s + 1) // 2 if not window else sum(min(i + 1, window) for i in range(s)))
    bwd_flops = 2.5 * 4 * b * h * d * pairs
    rows = [B.bench_one(fn_of(w, case), xs, do) for w in (0, 1)]
    ref, ratio = "n/a", ""
    if p == "gqa":
        ref_ms = B.bench_one(cudnn(case), xs[:3], do)
        ref, ratio = f"{ref_ms[0]:.3f} / {ref_ms[1]:.3f}", f"{ref_ms[1] / rows[1][1]:.2f}x"
    print(f"| {p} {case[1:]} | {rows[0][0]:.3f} / {rows[0][1]:.3f} | {rows[1][0]:.3f} / "
          f"{rows[1][1]:.3f} | {ref} | {rows[0][1] / rows[1][1]:.3f}x | "
          f"{bwd_flops / rows[1][1] / 1e9:.0f} | {ratio} |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
