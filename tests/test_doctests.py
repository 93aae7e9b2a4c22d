"""The examples in the committed packages' docstrings run (on the CPU, through the reference)."""

from __future__ import annotations

import doctest
import importlib

import pytest

from conftest import REPO_ROOT, import_generated

PACKAGES = sorted(p.name for p in (REPO_ROOT / "generated").iterdir() if (p / "__init__.py").exists())


@pytest.mark.parametrize("package", PACKAGES)
def test_package_docstring_examples_run(package):
    import_generated(package, "autograd")  # puts the repository root on sys.path
    module = importlib.import_module(f"generated.{package}")
    results = doctest.testmod(module, verbose=False, report=True)
    assert results.attempted > 0, "the package docstring has no example"
    assert results.failed == 0
