"""The nn.Module of every shipped package, on the CPU (through the reference fallback): it computes
what the package's function computes with the module's parameters, its parameters get gradients,
and a model cast to bf16 (parameters included) still runs forward and backward."""

import importlib

import pytest
import torch

torch.manual_seed(0)
H, KV, D, B, S = 4, 2, 64, 2, 7


def qkv(heads, kv_heads, dtype):
    return [torch.randn(B, S, n, D, dtype=dtype, requires_grad=True) for n in (heads, kv_heads, kv_heads)]


# package -> (module factory, inputs factory(dtype), the function call it must equal, parameters)
CASES = {
    "attention": (lambda p: p.Attention(causal=True), lambda dt: qkv(H, H, dt),
                  lambda p, m, x: p.attention(*x, causal=True), []),
    "gqa": (lambda p: p.Attention(), lambda dt: qkv(H, KV, dt), lambda p, m, x: p.gqa(*x), []),
    "attention_sink": (lambda p: p.Attention(H, window=3), lambda dt: qkv(H, KV, dt),
                       lambda p, m, x: p.attention_sink(*x, m.sinks, window=3), ["sinks"]),
    "rmsnorm": (lambda p: p.RMSNorm(D), lambda dt: [torch.randn(3, 5, D, dtype=dt, requires_grad=True)],
                lambda p, m, x: p.rmsnorm(*x, m.weight.to(x[0].dtype)), ["weight"]),
    "scaled_silu": (lambda p: p.ScaledSiLU(), lambda dt: [torch.randn(3, 5, D, dtype=dt, requires_grad=True)],
                    lambda p, m, x: p.scaled_silu(*x, m.weight), ["weight"]),
    "swiglu": (lambda p: p.SwiGLU(), lambda dt: [torch.randn(3, D, dtype=dt, requires_grad=True) for _ in "ab"],
               lambda p, m, x: p.swiglu(*x), []),
    "matmul": (lambda p: p.Linear(D, 24), lambda dt: [torch.randn(2, 5, D, dtype=dt, requires_grad=True)],
               lambda p, m, x: p.matmul(*x, m.weight.to(x[0].dtype), m.bias.to(x[0].dtype)), ["weight", "bias"]),
    "linear_attention": (lambda p: p.LinearAttention(), lambda dt: qkv(H, H, dt),
                         lambda p, m, x: p.linear_attention(*x), []),
}


@pytest.mark.parametrize("name", CASES)
def test_module_is_the_function(name):
    package = importlib.import_module(f"generated.{name}")
    make, inputs, call, params = CASES[name]
    module = make(package)
    assert [n for n, _ in module.named_parameters()] == params
    x = inputs(torch.bfloat16)
    y = module(*x)
    torch.testing.assert_close(y, call(package, module, x), rtol=0, atol=0)
    y.float().square().sum().backward()
    for t in x:
        assert t.grad is not None and t.grad.abs().sum() > 0
    for n, p in module.named_parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype and p.grad.abs().sum() > 0, n


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3]])
def test_module_cast_to_bf16_still_runs(name):
    """model.to(torch.bfloat16) casts the parameters; the module casts them back to what the op
    takes, and the gradient arrives in the parameter's (new) dtype."""
    package = importlib.import_module(f"generated.{name}")
    make, inputs, _, _ = CASES[name]
    module = make(package).to(torch.bfloat16)
    module(*inputs(torch.bfloat16)).float().sum().backward()
    for p in module.parameters():
        assert p.dtype == torch.bfloat16 and p.grad is not None and p.grad.dtype == torch.bfloat16


def test_linear_initialises_like_torch():
    """Linear stores weight [in, out] and draws it as torch.nn.Linear draws its [out, in] one."""
    package = importlib.import_module("generated.matmul")
    torch.manual_seed(3)
    ours = package.Linear(D, 24)
    torch.manual_seed(3)
    theirs = torch.nn.Linear(D, 24)
    torch.testing.assert_close(ours.weight, theirs.weight.T, rtol=0, atol=0)
    torch.testing.assert_close(ours.bias, theirs.bias, rtol=0, atol=0)
