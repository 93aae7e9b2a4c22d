"""The rmsnorm family (opgen/families/rmsnorm.py): spec models, invalid specs through load_plan with
their field paths, plan(), explain(), deterministic rendering, and the lowered CUDA of the dw
atomics."""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from pathlib import Path

import pytest

from conftest import (REPO_ROOT, assert_last_block_finishes, plan_from, spec_problems as problems,
                      write_spec as write)

from opgen.errors import OpgenError
from opgen.families import FAMILIES, rmsnorm
from opgen.families.rmsnorm import (
    DEFAULT_TILING,
    Spec,
    explain,
    matrix,
    padded,
    copied_rows,
    shared_bytes,
)
from opgen.plan import SM90_SMEM_LIMIT, weighted_bytes_moved
from opgen.render import environment, generate
from opgen.spec import DEFAULT_TOLERANCES, read_spec, validate

MINIMAL = 'name = "x"\nfamily = "rmsnorm"\n'




def plan_of(project: Path, text: str = MINIMAL) -> rmsnorm.Plan:
    return plan_from(rmsnorm.FAMILY, project, text)




def fields(project: Path, text: str) -> list[str]:
    return [field for field, _ in problems(project, text)]


# --- registry and defaults ------------------------------------------------------------------------


def test_registered_with_the_family_interface():
    family = FAMILIES["rmsnorm"]
    assert family is rmsnorm.FAMILY
    assert set(family.scaffolds) == {"rmsnorm"}


def test_minimal_spec_loads_every_default(project):
    spec = validate(Spec, read_spec(write(project, MINIMAL)))
    assert (spec.rmsnorm.eps, spec.rmsnorm.weight_dtype, spec.rmsnorm.max_channels) == (
        1e-6, "input", 16384)
    assert (spec.grads.dx.reduction, spec.grads.dw.reduction) == ("direct", "atomic")
    assert spec.saved.rstd == "auto"
    assert spec.tiling.fwd == DEFAULT_TILING["fwd"]
    assert spec.tiling.bwd == DEFAULT_TILING["bwd"]
    assert spec.test.shapes == ((3, 333, 77), (37, 5000), (4097,), (65, 8192))
    assert spec.bench.dtype == "bfloat16"
    assert [(s.rows, s.channels) for s in spec.bench.shapes] == [(16384, 4096), (4096, 8192),
                                                                 (65536, 1024)]


def test_shipped_spec_is_the_defaults(project):
    """specs/rmsnorm.toml shows the defaults: less its [[tiling.tuned]] table (what `opgen tune`
    measured on one GPU), it validates to the same spec as one that leaves every key out."""
    shipped = validate(Spec, read_spec(REPO_ROOT / "specs" / "rmsnorm.toml"))
    minimal = validate(Spec, read_spec(write(project, 'name = "rmsnorm"\nfamily = "rmsnorm"\n')))
    assert shipped.tiling.tuned
    untuned = shipped.model_copy(update={"tiling": shipped.tiling.model_copy(
        update={"tuned": minimal.tiling.tuned})})
    assert same_but_tolerance_tables(untuned, minimal)


def same_but_tolerance_tables(a: Spec, b: Spec) -> bool:
    """Equal specs, where an explicit [test.tolerance] table equal to the defaults counts as left out."""
    tolerances = {d: a.test.tolerance_for(d) for d in a.dtypes}
    return (a.model_copy(update={"test": a.test.model_copy(update={"tolerance": {}})}) == b
            and tolerances == {d: b.test.tolerance_for(d) for d in b.dtypes})


def test_partial_tiling_override_keeps_the_other_defaults(project):
    p = plan_of(project, MINIMAL + "[tiling.bwd]\nblock_rows = 64\n")
    assert p.kernels["bwd"].tiling == {"block_rows": 64, "block_channels": 1024, "threads": 256}
    assert p.kernels["fwd"].tiling == {"block_rows": 1, "block_channels": 1024, "threads": 128}


