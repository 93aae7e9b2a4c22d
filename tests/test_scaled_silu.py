"""The scaled_silu family (opgen/families/scaled_silu.py): spec models, invalid specs through
load_plan with their field paths, plan(), explain(), and deterministic rendering."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT, plan_from, spec_problems as problems, write_spec as write

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
    assert p.kernels["bwd"].tiling == {"block_rows": 1, "block_cols": 8192, "threads": 128}
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
    assert p.kernels["bwd"].tiling == {"block_rows": 1, "block_cols": 8192, "threads": 256}
    c = plan_of(project, CHANNEL)
    assert c.kernels["fwd"].tiling == {"block_rows": 16, "block_cols": 256, "threads": 256}
    assert c.kernels["bwd"].tiling == {"block_rows": 32, "block_cols": 256, "threads": 256}


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
    c = plan_of(project, CHANNEL + 'weight_dtype = "input"\n')
    assert (c.weight, c.cols_expr, c.weight_shape_expr, c.weight_dtype_expr) == (
        "channel", "x.shape[-1]", "((x.shape[-1],),)", "x.dtype")


def test_tile_and_matrix():
    assert tile("scalar", DEFAULT_TILING["bwd"]) == (1, 8192)
    assert tile("channel", DEFAULT_TILING["bwd"]) == (32, 256)
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
    # Per dtype: fwd x {recompute, save}, bwd x {recompute, save} x {atomic, split}; + the bench pair.
    assert len(labels) == 2 * (2 + 4) + 2
    assert "bwd bfloat16 1x231000 sigmoid=save dw=split" in labels
    assert labels[-2:] == ["fwd float16 1x67108864 sigmoid=recompute (bench)",
                           "bwd float16 1x67108864 sigmoid=recompute dw=atomic (bench)"]
    fwd = p.compile_jobs[0]
    assert fwd.factory == "x_fwd" and fwd.args == (1, 231000, "scalar", "float16", "float32", False)
    assert fwd.tiling == p.kernels["fwd"].tiling
    bwd = p.compile_jobs[1]
    assert bwd.args == (1, 231000, "scalar", "float16", "float32", False, "atomic")
    split_only = plan_of(project, CHANNEL + 'weight_dtype = "input"\n[grads.dw]\nreduction = "split"\n')
    jobs = split_only.compile_jobs
    assert len(jobs) == 2 * (2 + 2) + 2
    assert all("dw=atomic" not in j.label for j in jobs)
    assert jobs[1].args == (3000, 77, "channel", "float16", "float16", False, "split")


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
    tables = dict(explain(p, {"rows": 8192, "channels": 8192, "dtype": "float16"}))
    assert set(tables) >= {"kernels", "saved for backward", "gradient reductions"}
    kernels = tables["kernels"]
    assert kernels[0] == ["factory", "phase", "grid", "tiling", "computes"]
    assert kernels[1][2].endswith("= (16384, 1)") and kernels[2][2].endswith("= (8192, 1)")
    dw = tables["gradient reductions"][2]
    assert dw[:2] == ["dw", "atomic"] and dw[4] == "8192 (8192 per address)"
    c = plan_of(project, CHANNEL + '[grads.dw]\nreduction = "split"\n[saved]\nsigmoid = "save"\n')
    tables = dict(explain(c, {"rows": 8192, "channels": 8192, "dtype": "bfloat16"}))
    assert tables["kernels"][2][2].endswith("= (32, 256)")
    assert tables["gradient reductions"][2][3] == "8.0 MiB"  # 256 row blocks x 8192 fp32 partials
    saved = {row[0]: row[1] for row in tables["saved for backward"][1:]}
    assert saved["sigmoid"] == "256.0 MiB"  # fp32


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


# --- the real lowering: one atomic per block ------------------------------------------------------


def _kernel_body(source: str) -> str:
    return source[source.index("__global__ void __launch_bounds__"):]


@pytest.mark.compile
def test_dw_atomics_one_per_block_or_channel(project, monkeypatch):
    """Lower the atomic bwd kernels for sm_90a (TileLang + nvcc, on the CPU) and read the CUDA: a
    scalar weight issues exactly one guarded fp32 atomic per block, a channel weight one per
    channel of the tile, guarded against the tail channels."""
    import importlib.util

    from opgen.output import write as write_package

    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", '{"kind": "cuda", "arch": "sm_90a"}')
    sources = {}
    for name, text in (("s", MINIMAL.replace('"x"', '"s"')), ("c", CHANNEL.replace('"x"', '"c"'))):
        gen = generate(write(project, text, name=name))
        write_package(gen, project)
        path = project / gen.out_dir / "kernels.py"
        spec = importlib.util.spec_from_file_location(f"_silu_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        (job,) = [j for j in gen.plan.compile_jobs if j.label.startswith("bwd float16")
                  and "sigmoid=recompute dw=atomic" in j.label and "bench" not in j.label]
        kernel = getattr(module, job.factory)(*job.args, **job.tiling)
        sources[name] = _kernel_body(kernel.get_kernel_source())

    # The add sits inside the guard's block: no closing brace between them.
    scalar = sources["s"]
    assert scalar.count("AtomicAdd") == 1, scalar
    guarded = r"if \(\(\(int\)threadIdx\.x\) == 0\) \{[^}]*AtomicAdd\(\(&\(dW\[0\]\)\)"
    assert re.search(guarded, scalar), scalar
    # One add statement, each thread adding the channels it owns after the reduction; the 3000 x 77
    # test view with 32 x 256 tiles leaves 179 tail channels out.
    channel = sources["c"]
    assert channel.count("AtomicAdd") == 1, channel
    assert re.search(r"if \(\(\(int\)threadIdx\.x\) < 77\) \{[^}]*AtomicAdd", channel), channel
