"""The causal forward with its query blocks in launch order against the committed one, which runs
them longest first, from the repository root: `python docs/profiling/causal_order_probe.py`
(`--cpu`: only build the patched kernels, for sm_90a, to check they lower).

In a causal forward, query block bx sees bx + 1 key blocks: in launch order the grid's first
blocks are its shortest and its last its longest, so the last wave runs long blocks on a few SMs
while the rest idle. The committed forward maps launch index i to query block n_blocks - 1 - i
(`query_block`); the patched copy maps it to i (nothing else changes). Checked against the
committed kernel at odd lengths, then both timed back-to-back next to SDPA (cuDNN) in one
process. Run 72 ran it the other way round, before the template took the reversed order."""
import importlib.util
import os
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
T0 = time.perf_counter()
CPU = "--cpu" in sys.argv
if CPU:
    os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind":"cuda","arch":"sm_90a"}')

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from attention_probe_tensors import inputs, launch, pad8  # noqa: E402

PACKAGES = ("attention", "gqa")
# (package, batch, heads, kv_heads, seq_len, head_dim, dtype)
CASES = [("attention", 4, 16, 16, 4096, 128, "float16"), ("attention", 8, 16, 16, 2048, 64, "float16"),
         ("attention", 1, 16, 16, 16384, 128, "float16"),
         ("gqa", 2, 32, 8, 4096, 128, "bfloat16"), ("gqa", 1, 32, 8, 16384, 128, "bfloat16"),
         ("gqa", 8, 16, 2, 2048, 64, "bfloat16"), ("gqa", 2, 32, 8, 1000, 128, "bfloat16")]
ODD = [("attention", 2, 16, 16, 333, 128, "float16"), ("attention", 1, 16, 16, 1000, 64, "float16"),
       ("attention", 1, 16, 16, 4097, 128, "float16"), ("gqa", 3, 16, 4, 77, 64, "bfloat16"),
       ("gqa", 1, 32, 8, 1000, 128, "bfloat16")]
ORDER = "bx = query_block(launch_x)"


def launch_order_factory(package):
    """The package's forward factory from a copy of its kernels.py whose forward takes query
    block i at grid index i."""
    path = f"generated/{package}/kernels.py"
    text = open(path).read()
    assert text.count(ORDER) == 1, path
    folder = tempfile.mkdtemp()
    target = os.path.join(folder, f"{package}_launch_order_kernels.py")
    with open(target, "w") as f:
        f.write(text.replace(ORDER, "bx = launch_x"))
    spec = importlib.util.spec_from_file_location(f"{package}_launch_order_kernels", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, f"{package}_fwd")


autograds = {p: importlib.import_module(f"generated.{p}.autograd") for p in PACKAGES}
patched = {p: launch_order_factory(p) for p in PACKAGES}


def calls(package, h, kv, d, dt):
    A = autograds[package]
    committed = A.variant_calls(h, kv, d, True, 0, "bshd", dt, d ** -0.5, *A.reductions(h, kv))["fwd"]
    factory, args, tiling = committed
    return committed, (patched[package], args, tiling)


variants = sorted({(p, h, kv, d, dt) for p, _, h, kv, _, d, dt in CASES + ODD})
if CPU:
    from concurrent.futures import ThreadPoolExecutor

    def build(v):
        factory, args, tiling = calls(*v)[1]
        autograds[v[0]].build(factory, factory.get_tir(*args, **tiling))
        return v

    with ThreadPoolExecutor(2) as pool:
        for v in pool.map(build, variants):
            print("built", v, f"{time.perf_counter() - T0:.0f} s", flush=True)
    sys.exit(0)

import torch.nn.functional as Fn  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from generated.attention import bench_attention as B  # noqa: E402

for p in PACKAGES:
    autograds[p].prebuild([c for v in variants if v[0] == p for c in calls(*v)])
print(f"built in {time.perf_counter() - T0:.0f} s", flush=True)


def entries(p, h, kv, d, dt):
    return [autograds[p].launcher(c) for c in calls(p, h, kv, d, dt)]


bad = 0
for p, b, h, kv, s, d, dt in ODD:
    q, k, v = inputs(b, h, kv, s, d, dt, 1)
    (o0, l0), (o1, l1) = (launch(e, q, k, v) for e in entries(p, h, kv, d, dt))
    torch.cuda.synchronize()
    do = (o0.float() - o1.float()).abs().max().item()
    dl = (l0[..., :s] - l1[..., :s]).abs().max().item()
    ok = do == 0 and dl == 0
    bad += not ok
    print(f"{'ok ' if ok else 'BAD'} {p} B{b} H{h}/{kv} S{s} D{d}: O {do:.2e} lse {dl:.2e}", flush=True)
print("identical to the committed kernel" if not bad else f"{bad} DIFFER")

print("| case | longest first (committed) TF/s | launch order TF/s | gain of longest first | SDPA cuDNN TF/s |")
print("|---|---|---|---|---|")
for p, b, h, kv, s, d, dt in CASES:
    q, k, v = inputs(b, h, kv, s, d, dt)
    flops = 4 * b * h * d * s * (s + 1) / 2
    tfs = []
    for rnd in range(2):  # interleaved rounds: drift hits both alike
        for i, entry in enumerate(entries(p, h, kv, d, dt)):
            o = torch.empty_like(q)
            lse = torch.empty(b, h, pad8(s), device="cuda")
            ms = B.stream_ms(lambda: entry(q, k, v, o, lse))
            tfs.append((i, flops / ms / 1e9))
    best = [max(t for j, t in tfs if j == i) for i in (0, 1)]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ms = B.stream_ms(lambda: Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=h != kv))
    print(f"| {p} B{b} H{h}/{kv} S{s} D{d} {dt} | {best[0]:.1f} | {best[1]:.1f} | "
          f"{best[0] / best[1]:.3f}x | {flops / ms / 1e9:.1f} |", flush=True)
print(f"done in {time.perf_counter() - T0:.0f} s")
