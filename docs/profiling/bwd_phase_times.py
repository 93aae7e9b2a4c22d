"""Where an attention backward's GPU time goes, kernel by kernel, at the bench shapes: opgen's
preprocess (Delta and the zeroed fp32 dQ), bwd, postprocess (dQ's scale and cast, split dK/dV,
dsinks) next to SDPA cuDNN's and FlexAttention's own kernels, from torch.profiler over a few
backwards through the public functions (torch.autograd.grad, retain_graph).

    python docs/profiling/bwd_phase_times.py
    ONLY=gpt-oss python docs/profiling/bwd_phase_times.py   # the cases whose name holds ONLY
    SUFFIX=_cd python docs/profiling/bwd_phase_times.py      # package copies too (render_copies.sh)

With SUFFIX, each case also runs the copies generated/attention{SUFFIX}, gqa{SUFFIX} and
attention_sink{SUFFIX} (a variant's kernels next to the package's, in the same process).
"""
import collections
import importlib
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
from generated.attention_sink.bench_attention_sink import candidates as sink_candidates  # noqa: E402

# (label, attention, gqa, attention_sink): the packages, and with SUFFIX their copies.
SUFFIX = os.environ.get("SUFFIX", "")
PACKAGES = [("opgen" + label, *(getattr(importlib.import_module(f"generated.{name}{suffix}"), f"{name}{suffix}")
                                for name in ("attention", "gqa", "attention_sink")))
            for label, suffix in [("", "")] + ([(f" {SUFFIX}", SUFFIX)] if SUFFIX else [])]

CALLS = 5
# (name, batch, heads, kv_heads, seq_len, head_dim, causal, dtype, window, sinks)
CASES = [
    ("MHA D128 full", 4, 16, 16, 4096, 128, False, torch.float16, None, False),
    ("MHA D128 causal", 4, 16, 16, 4096, 128, True, torch.float16, None, False),
    ("MHA D64 full", 4, 16, 16, 4096, 64, False, torch.float16, None, False),
    ("GQA D128 causal", 2, 32, 8, 4096, 128, True, torch.bfloat16, None, False),
    ("sinks D128 causal", 2, 32, 8, 4096, 128, True, torch.bfloat16, None, True),
    ("sinks window 1024", 2, 32, 8, 4096, 128, True, torch.bfloat16, 1024, True),
    ("sinks window 128 gpt-oss", 1, 64, 8, 4096, 64, True, torch.bfloat16, 128, True),
]


def kernel_times(fn, inputs, grad):
    """{kernel name: (us a backward, launches a backward)} over CALLS backwards of fn."""
    out = fn()
    torch.autograd.grad(out, inputs, grad, retain_graph=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            torch.autograd.grad(out, inputs, grad, retain_graph=True)
        torch.cuda.synchronize()
    totals = collections.defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name][0] += event.time_range.elapsed_us() / CALLS
            totals[event.name][1] += 1 / CALLS
    return totals


def report(label, totals):
    whole = sum(t for t, _ in totals.values())
    print(f"  {label}: {whole:.1f} us on the GPU a backward", flush=True)
    for name, (t, n) in sorted(totals.items(), key=lambda kv: -kv[1][0]):
        print(f"    {t:9.1f} us {t / whole:6.1%}  x{n:.0f}  {name[:110]}", flush=True)


def main():
    print(f"# backward kernels, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for name, b, h, kv, s, d, causal, dtype, window, sinks in CASES:
        if os.environ.get("ONLY", "") not in name:
            continue
        torch.manual_seed(0)
        q = torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True)
        k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        grad = torch.randn_like(q)
        print(f"## {name}: B{b} H{h}/{kv} S{s} D{d} {dtype}", flush=True)
        if sinks:
            sink = torch.randn(h, device="cuda", dtype=torch.float32, requires_grad=True)
            inputs = (q, k, v, sink)
            for label, _, _, sink_op in PACKAGES:
                report(label, kernel_times(lambda: sink_op(q, k, v, sink, causal=causal, window=window),
                                           inputs, grad))
            flex = sink_candidates(s, causal, window, h != kv)["FlexAttention"]
            report("FlexAttention", kernel_times(lambda: flex(q, k, v, sink), inputs, grad))
            continue
        inputs = (q, k, v)
        for label, mha, grouped, _ in PACKAGES:
            op = mha if h == kv else grouped
            report(label, kernel_times(lambda: op(q, k, v, causal=causal), inputs, grad))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            report("SDPA cuDNN", kernel_times(
                lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=h != kv).transpose(1, 2),
                inputs, grad))


if __name__ == "__main__":
    main()