# --- invalid specs through load_plan: field paths and messages ------------------------------------


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ("[rmsnorm]\neps = 0.0\n", "rmsnorm.eps", "greater than 0"),
        ("[rmsnorm]\neps = -1e-6\n", "rmsnorm.eps", "greater than 0"),
        ('[rmsnorm]\neps = "1e-6"\n', "rmsnorm.eps", "must be a number (got \"1e-6\")"),
        ('[rmsnorm]\nweight_dtype = "float64"\n', "rmsnorm.weight_dtype",
         "must be one of input, float32"),
        ("[rmsnorm]\nmax_channels = 0\n", "rmsnorm.max_channels", "greater than or equal to 1"),
        ("[rmsnorm]\ngroups = 2\n", "rmsnorm.groups", "unknown key; allowed keys here: eps, "
         "max_channels, weight_dtype"),
        ('[grads.dx]\nreduction = "atomic"\n', "grads.dx.reduction",
         'must be one of direct (got "atomic")'),
        ('[grads.dw]\nreduction = "atomc"\n', "grads.dw.reduction", "must be one of atomic, split"),
        ('[saved]\nrstd = "keep"\n', "saved.rstd", "must be one of save, recompute"),
        ("[tiling.fwd]\nblock_rows = 3\n", "tiling.fwd.block_rows", "power of two >= 1"),
        ("[tiling.bwd]\nblock_channels = 1000\n", "tiling.bwd.block_channels", "power of two"),
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
        ("[tiling.fwd]\nblock_rows = 1\nblock_channels = 64\n", "tiling.fwd.block_channels",
         "block_rows x block_channels must be at least threads (128)"),
        ("[tiling.fwd]\nblock_rows = 2\nblock_channels = 8192\nthreads = 128\n", "tiling.fwd.block_channels",
         "must be at most 64 x threads (8192)"),
        # The bwd's w and dw sums of a row at max_channels (16384) in its threads' registers.
        ("[tiling.bwd]\nthreads = 128\n", "tiling.bwd.threads",
         "the row must be at most 64 x threads (8192): each thread holds w and the dw sums"),
        ("[rmsnorm]\nmax_channels = 6000\n[bench]\nshapes = [{ rows = 64, channels = 4096 }]\n",
         "test.shapes.3",
         "last dim (C) must be at most rmsnorm.max_channels (6000) (got 8192)"),
        ("[test]\nshapes = [[3, 2048]]\n", "test.shapes", "not a multiple of 1024"),
        ("[test]\nshapes = [[64, 77]]\n", "test.shapes", "rows (elements / last dim) are not a "
         "multiple of 16"),
        ("[test]\nshapes = []\n", "test.shapes", "at least one shape"),
        ("[bench]\nshapes = []\n", "bench.shapes", "at least one shape"),
        ("[bench]\nshapes = [{ rows = 2, channels = 16385 }]\n", "bench.shapes.0.channels",
         "must be at most rmsnorm.max_channels (16384)"),
        ('dtypes = ["float16"]\n', "bench.dtype",
         'must be one of the built dtypes float16 (got "bfloat16")'),
    ],
)
def test_consistency_errors(project, text, field, fragment):
    found = problems(project, MINIMAL + text)
    assert [f for f, _ in found] == [field], found
    assert fragment in found[0][1], found


def test_max_channels_names_the_phase_over_the_limit(project):
    # bwd registers: w and the dw sums of a row, at most 64 channels a thread (16384 at 256).
    found = problems(project, MINIMAL + "[rmsnorm]\nmax_channels = 20000\n")
    assert [f for f, _ in found] == ["tiling.bwd.threads"]
    assert found[0][1].startswith("at C = max_channels (20000, rounded up to whole block_channels "
                                  "chunks) the row must be at most 64 x threads (16384)")
    # Shared memory: bwd one row each of x and dy (4 bytes a channel at fp16), fwd block_rows
    # rows x 2 bytes.
    found = problems(project, MINIMAL + "[rmsnorm]\nmax_channels = 65536\n"
                     "[tiling.fwd]\nblock_rows = 4\nthreads = 256\n[tiling.bwd]\nthreads = 1024\n")
    assert [m.split(":")[0] for _, m in found] == [
        "the fwd kernel stages its block_rows rows of x in shared memory",
        "the bwd kernel stages its rows of x and dy in shared memory",
    ]


