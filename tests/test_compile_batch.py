"""The build's compile check runs nvcc on batches of kernels (one translation unit, TileLang's
headers parsed once): a batch's kernels pass with their own resources, a kernel that nvcc rejects
fails alone with nvcc's message for it, and kernels of one batch get names of their own. Real
TileLang lowering and real nvcc for sm_90a, on the CPU; nothing is mocked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opgen.compile import (TARGET, _KERNEL, _Lowered, _batch_source, _load, _lower, _nvcc,
                           _nvcc_groups, _resources, _split, compile_all)
from opgen.plan import CompileJob
from opgen.render import generate

pytestmark = [pytest.mark.compile, pytest.mark.xdist_group("compile_batch")]

# One factory, so its jobs land in one batch: Y = X * factor through a [block] fp32 tile in shared
# memory (block * 4 bytes). With broken, the product comes from a function no header declares:
# TileLang lowers it (the preamble is the same), nvcc rejects it.
KERNELS = '''\
import tilelang
import tilelang.language as T


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def scale(n, factor, broken, block, threads):
    def product(x):
        return T.call_extern("float32", "opgen_undeclared", x) if broken else x * factor

    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(n // block, threads=threads) as bx:
            tile = T.alloc_shared((block,), "float32")
            T.copy(X[bx * block], tile)
            for i in T.Parallel(block):
                Y[bx * block + i] = product(tile[i])

    return main
'''

# (n, factor, broken, block, threads)
GOOD = [(4096, 2.0, False, 1024, 128), (8192, 3.0, False, 512, 256), (4096, 0.5, False, 256, 64)]
BROKEN = (4096, 2.0, True, 1024, 128)

# scaled_silu's kernels lower fastest: real kernels of a shipped family.
SILU = """\
name = "tiny"
family = "scaled_silu"
dtypes = ["float16"]

[grads.dw]
reduction = "split"

[test]
shapes = [[4097]]

[bench]
shapes = [{ rows = 8, channels = 4096 }]
"""


@pytest.fixture(scope="module")
def kernels_py(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("batch") / "kernels.py"
    path.write_text(KERNELS)
    return path


def job(args, label) -> CompileJob:
    return CompileJob("scale", args, {}, label)


@pytest.fixture(scope="module")
def checked(kernels_py, tmp_path_factory):
    """The broken kernel between good ones, in one batch (one worker: one batch of all four), with
    TileLang's cache directory pointed at an empty one."""
    cache = tmp_path_factory.mktemp("tilelang-cache")
    work = [("specs/toy.toml", kernels_py, job(args, label))
            for args, label in [(GOOD[0], "good 0"), (BROKEN, "broken"), (GOOD[1], "good 1"),
                                (GOOD[2], "good 2")]]
    seen = []
    before = os.environ.get("TILELANG_CACHE_DIR")
    os.environ["TILELANG_CACHE_DIR"] = str(cache)  # the workers inherit it
    try:
        results = compile_all(work, workers=1, on_done=seen.append)
    finally:
        if before is None:
            del os.environ["TILELANG_CACHE_DIR"]
        else:
            os.environ["TILELANG_CACHE_DIR"] = before
    return results, seen, cache


@pytest.fixture
def in_process(monkeypatch):
    """TileLang in this process as in a compile worker: the check's target, no cache."""
    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", TARGET)
    monkeypatch.setenv("TILELANG_DISABLE_CACHE", "1")


def test_batched_kernels_pass_with_their_resources(checked):
    results, _, _ = checked
    for result, (n, factor, broken, block, threads) in zip(
            [results[0], *results[2:]], GOOD, strict=True):
        assert result.ok, result.error
        assert result.error == ""
        assert (result.smem_bytes, result.threads) == (block * 4, threads)
        assert result.seconds > 0


def test_nvcc_failure_is_reported_for_its_kernel_only(checked):
    results, _, _ = checked
    assert [r.ok for r in results] == [True, False, True, True]
    error = results[1].error
    assert results[1].label == "broken"
    assert 'error: identifier "opgen_undeclared" is undefined' in error
    assert "Command: " in error and "--use_fast_math" in error  # nvcc as TileLang runs it
    # nvcc's message for the kernel alone, not for the batch's renamed kernels
    assert "_opgen" not in error
    assert (results[1].smem_bytes, results[1].threads) == (0, 0)


def test_one_result_per_kernel_in_input_order(checked):
    results, seen, _ = checked
    assert [r.label for r in results] == ["good 0", "broken", "good 1", "good 2"]
    assert sorted(r.label for r in seen) == sorted(r.label for r in results)


def test_nvcc_runs_for_real(checked):
    """TileLang's binary cache, which would stand in for nvcc, is neither read nor filled."""
    _, _, cache = checked
    assert not [p for p in cache.rglob("*") if p.is_file()]


def test_broken_kernel_shares_the_batch_nvcc_run(kernels_py, in_process):
    """So `checked` sees a batch fail in nvcc, then each of its kernels compiled alone."""
    factory = _load(str(kernels_py)).scale
    lowered = []
    for i, args in enumerate([GOOD[0], BROKEN, GOOD[1], GOOD[2]]):
        artifact, pass_configs = _lower(factory, job(args, ""))
        lowered.append(_Lowered(i, "", "", artifact.kernel_source, artifact.target, pass_configs,
                                *_resources(artifact.device_mod), 0.0))
    assert [[k.index for k in group] for group in _nvcc_groups(lowered)] == [[0, 1, 2, 3]]


