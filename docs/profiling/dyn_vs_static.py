"""The attention kernels before (static batch/seq_len, commit 2c26cb1) and now (symbolic), one run:
fwd kernel and main bwd kernel time at the bench shapes (fp16, bshd, MHA)."""
import os, sys, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), ".prof"))  # static_kernels.py: git show 2c26cb1:generated/attention/kernels.py
import torch
import static_kernels as S
from generated.attention import autograd as A

CASES = [(4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (8, 16, 2048, 64, False), (8, 16, 2048, 64, True)]
DT = "float16"
t = time.perf_counter()
fwd_cfg = [dict(batch=b, heads=h, kv_heads=h, seq_len=s, dim=d, causal=c, window=0, layout="bshd", dtype=DT, **S.FWD_TILING) for b, h, s, d, c in CASES]
bwd_cfg = [dict(batch=b, heads=h, kv_heads=h, seq_len=s, dim=d, causal=c, window=0, layout="bshd", dtype=DT,
                dk_reduction="direct", dv_reduction="direct", **S.BWD_TILING) for b, h, s, d, c in CASES]
static_fwd = S.attention_fwd.par_compile(fwd_cfg)
static_bwd = S.attention_bwd.par_compile(bwd_cfg)
calls = []
for b, h, s, d, c in CASES:
    calls += A.variant_calls(h, h, d, c, 0, "bshd", DT, "direct", "direct").values()
A.prebuild(calls)
print(f"compiled {len(fwd_cfg) + len(bwd_cfg)} static + {len(A.KERNELS)} symbolic kernels in {time.perf_counter() - t:.0f} s", flush=True)


def ms(fn, reps=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return sorted(ts)[len(ts) // 2]


print("| B | H | S | D | causal | fwd static ms | fwd symbolic ms | symbolic/static | bwd static ms | bwd symbolic ms | symbolic/static |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for i, (b, h, s, d, c) in enumerate(CASES):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(b, s, h, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(4))
    calls = A.variant_calls(h, h, d, c, 0, "bshd", DT, "direct", "direct")
    fwd = A.launcher(calls["fwd"])
    o, lse = torch.empty_like(q), torch.empty(b, h, A.padded_rows(s), device="cuda")
    fwd(q, k, v, o, lse)
    o_static, lse_static = static_fwd[i](q, k, v)
    assert (o - o_static).abs().max().item() < 1e-2, "static and symbolic forward differ"
    delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
    pdelta = torch.zeros_like(lse)
    pdelta[..., :s] = delta
    dq = torch.zeros(b, A.padded_rows(s), h, d, device="cuda")
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    bwd = A.launcher(calls["bwd"])
    f_s = ms(lambda: static_fwd[i](q, k, v))
    f_d = ms(lambda: fwd(q, k, v, o, lse))
    b_s = ms(lambda: static_bwd[i](q, k, v, do, lse_static, delta, dq, dk, dv))
    b_d = ms(lambda: bwd(q, k, v, do, lse, pdelta, dq, dk, dv))
    print(f"| {b} | {h} | {s} | {d} | {c} | {f_s:.3f} | {f_d:.3f} | {f_s / f_d:.3f}x | {b_s:.3f} | {b_d:.3f} | {b_s / b_d:.3f}x |", flush=True)