def test_row_tails_are_not_required_with_one_row_per_block(project):
    p = plan_of(project, MINIMAL + "[tiling.fwd]\nblock_rows = 1\n[tiling.bwd]\nblock_rows = 1\n"
                "[test]\nshapes = [[64, 77]]\n")
    assert p.tail_case.shape == (64, 77)


def test_every_problem_is_reported_at_once(project):
    found = fields(project, MINIMAL + '[grads.dw]\nreduction = "x"\n[saved]\nrstd = "x"\n'
                   "[tiling.fwd]\nblock_channels = 48\n")
    assert found == ["grads.dw.reduction", "saved.rstd", "tiling.fwd.block_channels"]


# --- plan -----------------------------------------------------------------------------------------


def test_plan_is_frozen(project):
    p = plan_of(project)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "y"


def test_plan_generic_fields(project):
    p = plan_of(project)
    assert (p.family, p.name) == ("rmsnorm", "x")
    assert p.ops == {"fwd": "opgen::x_fwd", "bwd": "opgen::x_bwd"}
    assert p.dtypes == ("float16", "bfloat16")
    assert p.torch_dtypes == ("torch.float16", "torch.bfloat16")
    assert p.tolerances == DEFAULT_TOLERANCES
    assert p.source.spec_path == "specs/x.toml"
    assert p.bench.dtype == "bfloat16"
    assert (p.eps, p.eps_literal, p.max_channels) == (1e-6, "1e-06", 16384)
    assert (p.weight_dtype, p.weight_dtype_expr) == ("input", "x.dtype")
    f32 = plan_of(project, MINIMAL + '[rmsnorm]\nweight_dtype = "float32"\neps = 1e-5\n')
    assert (f32.weight_dtype_expr, f32.eps_literal) == ("torch.float32", "1e-05")


def test_plan_kernels(project):
    p = plan_of(project)
    assert list(p.kernels) == ["fwd", "bwd"]
    assert [k.factory for k in p.kernels.values()] == ["x_fwd", "x_bwd"]
    assert [k.phase for k in p.kernels.values()] == ["fwd", "bwd"]
    assert [k.tiling_name for k in p.kernels.values()] == ["FWD_TILING", "BWD_TILING"]
    assert all(k.out_idx is None for k in p.kernels.values())
    assert all(k.grid == "(ceildiv(rows, block_rows),)" for k in p.kernels.values())
    assert p.kernels["bwd"].tiling == {"block_rows": 16, "block_channels": 1024, "threads": 256}


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


@pytest.mark.parametrize("rstd, save, saved, recomputed", [
    ("save", True, ("x", "w", "rstd"), ()),
    ("recompute", False, ("x", "w"), ("rstd",)),
])
def test_plan_saved(project, rstd, save, saved, recomputed):
    p = plan_of(project, MINIMAL + f'[saved]\nrstd = "{rstd}"\n')
    assert (p.save_rstd, p.saved, p.recomputed) == (save, saved, recomputed)