def test_kernels_of_a_batch_get_names_of_their_own(kernels_py, in_process):
    factory = _load(str(kernels_py)).scale
    sources = [_lower(factory, job(args, ""))[0].kernel_source for args in GOOD]
    assert {_KERNEL.search(s).group(1) for s in sources} == {"main_kernel"}
    code, names = _batch_source(sources)
    assert names == ["main_kernel_opgen0", "main_kernel_opgen1", "main_kernel_opgen2"]
    assert "main_kernel(" not in code
    for name in names:  # declared, then defined
        assert [m.group(1) for m in _KERNEL.finditer(code)].count(name) == 2
    # The preamble once, then each source's kernels, unchanged but for the names.
    preamble = _split(sources[0])[0]
    assert code.count(preamble) == 1 and code.startswith(preamble)
    for source, name in zip(sources, names, strict=True):
        assert _split(source)[1].replace("main_kernel(", f"{name}(") in code
    artifact, pass_configs = _lower(factory, job(GOOD[0], ""))
    binary = _nvcc(code, artifact.target, pass_configs)
    assert all(f"{name}\0".encode() in binary for name in names)


def test_real_kernels_share_nvcc_runs(tmp_path, monkeypatch, in_process):
    """The sources TileLang writes for a shipped family batch: each holds nothing at top level
    but its kernel, and kernels of one factory share their preamble."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/tiny.toml").write_text(SILU)
    monkeypatch.chdir(tmp_path)
    gen = generate(Path("specs/tiny.toml"))
    path = tmp_path / "kernels.py"
    path.write_text(gen.files["kernels.py"])
    module = _load(str(path))
    lowered = []
    for i, j in enumerate(gen.plan.compile_jobs):
        artifact, pass_configs = _lower(getattr(module, j.factory), j)
        assert _split(artifact.kernel_source), j.label
        lowered.append(_Lowered(i, "", j.label, artifact.kernel_source, artifact.target,
                                pass_configs, *_resources(artifact.device_mod), 0.0))
    groups = _nvcc_groups(lowered)
    assert len(groups) < len(lowered)
    for group in (g for g in groups if len(g) > 1):
        code, names = _batch_source([k.source for k in group])
        binary = _nvcc(code, group[0].target, group[0].pass_configs)
        assert all(f"{name}\0".encode() in binary for name in names)


HEAD = '#include <tl_templates/cuda/reduce.h>\n\n'
KERNEL = ('extern "C" __global__ void k(float* X);\n'
          'extern "C" __global__ void __launch_bounds__(128, 1) k(float* X) {\n'
          '  #pragma unroll\n'
          '  for (int i = 0; i < 4; ++i) {\n    X[i] = 0;\n  }\n'
          '}\n')


@pytest.mark.parametrize("extra", [
    '__device__ float helper(float x) { return x; }\n',
    '#define SCALE 2\n',
    '  #define SCALE 2\n',
    'static __constant__ float table[4];\n',
], ids=["device function", "define", "indented define", "constant"])
def test_sources_with_more_than_kernels_are_compiled_alone(extra):
    """Anything else at top level, or a macro, would be seen by the kernels after it."""
    assert _split(HEAD + KERNEL) == (HEAD, KERNEL)
    assert _split(HEAD + KERNEL + extra) is None
    assert _split(HEAD + extra + KERNEL) == (HEAD + extra, KERNEL)  # in the preamble: compared


def test_the_same_kernel_in_two_packages_is_compiled_once(tmp_path, monkeypatch):
    """Packages of one family build many of the same kernels (a GQA package and a sinks package
    with the sinks off): one job of each distinct kernel is compiled, the others get its result.
    Only the same TIR with the same JIT settings counts: the same arguments with another body, or
    with other pass configs, are compiled."""
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tilelang-cache"))
    files = {
        "a": KERNELS,
        "b": KERNELS,  # another package, the same kernels
        "other_body": KERNELS.replace("x * factor", "x + factor"),
        "other_configs": KERNELS.replace(
            "pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}", ""),
    }
    paths = {}
    for name, text in files.items():
        paths[name] = tmp_path / name / "kernels.py"
        paths[name].parent.mkdir()
        paths[name].write_text(text)
    work = [(f"specs/{name}.toml", paths[name], job(args, label))
            for name, args, label in [("a", GOOD[0], "good 0"), ("b", GOOD[0], "good 0"),
                                      ("other_body", GOOD[0], "good 0"),
                                      ("other_configs", GOOD[0], "good 0"),
                                      ("a", GOOD[1], "good 1"),  # in no other package
                                      ("a", BROKEN, "broken"), ("b", BROKEN, "broken")]]
    seen = []
    results = compile_all(work, workers=1, on_done=seen.append)
    assert [(r.spec, r.label) for r in results] == [(spec, j.label) for spec, _, j in work]
    assert [r.source for r in results] == ["compiled", "identical", "compiled", "compiled",
                                           "compiled", "compiled", "identical"]
    assert [r.ok for r in results] == [True, True, True, True, True, False, False]
    assert results[1].smem_bytes == results[0].smem_bytes and results[1].seconds == 0.0
    assert results[6].error == results[5].error and "opgen_undeclared" in results[6].error
    assert not any(r.cached for r in results)  # each was checked in this build
    assert sorted((r.spec, r.label) for r in seen) == sorted((r.spec, r.label) for r in results)
