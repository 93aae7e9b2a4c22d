"""The generated test files on the CPU: the comparison helpers every one holds
(templates/_macros.jinja) pass a close gradient and fail a doubled, zeroed, sign-flipped or swapped
one, grads_of clears; the tests that need no GPU pass where a user runs them (pytest on the
package); the two-devices test passes with fake CUDA tensors. The other generated tests need a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import REPO_ROOT, TESTS_DIR, import_generated

PACKAGES = sorted(p.name for p in (REPO_ROOT / "generated").iterdir() if (p / "__init__.py").exists())
GOLDEN = sorted(p.name for p in (TESTS_DIR / "golden").iterdir() if (p / "__init__.py").exists())


def generated_test_module(package: str):
    return import_generated(package, f"test_{package}")


@pytest.mark.parametrize("package", PACKAGES)
def test_comparison_passes_close_and_rejects_broken_gradients(package):
    module = generated_test_module(package)
    dtype = module.DTYPES[0]
    torch.manual_seed(0)
    ref = torch.randn(64, 40)
    module.assert_catches_broken("dx", ref + 1e-4 * torch.randn(64, 40), ref, dtype)
    for broken in (2 * ref, torch.zeros_like(ref), -ref, torch.randn(64, 40)):
        with pytest.raises(AssertionError):
            module.assert_catches_broken("dx", broken, ref, dtype)
    module.assert_differs("dx", "swapped", torch.randn(64, 40), ref, dtype)
    with pytest.raises(pytest.fail.Exception, match="a swapped dx passed the comparison"):
        module.assert_differs("dx", "swapped", ref.clone(), ref, dtype)


@pytest.mark.parametrize("package", PACKAGES)
def test_grads_of_clones_then_clears(package):
    module = generated_test_module(package)
    used, unused = torch.randn(3, requires_grad=True), torch.randn(2, requires_grad=True)
    (used * 2).sum().backward()
    grads = module.grads_of({"used": used, "unused": unused})
    assert torch.equal(grads["used"], torch.full((3,), 2.0))
    assert grads["unused"] is None
    assert used.grad is None


def test_the_tests_that_need_no_gpu_pass():
    """pytest on every committed package and golden tree with CUDA hidden: the tests without
    requires_cuda (the CPU fallback's) run and pass, every other one skips. (A CPU tensor once
    stopped being an error; the test that still expected one failed on the GPU machine only.)"""
    paths = [f"generated/{p}" for p in PACKAGES] + [f"tests/golden/{p}" for p in GOLDEN]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths], cwd=REPO_ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-2000:]


@pytest.mark.parametrize("package", [p for p in PACKAGES
                                     if hasattr(generated_test_module(p), "test_rejects_tensors_on_two_devices")])
def test_two_devices_test_passes_with_fake_cuda_tensors(package):
    """The generated test_rejects_tensors_on_two_devices (each input in turn on the CPU, the rest
    on CUDA) with fake CUDA tensors: its inputs are valid, and the checks raise 'one device' for
    every one of them before anything else."""
    test = generated_test_module(package).test_rejects_tensors_on_two_devices
    with FakeTensorMode():
        test(no_launch=None)  # the fake tensors have no data: a launch would fail