def test_auto_rstd_saves_from_a_number_of_elements_on(project):
    """saved.rstd = "auto": calls of at least AUTO_SAVE_FROM_ELEMENTS elements save rstd, smaller
    (host-bound) ones recompute it. The package renders the rule, explain shows each shape's
    choice, and both forward and backward variants are compile-checked."""
    p = plan_of(project, MINIMAL + '[saved]\nrstd = "auto"\n')
    limit = rmsnorm.AUTO_SAVE_FROM_ELEMENTS
    assert p.save_from_elements == limit and not p.save_rstd
    assert (p.saves_at(limit - 1), p.saves_at(limit)) == (False, True)
    assert [rmsnorm.saves_rstd(choice, 1) for choice in ("save", "recompute", "auto")] == [
        True, False, False]
    files = generate(write(project, MINIMAL + '[saved]\nrstd = "auto"\n')).files
    assert f"\nSAVE_RSTD_FROM_ELEMENTS = {limit}\n" in files["autograd.py"]
    assert "return x.numel() >= SAVE_RSTD_FROM_ELEMENTS" in files["autograd.py"]
    assert "return apply_op(x, w, save_rstd_for(x), DW_REDUCTION)" in files["autograd.py"]
    assert "SAVE_RSTD =" not in files["autograd.py"]
    assert "assert flags == [False, True]" in files["test_x.py"]
    for rows, held in ((8, "recomputed in backward from x"), (16384, "saved")):
        tables = dict(explain(p, {"rows": rows, "channels": 4096, "dtype": "bfloat16"}))
        assert [row[2] for row in tables["saved for backward"][1:] if row[0] == "rstd"] == [held]
    # Every bench shape (>= the limit) saves; at max_channels both variants are built.
    labels = [j.label for j in p.compile_jobs]
    assert "bwd bfloat16 C=8192 rstd=save dw=atomic (bench)" in labels
    assert not any("recompute" in label and "(bench)" in label for label in labels)
    assert {"bwd float16 C=16384 rstd=save dw=atomic (max_channels)",
            "bwd float16 C=16384 rstd=recompute dw=atomic (max_channels)"} <= set(labels)


def test_matrix_and_padding():
    assert matrix((3, 333, 77)) == (999, 77)
    assert matrix((4097,)) == (1, 4097)
    assert [padded(c, 1024) for c in (1, 77, 1024, 1025, 8192)] == [1024, 1024, 1024, 2048, 8192]


def test_shared_bytes():
    fwd, bwd = DEFAULT_TILING["fwd"].model_dump(), DEFAULT_TILING["bwd"].model_dump()
    # fwd: 1 row of x (fp16) plus its fp32 rstd, and the reduction's 128 x 4-byte workspace.
    assert shared_bytes("fwd", fwd, 77, 2) == 1 * (1024 * 2 + 4) + 512
    # bwd, rows copied asynchronously (C * 2 bytes a multiple of 16): two rows each of x and dy
    # (fp16), two workspaces: 8 bytes a channel (w and the dw sums are registers).
    assert shared_bytes("bwd", bwd, 4096, 2) == 4096 * 8 + 2048
    assert shared_bytes("bwd", bwd, 16384, 2) == 16384 * 8 + 2048
    # Rows loaded by the first pass, one row of x and dy: 4 bytes a channel. A row off the
    # 16-byte grid (C padded to 1024-chunks), or two fp32 stages over the limit at C = 16384.
    assert shared_bytes("bwd", bwd, 4097, 2) == 5120 * 4 + 2048
    assert shared_bytes("bwd", bwd, 16384, 4) == 16384 * 8 + 2048
    assert shared_bytes("bwd", bwd, 16384, 4) <= SM90_SMEM_LIMIT < shared_bytes("bwd", bwd, 65536, 2)


def test_copied_rows_match_the_generated_kernels():
    """opgen's estimate (explain, the max_channels check, the tuned entries' rule) and the
    generated kernels' run-time choice of the rows copied ahead are one rule written twice: they
    must agree, at both row_stages."""
    kernels = importlib.import_module("generated.rmsnorm.kernels")
    for row_stages in (2, 3):
        tiling = {**DEFAULT_TILING["bwd"].model_dump(), "row_stages": row_stages}
        for dtype in ("float16", "bfloat16", "float32"):
            elem = kernels.ELEMENT_BYTES[dtype]
            for channels in (1, 8, 77, 1000, 1024, 4096, 4097, 5000, 8192, 9000, 12288, 13000,
                             14336, 16384):
                args = (channels, dtype, tiling["block_channels"], tiling["threads"], row_stages)
                assert copied_rows(tiling, channels, elem) == kernels.copied_rows(*args), \
                    (dtype, channels, row_stages)
    # Three where they fit, two where only two do, one off the 16-byte grid.
    three = {**DEFAULT_TILING["bwd"].model_dump(), "row_stages": 3}
    assert [copied_rows(three, c, 2) for c in (4096, 16384, 4097)] == [3, 3, 1]
    assert [copied_rows(three, c, 4) for c in (8192, 12288, 16384)] == [3, 2, 1]


