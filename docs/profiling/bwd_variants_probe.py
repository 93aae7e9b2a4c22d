"""Backward variants against the package's backward, through run_backward (preprocess, bwd,
postprocess, host included), on the H200:

    timeout 500 python docs/profiling/bwd_variants_probe.py

- pairs: dQ's fp32 accumulator laid out so that each thread's two adjacent columns are adjacent
  floats (each 8x8 block of dQ row-major): TileLang vectorizes the dQ atomics to one 8-byte add
  per pair (16 a step per thread at D128 128x64, not 32). The package's layout keeps each 8x8
  block in the GEMM fragment's order: one 4-byte add per element.
- overlap: bwd_schedules.bwd_overlap (async WGMMA: the two score-side GEMMs together, P computed
  while dP's is in flight, dS while dV's is) at the package's tiling.
- overlap + pairs: both.
- NAME@MxNsK: the variant at bwd tiling block_m M, block_n N, K stages (else the package's).
- no-dq-atomics, no-dq: bwd_ablations (timing only: dQ is wrong by design, so the gradient check
  skips them). `VARIANTS="no-dq-atomics,no-dq" python docs/profiling/bwd_variants_probe.py`:
  what the dQ path costs the backward.
- bulk-dq: the package's bwd with the tiling key bulk_dq (dQ staged and added by bulk
  reduce-adds), and its postprocess reading that layout.
- pingpong: bwd_pingpong.bwd_pingpong (two consumer warpgroups of 64 keys taking turns at the
  tensor cores, a partial dQ each, summed in shared memory and added by a writer warp) at the
  package's block_n and stages (block_m 128, 256 threads), with the bulk_dq postprocess;
  pingpong-bulk: its dQ partials added by the writer each as it is (dq_sum="bulk").
- free, free-bulk: pingpong and pingpong-bulk without the turns (turns=False): the two
  warpgroups run on their own, coupled only by the partial dQ hand-off (free) or not at all
  (free-bulk).
- cluster: bwd_cluster.bwd_cluster (key blocks in clusters of two, rank 1's dQ tile added to
  rank 0's in shared memory before one bulk add) at the package's block_n and stages, with the
  bulk_dq postprocess; a windowed, descending or in_block case runs the package's bwd (so
  only the MHA cases time it).

Each case: the package's CallPlan, and copies of it whose three backward phases are replaced
(the package's own preprocess and postprocess but for pairs, whose postprocess reads the
accumulator's layout, bulk-dq's too, and the bwd_ablations variants, which bring all three). Gradients are
compared first at odd lengths (dQ differs only in the order of fp32 adds; the overlap's dK and
dV in the order of MMA accumulation), then the backward is timed with the bench's stream_ms,
package and variants interleaved over 3 rounds, the best of each. VARIANTS="pairs" keeps some.
"""
import copy
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
import tilelang.language as T
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwd_schedules as S
from bwd_cluster import bwd_cluster
from bwd_pingpong import bwd_pingpong
from bwd_ablations import ABLATIONS, edited_kernels

from generated.attention import autograd as MHA, kernels as MHA_K, bench_attention as B
from generated.attention_sink import autograd as SINK, kernels as SINK_K
from generated.gqa import autograd as GQA, kernels as GQA_K

T0 = time.perf_counter()
PACKAGES = {"mha": (MHA, MHA_K), "gqa": (GQA, GQA_K), "sink": (SINK, SINK_K)}
PACKAGE_DIRS = {"mha": "attention", "gqa": "gqa", "sink": "attention_sink"}
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


VARIANTS = os.environ.get("VARIANTS", "pairs,overlap,overlap + pairs").split(",")
BUILT = {}  # (package, heads, kv_heads, head_dim, causal, window, dtype, variant) -> (bwd, postprocess)


def variant_key(case):
    p, b, h, kv, s, d, c, dt, w = case
    return p, h, kv, d, c, w, dt


def edit_of(name):
    """The variant a name asks for, without its tiling ("bulk-dq@128x64s2" -> "bulk-dq")."""
    return name.split("@")[0]


def tiling_of(name, package_tiling):
    """The bwd tiling of a variant: the package's, or the one its name gives after "@"
    ("overlap@128x64s2": block_m 128, block_n 64, 2 stages); bulk-dq's with bulk_dq."""
    if edit_of(name) == "bulk-dq":
        package_tiling = dict(package_tiling, bulk_dq=True)
    if edit_of(name).startswith(("pingpong", "free")) or edit_of(name) == "cluster":
        package_tiling = dict(package_tiling, block_m=128, threads=256, blocks_per_sm=1, bulk_dq=True)
    if edit_of(name) in ("pingpong-bulk", "free-bulk"):
        package_tiling = dict(package_tiling, dq_sum="bulk")
    if edit_of(name) in ("free", "free-bulk"):
        package_tiling = dict(package_tiling, turns=False)
    if "@" not in name:
        return package_tiling
    m, rest = name.split("@")[1].split("x")
    n, stages = rest.split("s")
    return dict(package_tiling, block_m=int(m), block_n=int(n), num_stages=int(stages))


