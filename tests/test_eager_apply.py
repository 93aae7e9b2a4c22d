"""The eager path calls the C++ apply of each package's EagerFunction directly (EAGER_APPLY),
its tensors first unwrapped by live(), as Function.apply would (its Python layer does nothing
else for an EagerFunction); where no input needs a gradient it calls EagerFunction.forward alone
with NO_GRAD, a ctx that keeps nothing. On the CPU: the bindings, and empty-work calls, which
launch no kernel, through both routes."""

from __future__ import annotations

import types

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
    # The C++ apply, not the Python classmethod (a torch whose Function.apply is the C++ one
    # already, 2.14 on, gives that same method).
    assert isinstance(autograd.EAGER_APPLY, types.BuiltinMethodType)
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


@pytest.mark.parametrize("package", PACKAGES)
def test_no_grad_context_keeps_nothing(package):
    """EagerFunction.forward called alone gets NO_GRAD: what it saves or sets for a backward
    that will not run is dropped, so the call holds no tensor after it returns."""
    autograd = import_generated(package, "autograd")
    ctx = autograd.NO_GRAD
    t = torch.randn(3)
    ctx.save_for_backward(t, t)
    ctx.plan = object()
    ctx.causal, ctx.window = True, 4
    assert not hasattr(ctx, "plan") and not hasattr(ctx, "causal")
    assert not hasattr(ctx, "__dict__")


def _routed(monkeypatch, autograd):
    """Send CPU tensors down the eager path (as CUDA ones go) and record the C++ apply's calls;
    only empty work, which launches no kernel, runs there on the CPU."""
    calls = []
    apply = autograd.EAGER_APPLY
    monkeypatch.setattr(autograd, "eager", lambda t: True)
    monkeypatch.setattr(autograd, "EAGER_APPLY", lambda *a: calls.append(a) or apply(*a))
    return calls


@pytest.mark.parametrize("grad_mode, needs, applied", [
    ("no_grad", (True, True, True), False),   # eval: no graph whatever the inputs
    ("inference_mode", (True, True, True), False),
    ("enabled", (False, False, False), False),  # every input frozen
    ("enabled", (True, False, False), True),
    ("enabled", (False, False, True), True),  # the bias alone
])
def test_eager_path_applies_the_function_only_where_a_gradient_is_needed(monkeypatch, grad_mode,
                                                                          needs, applied):
    mm = import_generated("matmul", "autograd")
    calls = _routed(monkeypatch, mm)
    a, b, bias = (torch.randn(*shape, requires_grad=need)
                  for shape, need in zip(((0, 5), (5, 3), (3,)), needs))
    mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
            "enabled": torch.enable_grad}[grad_mode]
    with mode():
        c = mm.apply_op(a, b, bias)
    assert bool(calls) == applied
    assert c.shape == (0, 3)
    if applied:
        assert type(c.grad_fn).__name__ == "EagerFunctionBackward"
        c.backward(torch.ones_like(c))
        for tensor, need in zip((a, b, bias), needs):
            assert (tensor.grad is not None) == need
    else:
        assert c.grad_fn is None and not c.requires_grad


def test_eager_path_without_a_bias_and_in_the_rowwise_family(monkeypatch):
    """bias None takes the optional input's branch; rmsnorm's forward alone returns y only."""
    mm = import_generated("matmul", "autograd")
    calls = _routed(monkeypatch, mm)
    with torch.no_grad():
        c = mm.apply_op(torch.randn(0, 5), torch.randn(5, 3), None)
    assert c.shape == (0, 3) and not calls
    rms = import_generated("rmsnorm", "autograd")
    calls = _routed(monkeypatch, rms)
    x, w = torch.randn(0, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    with torch.no_grad():
        y = rms.apply_op(x, w, True, rms.DW_REDUCTION)
    assert not calls and y.shape == (0, 8) and y.grad_fn is None
    y = rms.apply_op(x, w, True, rms.DW_REDUCTION)
    assert len(calls) == 1 and type(y.grad_fn).__name__ == "EagerFunctionBackward"


# The packages whose forward may save a tensor for the backward, and their empty inputs.
SAVING = {
    "rmsnorm": lambda: (torch.randn(0, 8), torch.randn(8)),
    "scaled_silu": lambda: (torch.randn(0, 8), torch.randn(())),
    "swiglu": lambda: (torch.randn(0, 8), torch.randn(0, 8)),
}


@pytest.mark.parametrize("package", SAVING)
@pytest.mark.parametrize("route", ["eager", "custom op"])
@pytest.mark.parametrize("grad_mode, needs, saves", [
    ("no_grad", True, False),
    ("inference_mode", True, False),
    ("enabled", False, False),  # frozen inputs
    ("enabled", True, True),
])
def test_a_call_no_backward_follows_saves_nothing(monkeypatch, package, route, grad_mode, needs,
                                                  saves):
    """What the spec saves serves the backward alone: the forward of a call that no backward
    follows is asked not to save it (one tensor fewer written), on either route."""
    autograd = import_generated(package, "autograd")
    seen = []

    def flag(args):
        seen.append([a for a in args if isinstance(a, bool)])

    if route == "eager":
        _routed(monkeypatch, autograd)
        forward = autograd.EagerFunction.forward
        monkeypatch.setattr(autograd.EagerFunction, "forward",
                            staticmethod(lambda ctx, *a: flag(a) or forward(ctx, *a)))
    else:
        op = autograd.forward_op
        monkeypatch.setattr(autograd, "forward_op", lambda *a: flag(a) or op(*a))
    inputs = [t.requires_grad_(needs) for t in SAVING[package]()]
    mode = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
            "enabled": torch.enable_grad}[grad_mode]
    with mode():
        y = autograd.apply_op(*inputs, True, *(() if package == "swiglu" else ("split",)))
    assert seen == [[saves]]
    assert y.shape == inputs[0].shape and y.requires_grad == saves
    if saves:
        y.sum().backward()
        assert all(t.grad is not None for t in inputs)
