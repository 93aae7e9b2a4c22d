"""The committed packages' public functions on real CPU tensors: they run reference.py (plain
torch, differentiated by autograd) after the same input checks, so a model's CPU unit tests and
torch.export on the CPU work without a GPU.

Each case checks the output and every gradient twice: against reference.py's function (equal by
construction: the public function calls it) and against an independent float64 computation of the
same math (torch's SDPA math for softmax attention, the formulas for the rest), which a wrong
argument order, mask or scale would fail. Odd shapes on purpose.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import REPO_ROOT, import_generated

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


def randn(*shape, dtype):
    return torch.randn(*shape, generator=GEN).to(dtype)


GEN = torch.Generator().manual_seed(0)


def sdpa64(q, k, v, causal, window=None, sinks=None, layout="bshd", scale=None):
    """Softmax attention in float64 by torch's SDPA math (scale None: 1 / sqrt(head_dim)); a sink
    logit s per head (not scaled) scales each row by L / (L + exp(s)) = sigmoid(lse - s), L the
    row's sum of exp(scaled scores)."""
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    seq_len, head_dim = q.shape[2], q.shape[3]
    i = torch.arange(seq_len)[:, None]
    j = torch.arange(seq_len)[None, :]
    visible = (j <= i) if causal else torch.ones(seq_len, seq_len, dtype=torch.bool)
    if window is not None:
        visible = visible & (i - j < window)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    if sinks is not None:
        scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(head_dim) if scale is None else scale)
        lse = scores.masked_fill(~visible, float("-inf")).logsumexp(-1, keepdim=True)
        o = o * torch.sigmoid(lse - sinks.double().view(1, -1, 1, 1))
    return o.transpose(1, 2) if layout == "bshd" else o


def linear_attention64(q, k, v):
    q, k, v = (t.double() for t in (q, k, v))
    scores = torch.einsum("bthd,bshd->bhts", q, k).tril()
    return torch.einsum("bhts,bshd->bthd", scores, v) / math.sqrt(q.shape[-1])


def rmsnorm64(x, w):
    eps = import_generated("rmsnorm", "reference").EPS
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def attention_inputs(heads, kv_heads, seq_len, dtype, layout="bshd", sinks=False):
    def shape(h):
        return (2, seq_len, h, 64) if layout == "bshd" else (2, h, seq_len, 64)

    inputs = {"q": randn(*shape(heads), dtype=dtype), "k": randn(*shape(kv_heads), dtype=dtype),
              "v": randn(*shape(kv_heads), dtype=dtype)}
    if sinks:
        inputs["sinks"] = randn(heads, dtype=F32)
    return inputs


# package -> {case id: make() -> (inputs in argument order, keyword arguments, float64 function)}
CASES = {
    "attention": {
        f"{layout}-causal{causal}-{str(dtype)[6:]}": (
            lambda layout=layout, causal=causal, dtype=dtype: (
                attention_inputs(3, 3, 13, dtype, layout), {"causal": causal, "layout": layout},
                lambda q, k, v: sdpa64(q, k, v, causal, layout=layout)))
        for layout in ("bshd", "bhsd") for causal in (False, True) for dtype in (F16, BF16)
    } | {
        "bhsd-causal-scale0.3": lambda: (
            attention_inputs(3, 3, 13, F16, "bhsd"),
            {"causal": True, "layout": "bhsd", "softmax_scale": 0.3},
            lambda q, k, v: sdpa64(q, k, v, True, layout="bhsd", scale=0.3)),
    },
    "attention_sink": {
        f"window{window}": (
            lambda window=window: (
                attention_inputs(6, 2, 17, BF16, sinks=True), {"causal": True, "window": window},
                lambda q, k, v, sinks: sdpa64(q, k, v, True, window, sinks)))
        for window in (None, 5)
    } | {
        "window5-scale0.3": lambda: (
            attention_inputs(6, 2, 17, BF16, sinks=True),
            {"causal": True, "window": 5, "softmax_scale": 0.3},
            lambda q, k, v, sinks: sdpa64(q, k, v, True, 5, sinks, scale=0.3)),
    },
    "gqa": {
        "causal": lambda: (attention_inputs(6, 3, 11, F16), {"causal": True},
                           lambda q, k, v: sdpa64(q, k, v, True)),
        "full-scale1.5": lambda: (attention_inputs(6, 3, 11, F16),
                                  {"causal": False, "softmax_scale": 1.5},
                                  lambda q, k, v: sdpa64(q, k, v, False, scale=1.5)),
    },
    "linear_attention": {
        "dk40-dv24": lambda: (
            {"q": randn(1, 19, 2, 40, dtype=F16), "k": randn(1, 19, 2, 40, dtype=F16),
             "v": randn(1, 19, 2, 24, dtype=F16)}, {}, linear_attention64),
    },
    "matmul": {
        "bias": lambda: (
            {"a": randn(3, 7, 40, dtype=BF16), "b": randn(40, 24, dtype=BF16),
             "bias": randn(24, dtype=BF16)}, {},
            lambda a, b, bias: a.double() @ b.double() + bias.double()),
    },
    "rmsnorm": {
        f"{str(dtype)[6:]}": lambda dtype=dtype: (
            {"x": randn(3, 5, 40, dtype=dtype), "w": randn(40, dtype=dtype)}, {}, rmsnorm64)
        for dtype in (F16, BF16)
    },
    "scaled_silu": {
        "scalar-w": lambda: (
            {"x": randn(3, 5, 7, dtype=F16), "w": randn((), dtype=F32)}, {},
            lambda x, w: w.double() * x.double() * torch.sigmoid(x.double())),
    },
    "swiglu": {
        "bf16": lambda: (
            {"a": randn(3, 5, 33, dtype=BF16), "b": randn(3, 5, 33, dtype=BF16)}, {},
            lambda a, b: a.double() * torch.sigmoid(a.double()) * b.double()),
    },
}
PARAMS = [
    pytest.param(package, make, id=f"{package}-{case_id}")
    for package, cases in CASES.items()
    for case_id, make in cases.items()
]


