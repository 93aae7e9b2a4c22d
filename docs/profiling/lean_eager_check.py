"""GPU check of the lean eager path (EagerFunction with its CallPlans) of matmul, swiglu and
linear_attention, from the repository root:

    python docs/profiling/lean_eager_check.py

Host times run first (see 2.), then the correctness checks.

1. Correctness: the public function (and apply_op for the variants it does not take) at odd shapes,
   strided inputs, a non-contiguous upstream gradient and a frozen input, against the package's
   reference.py run in float64 (its .float() kept float64). Per tensor: the relative error
   max |got - ref| / max |ref|; FAIL above TOLERANCE or on a wrong shape or dtype.
2. Host time per call at a tiny shape (what the bench's --overhead times): fwd, fwd under
   torch.no_grad (eval) and fwd+bwd, the
   median of rounds of back-to-back calls, next to the PyTorch baseline: cuBLAS addmm, eager
   F.silu(a) * b, the bench's chunked linear attention in PyTorch.

About 1-2 minutes on an H200 (the kernels build on first use, or come from TileLang's cache).
Exits 1 if a check failed."""

import contextlib
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.getcwd())
from generated.linear_attention import autograd as la  # noqa: E402
from generated.linear_attention.bench_linear_attention import chunked_torch  # noqa: E402
from generated.linear_attention.reference import linear_attention_reference  # noqa: E402
from generated.matmul import autograd as mm  # noqa: E402
from generated.matmul.reference import matmul_reference  # noqa: E402
from generated.swiglu import autograd as sw  # noqa: E402
from generated.swiglu.reference import swiglu_reference  # noqa: E402
from host_timing import per_call  # noqa: E402

BF16 = torch.bfloat16
DEVICE = "cuda"
# bf16 keeps 8 bits of mantissa: one rounding is up to 2^-9 = 0.2% of a value; the kernels round
# once from fp32, so their max error over a tensor stays well under 1% of its largest element.
TOLERANCE = 1e-2
FAILED = []


@contextlib.contextmanager
def float64_math():
    """reference.py computes in .float(); in here, .float() of a float64 tensor stays float64."""
    to_float = torch.Tensor.float
    torch.Tensor.float = lambda t, *args, **kwargs: (
        t if t.dtype == torch.float64 else to_float(t, *args, **kwargs)
    )
    try:
        yield
    finally:
        torch.Tensor.float = to_float


def rel_error(got, want):
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def check(label, fn, reference, leaves, make_args, grad_out):
    """fn(*make_args(leaves)) and its gradients vs reference's in float64; leaves: the tensors
    differentiated (those with requires_grad) or frozen (without)."""
    assert sw.eager(leaves[0]), "the public function would not take the eager path"
    out = fn(*make_args(leaves))
    wanted = [t for t in leaves if t.requires_grad]
    grads = torch.autograd.grad(out, wanted, grad_out)
    with float64_math():
        leaves64 = [t.detach().double().requires_grad_(t.requires_grad) for t in leaves]
        ref = reference(*make_args(leaves64))
        ref_grads = torch.autograd.grad(
            ref, [t for t in leaves64 if t.requires_grad], grad_out.double()
        )
    errors = [("out", out, ref)] + [
        (f"grad{i}", g, r) for i, (g, r) in enumerate(zip(grads, ref_grads))
    ]
    worst = 0.0
    parts = []
    for name, got, want in errors:
        if got.shape != want.shape or got.dtype != BF16:
            FAILED.append(
                f"{label} {name}: {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} bf16"
            )
            parts.append(f"{name} BAD")
            continue
        err = rel_error(got, want)
        worst = max(worst, err)
        parts.append(f"{name} {err:.1e}")
    status = "ok" if worst <= TOLERANCE else "FAIL"
    if status == "FAIL":
        FAILED.append(f"{label}: max relative error {worst:.2e}")
    print(f"  {status:4s} {label:52s} max {worst:.1e}  ({', '.join(parts)})", flush=True)


def randn(*shape, grad=True, scale=1.0):
    return (scale * torch.randn(*shape, device=DEVICE)).to(BF16).requires_grad_(grad)


def strided_like(shape):
    """A non-contiguous upstream gradient of `shape`: every other column of a wider one."""
    return torch.randn(*shape[:-1], 2 * shape[-1], device=DEVICE).to(BF16)[..., ::2]