def build_variants(cases):
    """Every variant's bwd and postprocess of every case, built at once in threads (as the
    package's prebuild does): the prim_funcs made one by one (each with its `_dq_layout` swapped
    in), then compiled together."""
    jobs = {}
    for key in sorted({variant_key(case) for case in cases}):
        p, h, kv, d, c, w, dt = key
        A, K = PACKAGES[p]
        calls = A.variant_calls(h, kv, d, c, w, "bshd", dt, d ** -0.5, *A.reductions(h, kv))
        shipped = K._dq_layout
        for name in VARIANTS:
            bwd_factory = S.bwd_overlap if "overlap" in name else calls["bwd"][0]
            if edit_of(name).startswith(("pingpong", "free")):
                bwd_factory = bwd_pingpong
            bwd_tiling = tiling_of(name, calls["bwd"][2])
            if edit_of(name) == "cluster":
                if w or bwd_tiling.get("descending") or calls["bwd"][1][8] == "in_block":
                    bwd_tiling = calls["bwd"][2]  # what it does not do: the package's own backward
                else:
                    bwd_factory = bwd_cluster
            (pre_factory, pre_args, pre_tiling), (post_factory, post_args, post_tiling) = (
                calls["preprocess"], calls["postprocess"])
            # The postprocess reads the bulk_dq layout.
            if edit_of(name) in ("bulk-dq", "pingpong", "pingpong-bulk", "free", "free-bulk") or bwd_factory is bwd_cluster:
                post_tiling = K.postprocess_tiling(post_tiling, True)
            if edit_of(name) in ABLATIONS:  # the edited module's three backward phases
                E = edited_kernels(PACKAGE_DIRS[p], edit_of(name))
                bwd_factory, pre_factory, post_factory = (
                    getattr(E, f.func.__name__) for f in (bwd_factory, pre_factory, post_factory))
            K._dq_layout = S._dq_layout = pairs_layout if "pairs" in name else shipped
            try:
                jobs[key + (name,)] = (
                    (pre_factory, pre_factory.get_tir(*pre_args, **pre_tiling)),
                    (bwd_factory, bwd_factory.get_tir(*calls["bwd"][1], **bwd_tiling)),
                    (post_factory, post_factory.get_tir(*post_args, **post_tiling)))
            finally:
                K._dq_layout = S._dq_layout = shipped
    with ThreadPoolExecutor(16) as pool:
        futures = {key: [pool.submit(PACKAGES[key[0]][0].build_entry_point, *job) for job in pair]
                   for key, pair in jobs.items()}
        for key, pair in futures.items():
            BUILT[key] = tuple(f.result() for f in pair)
    print(f"built {3 * len(jobs)} variant kernels in {time.perf_counter() - T0:.0f} s", flush=True)


def plans(case, q, k):
    """The package's CallPlan and each variant's: a copy with its bwd and postprocess."""
    p, b, h, kv, s, d, c, dt, w = case
    A = PACKAGES[p][0]
    reds = A.reductions(h, kv)
    plan = A.CallPlan(q, k, c, w, "bshd", d ** -0.5, *reds)
    variants = {}
    for name in VARIANTS:
        variant = variants[name] = copy.copy(plan)
        variant.preprocess, variant.bwd, variant.postprocess = BUILT[variant_key(case) + (name,)]
    return plan, variants, reds


def backward(p, plan, reds, q, k, v, sinks, o, lse, do, c, w, d):
    A = PACKAGES[p][0]
    return A.run_backward(q, k, v, *sinks, o, lse, do, c, w or None, "bshd", d ** -0.5, *reds, plan=plan)


def case_name(p, b, h, kv, s, d, c, dt, w):
    return f"{p} B{b} H{h}/{kv} S{s} D{d} {'causal' if c else 'full'}{f' window {w}' if w else ''} {dt}"


build_variants(ODD + CASES)
bad = 0
for case in ODD:
    p, b, h, kv, s, d, c, dt, w = case
    A = PACKAGES[p][0]
    q, k, v, sinks, do = tensors(*case, seed=1)
    plan, variants, reds = plans(case, q, k)
    o, lse = A.run_forward(q, k, v, *sinks, c, w or None, "bshd", d ** -0.5, plan=plan)
    ref = backward(p, plan, reds, q, k, v, sinks, o, lse, do, c, w, d)
    for name, variant in variants.items():
        if edit_of(name) in ABLATIONS:
            continue  # wrong by design: timed only
        got = backward(p, variant, reds, q, k, v, sinks, o, lse, do, c, w, d)
        diffs = [(x.float() - y.float()).abs().max().item() for x, y in zip(got, ref)]
        ok = all(x <= 2e-2 for x in diffs) and all(torch.isfinite(x).all().item() for x in got)
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:16s} {case_name(*case)}: max diff dq dk dv{' dsinks' if sinks else ''} "
              + " ".join(f"{x:.1e}" for x in diffs), flush=True)
print("all correct" if not bad else f"{bad} WRONG", flush=True)

print("| case | package bwd ms | " + " | ".join(f"{n} ms" for n in VARIANTS) + " | best / package |")
print("|---" * (3 + len(VARIANTS)) + "|")
for case in CASES:
    p, b, h, kv, s, d, c, dt, w = case
    A = PACKAGES[p][0]
    q, k, v, sinks, do = tensors(*case)
    plan, variants, reds = plans(case, q, k)
    o, lse = A.run_forward(q, k, v, *sinks, c, w or None, "bshd", d ** -0.5, plan=plan)
    runs = {"package": plan, **variants}
    times = {name: [] for name in runs}
    for _ in range(3):
        for name, pl in runs.items():
            times[name].append(B.stream_ms(lambda: backward(p, pl, reds, q, k, v, sinks, o, lse, do, c, w, d)))
    best = {name: min(t) for name, t in times.items()}
    print(f"| {case_name(*case)} | {best['package']:.3f} | " + " | ".join(f"{best[n]:.3f}" for n in VARIANTS)
          + f" | {min(best[n] for n in VARIANTS) / best['package']:.3f} |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
