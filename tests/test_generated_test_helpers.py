"""The comparison helpers every generated test file holds (templates/_macros.jinja), run on the CPU:
a close gradient passes, a doubled, zeroed, sign-flipped or swapped one fails, grads_of clears.
The generated tests that use them need a GPU; the helpers themselves do not."""

from __future__ import annotations

import pytest
import torch

from conftest import REPO_ROOT, import_generated

PACKAGES = sorted(p.name for p in (REPO_ROOT / "generated").iterdir() if (p / "__init__.py").exists())


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
