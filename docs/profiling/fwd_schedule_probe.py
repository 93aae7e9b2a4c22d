"""The package forward's two key-loop schedules side by side (overlap=False: GEMM, softmax, GEMM
one after the other; overlap=True: the next block's QK^T issued next to this block's PV as async
WGMMA) vs the committed variant (its spec's tiling) vs SDPA (cuDNN, flash): correctness at odd
lengths against the committed kernel, then kernel time at the bench shapes:
`python docs/profiling/fwd_schedule_probe.py`. The overlapped loop was first written here as a
separate kernel (runs 31 and 36, with a ping-pong variant of two warpgroups taking turns that lost
10-20%; both in git history before session 9) and is now the template's `overlap = true`."""
import os, sys, time, threading
sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as Fn
from torch.nn.attention import sdpa_kernel, SDPBackend
from concurrent.futures import ThreadPoolExecutor
from generated.attention import autograd as A
from generated.attention import kernels as K
from generated.attention import bench_attention as B
sys.path.insert(0, os.path.dirname(__file__))
from attention_probe_tensors import inputs, launch, pad8

T0 = time.perf_counter()
CASES = [(4, 16, 16, 4096, 128, False, "float16"), (4, 16, 16, 4096, 128, True, "float16"),
         (8, 16, 16, 2048, 64, False, "float16"), (8, 16, 16, 2048, 64, True, "float16"),
         (2, 32, 8, 4096, 128, True, "bfloat16"), (2, 32, 8, 4096, 128, False, "bfloat16")]
# ODD_D=64: only the odd shapes of that head dim (a config too big at the other one is left out).
ODD = [o for o in [(2, 16, 16, 333, 128, True, "float16"), (2, 16, 16, 333, 128, False, "float16"),
       (1, 16, 16, 1000, 64, True, "float16"), (3, 16, 16, 77, 64, False, "float16"),
       (1, 16, 16, 4097, 128, True, "float16"), (1, 32, 8, 1000, 128, True, "bfloat16"),
       (1, 16, 16, 128, 64, True, "float16"), (1, 16, 16, 1, 128, False, "float16")]
       if os.environ.get("ODD_D") is None or o[4] == int(os.environ["ODD_D"])]
CONFIGS = {
    "overlap 128x128 s2": (K.attention_fwd, (128, 128, 256, 2, True)),
    "overlap 128x128 s1": (K.attention_fwd, (128, 128, 256, 1, True)),
    "overlap 128x64 s2": (K.attention_fwd, (128, 64, 256, 2, True)),
    "loop 128x128 s2": (K.attention_fwd, (128, 128, 256, 2, False)),
    "loop 128x128 s1": (K.attention_fwd, (128, 128, 256, 1, False)),
    # One warpgroup of 64 query rows: twice the blocks, for short causal grids (S1000).
    "loop 64x128 t128 s2": (K.attention_fwd, (64, 128, 128, 2, False)),
    "loop 64x64 t128 s2": (K.attention_fwd, (64, 64, 128, 2, False)),
    # Wider key blocks (not a power of two: a WGMMA's N is any multiple of 8 up to 256): the
    # consumers get 240 registers each (TileLang emits warpgroup_reg_alloc<240>), room for a
    # 64 x 176 fp32 score tile per warpgroup; 128x176 s2 at D128 uses 208 KB of shared memory.
    "overlap 128x176 s2": (K.attention_fwd, (128, 176, 256, 2, True)),
    "loop 128x176 s2": (K.attention_fwd, (128, 176, 256, 2, False)),
    "overlap 128x160 s2": (K.attention_fwd, (128, 160, 256, 2, True)),
    "loop 128x192 s1": (K.attention_fwd, (128, 192, 256, 1, False)),
    # Three consumer warpgroups of 64 query rows (512 threads, 160 registers each): for D64,
    # where a 128-row block's two warpgroups leave the tensor cores waiting on the softmax.
    "overlap 192x128 t384 s2": (K.attention_fwd, (192, 128, 384, 2, True)),
    "loop 192x128 t384 s2": (K.attention_fwd, (192, 128, 384, 2, False)),
    "loop 192x192 t384 s2": (K.attention_fwd, (192, 192, 384, 2, False)),
    # The ping-pong forward (two warpgroups of 64 query rows taking turns at the tensor cores)
    # with wider key blocks: fewer softmax rounds and barriers per key (D128 at 176 and 192 compile
    # without spills or serialized WGMMAs; 192 at two stages uses 224 KB of shared memory).
    "pingpong 128x128 s2": (K.attention_fwd, (128, 128, 256, 2, False, False, 1, True)),
    "pingpong 128x160 s2": (K.attention_fwd, (128, 160, 256, 2, False, False, 1, True)),
    "pingpong 128x176 s2": (K.attention_fwd, (128, 176, 256, 2, False, False, 1, True)),
    "pingpong 128x192 s2": (K.attention_fwd, (128, 192, 256, 2, False, False, 1, True)),
    # Causal: query blocks i and n - 1 - i in one block's pipeline (balanced, half the blocks).
    "pairs loop 128x128 s2": (K.attention_fwd, (128, 128, 256, 2, False, True)),
    "pairs loop 128x128 s1": (K.attention_fwd, (128, 128, 256, 1, False, True)),
    "pairs loop 128x64 s2": (K.attention_fwd, (128, 64, 256, 2, False, True)),
}
# CASES="2,32,8,1000,128,1,bfloat16;..." (batch, heads, kv_heads, seq_len, head_dim, causal, dtype)
# replaces the bench shapes, e.g. with the short causal GQA forward (0.56x cuDNN at S1000, run 72).
if os.environ.get("CASES"):
    CASES = [(int(b), int(h), int(kv), int(s), int(d), c == "1", dt) for b, h, kv, s, d, c, dt in
             (case.split(",") for case in os.environ["CASES"].split(";"))]
