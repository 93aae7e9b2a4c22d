"""The eager path calls the C++ apply of each package's EagerFunction directly (EAGER_APPLY),
its tensors first unwrapped by live(), as Function.apply would (its Python layer does nothing
else for an EagerFunction). On the CPU: the binding, and an empty-work call through it, which
launches no kernel, against EagerFunction.apply."""

from __future__ import annotations

import pytest
import torch

from conftest import import_generated

PACKAGES = ["attention", "attention_sink", "gqa", "linear_attention",
            "matmul", "rmsnorm", "scaled_silu", "swiglu"]


@pytest.mark.parametrize("package", PACKAGES)
def test_eager_apply_is_the_functions_own_cxx_apply(package):
    autograd = import_generated(package, "autograd")
    assert hasattr(torch._C._functorch, "unwrap_if_dead")  # this torch takes the direct path
    assert autograd.EAGER_APPLY.__self__ is autograd.EagerFunction
    assert autograd.EAGER_APPLY.__name__ == "apply"
    assert autograd.EAGER_APPLY != autograd.EagerFunction.apply  # not the Python classmethod
    t = torch.randn(3)
    assert autograd.live(t) is t


def test_empty_call_through_eager_apply_matches_function_apply():
    mm = import_generated("matmul", "autograd")
    results = []
    for apply in (mm.EAGER_APPLY, mm.EagerFunction.apply):
        a = torch.randn(0, 5, requires_grad=True)
        b = torch.randn(5, 3, requires_grad=True)
        bias = torch.randn(3, requires_grad=True)
        c = apply(mm.live(a), mm.live(b), mm.live(bias))
        assert type(c.grad_fn).__name__ == "EagerFunctionBackward"
        c.backward(torch.ones_like(c))
        results.append((c, a.grad, b.grad, bias.grad))
    for got, want in zip(*results):
        assert got.shape == want.shape and torch.equal(got, want)
