"""The attention forward with O stored through shared memory by TMA (`generated/attention`, the
template's staged epilogue) against the same forward with O stored from registers
(`generated/attention_registers`, rendered from an earlier template under that name by
`bash docs/profiling/render_copies.sh COMMIT registers attention` on the CPU machine), through
the public function under torch.no_grad, interleaved in one process, with SDPA's cuDNN beside them. Outputs
must be bit-identical (the same values, only the store path differs), at odd lengths and both
layouts too. On an H200:

    python docs/profiling/stage_o_probe.py

Run 101 compared the unpaired forward (baseline 3ef2b4c); the paired causal forward (at most 16
query blocks: S <= 2048 at 128 rows) stages O since session 22's second change (baseline
5dd8f62): the S1000, S1024 and S2048 causal cases run it.
"""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(__file__))
import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_probe_tensors import inputs
from ncu_rmsnorm import ms as timed
from generated.attention_registers import attention_registers as registers
from generated.attention import attention as staged

ODD = [(1, 16, 1000, 64, True), (3, 16, 77, 64, False), (2, 16, 333, 128, False), (1, 16, 4097, 128, True),
       (1, 16, 130, 128, True)]
CASES = [(16, 16, 1024, 64, True), (8, 16, 2048, 64, True), (8, 16, 2048, 128, True), (16, 16, 1024, 128, True),
         (4, 16, 4096, 128, False), (4, 16, 4096, 128, True), (4, 16, 4096, 64, False),
         (4, 16, 4096, 64, True), (2, 16, 8192, 64, True), (8, 16, 2048, 64, False), (16, 16, 1024, 64, False)]


torch.backends.cuda.matmul.allow_tf32 = False
with torch.no_grad():
    for b, h, s, d, causal in ODD:
        q, k, v = inputs(b, h, h, s, d, "float16")
        for layout in ("bshd", "bhsd"):
            args = (q, k, v) if layout == "bshd" else tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))
            a, c = registers(*args, causal, layout), staged(*args, causal, layout)
            same = torch.equal(a, c)
            print(f"{'ok ' if same else 'BAD'} B{b} H{h} S{s} D{d} {'causal' if causal else 'full'} {layout}: "
                  f"max diff {(a.float() - c.float()).abs().max().item():.2e}", flush=True)
            assert same
    print("| case | registers ms | staged ms | staged / registers | cuDNN ms |\n|---|---|---|---|---|")
    for b, h, s, d, causal in CASES:
        q, k, v = inputs(b, h, h, s, d, "float16")
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        rounds = {"r": [], "s": [], "c": []}
        for _ in range(3):
            rounds["r"].append(timed(lambda: registers(q, k, v, causal)))
            rounds["s"].append(timed(lambda: staged(q, k, v, causal)))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                rounds["c"].append(timed(lambda: Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)))
        r, st, c = (min(rounds[x]) for x in "rsc")
        print(f"| B{b} H{h} S{s} D{d} {'causal' if causal else 'full'} | {r:.3f} | {st:.3f} | {st / r:.3f} | {c:.3f} |",
              flush=True)
