"""The attention forward and backward on two blocks an SM, against the package's kernels and
SDPA's cuDNN, through run_forward / run_backward (host included), on the H200:

    timeout 540 python docs/profiling/two_blocks_probe.py

Each variant is the package's own kernel at a tiling of one consumer warpgroup (threads 128, 64
rows a block) with blocks_per_sm = 2, which leaves room for two blocks an SM (shared memory under
~113 KB each): `__launch_bounds__(256, 2)`, registers shared out as 232 for the consumers and 24
for the producer (kernels.py's split_registers). Why: the package's blocks (two consumer warpgroups, 128 rows,
168 registers a thread) fill an SM's registers alone, so each block's prologue and epilogue run
exposed (runs 92 and 98: cuDNN's kernels overlap them), and its two warpgroups wait on their
WGMMAs in step (run 106: 19% of the backward's stall samples). Two blocks run out of step. What
may cost: each 64-row block loads K and V (forward) or Q and dO (backward) for half the rows the
package's block serves, twice the L2 traffic. The same 64-row tilings on one block an SM were
1.4-2.9x slower than the package's in `opgen tune` (runs 34-94).

Outputs are compared with the package's first, at odd lengths (forward: O and lse; backward:
every gradient), then each phase is timed with the bench's stream_ms, the package, the variants
and cuDNN interleaved over 3 rounds, the best of each. TILINGS="fwd:64x128s2,bwd:64x64s2" keeps
some (per head dim, those that fit).
"""
import copy
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from generated.attention import autograd as MHA, kernels as MHA_K, bench_attention as B
from generated.attention_sink import autograd as SINK, kernels as SINK_K
from generated.gqa import autograd as GQA, kernels as GQA_K

T0 = time.perf_counter()
PACKAGES = {"mha": (MHA, MHA_K), "gqa": (GQA, GQA_K), "sink": (SINK, SINK_K)}
# (package, batch, heads, kv_heads, seq_len, head_dim, causal, dtype, window)
ODD = [("mha", 2, 16, 16, 333, 128, False, "float16", 0), ("mha", 1, 16, 16, 1000, 64, True, "float16", 0),
       ("gqa", 2, 32, 8, 333, 128, True, "bfloat16", 0), ("sink", 1, 64, 8, 1000, 64, True, "bfloat16", 128),
       ("sink", 1, 32, 8, 777, 128, True, "bfloat16", 0)]
CASES = [("mha", 4, 16, 16, 4096, 128, False, "float16", 0), ("mha", 4, 16, 16, 4096, 128, True, "float16", 0),
         ("mha", 4, 16, 16, 4096, 64, False, "float16", 0), ("mha", 8, 16, 16, 2048, 64, True, "float16", 0),
         ("gqa", 2, 32, 8, 4096, 128, True, "bfloat16", 0), ("sink", 2, 32, 8, 4096, 128, True, "bfloat16", 0),
         ("sink", 1, 64, 8, 4096, 64, True, "bfloat16", 128)]
# Tilings (block_m x block_n, stages) per phase and head dim whose shared memory fits two blocks.
TILINGS = {("fwd", 64): ["64x128s2", "64x64s2"], ("fwd", 128): ["64x64s2", "64x128s1"],
           ("bwd", 64): ["64x64s2", "64x32s2"], ("bwd", 128): ["64x64s2", "64x64s1"]}
if os.environ.get("TILINGS"):
    wanted = {tuple(t.split(":")) for t in os.environ["TILINGS"].split(",")}
    TILINGS = {key: [t for t in names if (key[0], t) in wanted] for key, names in TILINGS.items()}


def tiling(name, package_tiling):
    """The package's tiling of a phase with block_m x block_n and stages from name ("64x128s2"),
    on one consumer warpgroup, two blocks an SM; a forward's without the overlap (it needs two
    warpgroups)."""
    m, rest = name.split("x")
    n, stages = rest.split("s")
    out = dict(package_tiling, block_m=int(m), block_n=int(n), threads=128, num_stages=int(stages),
               blocks_per_sm=2)
    if "overlap" in out:
        out["overlap"] = False
    return out


