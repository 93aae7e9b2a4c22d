"""The sliding-window forward of generated/attention_sink at short windows (the gpt-oss shape:
1 x 64/8 heads, S4096, D64, window 128, causal, bf16) under other tilings than the one tuned at
window 0: correctness against the committed kernel (gpt-oss shape and odd lengths), then kernel
time (back-to-back launches) and the public function's time, next to FlexAttention.
`python docs/profiling/window_fwd_probe.py`."""
import os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from concurrent.futures import ThreadPoolExecutor
from generated.attention_sink import autograd as A
from generated.attention_sink import kernels as K
from generated.attention_sink import bench_attention_sink as B
from generated.attention_sink import attention_sink

T0 = time.perf_counter()
# (batch, heads, kv_heads, seq_len, head_dim, window)
CASES = [(1, 64, 8, 4096, 64, 128), (1, 64, 8, 16384, 64, 128), (2, 32, 8, 4096, 128, 128),
         (1, 64, 8, 4096, 64, 512), (2, 32, 8, 4096, 128, 1024)]
ODD = [(1, 64, 8, 1000, 64, 128), (2, 16, 2, 333, 64, 128), (1, 32, 8, 777, 128, 128), (1, 16, 2, 77, 64, 100)]
# block_m, block_n, threads, num_stages, overlap
CONFIGS = {
    "ov 128x128 s2": (128, 128, 256, 2, True),
    "ov 128x64 s2": (128, 64, 256, 2, True),
    "loop 128x128 s2": (128, 128, 256, 2, False),
    "loop 128x64 s2": (128, 64, 256, 2, False),
    "loop 128x64 s1": (128, 64, 256, 1, False),
    "loop 64x64 t128 s2": (64, 64, 128, 2, False),
    "loop 64x128 t128 s2": (64, 128, 128, 2, False),
    "loop 64x64 t128 s1": (64, 64, 128, 1, False),
    # No producer warpgroup (num_stages 0): fewer registers per block, two blocks per SM?
    "loop 128x128 s0": (128, 128, 256, 0, False),
    "loop 128x64 s0": (128, 64, 256, 0, False),
    "loop 64x64 t128 s0": (64, 64, 128, 0, False),
    "loop 64x128 t128 s0": (64, 128, 128, 0, False),
    "loop 128x64 t128 s2": (128, 64, 128, 2, False),
}
if os.environ.get("CONFIGS"):
    CONFIGS = {k: v for k, v in CONFIGS.items() if k in os.environ["CONFIGS"].split(",")}
variants = sorted({(h, kv, d, w) for _, h, kv, _, d, w in CASES + ODD})
DT = "bfloat16"


def committed_call(h, kv, d, w):
    return A.variant_calls(h, kv, d, True, w, "bshd", DT, d ** -0.5, *A.reductions(h, kv))["fwd"]


jobs = {}
for name, tiling in CONFIGS.items():
    for h, kv, d, w in variants:
        jobs[(name, h, kv, d, w)] = (h, kv, d, True, w, "bshd", DT, d ** -0.5, *tiling)


def build(args):
    try:
        return A.entry_point(A.build(K.attention_sink_fwd, K.attention_sink_fwd.get_tir(*args)))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"


A.prebuild([committed_call(*v) for v in variants])
with ThreadPoolExecutor(16) as pool:
    built = dict(zip(jobs, pool.map(build, jobs.values())))
print(f"built {len(built)} kernels in {time.perf_counter() - T0:.0f} s", flush=True)
for key, k in built.items():
    if isinstance(k, str):
        print("BUILD FAILED", key, k)


def inputs(b, h, kv, s, d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for n in (h, kv, kv))
    sinks = torch.randn(h, device="cuda", generator=g)
    return q, k, v, sinks


def launch(entry, q, k, v, sinks):
    b, s, h, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(b, h, (s + 7) // 8 * 8, device="cuda")
    entry(q, k, v, sinks, o, lse)
    return o, lse


print("# correctness vs the committed forward (max abs diff of O; of lse over real rows)")
bad = 0
for b, h, kv, s, d, w in ODD + CASES[:1]:
    q, k, v, sinks = inputs(b, h, kv, s, d, 1)
    ref_o, ref_lse = launch(A.launcher(committed_call(h, kv, d, w)), q, k, v, sinks)
    for name in CONFIGS:
        entry = built[(name, h, kv, d, w)]
        if isinstance(entry, str):
            continue
        o, lse = launch(entry, q, k, v, sinks)
        torch.cuda.synchronize()
        do = (o.float() - ref_o.float()).abs().max().item()
        dl = (lse[..., :s] - ref_lse[..., :s]).abs().max().item()
        ok = do < 2e-2 and dl < 1e-3 and torch.isfinite(o).all().item()
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:20s} B{b} H{h}/{kv} S{s} D{d} window {w}: O {do:.2e} lse {dl:.2e}", flush=True)
print("all correct" if not bad else f"{bad} WRONG")

print("\nkernel TF/s (back-to-back launches); public = attention_sink() with the committed tiling")
print("| case | committed | " + " | ".join(CONFIGS) + " | public | Flex |")
print("|---" * (4 + len(CONFIGS)) + "|")
for b, h, kv, s, d, w in CASES:
    q, k, v, sinks = inputs(b, h, kv, s, d)
    pairs = sum(min(i + 1, w) for i in range(s))
    flops = 4 * b * h * d * pairs
    row = []
    for entry in [A.launcher(committed_call(h, kv, d, w))] + [built[(n, h, kv, d, w)] for n in CONFIGS]:
        if isinstance(entry, str):
            row.append("failed"); continue
        o = torch.empty_like(q); lse = torch.empty(b, h, (s + 7) // 8 * 8, device="cuda")
        ms = B.stream_ms(lambda: entry(q, k, v, sinks, o, lse))
        row.append(f"{flops / ms / 1e9:.1f}")
    ms = B.stream_ms(lambda: attention_sink(q, k, v, sinks, causal=True, window=w))
    row.append(f"{flops / ms / 1e9:.1f}")
    try:
        flex = B.candidates(s, True, w, kv != h)
        flex = {n: f for n, f in flex.items() if "flex" in n.lower()}
        for name, fn in flex.items():
            with torch.no_grad():
                ms = B.stream_ms(lambda: fn(q, k, v, sinks))
            row.append(f"{flops / ms / 1e9:.1f}")
            break
        else:
            row.append("n/a")
    except Exception as exc:
        row.append(f"err {type(exc).__name__}: {str(exc)[:80]}")
    print(f"| B{b} H{h}/{kv} S{s} D{d} window {w} | " + " | ".join(row) + " |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
