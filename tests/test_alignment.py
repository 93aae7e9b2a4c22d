"""The 16-byte alignment rule the kernels' vector loads need, as every package that has it checks
it (on CPU tensors here: the check reads only data pointers; the generated GPU tests call it
through the public functions)."""

from __future__ import annotations

import pytest
import torch

from conftest import import_generated

# package -> the names check_aligned takes, in order
PACKAGES = {
    "rmsnorm": ("x", "w"),
    "scaled_silu": ("x", "w"),
    "matmul": ("a", "b", "bias"),
    "linear_attention": ("q", "k", "v"),
}


def offset_view(n, dtype=torch.float16):
    """A contiguous tensor of n elements that starts one element past a 16-byte boundary."""
    t = torch.empty(n + 1, dtype=dtype)[1:].normal_()
    assert t.is_contiguous() and t.data_ptr() % 16
    return t


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_check_aligned_names_the_misaligned_input(package):
    autograd = import_generated(package, "autograd")
    names = PACKAGES[package]
    aligned = [torch.zeros(64, dtype=torch.float16) for _ in names]
    autograd.check_aligned(*aligned)
    for i, name in enumerate(names):
        inputs = list(aligned)
        inputs[i] = offset_view(64)
        with pytest.raises(ValueError, match=f"{package}: {name} must start at a 16-byte aligned "
                                             "address .*storage offset 1.*pass a copy"):
            autograd.check_aligned(*inputs)
    inputs = list(aligned)
    inputs[0] = torch.empty(9, dtype=torch.float16)[1:1]  # empty: never read, so never refused
    autograd.check_aligned(*inputs)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_dense_copies_only_what_the_kernels_cannot_read(package):
    autograd = import_generated(package, "autograd")
    t = torch.randn(8, 16, dtype=torch.float16)
    assert autograd.dense(t) is t
    for view in (offset_view(128).view(8, 16), t.t(), t.expand(2, 8, 16)):
        copy = autograd.dense(view)
        assert copy.is_contiguous() and copy.data_ptr() % 16 == 0
        assert torch.equal(copy, view)
