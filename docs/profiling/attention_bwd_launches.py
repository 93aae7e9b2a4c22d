"""The attention families' backward on the GPU, through the public functions: every gradient
against the package's reference.py at odd shapes, the CUDA kernels one backward launches
(torch.profiler), and host time per call at tiny shapes next to SDPA (cuDNN).

    python docs/profiling/attention_bwd_launches.py      (from the repository root; ~1-2 min)

Exits 1 if a gradient is off. The reference computes in float32 (its own .float()); its inputs
and gradients are float64 leaves, and every error is taken in float64: max |got - ref| over
max |ref|, per gradient. Launches are counted for the backward alone (the forward runs first,
outside the profiler); torch.autograd.grad, so no .grad accumulation adds kernels.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generated.attention import autograd as attention_autograd  # noqa: E402
from generated.attention.reference import attention_reference  # noqa: E402
from generated.attention_sink import autograd as sink_autograd  # noqa: E402
from generated.attention_sink.reference import attention_sink_reference  # noqa: E402
from generated.gqa import autograd as gqa_autograd  # noqa: E402
from generated.gqa.reference import gqa_reference  # noqa: E402
from host_timing import per_call  # noqa: E402

DTYPE = torch.bfloat16
TOLERANCE = 2e-2  # relative, bf16 (the generated tests' bf16 rtol)
PACKAGES = {
    "attention": (attention_autograd.attention, attention_reference, False),
    "gqa": (gqa_autograd.gqa, gqa_reference, False),
    "attention_sink": (sink_autograd.attention_sink, attention_sink_reference, True),
}
# (package, batch, heads, kv_heads, seq_len, head_dim, layout, causal, window): odd lengths (no
# multiple of 8 or of a block), both layouts where the package has them, grouped and not. Each
# (heads, kv_heads, head_dim, layout, causal, window) builds its kernels on first use (seconds):
# the cases share a few of them, and the host times below reuse them too.
CASES = [
    ("attention", 1, 4, 4, 333, 64, "bshd", False, None),
    ("attention", 2, 4, 4, 1000, 64, "bshd", False, None),
    ("attention", 2, 4, 4, 77, 128, "bhsd", True, None),
    ("attention", 1, 4, 4, 1000, 128, "bhsd", True, None),
    ("gqa", 1, 32, 8, 333, 128, "bshd", True, None),
    ("gqa", 2, 32, 8, 77, 128, "bshd", True, None),
    ("gqa", 1, 8, 8, 1000, 64, "bshd", False, None),
    ("gqa", 2, 8, 8, 77, 64, "bshd", False, None),
    ("attention_sink", 1, 32, 8, 333, 64, "bshd", True, 128),
    ("attention_sink", 2, 32, 8, 1000, 64, "bshd", True, 128),
    ("attention_sink", 2, 8, 8, 77, 128, "bshd", True, None),
]
# (package, heads, kv_heads, head_dim, causal, window) of the host times at batch 1, seq_len 128.
TINY = [
    ("attention", 4, 4, 64, False, None),
    ("gqa", 32, 8, 128, True, None),
    ("attention_sink", 32, 8, 64, True, 128),
]


def shape_of(layout, batch, heads, seq_len, head_dim):
    return (
        (batch, seq_len, heads, head_dim) if layout == "bshd" else (batch, heads, seq_len, head_dim)
    )


def make_inputs(batch, heads, kv_heads, seq_len, head_dim, layout, sinks, requires_grad=True):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, dtype=DTYPE):
        return torch.randn(*shape, generator=gen, device="cuda", dtype=dtype)

    inputs = [
        randn(*shape_of(layout, batch, h, seq_len, head_dim)) for h in (heads, kv_heads, kv_heads)
    ]
    if sinks:
        inputs.append(randn(heads, dtype=torch.float32))
    for t in inputs:
        t.requires_grad_(requires_grad)
    return inputs, randn(*shape_of(layout, batch, heads, seq_len, head_dim))


def kwargs(package, layout, causal, window):
    extra = {"window": window} if package == "attention_sink" else {}
    return {"causal": causal, "layout": layout, **extra}


def kernels_of_backward(out, inputs, do):
    """The names of the CUDA kernels (and memsets, memcpys) torch.autograd.grad launches."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(out, inputs, do)
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def check(case):
    package, batch, heads, kv_heads, seq_len, head_dim, layout, causal, window = case
    fn, reference, sinks = PACKAGES[package]
    kw = kwargs(package, layout, causal, window)
    inputs, do = make_inputs(batch, heads, kv_heads, seq_len, head_dim, layout, sinks)
    out = fn(*inputs, **kw)
    got = torch.autograd.grad(out, inputs, do, retain_graph=True)
    leaves = [t.detach().double().requires_grad_() for t in inputs]
    ref_out = reference(*leaves, **kw)
    want = torch.autograd.grad(ref_out, leaves, do.double())
    errors = {"o": relative_error(out, ref_out)}
    for name, t, g, w in zip(("dq", "dk", "dv", "dsinks"), inputs, got, want):
        assert (g.shape, g.dtype) == (t.shape, t.dtype), name
        errors[name] = relative_error(g, w)
    kernels = kernels_of_backward(fn(*inputs, **kw), inputs, do)
    bad = [name for name, e in errors.items() if not e <= TOLERANCE]  # NaN fails too
    label = f"{package} B{batch} H{heads}/{kv_heads} S{seq_len} D{head_dim} {layout} causal={causal} window={window}"
    print(
        f"{'FAIL' if bad else 'ok  '} {label:72s} launches/bwd {len(kernels):2d}  "
        + " ".join(f"{n} {e:.1e}" for n, e in errors.items()),
        flush=True,
    )
    return not bad, len(kernels), kernels


