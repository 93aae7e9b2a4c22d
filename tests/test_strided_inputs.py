"""Strided inputs of the packages whose kernels index dense tensors (rmsnorm, scaled_silu, matmul,
linear_attention): the public function copies each strided one once and refuses none. On the CUDA
path (fake CUDA tensors) the forward op receives dense tensors, and contiguous inputs pass
unchanged; on the CPU the reference gives the dense inputs' output and gradients. The attention
packages read views in place instead (tests/test_attention_call.py). The generated GPU tests
(`test_strided_inputs_are_copied_once`) run the kernels on such views."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import import_generated

BF16 = torch.bfloat16


def strided(t):
    """A non-contiguous view with t's shape and dtype (every other element of a storage twice t's
    size; a 0-d t stays 0-d). Built by as_strided: a CPU build of torch refuses most ops on fake
    CUDA tensors."""
    if t.dim() == 0:
        return t
    storage = torch.empty(2 * t.numel(), dtype=t.dtype, device=t.device)
    return storage.as_strided(t.shape, [2 * s for s in torch.empty(t.shape, device="meta").stride()])


def inputs_of(package, device="cpu"):
    """{name: tensor} for one call, float16 or bfloat16 as the package takes."""
    gen = torch.Generator().manual_seed(0)
    if package == "rmsnorm":
        shapes, dtype = {"x": (3, 5, 64), "w": (64,)}, BF16
    elif package == "scaled_silu":  # w: a float32 scalar
        x = torch.randn(3, 5, 64, generator=gen).half()
        found = {"x": x, "w": torch.randn((), generator=gen)}
        if device == "cpu":
            return found
        return {n: torch.empty(t.shape, dtype=t.dtype, device=device) for n, t in found.items()}
    elif package == "matmul":
        shapes, dtype = {"a": (2, 7, 64), "b": (64, 32), "bias": (32,)}, BF16
    else:
        shapes, dtype = {"q": (2, 9, 2, 64), "k": (2, 9, 2, 64), "v": (2, 9, 2, 32)}, BF16
    if device != "cpu":
        return {n: torch.empty(s, dtype=dtype, device=device) for n, s in shapes.items()}
    return {n: torch.randn(s, generator=gen).to(dtype) for n, s in shapes.items()}


PACKAGES = ["rmsnorm", "scaled_silu", "matmul", "linear_attention"]


def public(package):
    return getattr(import_generated(package, "autograd"), package)


@pytest.mark.parametrize("package", PACKAGES)
def test_strided_inputs_reach_the_op_dense(package, forward_calls):
    calls = forward_calls(package)
    with FakeTensorMode():
        dense = inputs_of(package, device="cuda")
        views = {n: strided(t) for n, t in dense.items()}
        assert any(not t.is_contiguous() for t in views.values())
        public(package)(*views.values())
        public(package)(*dense.values())
    (from_views, from_dense) = calls
    tensors = [t for t in from_views if isinstance(t, torch.Tensor)]
    assert len(tensors) == len(views) and all(t.is_contiguous() for t in tensors)
    # Dense inputs are passed on as they are: no copy.
    assert all(got is want for got, want in zip(from_dense, dense.values()))


@pytest.mark.parametrize("package", PACKAGES)
def test_strided_cpu_inputs_give_the_dense_results(package):
    dense = {n: t.requires_grad_() for n, t in inputs_of(package).items()}
    bases = {n: torch.stack([t.detach(), torch.zeros_like(t)], dim=-1).requires_grad_()
             if t.dim() else t.detach().clone().requires_grad_() for n, t in dense.items()}
    views = {n: b[..., 0] if dense[n].dim() else b for n, b in bases.items()}
    out_view, out_dense = public(package)(*views.values()), public(package)(*dense.values())
    assert torch.equal(out_view, out_dense)
    grad = torch.randn_like(out_dense)
    got = torch.autograd.grad(out_view, list(bases.values()), grad)
    want = torch.autograd.grad(out_dense, list(dense.values()), grad)
    for name, g, w in zip(dense, got, want):
        if dense[name].dim():
            assert not g[..., 1].any(), name
            g = g[..., 0]
        torch.testing.assert_close(g, w, msg=name)
