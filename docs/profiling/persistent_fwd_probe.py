"""The persistent forward prototype (`persistent_fwd.py`) against the packages' forwards (the
kernel a call launches: attention's, the paired one up to 16 query blocks when causal;
attention_sink's run_forward where a case has sinks or a window) and SDPA's cuDNN and flash
backends: correctness at odd lengths against the package, then kernel time at the bench shapes,
on an H200:

    timeout 540 python docs/profiling/persistent_fwd_probe.py

CONFIGS="128,128,2,0,0;128,128,2,1,1" sets the persistent variants (block_m, block_n, stages,
overlap 0/1, symbolic batch and length 0/1[, O through shared memory and a TMA store 0/1]; the
default: both schedules at 128x128 with 2 stages for the shape, the overlapped one with O by
TMA, the overlapped one for every shape, and three consumer warpgroups of 64 rows, 192x128, at
D64). CASES="b,h,kv,s,d,causal,dtype[,window,sinks];..." replaces the timed
cases. A hung kernel (a barrier protocol bug) makes it exit 3 naming the case."""
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(__file__))
import tilelang
import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_probe_tensors import inputs, pad8
from generated.attention import autograd as A
from generated.attention import bench_attention as B
from generated.attention_sink import autograd as S
from persistent_fwd import persistent_fwd, section_pairs

DYNAMIC, DYNAMIC_LOCK = {}, threading.Lock()
T0 = time.perf_counter()
# (batch, heads, kv_heads, seq_len, head_dim, causal, dtype, window, sinks)
CASES = [(16, 16, 16, 1024, 64, True, "float16"), (8, 16, 16, 2048, 64, True, "float16"),
         (4, 16, 16, 4096, 64, True, "float16"), (2, 16, 16, 8192, 64, True, "float16"),
         (4, 16, 16, 4096, 64, False, "float16"), (4, 16, 16, 4096, 128, True, "float16"),
         (4, 16, 16, 4096, 128, False, "float16"), (2, 32, 8, 4096, 128, True, "bfloat16"),
         # attention_sink's bench shapes: sinks; sinks + window 1024; the gpt-oss shape
         (2, 32, 8, 4096, 128, True, "bfloat16", 0, True),
         (2, 32, 8, 4096, 128, True, "bfloat16", 1024, True),
         (1, 64, 8, 4096, 64, True, "bfloat16", 128, True)]
ODD = [(1, 16, 16, 1000, 64, True, "float16"), (3, 16, 16, 77, 64, False, "float16"),
       (2, 16, 16, 333, 128, False, "float16"), (1, 32, 8, 1000, 128, True, "bfloat16"),
       (1, 16, 16, 4097, 128, True, "float16"), (1, 16, 16, 128, 64, True, "float16"),
       (1, 64, 8, 1000, 64, True, "bfloat16", 128, True), (2, 32, 8, 333, 128, True, "bfloat16", 0, True)]


def parse_case(text):
    """b,h,kv,s,d,causal,dtype[,window,sinks] (causal and sinks: 1 or 0)."""
    b, h, kv, s, d, c, dt, *rest = text.split(",")
    w, sk = (rest + ["0", "0"])[:2]
    return int(b), int(h), int(kv), int(s), int(d), c == "1", dt, int(w), sk == "1"


if os.environ.get("CASES"):
    CASES = [parse_case(case) for case in os.environ["CASES"].split(";")]
CASES = [(*c, 0, False)[:9] for c in CASES]  # window 0, no sinks where a case leaves them out
ODD = [(*c, 0, False)[:9] for c in ODD]
CONFIGS = [(*(int(x) for x in c.split(",")), 0)[:6] for c in
           os.environ.get("CONFIGS", "128,128,2,0,0;128,128,2,1,0;128,128,2,1,0,1;128,128,2,1,1;"
                          "192,128,2,1,0").split(";")]
SMS = torch.cuda.get_device_properties(0).multi_processor_count


def build(key):
    """The persistent kernel of (case, config), as entry(q, k, v, sinks, o, lse); a string where
    it does not build."""
    (b, h, kv, s, d, c, dt, w, sk), (bm, bn, st, ov, dyn, so) = key
    if bm * d * 2 * (2 + so) + 2 * st * bn * d * 2 > 227 * 1024:
        return "too much shared memory"
    if bm == 192 and d > 64:  # three consumer warpgroups: for D64 (the package's 192-row rule)
        return "192 rows at D64 only"
    options = dict(overlap=bool(ov), window=w, sinks=sk, stage_o=bool(so))
    try:
        if dyn:  # one kernel for every batch and length: the first case's build serves the rest
            with DYNAMIC_LOCK:
                variant = (h, kv, d, c, dt, w, sk, bm, bn, st, ov, so)
                if variant not in DYNAMIC:
                    DYNAMIC[variant] = tilelang.compile(
                        persistent_fwd(None, h, kv, None, d, c, dt, bm, bn, st, SMS, **options),
                        out_idx=None)
                kernel = DYNAMIC[variant]
        else:
            kernel = tilelang.compile(
                persistent_fwd(b, h, kv, s, d, c, dt, bm, bn, st, SMS, **options), out_idx=None)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:200]}"
    section = section_pairs(b, h, kv, s, d)
    return lambda q, k, v, sinks, o, lse: kernel(q, k, v, sinks, o, lse, section)


