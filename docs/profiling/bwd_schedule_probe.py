"""Backward schedules (bwd_schedules.py) and tilings vs the package backward vs SDPA cuDNN: every
variant replaces the package's bwd kernel inside run_backward (same buffers, same preprocess,
postprocess and dK/dV reduction), is checked against the package's own gradients at odd lengths,
then timed at the bench shapes (`stream_ms`, all backward phases, host included).
On the H200: `source .gpu/env.sh && python docs/profiling/bwd_schedule_probe.py` (~2 minutes)."""
import os, sys, time, threading
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "docs", "profiling"))
import torch
import torch.nn.functional as Fn
from torch.nn.attention import sdpa_kernel, SDPBackend
from concurrent.futures import ThreadPoolExecutor
import bwd_schedules as S
from generated.attention import autograd as MHA, kernels as MHA_K, bench_attention as B
from generated.gqa import autograd as GQA, kernels as GQA_K

T0 = time.perf_counter()
# (package, b, h, kv, s, d, causal, dtype)
CASES = [("mha", 4, 16, 16, 4096, 128, False, "float16"), ("mha", 4, 16, 16, 4096, 128, True, "float16"),
         ("mha", 8, 16, 16, 2048, 64, False, "float16"), ("mha", 8, 16, 16, 2048, 64, True, "float16"),
         ("gqa", 2, 32, 8, 4096, 128, True, "bfloat16"), ("gqa", 2, 32, 8, 4096, 128, False, "bfloat16")]
ODD = [("mha", 2, 16, 16, 333, 128, True, "float16"), ("mha", 3, 16, 16, 77, 64, False, "float16"),
       ("mha", 1, 16, 16, 1000, 64, True, "float16"), ("mha", 1, 16, 16, 4097, 128, True, "float16"),
       ("gqa", 1, 32, 8, 1000, 128, True, "bfloat16"), ("gqa", 2, 32, 8, 333, 128, False, "bfloat16")]
# name -> (the package's kernels module factory or S.bwd_overlap, tiling); None = the package's.
CONFIGS = {
    "shipped tiling, overlap": ("overlap", (128, 32, 256, 2)),
    "64x128 t128 s2": ("plain", (64, 128, 128, 2)),
    "64x128 t128 s2, overlap": ("overlap", (64, 128, 128, 2)),
    "128x64 t256 s2, overlap": ("overlap", (128, 64, 256, 2)),
}
PACKAGES = {"mha": (MHA, MHA_K), "gqa": (GQA, GQA_K)}
variants = sorted({(p, h, kv, d, c, dt) for p, _, h, kv, _, d, c, dt in CASES + ODD})


def calls_of(p, h, kv, d, c, dt):
    A = PACKAGES[p][0]
    return A.variant_calls(h, kv, d, c, 0, "bshd", dt, d ** -0.5, *A.reductions(h, kv))


jobs = {}
for name, (schedule, tiling) in CONFIGS.items():
    for v in variants:
        p, h, kv, d, c, dt = v
        shipped = MHA_K.attention_bwd if p == "mha" else GQA_K.gqa_bwd
        factory = S.bwd_overlap if schedule == "overlap" else shipped
        args = calls_of(*v)["bwd"][1]
        jobs[(name, v)] = (factory, (*args, *tiling))
committed = [threading.Thread(target=lambda p=p: PACKAGES[p][0].prebuild(
    [call for v in variants if v[0] == p for call in calls_of(*v).values()])) for p in PACKAGES]
for t in committed:
    t.start()


def build(job):
    factory, args = job
    try:
        return MHA.entry_point(MHA.build(factory, factory.get_tir(*args)))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"


with ThreadPoolExecutor(16) as pool:
    built = dict(zip(jobs, pool.map(build, jobs.values())))
for t in committed:
    t.join()
print(f"built {len(built)} variant kernels + the packages' in {time.perf_counter() - T0:.0f} s", flush=True)
for key, k in built.items():
    if isinstance(k, str):
        print("BUILD FAILED", key, k)


def backward_with(v, entry):
    """The package's run_backward with its bwd kernel replaced by entry (None: the package's)."""
    A = PACKAGES[v[0]][0]
    key = A.kernel_key(*calls_of(*v)["bwd"])
    shipped = A.KERNELS[key]
    if entry is not None:
        A.KERNELS[key] = entry

    def run(q, k, vv, o, lse, do, c):
        return A.run_backward(q, k, vv, o, lse, do, c, None, "bshd", q.shape[-1] ** -0.5)

    return run, lambda: A.KERNELS.__setitem__(key, shipped)


def inputs(b, h, kv, s, d, dt, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, dt)
    q, k, v = (torch.randn(b, s, n, d, device="cuda", dtype=dtype, generator=g) for n in (h, kv, kv))
    do = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    return q, k, v, do


print("# correctness vs the package's backward (max abs diff of dq, dk, dv)")
bad = 0
for p, b, h, kv, s, d, c, dt in ODD:
    v = (p, h, kv, d, c, dt)
    A = PACKAGES[p][0]
    q, k, vv, do = inputs(b, h, kv, s, d, dt, 1)
    o, lse = A.run_forward(q, k, vv, c, None, "bshd", d ** -0.5)
    run, restore = backward_with(v, None)
    ref = run(q, k, vv, o, lse, do, c)
    for name in CONFIGS:
        entry = built[(name, v)]
        if isinstance(entry, str):
            continue
        run, restore = backward_with(v, entry)
        got = run(q, k, vv, o, lse, do, c)
        restore()
        torch.cuda.synchronize()
        diffs = [(x.float() - y.float()).abs().max().item() for x, y in zip(got, ref)]
        tol = 2e-2 if dt == "bfloat16" else 1e-2
        ok = all(x < tol for x in diffs) and all(torch.isfinite(x).all().item() for x in got)
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:26s} {p} B{b} H{h}/{kv} S{s} D{d} causal={c} {dt}: "
              + " ".join(f"{x:.2e}" for x in diffs), flush=True)
print("all correct" if not bad else f"{bad} WRONG")

print("| case | package | " + " | ".join(CONFIGS) + " | cuDNN |")
print("|---" * (3 + len(CONFIGS)) + "|")
for p, b, h, kv, s, d, c, dt in CASES:
    v = (p, h, kv, d, c, dt)
    A = PACKAGES[p][0]
    q, k, vv, do = inputs(b, h, kv, s, d, dt)
    o, lse = A.run_forward(q, k, vv, c, None, "bshd", d ** -0.5)
    flops = 2.5 * 4 * b * h * d * (s * (s + 1) / 2 if c else s * s)
    row = []
    for entry in [None] + [built[(n, v)] for n in CONFIGS]:
        if isinstance(entry, str):
            row.append("failed"); continue
        run, restore = backward_with(v, entry)
        ms = B.stream_ms(lambda: run(q, k, vv, o, lse, do, c))
        restore()
        row.append(f"{flops / ms / 1e9:.0f}")
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, vv))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=c, enable_gqa=h != kv)
        dot = do.transpose(1, 2)
        ms = B.stream_ms(lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True))
    row.append(f"{flops / ms / 1e9:.0f}")
    print(f"| {p} B{b} H{h}/{kv} S{s} D{d} {'causal' if c else 'full'} {dt} | " + " | ".join(row) + " |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
