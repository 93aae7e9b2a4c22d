"""The scaled_silu family (opgen/families/scaled_silu.py): spec models, invalid specs through
load_plan with their field paths, plan(), explain(), deterministic rendering, and the lowered CUDA
of the kernels (symbolic dims, vector accesses, one dw atomic per block or channel)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from conftest import (REPO_ROOT, assert_last_block_finishes, import_generated, plan_from,
                      spec_problems as problems, write_spec as write)

from opgen.errors import OpgenError
from opgen.families import FAMILIES, scaled_silu
from opgen.families.scaled_silu import DEFAULT_TILING, Spec, bytes_moved, explain, matrix, tile
from opgen.render import environment, generate
from opgen.spec import DEFAULT_TOLERANCES, read_spec, validate

MINIMAL = 'name = "x"\nfamily = "scaled_silu"\n'
CHANNEL = MINIMAL + '[scaled_silu]\nweight = "channel"\n'




def plan_of(project: Path, text: str = MINIMAL) -> scaled_silu.Plan:
    return plan_from(scaled_silu.FAMILY, project, text)




def fields(project: Path, text: str) -> list[str]:
    return [field for field, _ in problems(project, text)]


# --- registry and defaults ------------------------------------------------------------------------


def test_registered_with_the_family_interface():
    family = FAMILIES["scaled_silu"]
    assert family is scaled_silu.FAMILY
    assert set(family.scaffolds) == {"scaled_silu"}


def test_minimal_spec_loads_every_default(project):
    spec = validate(Spec, read_spec(write(project, MINIMAL)))
    assert spec.scaled_silu.weight == "scalar"
    assert spec.scaled_silu.weight_dtype == "float32"
    assert (spec.grads.dx.reduction, spec.grads.dw.reduction) == ("direct", "atomic")
    assert spec.saved.sigmoid == "recompute"
    assert spec.tiling.fwd == DEFAULT_TILING["fwd"]
    assert spec.tiling.bwd == DEFAULT_TILING["bwd"]
    assert spec.test.shapes == ((3, 1000, 77), (4097,), (64, 1024))
    assert spec.bench.dtype == "float16"
    assert [(s.rows, s.channels) for s in spec.bench.shapes] == [(8192, 8192)]
    assert 8192 * 8192 == 64 * 2**20


def test_shipped_spec_is_the_defaults(project):
    """specs/scaled_silu.toml shows the defaults: it validates to the same spec as one that leaves
    every key out."""
    shipped = validate(Spec, read_spec(REPO_ROOT / "specs" / "scaled_silu.toml"))
    minimal = validate(Spec, read_spec(write(project, 'name = "scaled_silu"\nfamily = "scaled_silu"\n')))
    assert same_but_tolerance_tables(shipped, minimal)


def same_but_tolerance_tables(a: Spec, b: Spec) -> bool:
    """Equal specs, where an explicit [test.tolerance] table equal to the defaults counts as left out."""
    tolerances = {d: a.test.tolerance_for(d) for d in a.dtypes}
    return (a.model_copy(update={"test": a.test.model_copy(update={"tolerance": {}})}) == b
            and tolerances == {d: b.test.tolerance_for(d) for d in b.dtypes})


def test_partial_tiling_override_keeps_the_other_defaults(project):
    p = plan_of(project, MINIMAL + "[tiling.bwd]\nthreads = 128\n")
    assert p.kernels["bwd"].tiling == {"block_rows": 1, "block_cols": 4096, "threads": 128}
    assert p.kernels["fwd"].tiling == {"block_rows": 1, "block_cols": 4096, "threads": 256}


# --- invalid specs through load_plan: field paths and messages ------------------------------------


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ('[scaled_silu]\nweight = "row"\n', "scaled_silu.weight", "must be one of scalar, channel"),
        ('[scaled_silu]\nweight_dtype = "float64"\n', "scaled_silu.weight_dtype",
         "must be one of float32, input"),
        ('[grads.dx]\nreduction = "atomic"\n', "grads.dx.reduction",
         'must be one of direct (got "atomic")'),
        ('[grads.dw]\nreduction = "atomc"\n', "grads.dw.reduction", "must be one of atomic, split"),
        ('[grads.dw]\nreduction = "direct"\n', "grads.dw.reduction", "must be one of atomic, split"),
        ('[saved]\nsigmoid = "keep"\n', "saved.sigmoid", "must be one of recompute, save"),
        ("[tiling.fwd]\nblock = 1000\n", "tiling.fwd.block", "power of two"),
        ("[tiling.bwd]\nthreads = 100\n", "tiling.bwd.threads", "multiple of 32"),
        ("[tiling.bwd]\nblock_m = 64\n", "tiling.bwd.block_m", "unknown key"),
        ("[test]\nshapes = [[3, 0, 77]]\n", "test.shapes.0.1", "greater than or equal to 1"),
        ("[test]\nshapes = [[]]\n", "test.shapes.0", "at least 1 item"),
        ("[bench]\nshapes = [{ rows = 8192 }]\n", "bench.shapes.0.channels", "required key is missing"),
        ("[test.tolerance.float16]\nrtol = 2.0\natol = 0.01\n", "test.tolerance.float16.rtol",
         "less than or equal to 1"),
    ],
)
def test_field_errors(project, text, field, fragment):
    found = problems(project, MINIMAL + text)
    assert [f for f, _ in found] == [field], found
    assert fragment in found[0][1], found


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ("[tiling.fwd]\nblock = 64\nthreads = 128\n", "tiling.fwd.block", "at least threads (128)"),
        ("[tiling.bwd]\nblock = 32768\nthreads = 256\n", "tiling.bwd.block", "at most 64 x threads"),
        ("[test]\nshapes = [[64, 1024]]\n", "test.shapes", "not a multiple of 4096"),
        ("[test]\nshapes = []\n", "test.shapes", "at least one shape"),
        ("[bench]\nshapes = []\n", "bench.shapes", "at least one shape"),
    ],
)
def test_consistency_errors(project, text, field, fragment):
    found = problems(project, MINIMAL + text)
    assert [f for f, _ in found] == [field], found
    assert fragment in found[0][1], found


def test_channel_consistency_errors(project):
    found = problems(project, CHANNEL + "[tiling.fwd]\nblock = 256\nblock_channels = 512\n")
    assert found == [("tiling.fwd.block_channels", "must be at most block (256): a tile is "
                      "[block // block_channels, block_channels] (got 512)")]
    found = problems(project, CHANNEL + "[test]\nshapes = [[64, 1024]]\n")
    assert [f for f, _ in found] == ["test.shapes", "test.shapes"]
    assert "last dim (C) is not a multiple of 256" in found[0][1]
    assert "rows (elements / last dim) are not a multiple of 16" in found[1][1]
    # A last dim and a row count with tails, in different shapes, are enough.
    p = plan_of(project, CHANNEL + "[test]\nshapes = [[64, 77], [3, 1024]]\n")
    assert p.tail_case.shape == (64, 77)


def test_block_channels_are_not_checked_for_a_scalar_weight(project):
    p = plan_of(project, MINIMAL + "[tiling.fwd]\nblock = 256\nblock_channels = 512\n")
    assert p.kernels["fwd"].tiling == {"block_rows": 1, "block_cols": 256, "threads": 256}


def test_every_problem_is_reported_at_once(project):
    found = fields(project, MINIMAL + '[scaled_silu]\nweight = "row"\n[saved]\nsigmoid = "x"\n'
                   "[tiling.fwd]\nblock = 48\n")
    assert found == ["scaled_silu.weight", "saved.sigmoid", "tiling.fwd.block"]


# --- plan -----------------------------------------------------------------------------------------


def test_plan_is_frozen(project):
    p = plan_of(project)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "y"


def test_plan_generic_fields(project):
    p = plan_of(project)
    assert (p.family, p.name) == ("scaled_silu", "x")
    assert p.ops == {"fwd": "opgen::x_fwd", "bwd": "opgen::x_bwd"}
    assert p.dtypes == ("float16", "bfloat16")
    assert p.torch_dtypes == ("torch.float16", "torch.bfloat16")
    assert p.tolerances == DEFAULT_TOLERANCES
    assert p.source.spec_path == "specs/x.toml"
    assert p.bench.dtype == "float16"


def test_plan_kernels(project):
    p = plan_of(project)
    assert list(p.kernels) == ["fwd", "bwd"]
    assert [k.factory for k in p.kernels.values()] == ["x_fwd", "x_bwd"]
    assert [k.tiling_name for k in p.kernels.values()] == ["FWD_TILING", "BWD_TILING"]
    assert all(k.out_idx is None for k in p.kernels.values())
    # A scalar weight views x as one row: 1 x block tiles.
    assert p.kernels["bwd"].tiling == {"block_rows": 1, "block_cols": 4096, "threads": 256}
    assert p.kernels["bwd"].grid == "(ceildiv(cols, block_cols),)"
    c = plan_of(project, CHANNEL)
    assert c.kernels["fwd"].tiling == {"block_rows": 16, "block_cols": 256, "threads": 256}
    assert c.kernels["bwd"].tiling == {"block_rows": 16, "block_cols": 256, "threads": 256}
    # One grid dim: the row blocks are not bounded by a second dim's 65535.
    assert c.kernels["bwd"].grid == "(ceildiv(rows, block_rows) * ceildiv(cols, block_cols),)"


@pytest.mark.parametrize("dw, alloc, tested", [("atomic", "torch.zeros", ("atomic", "split")),
                                               ("split", "torch.empty", ("split",))])
def test_plan_grads(project, dw, alloc, tested):
    p = plan_of(project, MINIMAL + f'[grads.dw]\nreduction = "{dw}"\n')
    dx, dw_plan = p.grads
    assert (dx.grad, dx.input, dx.reduction) == ("dx", "x", "direct")
    assert (dx.buffer_dtype, dx.alloc) == ("input", "torch.empty")
    assert (dw_plan.grad, dw_plan.input, dw_plan.reduction) == ("dw", "w", dw)
    assert (dw_plan.buffer_dtype, dw_plan.alloc) == ("float32", alloc)
    assert p.dw_reduction == dw
    assert p.test_reductions == tested
    assert bool(p.atomic_grads) == (dw == "atomic")
    assert p.grad_check_order == (("dx", "x"), ("dw", "w"))


@pytest.mark.parametrize("sigmoid, save, saved, recomputed", [
    ("recompute", False, ("x", "w"), ("sigmoid",)),
    ("save", True, ("x", "w", "sigmoid"), ()),
])
def test_plan_saved(project, sigmoid, save, saved, recomputed):
    p = plan_of(project, MINIMAL + f'[saved]\nsigmoid = "{sigmoid}"\n')
    assert (p.save_sigmoid, p.saved, p.recomputed) == (save, saved, recomputed)


def test_plan_weight_expressions(project):
    s = plan_of(project)
    assert (s.weight, s.cols_expr, s.weight_shape_expr, s.weight_dtype_expr) == (
        "scalar", "x.numel()", "((), (1,))", "torch.float32")
    # The element count is the symbol; no dim is a factory argument.
    assert (s.channels_expr, s.symbolic_expr, s.symbolic_doc) == ("None", "cols", "element counts")
    c = plan_of(project, CHANNEL + 'weight_dtype = "input"\n')
    assert (c.weight, c.cols_expr, c.weight_shape_expr, c.weight_dtype_expr) == (
        "channel", "x.shape[-1]", "((x.shape[-1],),)", "x.dtype")
    assert (c.channels_expr, c.symbolic_expr, c.symbolic_doc) == ("cols", "rows", "row counts")


def test_int32_extent_leaves_a_block_of_headroom(project):
    """ceildiv and the tile bounds add up to a block to the symbolic dim: the longest int32 one
    is 2^31 - 1 less the largest block along it (cols: 4096, fwd and bwd; rows: its 16-row tiles)."""
    assert plan_of(project).int32_extent == 2**31 - 1 - 4096
    assert plan_of(project, CHANNEL).int32_extent == 2**31 - 1 - 16
    wide_fwd = plan_of(project, MINIMAL + "[tiling.fwd]\nblock = 65536\n")
    assert wide_fwd.int32_extent == 2**31 - 1 - 65536


def test_tile_and_matrix():
    assert tile("scalar", DEFAULT_TILING["bwd"]) == (1, 4096)
    assert tile("channel", DEFAULT_TILING["bwd"]) == (16, 256)
    assert matrix("scalar", (3, 1000, 77)) == (1, 231000)
    assert matrix("channel", (3, 1000, 77)) == (3000, 77)
    assert matrix("channel", (4097,)) == (1, 4097)


def test_plan_test_cases_and_tail_case(project):
    p = plan_of(project)
    assert [c.shape for c in p.test_cases] == [(3, 1000, 77), (4097,), (64, 1024)]
    assert [c.id for c in p.test_cases] == ["3x1000x77", "4097", "64x1024"]
    assert p.tail_case.shape == (3, 1000, 77)
    p = plan_of(project, MINIMAL + "[test]\nshapes = [[64, 1024], [4097]]\n")
    assert p.tail_case.shape == (4097,)


def test_plan_compile_jobs(project):
    p = plan_of(project)
    labels = [j.label for j in p.compile_jobs]
    # Per dtype: fwd x {recompute, save}, bwd x {recompute, save} x {atomic, split}; + the spec's
    # pair with int64 dims. The element count is symbolic: the bench pair is the tests' pair.
    assert len(labels) == 2 * (2 + 4) + 2
    assert "bwd bfloat16 sigmoid=save dw=split" in labels
    assert not any("bench" in label for label in labels)
    assert labels[-2:] == ["fwd float16 sigmoid=recompute (int64 dims)",
                           "bwd float16 sigmoid=recompute dw=atomic (int64 dims)"]
    fwd = p.compile_jobs[0]
    assert fwd.factory == "x_fwd" and fwd.args == ("scalar", None, "int32", "float16", "float32", False)
    assert fwd.tiling == p.kernels["fwd"].tiling
    bwd = p.compile_jobs[1]
    assert bwd.args == ("scalar", None, "int32", "float16", "float32", False, "atomic")
    assert p.compile_jobs[-1].args == ("scalar", None, "int64", "float16", "float32", False, "atomic")
    split_only = plan_of(project, CHANNEL + 'weight_dtype = "input"\n[grads.dw]\nreduction = "split"\n')
    jobs = split_only.compile_jobs
    # A channel weight's variant is its C: the tail shape's 77, the benchmark's 8192.
    assert len(jobs) == 2 * (2 + 2) + 2 + 2
    assert all("dw=atomic" not in j.label for j in jobs)
    assert jobs[1].args == ("channel", 77, "int32", "float16", "float16", False, "split")
    assert [j.label for j in jobs[-4:]] == [
        "fwd float16 C=8192 sigmoid=recompute (bench)",
        "bwd float16 C=8192 sigmoid=recompute dw=split (bench)",
        "fwd float16 C=77 sigmoid=recompute (int64 dims)",
        "bwd float16 C=77 sigmoid=recompute dw=split (int64 dims)",
    ]


def test_plan_bench_bytes(project):
    p = plan_of(project)
    n = 8192 * 8192
    (case,) = p.bench_cases
    assert (case.rows, case.channels) == (8192, 8192)
    # fwd: x read, y written (fp16), w read (one fp32); bwd: dy, x read, dx written, w read, dw written.
    assert (case.fwd_bytes, case.bwd_bytes) == (2 * 2 * n + 4, 3 * 2 * n + 2 * 4)
    assert bytes_moved("channel", n, 8192, 2, 2) == (4 * n + 2 * 8192, 6 * n + 4 * 8192)


def test_explain_tables(project):
    p = plan_of(project)
    titled = explain(p, {"rows": 8192, "channels": 8192, "dtype": "float16"})
    assert titled[0][0].endswith("kernels see [1, 67108864], cols symbolic, int32)")
    tables = dict(titled)
    assert set(tables) >= {"kernels", "saved for backward", "gradient reductions"}
    kernels = tables["kernels"]
    assert kernels[0] == ["factory", "phase", "grid", "tiling", "computes"]
    assert kernels[1][2].endswith("= (16384,)") and kernels[2][2].endswith("= (16384,)")
    dw = tables["gradient reductions"][2]
    assert dw[:2] == ["dw", "atomic"] and dw[4] == "16384 (16384 per address)"
    c = plan_of(project, CHANNEL + '[grads.dw]\nreduction = "split"\n[saved]\nsigmoid = "save"\n')
    titled = explain(c, {"rows": 8192, "channels": 8192, "dtype": "bfloat16"})
    assert titled[0][0].endswith("kernels see [8192, 8192], rows symbolic, int32)")
    tables = dict(titled)
    assert tables["kernels"][2][2].endswith("= (16384,)")  # 512 row blocks x 32 column blocks
    assert tables["gradient reductions"][2][3] == "16.0 MiB"  # 512 row blocks x 8192 fp32 partials
    saved = {row[0]: row[1] for row in tables["saved for backward"][1:]}
    assert saved["sigmoid"] == "256.0 MiB"  # fp32


def test_explain_names_the_int64_variant_of_a_long_view(project):
    p = plan_of(project)
    (title, _), *_ = explain(p, {"rows": 65536, "channels": 32768, "dtype": "float16"})
    assert title.endswith("kernels see [1, 2147483648], cols symbolic, int64)")


def test_explain_rejects_impossible_shapes(project):
    p = plan_of(project)
    with pytest.raises(OpgenError, match="dtype must be one of"):
        explain(p, {"rows": 1, "channels": 1, "dtype": "float8"})
    with pytest.raises(OpgenError, match="rows and channels must be >= 1"):
        explain(p, {"rows": 0, "channels": 1, "dtype": "float16"})


# --- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", [MINIMAL, CHANNEL + '[grads.dw]\nreduction = "split"\n[saved]\nsigmoid = "save"\n']
)
def test_generate_is_deterministic(project, text):
    path = write(project, text)
    first, second = generate(path), generate(path)
    assert first.files == second.files
    assert sorted(first.files) == ["__init__.py", "autograd.py", "bench_x.py", "kernels.py", "modules.py",
                                   "opgen-manifest.json", "reference.py", "spec.toml", "test_x.py"]
    for name, source in first.files.items():
        if name.endswith(".py"):
            compile(source, name, "exec")  # valid Python
            assert str(project) not in source  # no absolute paths


def test_generated_test_runs_split_against_atomic_only_for_an_atomic_spec(project):
    atomic = generate(write(project, MINIMAL)).files["test_x.py"]
    split = generate(write(project, MINIMAL + '[grads.dw]\nreduction = "split"\n')).files["test_x.py"]
    for name in ("test_dw_atomics_accumulate", "test_dw_atomic_and_split_agree"):
        assert name in atomic and name not in split
    for text in (atomic, split):
        assert "test_dw_split_is_deterministic" in text
        assert "test_strided_dy" in text
        assert 'pytest.param(True, id="save")' in text and 'pytest.param(False, id="recompute")' in text


def test_scaffold_matches_the_defaults(project):
    """`opgen new scaled_silu` renders the defaults of the models (tiling, tolerances)."""
    preset = scaled_silu.FAMILY.scaffolds["scaled_silu"]
    text = environment().get_template("new/scaled_silu.toml.jinja").render(name="x", preset=preset)
    spec = validate(Spec, read_spec(write(project, text)))
    assert same_but_tolerance_tables(spec, validate(Spec, read_spec(write(project, MINIMAL, name="y"))))
    assert math.prod(spec.test.shapes[1]) % DEFAULT_TILING["fwd"].block


# --- the committed package: one kernel per variant ------------------------------------------


@pytest.fixture
def recorded(monkeypatch):
    """generated/scaled_silu/autograd with empty KERNELS and PLANS (a CallPlan from an earlier
    test holds its kernels) and its factories replaced by recorders: (autograd, {factory: [build
    args]}, [shapes of the launched buffers])."""
    autograd = import_generated("scaled_silu", "autograd")
    builds, launches = {}, []

    class Compiled:
        adapter = None  # not a tvm_ffi kernel: entry_point keeps the object

        def __call__(self, *buffers):
            launches.append(tuple(tuple(t.shape) for t in buffers))

    def recorder(name):
        def factory(*args, **tiling):
            builds.setdefault(name, []).append(args)
            return Compiled()

        return factory

    monkeypatch.setattr(autograd, "KERNELS", {})
    monkeypatch.setattr(autograd, "PLANS", {})
    for name in ("scaled_silu_fwd", "scaled_silu_bwd"):
        monkeypatch.setattr(autograd, name, recorder(name))
    return autograd, builds, launches


def _forward_and_backward(autograd, shape):
    import torch

    x = torch.randn(shape).to(torch.float16)
    w = torch.ones((), dtype=torch.float32)
    autograd.run_forward(x, w, False)
    autograd.launch_backward(x, None, w, torch.randn_like(x), torch.empty_like(x),
                             autograd.alloc_dw(x, "split"), "split")


def test_one_kernel_per_variant_serves_every_shape(recorded):
    """The shipped (scalar weight) package builds its kernels from the variant alone: x of any
    shape, odd sizes included, launches the same two kernels on its [1, x.numel()] view."""
    autograd, builds, launches = recorded
    shapes = [(3, 1000, 77), (4097,), (64, 1024), (1,), (5, 5, 5)]
    for shape in shapes:
        _forward_and_backward(autograd, shape)
    assert builds == {
        "scaled_silu_fwd": [("scalar", None, "int32", "float16", "float32", False)],
        "scaled_silu_bwd": [("scalar", None, "int32", "float16", "float32", False, "split")],
    }
    assert len(autograd.KERNELS) == 2
    # x, w, y, then x, w, dy, dx and the [column blocks] split partials.
    assert launches[-2:] == [((1, 125), (1,), (1, 125)), ((1, 125), (1,), (1, 125), (1, 125), (1,))]


def test_a_view_past_the_int32_extent_takes_the_int64_kernels(recorded, monkeypatch):
    autograd, builds, _ = recorded
    kernels = import_generated("scaled_silu", "kernels")
    assert kernels.dim_dtype(kernels.INT32_EXTENT) == "int32"
    assert kernels.dim_dtype(kernels.INT32_EXTENT + 1) == "int64"
    monkeypatch.setattr(kernels, "INT32_EXTENT", 4096)
    for shape in ((4096,), (4097,), (4096,)):
        _forward_and_backward(autograd, shape)
    assert [args[2] for args in builds["scaled_silu_fwd"]] == ["int32", "int64"]
    assert [args[2] for args in builds["scaled_silu_bwd"]] == ["int32", "int64"]


# --- the real lowering: symbolic dims, vector accesses, one atomic per block -----------------


def _kernel_body(source: str) -> str:
    return source[source.index("__global__ void __launch_bounds__"):]


def _lower(factory, job) -> str:
    """The CUDA source of a job's kernel, lowered by TileLang for sm_90a with the factory's pass
    configs (the lowering the compile check runs, without nvcc)."""
    import tilelang
    from tvm import transform
    from tvm.target import Target

    target = {"kind": "cuda", "arch": "sm_90a"}
    func = factory.get_tir(*job.args, **job.tiling)
    with transform.PassContext(opt_level=3, config=factory.pass_configs), Target(target):
        return _kernel_body(tilelang.lower(func, target=target).kernel_source)


# The kernels read, by spec and job label: the default (scalar) spec, and a channel spec whose
# tail shape has C = 77 (no vector access fits a row) and whose benchmark has C = 8192.
LOWERED = {
    "s": ["fwd float16 sigmoid=recompute", "fwd float16 sigmoid=save",
          "bwd float16 sigmoid=recompute dw=atomic", "bwd float16 sigmoid=recompute dw=split",
          "fwd float16 sigmoid=recompute (int64 dims)"],
    "c": ["bwd float16 C=77 sigmoid=recompute dw=atomic", "bwd float16 C=77 sigmoid=recompute dw=split",
          "fwd float16 C=8192 sigmoid=recompute (bench)",
          "bwd float16 C=8192 sigmoid=recompute dw=atomic (bench)"],
}


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """{(spec, job label): kernel source} of LOWERED."""
    import importlib.util
    import os

    from opgen.output import write as write_package

    root = tmp_path_factory.mktemp("scaled_silu")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        sources = {}
        for name, text in (("s", MINIMAL), ("c", CHANNEL)):
            gen = generate(write(root, text.replace('"x"', f'"{name}"'), name=name))
            write_package(gen, root)
            path = root / gen.out_dir / "kernels.py"
            spec = importlib.util.spec_from_file_location(f"_silu_lowered_{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            jobs = {job.label: job for job in gen.plan.compile_jobs}
            for label in LOWERED[name]:
                sources[name, label] = _lower(getattr(module, jobs[label].factory), jobs[label])
        return sources
    finally:
        os.chdir(cwd)


def _params(source: str) -> str:
    """The kernel's parameter list."""
    start = source.index("_kernel(") + len("_kernel(")
    return source[start:source.index(")", start)]