if os.environ.get("CONFIGS"):
    CONFIGS = {k: v for k, v in CONFIGS.items() if k in os.environ["CONFIGS"].split(",")}
variants = sorted({(h, kv, d, c, dt) for _, h, kv, _, d, c, dt in CASES + ODD})


def committed_calls(h, kv, d, c, dt):
    return A.variant_calls(h, kv, d, c, 0, "bshd", dt, d ** -0.5, *A.reductions(h, kv))


jobs = {}
for name, (factory, tiling) in CONFIGS.items():
    for h, kv, d, c, dt in variants:
        jobs[(name, h, kv, d, c, dt)] = (factory, (h, kv, d, c, 0, "bshd", dt, d ** -0.5, *tiling))
committed = threading.Thread(target=lambda: A.prebuild([committed_calls(*v)["fwd"] for v in variants]))
committed.start()


def build(job):
    factory, args = job
    try:
        return A.entry_point(A.build(factory, factory.get_tir(*args)))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"


with ThreadPoolExecutor(16) as pool:
    built = dict(zip(jobs, pool.map(build, jobs.values())))
committed.join()
print(f"built {len(built)} variant kernels + committed in {time.perf_counter() - T0:.0f} s", flush=True)
for key, k in built.items():
    if isinstance(k, str):
        print("BUILD FAILED", key, k)


print("# correctness vs the committed forward (max abs diff of O; of lse over real rows)")
bad = 0
for b, h, kv, s, d, c, dt in ODD:
    q, k, v = inputs(b, h, kv, s, d, dt, 1)
    ref_o, ref_lse = launch(A.launcher(committed_calls(h, kv, d, c, dt)["fwd"]), q, k, v)
    for name in CONFIGS:
        entry = built[(name, h, kv, d, c, dt)]
        if isinstance(entry, str):
            continue
        o, lse = launch(entry, q, k, v)
        torch.cuda.synchronize()
        do = (o.float() - ref_o.float()).abs().max().item()
        dl = (lse[..., :s] - ref_lse[..., :s]).abs().max().item()
        ok = do < 2e-2 and dl < 1e-3 and torch.isfinite(o).all().item()
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:18s} B{b} H{h}/{kv} S{s} D{d} causal={c} {dt}: O {do:.2e} lse {dl:.2e}", flush=True)
print("all correct" if not bad else f"{bad} WRONG")

# ROUNDS=n: every column of a case timed in turns (the bench's in_turns), n rounds, each cell the
# median of its n times (a kernel timed first in a process reads faster than later: run 226).
ROUNDS = int(os.environ.get("ROUNDS", "1"))
print(f"| case | committed | " + " | ".join(CONFIGS) + f" | cuDNN | flash |  (TF/s, median of {ROUNDS} rounds)")
print("|---" * (4 + len(CONFIGS)) + "|")
for b, h, kv, s, d, c, dt in CASES:
    q, k, v = inputs(b, h, kv, s, d, dt)
    flops = 4 * b * h * d * (s * (s + 1) / 2 if c else s * s)
    entries = [A.launcher(committed_calls(h, kv, d, c, dt)["fwd"])] + [built[(n, h, kv, d, c, dt)] for n in CONFIGS]
    fns = {}  # column -> a call, or why it cannot run (B.in_turns leaves those out)
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            fns[i] = "failed"; continue
        o = torch.empty_like(q); lse = torch.empty(b, h, pad8(s), device="cuda")
        fns[i] = lambda entry=entry, o=o, lse=lse: entry(q, k, v, o, lse)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        def sdpa(backend=backend):
            with sdpa_kernel(backend):
                return Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=c, enable_gqa=h != kv)
        fns[len(fns)] = sdpa  # a backend missing here raises in its first turn: reported "n/a"
    ms = B.in_turns(fns, lambda fn: (B.stream_ms(fn),), rounds=ROUNDS, times=1)
    row = [f"{flops / ms[i][0] / 1e9:.0f}" if isinstance(ms.get(i), tuple)
           else "failed" if fns[i] == "failed" else "n/a" for i in fns]
    print(f"| B{b} H{h}/{kv} S{s} D{d} {'causal' if c else 'full'} {dt} | " + " | ".join(row) + " |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
