"""The committed packages check a call's inputs once per distinct metadata (check_new_inputs): a
call whose tensors have the types, shapes, strides, dtypes and devices (and whose other
arguments the types and values) of a call that passed is not checked again, and anything else
is. On CPU tensors, which take the same checks before the reference runs."""

from __future__ import annotations

import pytest
import torch

from conftest import import_generated

BF16, F16 = torch.bfloat16, torch.float16


def randn(*shape, dtype=BF16):
    return torch.randn(*shape).to(dtype)


# package: (a valid call's arguments, the same call made invalid in one respect the metadata
# holds: (arguments, the exception))
CASES = {
    "attention": lambda: (
        (randn(1, 5, 2, 64), randn(1, 5, 2, 64), randn(1, 5, 2, 64), True),
        [
            ((randn(1, 5, 2, 64), randn(1, 5, 2, 64), randn(1, 5, 2, 64), True, "bsdh"),
             ValueError),
            ((randn(1, 5, 2, 64), randn(1, 5, 2, 64, dtype=F16), randn(1, 5, 2, 64), True),
             TypeError),
            ((randn(1, 5, 2, 64), randn(1, 5, 2, 64), randn(1, 5, 2, 64), 1), TypeError),
        ],
    ),
    "attention_sink": lambda: (
        (randn(1, 5, 4, 64), randn(1, 5, 2, 64), randn(1, 5, 2, 64), torch.zeros(4), True, 3),
        [
            ((randn(1, 5, 4, 64), randn(1, 5, 2, 64), randn(1, 5, 2, 64), torch.zeros(4), True,
              0), ValueError),
            ((randn(1, 5, 4, 64), randn(1, 5, 2, 64), randn(1, 5, 2, 64), torch.zeros(4), True,
              3.0), ValueError),
        ],
    ),
    "matmul": lambda: (
        (randn(7, 5), randn(5, 3), randn(3)),
        [
            ((randn(7, 5), randn(5, 3), randn(3, dtype=F16)), TypeError),
            ((randn(7, 5), randn(5, 3), randn(3).to("meta")), ValueError),
        ],
    ),
    "rmsnorm": lambda: (
        (randn(3, 64), randn(64)),
        [((randn(3, 64, dtype=torch.float64), randn(64)), TypeError)],
    ),
    "swiglu": lambda: (
        (randn(3, 64), randn(3, 64)),
        [((randn(3, 64), randn(3, 64, dtype=F16)), TypeError)],
    ),
    "linear_attention": lambda: (
        (randn(1, 6, 2, 16), randn(1, 6, 2, 16), randn(1, 6, 2, 16)),
        [((randn(1, 6, 2, 16), randn(1, 6, 2, 16), randn(1, 6, 2, 16, dtype=torch.int32)),
          TypeError)],
    ),
}


def counting_checks(monkeypatch, autograd):
    """Count the package's check_inputs calls (the public function looks it up at call time)."""
    calls = []
    check_inputs = autograd.check_inputs

    def counted(*args):
        calls.append(args)
        return check_inputs(*args)

    monkeypatch.setattr(autograd, "check_inputs", counted)
    monkeypatch.setattr(autograd, "CHECKED", set())
    return calls


@pytest.mark.parametrize("package", sorted(CASES))
def test_known_metadata_is_checked_once(monkeypatch, package):
    autograd = import_generated(package, "autograd")
    public = getattr(autograd, package)
    calls = counting_checks(monkeypatch, autograd)
    valid, _ = CASES[package]()
    first = public(*valid)
    again = public(*(t.clone() if isinstance(t, torch.Tensor) else t for t in valid))
    assert len(calls) == 1, "a call of known metadata was checked again"
    torch.testing.assert_close(again, first)


@pytest.mark.parametrize("package", sorted(CASES))
def test_other_metadata_is_checked_after_a_valid_call(monkeypatch, package):
    autograd = import_generated(package, "autograd")
    public = getattr(autograd, package)
    calls = counting_checks(monkeypatch, autograd)
    valid, invalid = CASES[package]()
    public(*valid)
    for args, error in invalid:
        with pytest.raises(error, match=f"^{package}: "):
            public(*args)
        with pytest.raises(error, match=f"^{package}: "):  # and again: a failure is not kept
            public(*args)
    assert len(calls) == 1 + 2 * len(invalid)


def test_a_bool_option_is_not_its_int(monkeypatch):
    """True == 1 and hash alike: the key holds each option's type too."""
    autograd = import_generated("attention", "autograd")
    counting_checks(monkeypatch, autograd)
    q = randn(1, 5, 2, 64)
    autograd.attention(q, q, q, True)
    with pytest.raises(TypeError, match="causal must be a bool"):
        autograd.attention(q, q, q, 1)


def test_the_set_is_bounded(monkeypatch):
    autograd = import_generated("rmsnorm", "autograd")
    counting_checks(monkeypatch, autograd)
    monkeypatch.setattr(autograd, "MAX_CHECKED", 3)
    w = randn(64)
    for rows in range(1, 8):
        autograd.rmsnorm(randn(rows, 64), w)
        assert len(autograd.CHECKED) <= 3
