"""The attention package's forward and backward kernels at a bench shape, for Nsight Compute: three
warm-up rounds, then one forward and one backward launch inside NVTX ranges. On the H200:

    ncu --clock-control none -k regex:"^(fwd|bwd)_kernel" --launch-skip 6 --launch-count 2 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section ComputeWorkloadAnalysis --section SchedulerStats \
        python docs/profiling/ncu_attention.py [attention|gqa] [causal]

Shape: MHA fp16 B4 H16 S4096 D128 (attention), GQA bf16 B2 32/8 S4096 D128 (gqa), or the gpt-oss
shape of attention_sink (`attention_sink window128`: bf16 B1 64/8 S4096 D64, sinks, window 128;
WINDOW=1024 its window-1024 bench shape instead: bf16 B2 32/8 S4096 D128, sinks, causal; a
package copy such as attention_sink_desc is profiled the same way).
SEQ=1000 sets the length, DIM=64 the head dim (attention, gqa); SDPA=cudnn runs SDPA's cuDNN forward and backward on the same inputs
instead (profile it with -k regex:"cudnn|sm90")."""
import importlib
import os
import sys

sys.path.insert(0, os.getcwd())
import torch

name = sys.argv[1] if len(sys.argv) > 1 else "attention"
causal = len(sys.argv) > 2 and sys.argv[2] == "causal"
A = importlib.import_module(f"generated.{name}.autograd")
b, h, kv, dtype = (4, 16, 16, torch.float16) if name == "attention" else (2, 32, 8, torch.bfloat16)
s, d = int(os.environ.get("SEQ", 4096)), int(os.environ.get("DIM", 128))
window = None
extra = ()
if name.startswith("attention_sink"):
    b, h, kv, d, causal, window = 1, 64, 8, 64, True, 128
    if os.environ.get("WINDOW") == "1024":
        b, h, kv, d, window = 2, 32, 8, 128, 1024
    extra = (torch.randn(h, device="cuda"),)
q = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=dtype) for _ in range(2))
do = torch.randn_like(q)
scale = d ** -0.5
if os.environ.get("SDPA") == "cudnn":
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qt, kt, vt = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(4):
            F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=h != kv).backward(do.transpose(1, 2))
    torch.cuda.synchronize()
    print("done cudnn", "causal" if causal else "full")
    sys.exit(0)
for _ in range(3):
    o, lse = A.run_forward(q, k, v, *extra, causal, window, "bshd", scale)
    A.run_backward(q, k, v, *extra, o, lse, do, causal, window, "bshd", scale)
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("fwd")
o, lse = A.run_forward(q, k, v, *extra, causal, window, "bshd", scale)
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
torch.cuda.nvtx.range_push("bwd")
A.run_backward(q, k, v, *extra, o, lse, do, causal, window, "bshd", scale)
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
print("done", name, "causal" if causal else "full")
