"""The scaled_silu backward kernel alone at 8192 x 8192 fp16, eight launches, for ncu
(`ncu -k regex:bwd_kernel --launch-skip 5 --launch-count 1 python docs/profiling/ncu_scaled_silu_bwd.py`)."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch
A = __import__("generated.scaled_silu.autograd", fromlist=["x"])
x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
w = torch.randn((), device="cuda")
dy = torch.randn_like(x); dx = torch.empty_like(x); dw = A.alloc_dw(x, "atomic")
for _ in range(8):
    A.launch_backward(x, None, w, dy, dx, dw, "atomic")
torch.cuda.synchronize()