def relative_error(got, want):
    got, want = got.detach().double(), want.detach().double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check_gqa_atomic():
    """gqa's backward with fp32-atomic dK/dV (the public function uses the spec's split): the
    package's run_backward, against its split result and the reference."""
    inputs, do = make_inputs(1, 32, 8, 333, 128, "bshd", False, requires_grad=False)
    scale = 128**-0.5
    o, lse = gqa_autograd.run_forward(*inputs, True, None, "bshd", scale)
    atomic = gqa_autograd.run_backward(
        *inputs, o, lse, do, True, None, "bshd", scale, "atomic", "atomic"
    )
    split = gqa_autograd.run_backward(
        *inputs, o, lse, do, True, None, "bshd", scale, "split", "split"
    )
    again = gqa_autograd.run_backward(
        *inputs, o, lse, do, True, None, "bshd", scale, "split", "split"
    )
    errors = {name: relative_error(a, s) for name, a, s in zip(("dq", "dk", "dv"), atomic, split)}
    repeatable = all(torch.equal(a, b) for a, b in zip(split, again))
    ok = repeatable and all(e <= TOLERANCE for e in errors.values())
    print(
        f"{'ok  ' if ok else 'FAIL'} gqa atomic vs split dK/dV (S333 32/8 D128): "
        + " ".join(f"{n} {e:.1e}" for n, e in errors.items())
        + f"; split bitwise repeatable: {repeatable}"
    )
    return ok


def host_times():
    """fwd and fwd+bwd host time per call (torch.autograd.grad, as the benches' overhead table)
    at tiny shapes, the public function next to SDPA with the cuDNN backend."""
    print("\n| case | implementation | fwd us | fwd+bwd us |\n|---|---|---|---|")
    for package, heads, kv_heads, head_dim, causal, window in TINY:
        fn, _, sinks = PACKAGES[package]
        kw = kwargs(package, "bshd", causal, window)
        inputs, do = make_inputs(1, heads, kv_heads, 128, head_dim, "bshd", sinks)
        case = f"{package} B1 S128 H{heads}/{kv_heads} D{head_dim} causal={causal} window={window}"

        def sdpa(q, k, v, *_):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                out = F.scaled_dot_product_attention(
                    q.transpose(1, 2),
                    k.transpose(1, 2),
                    v.transpose(1, 2),
                    is_causal=causal,
                    enable_gqa=heads != kv_heads,
                )
            return out.transpose(1, 2)

        impls = {f"opgen {package}": lambda *t: fn(*t, **kw)}
        if not sinks:
            impls["SDPA cuDNN"] = sdpa
        for name, impl in impls.items():
            try:
                fwd = per_call(lambda: impl(*inputs), n=300)
                both = per_call(lambda: torch.autograd.grad(impl(*inputs), inputs, do), n=300)
                print(f"| {case} | {name} | {fwd:.1f} | {both:.1f} |", flush=True)
            except Exception as exc:  # SDPA's backend may refuse a case here: say why
                print(f"| {case} | {name} | n/a: {str(exc).splitlines()[0][:80]} | |", flush=True)


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {DTYPE}")
    results = [check(case) for case in CASES]
    ok = all(r[0] for r in results) and check_gqa_atomic()
    print("\nkernels of one backward, per package (first case of each):")
    seen = set()
    for case, (_, count, names) in zip(CASES, results):
        if case[0] not in seen:
            seen.add(case[0])
            print(f"  {case[0]}: {count}: {', '.join(names)}")
    host_times()
    print("\nall gradients within tolerance" if ok else "\nSOME GRADIENTS ARE OFF")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