@pytest.mark.compile
@pytest.mark.xdist_group("scaled_silu_compile")
def test_runtime_dims_are_kernel_parameters(lowered):
    """The element count (scalar weight) or the row count (channel weight) is a parameter of the
    kernel, bound at each call, never a constant of it; so is the count of split partials."""
    fwd = lowered["s", "fwd float16 sigmoid=recompute"]
    assert _params(fwd).endswith("half_t* __restrict__ Y, int cols"), _params(fwd)
    assert _params(lowered["s", "fwd float16 sigmoid=recompute (int64 dims)"]).endswith("int64_t cols")
    assert _params(lowered["s", "bwd float16 sigmoid=recompute dw=split"]).endswith("int col_blocks, int cols")
    assert _params(lowered["s", "bwd float16 sigmoid=recompute dw=atomic"]).endswith("dY, int cols")
    assert _params(lowered["c", "bwd float16 C=77 sigmoid=recompute dw=split"]).endswith(
        "int row_blocks, int rows")
    assert _params(lowered["c", "fwd float16 C=8192 sigmoid=recompute (bench)"]).endswith("int rows")
    # One grid dim: the row blocks are not limited to a second dim's 65535.
    for key, source in lowered.items():
        assert "blockIdx.y" not in source, key


@pytest.mark.compile
@pytest.mark.xdist_group("scaled_silu_compile")
def test_full_tiles_load_and_store_vectors(lowered):
    """Note [full tiles unguarded]: a whole tile takes a branch without per-element guards, whose
    global accesses are vectors (16 bytes of fp16 for the scalar fwd; 4 elements where the loop
    also holds an fp32 tensor, as the static kernels did); only the tail tile tests each element
    against the symbolic count."""
    fwd = lowered["s", "fwd float16 sigmoid=recompute"]
    full = fwd.index("if (((((int)blockIdx.x) * 4096) + 4096) <= cols) {")
    tail = fwd.index("} else {", full)
    for access in ("*(uint4*)(X + ", "*(uint4*)(Y + "):
        assert full < fwd.index(access) < tail, fwd
    assert re.search(r"< cols\) \{\s*Y\[", fwd[tail:]), fwd  # per element, guarded
    saved = lowered["s", "fwd float16 sigmoid=save"]
    for access in ("*(uint2*)(X + ", "*(uint2*)(Y + ", "*(float4*)(S + "):
        assert access in saved, saved
    bwd = lowered["s", "bwd float16 sigmoid=recompute dw=atomic"]
    assert "if (((((int)blockIdx.x) * 4096) + 4096) <= cols) {" in bwd, bwd
    for access in ("*(uint2*)(X + ", "*(uint2*)(dY + ", "*(uint2*)(dX + "):
        assert access in bwd, bwd
    # A channel weight: C = 8192 is static, so even the tail tile (rows past the end) keeps
    # vectors; its guard is per row.
    for label, accesses in (("fwd float16 C=8192 sigmoid=recompute (bench)", ("X", "Y")),
                            ("bwd float16 C=8192 sigmoid=recompute dw=atomic (bench)", ("X", "dY", "dX"))):
        source = lowered["c", label]
        assert "if ((((((int)blockIdx.x) >> 5) *" in source, source  # 32 column blocks of 256
        for name in accesses:
            assert f"*(uint2*)({name} + " in source, source
            assert not re.search(rf"(?<![\w*(]){name}\[", source), source  # no scalar access