def correctness():
    torch.manual_seed(0)
    print("# correctness: relative error max |got - ref| / max |ref| vs reference.py in float64")
    print("matmul")
    for lead, m, n, k in (((), 333, 77, 96), ((2,), 45, 200, 130), ((), 1000, 33, 64)):
        a, b, bias = randn(*lead, m, k), randn(k, n), randn(n)
        dc = torch.randn(*lead, m, n, device=DEVICE).to(BF16)
        check(
            f"a {(*lead, m, k)} @ b {(k, n)} + bias",
            mm.matmul,
            matmul_reference,
            [a, b, bias],
            lambda t: t,
            dc,
        )
    a, b = randn(77, 96), randn(96, 131, grad=False)  # a frozen weight: no dB launch
    check(
        "a (77, 96) @ frozen b (96, 131), no bias (apply_op)",
        lambda a, b: mm.apply_op(a, b, None),
        matmul_reference,
        [a, b],
        lambda t: t,
        strided_like((77, 131)),
    )
    a, b, bias = randn(3, 5, 64), randn(64, 48), randn(48)
    check(
        "a (3, 5, 64), strided dC",
        mm.matmul,
        matmul_reference,
        [a, b, bias],
        lambda t: t,
        strided_like((3, 5, 48)),
    )

    print("swiglu")
    for shape in ((3, 333, 77), (4097,)):
        a, b = randn(*shape, scale=4.0), randn(*shape)
        check(
            f"a, b {shape}",
            sw.swiglu,
            swiglu_reference,
            [a, b],
            lambda t: t,
            torch.randn(shape, device=DEVICE).to(BF16),
        )
    for rows, cols in (
        (9, 1100),
        (37, 77),
    ):  # halves of one wider tensor: strided rows; C = 77: b misaligned
        x = randn(rows, 2 * cols, scale=2.0)
        check(
            f"a, b halves of x ({rows}, {2 * cols})",
            sw.swiglu,
            swiglu_reference,
            [x],
            lambda t: t[0].chunk(2, dim=-1),
            strided_like((rows, cols)),
        )
    a, b = randn(5, 7, 300, scale=4.0), randn(5, 7, 300)
    check(
        "a, b (5, 7, 300), sigmoid saved (apply_op)",
        lambda a, b: sw.apply_op(a, b, True),
        swiglu_reference,
        [a, b],
        lambda t: t,
        torch.randn(5, 7, 300, device=DEVICE).to(BF16),
    )

    print("linear_attention")
    for batch, seq_len, heads, dim_k, dim_v in (
        (2, 333, 3, 64, 64),
        (1, 77, 2, 40, 24),
        (1, 200, 4, 64, 128),
    ):
        q, k = randn(batch, seq_len, heads, dim_k), randn(batch, seq_len, heads, dim_k)
        v = randn(batch, seq_len, heads, dim_v)
        check(
            f"q, k {tuple(q.shape)}, v {tuple(v.shape)}",
            la.linear_attention,
            linear_attention_reference,
            [q, k, v],
            lambda t: t,
            torch.randn(v.shape, device=DEVICE).to(BF16),
        )
    q, k, v = randn(1, 130, 2, 32), randn(1, 130, 2, 32, grad=False), randn(1, 130, 2, 32)
    check(
        "frozen k, strided dO",
        la.linear_attention,
        linear_attention_reference,
        [q, k, v],
        lambda t: t,
        strided_like((1, 130, 2, 32)),
    )


def median_us(fn):
    return per_call(fn, n=300, rounds=7, warmup=30, statistic="median")


def host_times():
    torch.manual_seed(0)
    print(
        "\n# host time per call at a tiny shape, us (median of 7 rounds of 300 back-to-back calls)"
    )
    print(f"{'':44s} {'fwd':>8s} {'eval fwd':>8s} {'fwd+bwd':>8s}")
    a, b, bias = randn(64, 64), randn(64, 64), randn(64)
    x, y = randn(8, 1024), randn(8, 1024)
    q, k, v = randn(1, 128, 16, 128), randn(1, 128, 16, 128), randn(1, 128, 16, 128)
    cases = [
        ("matmul 64^3 + bias: opgen", mm.matmul, (a, b, bias)),
        ("matmul 64^3 + bias: torch.addmm (cuBLAS)", torch.addmm, (bias, a, b)),
        ("swiglu [8, 1024]: opgen", sw.swiglu, (x, y)),
        ("swiglu [8, 1024]: eager F.silu(a) * b", lambda a, b: F.silu(a) * b, (x, y)),
        ("linear_attention [1, 128, 16, 128]: opgen", la.linear_attention, (q, k, v)),
        ("linear_attention [1, 128, 16, 128]: chunked", chunked_torch, (q, k, v)),
    ]
    for label, fn, args in cases:
        leaves = [t for t in args if t.requires_grad]
        grad = torch.randn_like(fn(*args))
        fwd = median_us(lambda: fn(*args))
        with torch.no_grad():  # the eager path without the autograd node (NO_GRAD)
            evaluated = median_us(lambda: fn(*args))
        both = median_us(lambda: torch.autograd.grad(fn(*args), leaves, grad))
        print(f"{label:44s} {fwd:8.1f} {evaluated:8.1f} {both:8.1f}", flush=True)


if __name__ == "__main__":
    # Host times first: they build only the tiny shapes' kernels, so a call that runs out of time
    # building the correctness cases' kernels (one after another) still reports them.
    host_times()
    correctness()
    if FAILED:
        print("\nFAILED:\n  " + "\n  ".join(FAILED))
        sys.exit(1)
    print("\nall checks passed")