def test_plan_test_cases_and_tail_case(project):
    p = plan_of(project)
    assert [c.shape for c in p.test_cases] == [(3, 333, 77), (37, 5000), (4097,), (65, 8192)]
    assert [c.id for c in p.test_cases] == ["3x333x77", "37x5000", "4097", "65x8192"]
    assert p.tail_case.shape == (3, 333, 77)
    # A shape with tails in both rows and channels is preferred over the first with one.
    p = plan_of(project, MINIMAL + "[test]\nshapes = [[64, 77], [33, 4096], [9, 1000]]\n")
    assert p.tail_case.shape == (9, 1000)
    p = plan_of(project, MINIMAL + "[test]\nshapes = [[64, 77], [33, 4096]]\n")
    assert p.tail_case.shape == (64, 77)


def test_plan_compile_jobs(project):
    p = plan_of(project, MINIMAL + '[saved]\nrstd = "save"\n')
    labels = [j.label for j in p.compile_jobs]
    # Per dtype: fwd x {recompute, save}, bwd x {recompute, save} x {atomic, split}; + a pair
    # per bench shape (C 4096, 8192, 1024) and its fwd without rstd (a call under no_grad); + the
    # pair at C = max_channels.
    assert len(labels) == 2 * (2 + 4) + 3 * 3 + 2
    assert "bwd bfloat16 C=77 rstd=save dw=split" in labels
    assert labels[-11:-8] + labels[-2:] == [
        "fwd bfloat16 C=4096 rstd=save (bench)",
        "bwd bfloat16 C=4096 rstd=save dw=atomic (bench)",
        "fwd bfloat16 C=4096 rstd=recompute (bench, no grad)",
        "fwd float16 C=16384 rstd=save (max_channels)",
        "bwd float16 C=16384 rstd=save dw=atomic (max_channels)"]
    fwd = p.compile_jobs[0]  # the row count is symbolic: not an argument
    assert fwd.factory == "x_fwd" and fwd.args == (77, "float16", "float16", 1e-6, False)
    assert fwd.tiling == p.kernels["fwd"].tiling
    bwd = p.compile_jobs[1]
    assert bwd.args == (77, "float16", "float16", 1e-6, False, "atomic")
    split_only = plan_of(project, MINIMAL + '[rmsnorm]\nweight_dtype = "float32"\n'
                         '[grads.dw]\nreduction = "split"\n[saved]\nrstd = "recompute"\n')
    jobs = split_only.compile_jobs
    assert len(jobs) == 2 * (2 + 2) + 3 * 2 + 2
    assert all("dw=atomic" not in j.label for j in jobs)
    assert jobs[1].args == (77, "float16", "float32", 1e-6, False, "split")
    assert jobs[-1].label == "bwd float16 C=16384 rstd=recompute dw=split (max_channels)"


def test_plan_bench_bytes(project):
    p = plan_of(project)
    n = 16384 * 4096
    case = p.bench_cases[0]
    assert [(c.rows, c.channels) for c in p.bench_cases] == [(16384, 4096), (4096, 8192),
                                                              (65536, 1024)]
    # fwd: x read, y written, w read (bf16); bwd: dy, x read, dx written, w read, dw written.
    assert (case.fwd_bytes, case.bwd_bytes) == (2 * 2 * n + 2 * 4096, 3 * 2 * n + 2 * 2 * 4096)
    assert weighted_bytes_moved(n, 4096, 2, 4) == (4 * n + 4 * 4096, 6 * n + 8 * 4096)


