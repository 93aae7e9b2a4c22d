"""Short causal attention through the public functions, paired forward (as shipped) against one
query block per block (pairs_query_blocks forced off) against SDPA's cuDNN and flash backends, in
one process: TF/s of the forward and of the backward (bench_one of the package's bench: streams of
back-to-back calls). From the repository root on the GPU:

    python docs/profiling/short_causal_probe.py
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from generated.attention import autograd as mha_autograd
from generated.attention import attention
from generated.gqa import autograd as gqa_autograd
from generated.gqa import gqa
from generated.gqa.bench_gqa import bench_one

# (package, op, autograd module, batch, heads, kv_heads, seq_len, head_dim, dtype)
CASES = [
    ("gqa", gqa, gqa_autograd, 2, 32, 8, 1000, 128, torch.bfloat16),
    ("gqa", gqa, gqa_autograd, 2, 32, 8, 2048, 128, torch.bfloat16),
    ("gqa", gqa, gqa_autograd, 2, 16, 4, 1024, 128, torch.bfloat16),  # examples/model_step.py's
    ("attention", attention, mha_autograd, 8, 16, 16, 2048, 64, torch.float16),
    ("attention", attention, mha_autograd, 4, 16, 16, 1000, 128, torch.float16),
]

shipped_rule = {m: m.pairs_query_blocks for m in (gqa_autograd, mha_autograd)}

# Every variant's kernels built before anything is timed: in run 79 the first column of a case
# whose variant was new ran right after its build, and read up to 2x slower than a column after
# it (a host-bound call at these shapes times the host too).
for name, op, module, b, h, kv, s, d, dtype in CASES:
    q = torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    op(q, k, v, causal=True).sum().backward()
torch.cuda.synchronize()
print("| case | paired (shipped) fwd / bwd | unpaired fwd / bwd | cuDNN fwd / bwd | flash fwd / bwd |")
print("|---|---|---|---|---|")
for name, op, module, b, h, kv, s, d, dtype in CASES:
    q = torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    do = torch.randn_like(q)
    fwd_flops = 4 * b * h * d * s * (s + 1) / 2
    cells = []
    for rule in (shipped_rule[module], lambda *args: False):
        module.pairs_query_blocks = rule
        module.PLANS.clear()
        fwd_ms, bwd_ms = bench_one(lambda q, k, v: op(q, k, v, causal=True), [q, k, v], do)
        cells.append(f"{fwd_flops / fwd_ms / 1e9:.0f} / {2.5 * fwd_flops / bwd_ms / 1e9:.0f}")
    module.pairs_query_blocks = shipped_rule[module]
    module.PLANS.clear()
    qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        try:
            with sdpa_kernel(backend):
                fwd_ms, bwd_ms = bench_one(
                    lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != kv),
                    [qt, kt, vt], do.transpose(1, 2))
            cells.append(f"{fwd_flops / fwd_ms / 1e9:.0f} / {2.5 * fwd_flops / bwd_ms / 1e9:.0f}")
        except RuntimeError:
            cells.append("n/a")
    print(f"| {name} B{b} {h}/{kv} S{s} D{d} {str(dtype)[6:]} causal | " + " | ".join(cells) + " |", flush=True)
