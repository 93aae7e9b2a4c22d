"""Why FlexAttention's forward at the gpt-oss shape (B1 64/8 heads S4096 D64, causal, window 128,
bf16) moved between 14 and 39 TF/s from run to run in the attention_sink bench: the same call,
timed several times in one process, taken apart.

1. flex_attention alone (torch.compile'd, dynamic=False, as the bench compiles it), no lse;
2. with return_lse=True;
3. the sinks rescale (sigmoid and cast) in eager after it, what the bench did up to run 72;
4. the same with the rescale inside one torch.compile'd function, what the bench does since;
and each of them three times, with a fresh block mask, next to the bench's own `candidates()`
entry (on the package's bshd tensors, as transposed views).

`python docs/profiling/flex_baseline_probe.py` on the GPU, from the repository root."""
import os
import sys

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: E402

from generated.attention_sink import bench_attention_sink as B  # noqa: E402

BATCH, HEADS, KV_HEADS, SEQ, DIM, WINDOW = 1, 64, 8, 4096, 64, 128
FLOPS = 4 * BATCH * HEADS * DIM * sum(min(i + 1, WINDOW) for i in range(SEQ))

g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(BATCH, HEADS, SEQ, DIM, device="cuda", dtype=torch.bfloat16, generator=g)
k, v = (torch.randn(BATCH, KV_HEADS, SEQ, DIM, device="cuda", dtype=torch.bfloat16, generator=g) for _ in "kv")
sinks = torch.randn(HEADS, device="cuda", generator=g)


def mask_mod(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < WINDOW)


block_mask = create_block_mask(mask_mod, None, None, SEQ, SEQ)
flex = torch.compile(flex_attention, dynamic=False)


def plain():
    return flex(q, k, v, block_mask=block_mask, enable_gqa=True)


def with_lse():
    return flex(q, k, v, block_mask=block_mask, enable_gqa=True, return_lse=True)


def sinks_eager():
    out, lse = with_lse()
    scale = torch.sigmoid(lse - sinks.view(1, -1, 1)).unsqueeze(-1)
    return (out * scale).to(q.dtype)


@torch.compile(dynamic=False)
def sinks_compiled(q, k, v, sinks):
    out, lse = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True, return_lse=True)
    scale = torch.sigmoid(lse - sinks.view(1, -1, 1)).unsqueeze(-1)
    return (out * scale).to(q.dtype)


bench_flex = B.candidates(SEQ, True, WINDOW, True)["FlexAttention"]
qb, kb, vb = (t.transpose(1, 2) for t in (q, k, v))  # the bench's bshd inputs
cases = {
    "flex, no lse": plain,
    "flex, return_lse": with_lse,
    "flex + sinks rescale (eager)": sinks_eager,
    "flex + sinks rescale (one compiled fn)": lambda: sinks_compiled(q, k, v, sinks),
    "bench's FlexAttention entry": lambda: bench_flex(qb, kb, vb, sinks),
}
for round_ in range(3):
    row = []
    for name, fn in cases.items():
        ms = B.stream_ms(fn)
        row.append(f"{name} {FLOPS / ms / 1e9:.1f} TF/s ({ms * 1e3:.0f} us)")
    print(f"round {round_}: " + "; ".join(row), flush=True)