def test_explain_tables(project):
    p = plan_of(project)
    tables = dict(explain(p, {"rows": 16384, "channels": 4096, "dtype": "bfloat16"}))
    assert set(tables) >= {"kernels", "saved for backward", "gradient reductions"}
    kernels = tables["kernels"]
    assert kernels[0] == ["factory", "phase", "grid", "tiling", "shared memory", "computes"]
    assert kernels[1][2].endswith("= (16384,)") and kernels[2][2].endswith("= (1024,)")
    assert kernels[2][4] == "34.0 KiB"  # two rows of x and dy in flight (async copies)
    dw = tables["gradient reductions"][2]
    assert dw[:2] == ["dw", "atomic"] and dw[4] == "4194304 (1024 per address)"
    saved = {row[0]: row[1] for row in tables["saved for backward"][1:]}
    assert saved["rstd"] == "64.0 KiB"  # fp32 per row
    s = plan_of(project, MINIMAL + '[grads.dw]\nreduction = "split"\n[saved]\nrstd = "recompute"\n')
    tables = dict(explain(s, {"rows": 16384, "channels": 4096, "dtype": "bfloat16"}))
    assert tables["gradient reductions"][2][3] == "16.0 MiB"  # 1024 row blocks x 4096 fp32 partials
    recomputed = [row for row in tables["saved for backward"][1:] if row[0] == "rstd"]
    assert recomputed == [["rstd", "64.0 KiB", "recomputed in backward from x"]]


def test_explain_rejects_impossible_shapes(project):
    p = plan_of(project)
    with pytest.raises(OpgenError, match="dtype must be one of"):
        explain(p, {"rows": 1, "channels": 1, "dtype": "float8"})
    with pytest.raises(OpgenError, match="rows and channels must be >= 1"):
        explain(p, {"rows": 0, "channels": 1, "dtype": "float16"})
    with pytest.raises(OpgenError, match=r"channels must be at most rmsnorm.max_channels \(16384\)"):
        explain(p, {"rows": 1, "channels": 16385, "dtype": "float16"})


# --- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", [MINIMAL, MINIMAL + '[grads.dw]\nreduction = "split"\n[saved]\nrstd = "recompute"\n']
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


def test_generated_files_carry_the_spec_choices(project):
    files = generate(write(project, MINIMAL + "[rmsnorm]\neps = 1e-5\nmax_channels = 8192\n"
                           '[saved]\nrstd = "save"\n[test]\nshapes = [[3, 333, 77]]\n')).files
    for name in ("autograd.py", "reference.py"):
        assert "\nEPS = 1e-05\n" in files[name], name
    assert "\nMAX_CHANNELS = 8192\n" in files["autograd.py"]
    assert 'DW_REDUCTION = "atomic"\nSAVE_RSTD = True\n' in files["autograd.py"]
    assert "return apply_op(x, w, save_rstd_for(x), DW_REDUCTION)" in files["autograd.py"]
    assert "TAIL_SHAPE = (3, 333, 77)\n" in files["test_x.py"]


def test_generated_test_runs_split_against_atomic_only_for_an_atomic_spec(project):
    atomic = generate(write(project, MINIMAL)).files["test_x.py"]
    split = generate(write(project, MINIMAL + '[grads.dw]\nreduction = "split"\n')).files["test_x.py"]
    for name in ("test_dw_atomics_accumulate", "test_dw_atomic_and_split_agree"):
        assert name in atomic and name not in split
    for text in (atomic, split):
        for name in ("test_dw_split_is_deterministic", "test_strided_dy", "test_expanded_dy",
                     "test_comparison_catches_broken_gradients",
                     "test_rejects_bad_inputs_before_launch", "test_rejects_tensors_on_two_devices"):
            assert f"def {name}(" in text, name
        assert 'pytest.param(True, id="save")' in text and 'pytest.param(False, id="recompute")' in text


