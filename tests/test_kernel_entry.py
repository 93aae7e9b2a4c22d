"""How the generated packages find a compiled kernel's entry point (`entry_point` in every
autograd.py), for the two forms TileLang 0.1.15's tvm_ffi adapter holds a kernel in: an Executable
for a kernel compiled in this process, the loaded module for one read from its disk cache. The
stand-ins below have exactly the attributes each form has; on the GPU the generated tests run the
real ones (a first run compiles, later runs load from the cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO_ROOT, import_generated

PACKAGES = sorted(p.parent.name for p in (REPO_ROOT / "generated").glob("*/autograd.py"))


def main(*buffers):
    return buffers


class Module:
    """A loaded tvm_ffi module: any attribute is looked up as a function of that name."""

    def get_function(self, name):
        if name != "main":
            raise AttributeError(f"Module has no function '{name}'")
        return main

    def __getattr__(self, name):
        return self.get_function(name)


class Executable:
    """What tvm.compile returns: runnable through jit()."""

    def jit(self):
        return Module()


class Adapter:
    def __init__(self, executable):
        self.executable = executable

    def get_exportable_executable(self):
        return self.executable


class Kernel:
    def __init__(self, adapter):
        self.adapter = adapter


@pytest.mark.parametrize("package", PACKAGES)
def test_entry_point_of_compiled_and_cached_kernels(package):
    entry_point = import_generated(package, "autograd").entry_point
    assert entry_point(Kernel(Adapter(Executable()))) is main  # compiled in this process
    assert entry_point(Kernel(Adapter(Module()))) is main  # loaded from the disk cache


@pytest.mark.parametrize("package", PACKAGES)
def test_other_backends_keep_the_kernel_object(package):
    entry_point = import_generated(package, "autograd").entry_point
    other = Kernel(object())  # e.g. the cython adapter: no tvm_ffi module
    assert entry_point(other) is other


def test_every_package_is_covered():
    assert len(PACKAGES) == len(list(Path(REPO_ROOT, "specs").glob("*.toml")))