def public_function(package):
    return getattr(import_generated(package, "autograd"), package)


def reference_function(package):
    return getattr(import_generated(package, "reference"), f"{package}_reference")


def run(fn, inputs, kwargs, grad_out=None):
    """fn's output and the gradient of every input (fresh leaves of the same values)."""
    leaves = {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}
    out = fn(*leaves.values(), **kwargs)
    if grad_out is None:
        grad_out = torch.randn(out.shape, generator=GEN).to(out.dtype)
    out.backward(grad_out.to(out.dtype))
    return out, {name: t.grad for name, t in leaves.items()}, grad_out


def assert_close(name, actual, expected, rel=2e-2):
    """Within rel of the largest |expected| (low-precision inputs, float32 math)."""
    assert actual.shape == expected.shape, f"{name}: {tuple(actual.shape)} != {tuple(expected.shape)}"
    scale = expected.double().abs().max().item() or 1.0
    err = (actual.double() - expected.double()).abs().max().item()
    assert err <= rel * scale, f"{name}: max err {err:.3g} > {rel} * max |expected| = {rel * scale:.3g}"


def test_every_shipped_package_has_cases():
    shipped = {p.name for p in (REPO_ROOT / "generated").iterdir() if (p / "autograd.py").exists()}
    assert shipped == set(CASES)


@pytest.mark.parametrize("package, make", PARAMS)
def test_cpu_tensors_run_the_reference(package, make):
    """Output and gradients on CPU tensors: the reference's exactly, and its dtypes and shapes."""
    inputs, kwargs, _ = make()
    out, grads, grad_out = run(public_function(package), inputs, kwargs)
    ref_out, ref_grads, _ = run(reference_function(package), inputs, kwargs, grad_out)
    assert (out.device.type, out.dtype) == ("cpu", ref_out.dtype)
    assert torch.equal(out, ref_out)
    for name, grad in grads.items():
        assert (grad.dtype, grad.shape) == (inputs[name].dtype, inputs[name].shape), f"d{name}"
        assert torch.equal(grad, ref_grads[name]), f"d{name} differs from the reference's"


@pytest.mark.parametrize("package, make", PARAMS)
def test_cpu_results_match_a_float64_computation(package, make):
    """The same output and gradients, within low-precision error, by independent float64 math on
    the same (rounded) input values."""
    inputs, kwargs, exact = make()
    out, grads, grad_out = run(public_function(package), inputs, kwargs)
    wide = {name: t.double() for name, t in inputs.items()}
    want, want_grads, _ = run(exact, wide, {}, grad_out.double())
    assert_close("output", out, want)
    for name, grad in grads.items():
        assert_close(f"d{name}", grad, want_grads[name])


@pytest.mark.parametrize("package, make", PARAMS)
def test_torch_export_on_cpu_runs(package, make):
    """torch.export of the public function on CPU tensors traces the reference's torch ops (no
    opgen op: those run on CUDA only), and the exported program gives the eager output."""
    inputs, kwargs, _ = make()
    fn = public_function(package)

    class Op(torch.nn.Module):
        def forward(self, *tensors):
            return fn(*tensors, **kwargs)

    program = torch.export.export(Op(), tuple(inputs.values()))
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert not any(target.startswith("opgen.") for target in targets), targets
    assert torch.equal(program.module()(*inputs.values()), fn(*inputs.values(), **kwargs))


@pytest.mark.parametrize("package", sorted(CASES))
def test_inputs_on_two_devices_are_refused(package):
    """A CPU tensor next to a (fake) CUDA one: a clear error from the input checks."""
    inputs, kwargs, _ = next(iter(CASES[package].values()))()
    with FakeTensorMode():
        names = list(inputs)
        args = [torch.empty(t.shape, dtype=t.dtype, device="cpu" if name == names[-1] else "cuda")
                for name, t in inputs.items()]
        with pytest.raises(ValueError, match="one device"):
            public_function(package)(*args, **kwargs)


@pytest.mark.parametrize("package", sorted(CASES))
def test_other_devices_are_refused(package):
    inputs, kwargs, _ = next(iter(CASES[package].values()))()
    with pytest.raises(ValueError, match="a CUDA device, or the CPU"):
        public_function(package)(*(t.to("meta") for t in inputs.values()), **kwargs)