def tensors(p, b, h, kv, s, d, c, dt, w, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dtype = getattr(torch, dt)
    q, k, v = (torch.randn(b, s, n, d, device="cuda", dtype=dtype, generator=g) for n in (h, kv, kv))
    do = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    sinks = (torch.randn(h, device="cuda", generator=g),) if p == "sink" else ()
    return q, k, v, sinks, do


def fwd_call(case, name):
    """(factory, args, tiling) of the variant forward a case runs: the paired kernel where the
    package would pair the variant's query blocks."""
    p, b, h, kv, s, d, c, dt, w = case
    A, K = PACKAGES[p]
    factory, args, own = A.variant_calls(h, kv, d, c, w, "bshd", dt, d ** -0.5, *A.reductions(h, kv))["fwd"]
    t = tiling(name, own)
    if K.pairs_query_blocks(c, w, s, t["block_m"]):
        t = K.paired_tiling(t)
    return factory, args, t


def bwd_call(case, name):
    p, b, h, kv, s, d, c, dt, w = case
    A = PACKAGES[p][0]
    factory, args, own = A.variant_calls(h, kv, d, c, w, "bshd", dt, d ** -0.5, *A.reductions(h, kv))["bwd"]
    return factory, args, tiling(name, own)


def key_of(factory, args, t):
    return factory.func.__name__, args, tuple(sorted(t.items()))


BUILT = {}


def variant_jobs(cases):
    """{kernel key: (factory, prim_func)} of every variant kernel the cases run."""
    jobs = {}
    for case in cases:
        d = case[5]
        for phase, call in (("fwd", fwd_call), ("bwd", bwd_call)):
            for name in TILINGS[phase, d]:
                factory, args, t = call(case, name)
                key = key_of(factory, args, t)
                if key not in jobs:
                    jobs[key] = (factory, factory.get_tir(*args, **t))
    return jobs


def build_all(cases):
    """Every variant kernel the cases run, built at once in threads (as the package's prebuild)."""
    jobs = variant_jobs(cases)
    with ThreadPoolExecutor(16) as pool:
        futures = {key: pool.submit(MHA.build_entry_point, *job) for key, job in jobs.items()}
        for key, future in futures.items():
            try:
                BUILT[key] = future.result()
            except Exception as exc:  # reported per variant below
                BUILT[key] = exc
                print(f"build failed: {key[0]} {dict(key[2])}: {str(exc).splitlines()[-1][:200]}", flush=True)
    print(f"built {len(jobs)} variant kernels in {time.perf_counter() - T0:.0f} s", flush=True)


def cpu_check(cases):
    """On the CPU (no GPU needed): each variant kernel lowered and compiled for sm_90a, with the
    launch bounds and register split TileLang wrote, and ptxas's registers, spills and C75xx
    notes: what must hold before the GPU call."""
    import re

    from ptxas_check import ptxas_notes

    for key, (factory, prim_func) in variant_jobs(cases).items():
        kernel = MHA.build(factory, prim_func)
        source = kernel.get_kernel_source()
        print(key[0], dict(key[2]), re.findall(r"__launch_bounds__\([^)]*\)", source),
              re.findall(r"warpgroup_reg_\w+<\d+>", source),
              "ptxas (registers, spill bytes, notes):", ptxas_notes(kernel, key[0]), flush=True)


def plans(case, q, k):
    """The package's CallPlan, and per phase and tiling name a copy running the variant kernel
    (None where it did not build)."""
    p, b, h, kv, s, d, c, dt, w = case
    A, K = PACKAGES[p]
    plan = A.CallPlan(q, k, c, w, "bshd", d ** -0.5, *A.reductions(h, kv))
    variants = {}
    for phase, call in (("fwd", fwd_call), ("bwd", bwd_call)):
        for name in TILINGS[phase, d]:
            factory, args, t = call(case, name)
            built = BUILT[key_of(factory, args, t)]
            if isinstance(built, Exception):
                variants[phase, name] = None
                continue
            variant = variants[phase, name] = copy.copy(plan)
            setattr(variant, phase, built)
            if phase == "fwd" and hasattr(plan, "fwd_scalars"):  # the heads a block walks
                variant.fwd_scalars = (
                    (K.heads_per_block(b, h, s, t, A.sm_count(q.device)),)
                    if K.walks_heads(w, t["block_m"], t["block_n"]) else ())
    return plan, variants


def forward(case, plan, q, k, v, sinks):
    p, b, h, kv, s, d, c, dt, w = case
    return PACKAGES[p][0].run_forward(q, k, v, *sinks, c, w or None, "bshd", d ** -0.5, plan=plan)


def backward(case, plan, q, k, v, sinks, o, lse, do):
    p, b, h, kv, s, d, c, dt, w = case
    A = PACKAGES[p][0]
    return A.run_backward(q, k, v, *sinks, o, lse, do, c, w or None, "bshd", d ** -0.5,
                          *A.reductions(h, kv), plan=plan)


def case_name(p, b, h, kv, s, d, c, dt, w):
    return f"{p} B{b} H{h}/{kv} S{s} D{d} {'causal' if c else 'full'}{f' window {w}' if w else ''} {dt}"


def cudnn(case, q, k, v, do):
    """SDPA's cuDNN forward and backward on the same tensors, or None where it cannot (sinks)."""
    p, b, h, kv, s, d, c, dt, w = case
    if p == "sink":
        return None
    qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
    dot = do.transpose(1, 2)

    def fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=c, enable_gqa=h != kv)

    out = fwd()
    return fwd, lambda: torch.autograd.grad(out, (qt, kt, vt), dot, retain_graph=True)