@pytest.mark.compile
@pytest.mark.xdist_group("scaled_silu_compile")
def test_dw_atomics_one_per_block_or_channel(lowered):
    """The atomic bwd kernels: a scalar weight issues exactly one guarded fp32 atomic per block,
    a channel weight one per channel of the tile, guarded against the tail channels; then one
    thread counts the block done, and the last block casts the sums into dw and zeroes them and
    the count (conftest.assert_last_block_finishes)."""
    # The add sits inside the guard's block: no closing brace between them.
    scalar = lowered["s", "bwd float16 sigmoid=recompute dw=atomic"]
    assert len(re.findall(r"AtomicAdd\(", scalar)) == 1, scalar
    guarded = r"if \(\(\(int\)threadIdx\.x\) == 0\) \{[^}]*AtomicAdd\(\(&\(dW\[0\]\)\)"
    assert re.search(guarded, scalar), scalar
    # One add statement, each thread adding the channels it owns after the reduction; C = 77
    # with 32 x 256 tiles leaves 179 tail channels out.
    channel = lowered["c", "bwd float16 C=77 sigmoid=recompute dw=atomic"]
    assert len(re.findall(r"AtomicAdd\(", channel)) == 1, channel
    assert re.search(r"if \(\(\(int\)threadIdx\.x\) < 77\) \{[^}]*AtomicAdd", channel), channel
    for source in (scalar, channel):
        added, counted = source.index("AtomicAdd("), source.index("AtomicAddRet((&(Done[0])), 1)")
        assert added < source.index("__threadfence();", added) < counted, source
    for source, guard in ((scalar, "threadIdx.x) < 1"), (channel, "threadIdx.x) < 77")):
        assert_last_block_finishes(source, source.index("AtomicAddRet((&(Done[0])), 1)"), guard)


@pytest.mark.compile
@pytest.mark.xdist_group("scaled_silu_compile")
def test_dw_split_stores_one_partial_per_block_or_channel(lowered):
    """Block b writes partial b; the store is also checked against the buffer's own symbol (TileLang
    cannot prove b < col_blocks, a symbol of its own), once per block."""
    scalar = lowered["s", "bwd float16 sigmoid=recompute dw=split"]
    assert "AtomicAdd" not in scalar, scalar
    assert re.search(r"if \(\(\(int\)threadIdx\.x\) == 0\) \{[^}]*if \(\(\(int\)blockIdx\.x\) < col_blocks\) "
                     r"\{\s*dW\[\(\(int64_t\)\(\(int\)blockIdx\.x\)\)\] = ", scalar), scalar
    channel = lowered["c", "bwd float16 C=77 sigmoid=recompute dw=split"]
    assert "AtomicAdd" not in channel, channel
    # Row block blockIdx.x (one column block: C = 77 < 256) writes its row of [row blocks, 77].
    assert re.search(r"< 77\) \{\s*if \(\(\(int\)blockIdx\.x\) < row_blocks\) \{\s*"
                     r"dW\[[^\]]*blockIdx\.x\)+ \* \(int64_t\)77\)", channel), channel