def package_forward(case, copy_out=True):
    """The package's forward at this case, as entry(q, k, v, sinks, o, lse): the kernel its call
    launches (attention), or attention_sink's run_forward where the case has sinks or a window
    (its O and lse copied into o and lse, unless copy_out is False: the timing)."""
    b, h, kv, s, d, c, dt, w, sk = case
    if sk or w:
        def entry(q, k, v, sinks, o, lse):
            got_o, got_lse = S.run_forward(q, k, v, sinks, c, w, "bshd", d ** -0.5)
            if copy_out:
                o.copy_(got_o)
                lse.copy_(got_lse)
        return entry
    calls = A.variant_calls(h, kv, d, c, 0, "bshd", dt, d ** -0.5, *A.reductions(h, kv))
    paired = "fwd_pairs" in calls and A.pairs_query_blocks(c, 0, s, calls["fwd"][2]["block_m"])
    kernel = A.launcher(calls["fwd_pairs" if paired else "fwd"])
    return lambda q, k, v, sinks, o, lse: kernel(q, k, v, o, lse)


def tensors(case, seed=0):
    b, h, kv, s, d, c, dt, w, sk = case
    q, k, v = inputs(b, h, kv, s, d, dt, seed)
    sinks = (torch.randn(h, device="cuda") if sk else torch.zeros(h, device="cuda"))
    return q, k, v, sinks, torch.empty_like(q), torch.empty(b, h, pad8(s), device="cuda")


def name(case):
    b, h, kv, s, d, c, dt, w, sk = case
    return (f"B{b} H{h}/{kv} S{s} D{d} {'causal' if c else 'full'}{f' window {w}' if w else ''}"
            f"{' sinks' if sk else ''} {dt}")


def synchronize(what, seconds=20):
    """torch.cuda.synchronize(), or exit 3 naming `what` if the GPU does not finish in time: a
    barrier protocol bug hangs the kernel, and a hung sync never returns to Python."""
    done = threading.Event()

    def watchdog():
        if not done.wait(seconds):
            print(f"HANG: {what} did not finish in {seconds} s", flush=True)
            os._exit(3)

    threading.Thread(target=watchdog, daemon=True).start()
    torch.cuda.synchronize()
    done.set()


keys = [(case, config) for case in ODD + CASES for config in CONFIGS]
with ThreadPoolExecutor(16) as pool:
    built = dict(zip(keys, pool.map(build, keys)))
print(f"built {len(built)} persistent kernels in {time.perf_counter() - T0:.0f} s", flush=True)
for key, k in built.items():
    if isinstance(k, str):
        print("BUILD FAILED", key, k)

print("# correctness vs the package's forward (max abs diff of O; of lse over real rows)")
bad = 0
for case in ODD + CASES[:1]:
    s = case[3]
    q, k, v, sinks, ref_o, ref_lse = tensors(case, seed=1)
    package_forward(case)(q, k, v, sinks, ref_o, ref_lse)
    for config in CONFIGS:
        kernel = built[(case, config)]
        if isinstance(kernel, str):
            continue
        o, lse = torch.full_like(ref_o, float("nan")), torch.full_like(ref_lse, float("nan"))
        kernel(q, k, v, sinks, o, lse)
        synchronize(f"{config} at {name(case)}")
        do = (o.float() - ref_o.float()).abs().max().item()
        dl = (lse[..., :s] - ref_lse[..., :s]).abs().max().item()
        ok = do < 2e-2 and dl < 1e-3 and torch.isfinite(o).all().item()
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {config} {name(case)}: O {do:.2e} lse {dl:.2e}", flush=True)
print("all correct" if not bad else f"{bad} WRONG")

names = [f"persistent {'overlap' if ov else 'loop'} {bm}x{bn} s{st}{' dyn' if dyn else ''}"
         f"{' O by TMA' if so else ''}" for bm, bn, st, ov, dyn, so in CONFIGS]
print("| case | package | " + " | ".join(names) + " | cuDNN | flash |")
print("|---" * (4 + len(names)) + "|")
for case in CASES:
    b, h, kv, s, d, c, dt, w, sk = case
    q, k, v, sinks, o, lse = tensors(case)
    pairs = (min(w, s) * (min(w, s) + 1) / 2 + (s - min(w, s)) * w if w
             else s * (s + 1) / 2 if c else s * s)
    flops = 4 * b * h * d * pairs
    row = []
    for entry in [package_forward(case, copy_out=False)] + [built[(case, cf)] for cf in CONFIGS]:
        if isinstance(entry, str):
            row.append("failed")
            continue
        ms = B.stream_ms(lambda: entry(q, k, v, sinks, o, lse))
        row.append(f"{flops / ms / 1e9:.0f}")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        if sk or w:  # SDPA has neither sinks nor a sliding window
            row.append("n/a")
            continue
        try:
            with sdpa_kernel(backend):
                ms = B.stream_ms(lambda: Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=c,
                                                                          enable_gqa=h != kv))
            row.append(f"{flops / ms / 1e9:.0f}")
        except Exception:
            row.append("n/a")
    print(f"| {name(case)} | " + " | ".join(row) + " |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
