"""dsinks summed by the preprocess ([tiling.dsinks] in_preprocess: one launch less a backward)
against the dsinks kernel, through the public function: attention_sink and a copy rendered with
the key on, forward + backward per call, host-bound at a tiny shape and GPU-bound at gpt-oss's.

    SPEC_EDIT='s/^\\[tiling.dsinks\\]\\(.*\\)$/[tiling.dsinks]\\1\\nin_preprocess = true/' \\
        bash docs/profiling/render_copies.sh - sp attention_sink
    python docs/profiling/dsinks_host_ab.py

Every row is microseconds per call of back-to-back calls (host_timing.per_call, the median of
5 rounds), the two packages in turn, twice. Run 218 timed the GPU side alone (bwd_phase_times.py:
the preprocess 5.5 us longer, the dsinks kernel's 5.0 gone); this is the whole call."""
import importlib
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_timing import per_call  # noqa: E402

PACKAGES = {name: getattr(importlib.import_module(f"generated.{name}"), name)
            for name in ("attention_sink", "attention_sink_sp")}
# (label, batch, heads, kv_heads, seq_len, head_dim, window)
SHAPES = [
    ("tiny B1 S128 8/2 D64", 1, 8, 2, 128, 64, None),
    ("gpt-oss B1 S4096 64/8 D64 window 128", 1, 64, 8, 4096, 64, 128),
]


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for label, b, h, kv, s, d, window in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(2))
        sinks = torch.randn(h, device="cuda", requires_grad=True)
        grad = torch.randn_like(q)
        inputs = (q, k, v, sinks)
        print(f"## {label}", flush=True)
        for round_ in (1, 2):
            for name, op in PACKAGES.items():
                def step(op=op):
                    torch.autograd.grad(op(q, k, v, sinks, causal=True, window=window), inputs, grad)

                print(f"  {name:20s} round {round_}: {per_call(step, n=100, rounds=5, statistic='median'):8.1f} us",
                      flush=True)


if __name__ == "__main__":
    main()