def main():
    build_all(ODD + CASES)
    bad = 0
    for case in ODD:
        q, k, v, sinks, do = tensors(*case, seed=1)
        plan, variants = plans(case, q, k)
        o, lse = forward(case, plan, q, k, v, sinks)
        grads = backward(case, plan, q, k, v, sinks, o, lse, do)
        for (phase, name), variant in variants.items():
            if variant is None:
                print(f"--  {phase} {name}: not built", flush=True)
                continue
            if phase == "fwd":  # lse's rows past seq_len are padding
                o_got, lse_got = forward(case, variant, q, k, v, sinks)
                got, ref = (o_got, lse_got[..., :case[4]]), (o, lse[..., :case[4]])
                what = "O lse"
            else:
                got, ref = backward(case, variant, q, k, v, sinks, o, lse, do), grads
                what = "dq dk dv" + (" dsinks" if sinks else "")
            diffs = [(x.float() - y.float()).abs().max().item() for x, y in zip(got, ref) if x.numel()]
            ok = all(x <= 2e-2 for x in diffs) and all(torch.isfinite(x).all().item() for x in got)
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {phase} {name:9s} {case_name(*case)}: max diff {what} "
                  + " ".join(f"{x:.1e}" for x in diffs), flush=True)
    print("all correct" if not bad else f"{bad} WRONG", flush=True)

    for phase in ("fwd", "bwd"):
        print(f"\n| case | package {phase} ms | variants ({phase} ms) | cuDNN ms | best / package | package / cuDNN | best / cuDNN |")
        print("|---|---|---|---|---|---|---|")
        for case in CASES:
            q, k, v, sinks, do = tensors(*case)
            plan, variants = plans(case, q, k)
            o, lse = forward(case, plan, q, k, v, sinks)
            runs = {"package": plan, **{name: pl for (ph, name), pl in variants.items() if ph == phase and pl}}
            if phase == "fwd":
                timed = {name: (lambda pl=pl: forward(case, pl, q, k, v, sinks)) for name, pl in runs.items()}
            else:
                timed = {name: (lambda pl=pl: backward(case, pl, q, k, v, sinks, o, lse, do)) for name, pl in runs.items()}
            ref = cudnn(case, q, k, v, do)
            if ref is not None:
                timed["cuDNN"] = ref[0] if phase == "fwd" else ref[1]
            times = {name: [] for name in timed}
            for _ in range(3):
                for name, fn in timed.items():
                    times[name].append(B.stream_ms(fn))
            best = {name: min(t) for name, t in times.items()}
            names = [n for n in best if n not in ("package", "cuDNN")]
            top = min((best[n] for n in names), default=float("nan"))
            ref_ms = best.get("cuDNN", float("nan"))
            print(f"| {case_name(*case)} | {best['package']:.3f} | "
                  + ", ".join(f"{n} {best[n]:.3f}" for n in names)
                  + f" | {ref_ms:.3f} | {top / best['package']:.3f} | {ref_ms / best['package']:.3f} | {ref_ms / top:.3f} |",
                  flush=True)
    print(f"done in {time.perf_counter() - T0:.0f} s")


if __name__ == "__main__":
    if sys.argv[1:] == ["--cpu"]:
        cpu_check(ODD + CASES)
    else:
        main()
