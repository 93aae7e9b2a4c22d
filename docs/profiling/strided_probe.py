"""q, k, v split from one fused projection, as a model makes them: the kernels reading the views
in place against the same call on dense copies made inside the timed call (what the package did
before it read strides), and SDPA cuDNN on the same views. gqa's bench shape (bf16, B2, 32/8
heads, S4096, D128, causal) and a small one (B1 S512), fwd and fwd+bwd per call, stream_ms.
Also checks that the in-place call equals the dense one bit for bit."""
import os, sys
sys.path.insert(0, os.getcwd())
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from generated.gqa import gqa
from generated.gqa.autograd import read_in_place
from generated.gqa.bench_gqa import stream_ms

for batch, seq_len in ((2, 4096), (1, 512)):
    heads, kv_heads, dim = 32, 8, 128
    torch.manual_seed(0)
    base = torch.randn(batch, seq_len, heads + 2 * kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    base.requires_grad_()
    q, k, v = base.split([heads, kv_heads, kv_heads], dim=2)
    assert all(read_in_place(t) and not t.is_contiguous() for t in (q, k, v))
    do = torch.randn(batch, seq_len, heads, dim, device="cuda", dtype=torch.bfloat16)

    def in_place():
        return gqa(q, k, v, causal=True)

    def copied():
        return gqa(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               is_causal=True, enable_gqa=True)
        return o.transpose(1, 2)

    o1, o2 = in_place(), copied()
    g1 = torch.autograd.grad(o1, base, do)[0]
    g2 = torch.autograd.grad(o2, base, do)[0]
    print(f"B{batch} S{seq_len}: outputs equal: {torch.equal(o1, o2)}; grads max diff "
          f"{(g1.float() - g2.float()).abs().max().item():.2e}")
    for name, fn in (("views read in place", in_place), ("dense copies first", copied), ("SDPA cuDNN on the views", sdpa)):
        fwd = stream_ms(fn)
        both = stream_ms(lambda: torch.autograd.grad(fn(), base, do))
        print(f"  {name:28s} fwd {fwd * 1e3:9.1f} us   fwd+bwd {both * 1e3:9.1f} us")