def test_scaffold_matches_the_defaults(project):
    """`opgen new rmsnorm` renders the defaults of the models (tiling, tolerances, eps), and
    besides them its [[tiling.tuned]] entries (the shipped spec's: tests/test_cli.py)."""
    preset = {**rmsnorm.FAMILY.scaffolds["rmsnorm"], "tuned": None}
    text = environment().get_template("new/rmsnorm.toml.jinja").render(name="x", preset=preset)
    spec = validate(Spec, read_spec(write(project, text)))
    assert same_but_tolerance_tables(spec, validate(Spec, read_spec(write(project, MINIMAL, name="y"))))
    assert math.prod(spec.test.shapes[0]) % DEFAULT_TILING["fwd"].block_channels


# --- the real lowering: one atomic per block and channel ------------------------------------------


def _kernel_body(source: str) -> str:
    return source[source.index("__global__ void __launch_bounds__"):]


def _block_end(source: str, start: int) -> int:
    """The index just past the brace that closes the first block opened at or after start."""
    depth = 0
    for i in range(source.index("{", start), len(source)):
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        if depth == 0:
            return i + 1
    raise AssertionError("unbalanced braces")


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    """The CUDA of every tail-case fp16 kernel of the default spec: {label: kernel source}."""
    import importlib.util
    import os

    from opgen.output import write as write_package

    root = tmp_path_factory.mktemp("rmsnorm")
    cwd, target = os.getcwd(), os.environ.get("TILELANG_DEFAULT_TARGET")
    os.chdir(root)
    os.environ["TILELANG_DEFAULT_TARGET"] = '{"kind": "cuda", "arch": "sm_90a"}'
    try:
        gen = generate(write(root, MINIMAL))
        write_package(gen, root)
        spec = importlib.util.spec_from_file_location("_rmsnorm_lowered", root / gen.out_dir / "kernels.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sources = {}
        for job in gen.plan.compile_jobs:
            if job.label.startswith(("fwd float16 C=77 rstd=save", "bwd float16 C=77 rstd=recompute")):
                kernel = getattr(module, job.factory)(*job.args, **job.tiling)
                sources[job.label] = _kernel_body(kernel.get_kernel_source())
        return sources
    finally:
        os.chdir(cwd)
        if target is None:
            os.environ.pop("TILELANG_DEFAULT_TARGET", None)
        else:
            os.environ["TILELANG_DEFAULT_TARGET"] = target


@pytest.mark.compile
@pytest.mark.xdist_group("rmsnorm_compile")
def test_dw_atomics_one_per_block_and_channel(lowered):
    """Lowered for sm_90a (TileLang + nvcc, on the CPU): the atomic bwd kernel issues one fp32
    atomic per channel, guarded against the tail channels (the [rows, 77] test view; rows symbolic), after the loop
    over the block's rows, not inside it; then one thread counts the block done, and the last
    block casts the sums into dw and zeroes them and the count (plain loads and stores of the
    sums, after a second fence; the count reset by an atomic store)."""
    source = lowered["bwd float16 C=77 rstd=recompute dw=atomic"]
    assert len(re.findall(r"AtomicAdd\(", source)) == 1, source
    # The add sits inside the guard's block: no closing brace between them.
    assert re.search(r"if \(\(\(i_\d+ \* 256\) \+ \(\(int\)threadIdx\.x\)\) < 77\) \{[^}]*AtomicAdd", source), source
    # The rows loop runs over the block's existing rows only; the add comes after it.
    r = DEFAULT_TILING["bwd"].block_rows
    rows_loop = source.index(f"for (int s = 0; s < min({r}, (rows - (((int)blockIdx.x) * {r}))); ++s)")
    assert source.index("AtomicAdd") > _block_end(source, rows_loop), source
    added, counted = source.index("AtomicAdd("), source.index("AtomicAddRet((&(Done[0])), 1)")
    fence = source.index("__threadfence();", added)
    assert added < fence < counted, source
    # The last block: the count completed by it is ceildiv(rows, 16) - 1.
    assert re.search(r"done == \(\(\(rows \+ 15\) >> 4\) - 1\)", source), source
    assert_last_block_finishes(source, counted, "threadIdx.x) < 77")



@pytest.mark.compile
@pytest.mark.xdist_group("rmsnorm_compile")
def test_dw_split_stores_one_partial_per_block_and_channel(lowered):
    source = lowered["bwd float16 C=77 rstd=recompute dw=split"]
    assert "AtomicAdd" not in source, source
    # Row block blockIdx.x writes its partial row of the [row blocks, 77] buffer, tail guarded.
    # (The index is int64: the row count is symbolic.)
    assert re.search(r"< 77\) \{\s*dW\[[^\]]*blockIdx\.x\)+ \* (?:\(int64_t\))?77\)", source), source


@pytest.mark.compile
@pytest.mark.xdist_group("rmsnorm_compile")
def test_fwd_spreads_every_chunk_over_all_threads(lowered):
    """See Note [row sums in shared memory] in kernels.py: a loop that read the reduced per-row
    fragment would inherit its layout and run a whole 1024-channel chunk on a few threads. Every
    loop over the block_rows x 1024 tile has (tile elements / threads) iterations per thread."""
    source = lowered["fwd float16 C=77 rstd=save"]
    extents = [int(n) for n in re.findall(r"for \(int \w+ = 0; \w+ < (\d+); \+\+\w+\)", source)]
    t = DEFAULT_TILING["fwd"]
    assert 1024 not in extents and max(extents) == t.block_rows * t.block_channels // t.threads, extents


@pytest.mark.compile
@pytest.mark.xdist_group("rmsnorm_compile")
def test_three_row_stages_keep_two_rows_in_flight_and_write_only_rows_that_exist(monkeypatch):
    """row_stages = 3 (the golden rmsnorm_tuned tree at C = 8192), lowered for sm_90a: cp.async
    groups waited down to two in flight; the loop runs the block's 32 rows whatever the row count
    (a 3-stage pipeline needs a constant trip count), reading the last row again past the end,
    and dx is written only for rows that exist."""
    from opgen.compile import _load, _lower
    from opgen.plan import CompileJob

    module = _load(str(REPO_ROOT / "tests/golden/rmsnorm_tuned/kernels.py"))
    tiling = module.BWD_TILINGS[8192]
    assert tiling["row_stages"] == 3
    job = CompileJob("rmsnorm_tuned_bwd", (8192, "bfloat16", "bfloat16", 1e-6, True, "atomic"),
                     tiling, "bwd C=8192 row_stages=3")
    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", '{"kind": "cuda", "arch": "sm_90a"}')
    source = _kernel_body(_lower(module.rmsnorm_tuned_bwd, job)[0].kernel_source)
    assert "cp_async_wait<2>" in source and "min(32, (rows" not in source, source
    assert "for (int s = 0; s < 30; ++s)" in source, source  # 32 rows: 2 in the prologue
    # Row blockIdx.x * 32 + s read at min(row, rows - 1); dx written under row < rows.
    assert "(((int64_t)rows) - (int64_t)1)" in source, source
    assert "if (((((int)blockIdx.x) * 32) + s) < rows) {" in source, source


def test_the_atomic_backward_takes_dw_itself():
    """The atomic bwd kernel finishes dw in its launch: the buffer a caller passes for it is dw
    (C, w's dtype), not an fp32 sum to cast; the fp32 sums live in the package (ACCUMULATORS).
    Split keeps its fp32 partials, one row per block of rows."""
    import torch

    autograd = importlib.import_module("generated.rmsnorm.autograd")
    x = torch.empty(1000, 77, dtype=torch.bfloat16)
    dw = autograd.alloc_dw(x, "atomic")
    assert (dw.shape, dw.dtype) == ((77,), torch.bfloat16)
    partials = autograd.alloc_dw(x, "split")
    rows = DEFAULT_TILING["bwd"].block_rows
    assert (partials.shape, partials.dtype) == ((-(-1000 // rows), 77), torch.float32)
    assert autograd.ACCUMULATORS == {}
