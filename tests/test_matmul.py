"""The matmul family (opgen/families/matmul.py): spec models, invalid specs through load_plan with
their field paths, plan(), explain(), deterministic rendering, and the real lowering of the GEMMs
(they must be WGMMA kernels for sm_90a)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from conftest import REPO_ROOT, plan_from, spec_problems as problems, write_spec as write

from opgen.errors import OpgenError
from opgen.families import FAMILIES, matmul
from opgen.families.matmul import (
    DEFAULT_TILING,
    DEFAULT_TOLERANCES,
    GemmTiling,
    Spec,
    axis_blocks,
    explain,
    flops,
    smem_bytes,
    wgmma_warps,
)
from opgen.plan import SM90_SMEM_LIMIT
from opgen.render import environment, generate
from opgen.spec import read_spec, validate

MINIMAL = 'name = "x"\nfamily = "matmul"\n'
BIAS = MINIMAL + "[matmul]\nbias = true\n"
BIAS_BF16 = MINIMAL + 'dtypes = ["bfloat16"]\n[matmul]\nbias = true\n'




def plan_of(project: Path, text: str = MINIMAL) -> matmul.Plan:
    return plan_from(matmul.FAMILY, project, text)




# --- registry and defaults ------------------------------------------------------------------------


def test_registered_with_the_family_interface():
    family = FAMILIES["matmul"]
    assert family is matmul.FAMILY
    assert set(family.scaffolds) == {"matmul"}
    assert family.required_shape_keys == ("m", "n", "k")


def test_minimal_spec_loads_every_default(project):
    spec = validate(Spec, read_spec(write(project, MINIMAL)))
    assert spec.matmul.bias is False
    assert (spec.grads.da.reduction, spec.grads.db.reduction, spec.grads.dbias.reduction) == (
        "direct", "direct", "split")
    assert spec.tiling.fwd == GemmTiling(block_m=128, block_n=256, block_k=64, threads=256,
                                         num_stages=3)
    assert spec.tiling.da == spec.tiling.db == spec.tiling.fwd
    assert spec.tiling.dbias == DEFAULT_TILING["dbias"]
    assert [(s.m, s.n, s.k) for s in spec.test.shapes] == [
        (1000, 777, 336), (64, 4096, 64), (4097, 128, 1024), (333, 333, 333)]
    assert spec.bench.dtype == "bfloat16"
    assert [(s.m, s.n, s.k) for s in spec.bench.shapes] == [(4096,) * 3, (8192,) * 3]


def test_shipped_spec_is_the_scaffold_with_a_bias(project):
    """specs/matmul.toml shows the defaults, with the bias turned on."""
    shipped = validate(Spec, read_spec(REPO_ROOT / "specs" / "matmul.toml"))
    minimal = validate(Spec, read_spec(write(project, BIAS.replace('"x"', '"matmul"'))))
    tolerances = {d: shipped.test.tolerance_for(d) for d in shipped.dtypes}
    assert tolerances == DEFAULT_TOLERANCES
    without_tables = shipped.test.model_copy(update={"tolerance": {}})
    assert shipped.model_copy(update={"test": without_tables}) == minimal


def test_partial_tiling_override_keeps_the_other_defaults(project):
    p = plan_of(project, MINIMAL + "[tiling.db]\nnum_stages = 2\n")
    assert p.kernels["db"].tiling == {"block_m": 128, "block_n": 256, "block_k": 64,
                                      "threads": 256, "num_stages": 2}
    assert p.kernels["fwd"].tiling["num_stages"] == 3


def test_default_tolerances_are_looser_than_rounding_and_catch_a_doubled_gradient():
    for dtype, mantissa_bits in (("float16", 10), ("bfloat16", 7)):
        tol = DEFAULT_TOLERANCES[dtype]
        assert 2 ** -mantissa_bits < tol.rtol < 0.5  # one ulp passes; |2g - g| = |g| does not
        assert tol.atol < 0.01  # a fraction of the tensor's largest |value|


# --- invalid specs through load_plan: field paths and messages ------------------------------------


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ("[matmul]\nbias = 1\n", "matmul.bias", "must be true or false (got 1)"),
        ("[matmul]\ntranspose = true\n", "matmul.transpose",
         "unknown key; allowed keys here: bias"),
        ('[grads.da]\nreduction = "atomic"\n', "grads.da.reduction", "must be one of direct"),
        ('[grads.dbias]\nreduction = "atomic"\n', "grads.dbias.reduction", "must be one of split"),
        ("[tiling.fwd]\nblock_k = 48\n", "tiling.fwd.block_k", "power of two"),
        ("[tiling.da]\nthreads = 100\n", "tiling.da.threads", "multiple of 32"),
        ("[tiling.db]\nnum_stages = 5\n", "tiling.db.num_stages", "less than or equal to 4"),
        ("[tiling.dbias]\nblock_k = 64\n", "tiling.dbias.block_k", "unknown key"),
        ("[tiling.bwd]\nblock_m = 64\n", "tiling.bwd", "unknown key"),
        ("[test]\nshapes = [{ m = 1000, n = 0, k = 336 }]\n", "test.shapes.0.n",
         "greater than or equal to 1"),
        ("[test]\nshapes = [[1000, 777, 336]]\n", "test.shapes.0", "must be a table (got [1000, 777, 336])"),
        ("[bench]\nshapes = [{ m = 4096, n = 4096 }]\n", "bench.shapes.0.k",
         "required key is missing"),
        ('[bench]\ndtype = "float32"\n', "bench.dtype", "must be one of float16, bfloat16"),
        ("[test.tolerance.bfloat16]\nrtol = 0.0\natol = 0.01\n", "test.tolerance.bfloat16.rtol",
         "greater than 0"),
    ],
)
def test_field_errors(project, text, field, fragment):
    found = problems(project, MINIMAL + text)
    assert [f for f, _ in found] == [field], found
    assert fragment in found[0][1], found


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ("[tiling.fwd]\nthreads = 160\n", "tiling.fwd.threads", "multiple of 128"),
        ("[tiling.da]\nblock_m = 32\n", "tiling.da.block_m", "at least 64"),
        ("[tiling.db]\nthreads = 384\n", "tiling.db", "cannot be split over 12 warps"),
        ("[tiling.fwd]\nblock_n = 256\nblock_k = 128\nnum_stages = 4\n", "tiling.fwd",
         "needs about 384 KB of shared memory"),
        ("[tiling.dbias]\nblock_m = 128\n", "tiling.dbias", "at most 64 x threads"),
        ("[tiling.dbias]\nblock_m = 16\nblock_n = 16\nthreads = 512\n", "tiling.dbias",
         "at least threads"),
        ("[test]\nshapes = [{ m = 1024, n = 777, k = 333 }, { m = 64, n = 64, k = 64 }]\n",
         "test.shapes", "m is not a multiple of 32"),
        ("[test]\nshapes = [{ m = 1000, n = 777, k = 333 }]\n", "test.shapes", "square shape"),
        ("[test]\nshapes = []\n", "test.shapes", "at least one shape"),
        ("[bench]\nshapes = []\n", "bench.shapes", "at least one shape"),
    ],
)
def test_consistency_errors(project, text, field, fragment):
    found = problems(project, MINIMAL + text)
    assert [f for f, _ in found] == [field], found
    assert fragment in found[0][1], found


def test_every_problem_is_reported_at_once(project):
    found = problems(project, MINIMAL + '[grads.db]\nreduction = "split"\n'
                     '[tiling.da]\nblock_m = 48\n[bench]\ndtype = "float8"\n')
    assert [f for f, _ in found] == ["grads.db.reduction", "tiling.da.block_m", "bench.dtype"]


def test_consistency_errors_together(project):
    found = problems(project, MINIMAL + "[tiling.fwd]\nthreads = 160\n"
                     "[test]\nshapes = [{ m = 256, n = 256, k = 256 }]\n")
    assert [f for f, _ in found] == ["tiling.fwd.threads"] + ["test.shapes"] * 3
    assert [msg.split(" is not")[0] for _, msg in found[1:]] == [
        "add a shape whose m", "add a shape whose n", "add a shape whose k"]


# --- plan -----------------------------------------------------------------------------------------


def test_plan_is_frozen(project):
    p = plan_of(project)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "y"


def test_plan_generic_fields(project):
    p = plan_of(project)
    assert (p.family, p.name) == ("matmul", "x")
    assert p.ops == {
        "fwd": "opgen::x_fwd", "bwd_da": "opgen::x_bwd_da", "bwd_db": "opgen::x_bwd_db"}
    assert p.dtypes == ("float16", "bfloat16")
    assert p.torch_dtypes == ("torch.float16", "torch.bfloat16")
    assert p.tolerances == DEFAULT_TOLERANCES
    assert p.source.spec_path == "specs/x.toml"
    assert p.bench.dtype == "bfloat16"
    assert p.saved == ("a", "b")


def test_plan_kernels_without_bias(project):
    p = plan_of(project)
    assert list(p.kernels) == ["fwd", "da", "db"]
    assert [k.factory for k in p.kernels.values()] == ["x_fwd", "x_bwd_da", "x_bwd_db"]
    assert [k.phase for k in p.kernels.values()] == ["fwd", "bwd", "bwd"]
    assert [k.tiling_name for k in p.kernels.values()] == ["FWD_TILING", "DA_TILING", "DB_TILING"]
    assert all(k.out_idx is None for k in p.kernels.values())
    assert p.kernels["da"].grid == "(ceildiv(k, block_n), ceildiv(m, block_m))"
    assert p.kernels["db"].grid == "(ceildiv(n, block_n), ceildiv(k, block_m))"
    assert "transpose_B" in p.kernels["da"].summary and "transpose_A" in p.kernels["db"].summary
    assert (p.bias, p.bias_variants, p.tensor_inputs) == (False, (False,), ("a", "b"))
    assert (p.params, p.apply_args) == ("a, b", "a, b, None")


def test_plan_kernels_and_grads_with_bias(project):
    p = plan_of(project, BIAS)
    assert list(p.kernels) == ["fwd", "da", "db", "dbias"]
    dbias = p.kernels["dbias"]
    assert (dbias.factory, dbias.phase, dbias.tiling) == (
        "x_bwd_dbias", "bwd_param", {"block_m": 32, "block_n": 256, "threads": 256})
    assert [(g.grad, g.input, g.reduction, g.buffer_dtype, g.alloc) for g in p.grads] == [
        ("da", "a", "direct", "input", "torch.empty"),
        ("db", "b", "direct", "input", "torch.empty"),
        ("dbias", "bias", "split", "float32", "torch.empty"),
    ]
    assert p.grad_check_order == (("dA", "a"), ("dB", "b"), ("dbias", "bias"))
    assert (p.bias, p.bias_variants, p.tensor_inputs) == (True, (True, False), ("a", "b", "bias"))
    assert (p.params, p.apply_args) == ("a, b, bias", "a, b, bias")
    assert list(p.ops) == ["fwd", "bwd_da", "bwd_db", "bwd_dbias"]
    assert p.ops["bwd_dbias"] == "opgen::x_bwd_dbias"


def test_plan_test_cases(project):
    p = plan_of(project)
    assert [c.id for c in p.test_cases] == ["m1000-n777-k336", "m64-n4096-k64", "m4097-n128-k1024",
                                           "m333-n333-k333"]
    assert (p.tail_case.m, p.tail_case.n, p.tail_case.k) == (1000, 777, 336)
    assert (p.square_case.m, p.square_case.n, p.square_case.k) == (333, 333, 333)
    # The tail case is the one with the most partial tiles.
    p = plan_of(project, MINIMAL + "[test]\nshapes = [{ m = 64, n = 64, k = 64 }, "
                "{ m = 1000, n = 64, k = 64 }, { m = 100, n = 100, k = 100 }]\n")
    assert (p.tail_case.m, p.tail_case.n, p.tail_case.k) == (100, 100, 100)


def test_axis_blocks_cover_every_phase(project):
    spec = validate(Spec, read_spec(write(project, MINIMAL + "[tiling.db]\nblock_k = 32\n"
                                                         "[tiling.da]\nblock_n = 64\n")))
    # M: fwd block_m, da block_m, db block_k (32), dbias block_m (32); N: fwd block_n, da block_k,
    # db block_n, dbias block_n; K: fwd block_k, da block_n (64), db block_m.
    assert axis_blocks(spec.tiling) == {"m": 32, "n": 64, "k": 64}


def test_wgmma_warps_follow_the_full_row_policy():
    def tiles(block_m, block_n, threads):
        return GemmTiling(block_m=block_m, block_n=block_n, block_k=64, threads=threads,
                          num_stages=3)

    assert wgmma_warps(tiles(128, 128, 256)) == (8, 1)
    assert wgmma_warps(tiles(64, 128, 256)) == (4, 2)
    assert wgmma_warps(tiles(128, 256, 128)) == (4, 1)
    assert wgmma_warps(tiles(128, 128, 384)) is None


def test_smem_estimate():
    fwd = DEFAULT_TILING["fwd"]
    # Three stages of a 128x64 and a 64x256 fp16 tile; the 128x256 staging tile reuses them.
    assert smem_bytes(fwd) == 3 * 2 * (8192 + 16384) == 147456
    single = fwd.model_copy(update={"num_stages": 0})
    assert smem_bytes(single) == 128 * 256 * 2  # the staging tile is the larger
    assert smem_bytes(fwd.model_copy(update={"block_n": 256, "num_stages": 4})) > 0
    assert all(smem_bytes(DEFAULT_TILING[p]) <= SM90_SMEM_LIMIT for p in ("fwd", "da", "db"))


def test_plan_compile_jobs(project):
    p = plan_of(project, BIAS)
    labels = [j.label for j in p.compile_jobs]
    # m is symbolic: a job per (n, k) variant. Per dtype at the tail shape: fwd with and without
    # bias, dA, dB, dbias; per bench shape the same with the spec's bias; then the bench sweep's
    # square sizes the bench shapes leave out (512, 1024, 2048).
    assert len(labels) == 2 * 5 + 2 * 4 + 3 * 4
    assert labels[:5] == [
        "fwd float16 n=777 k=336 bias=True", "fwd float16 n=777 k=336 bias=False",
        "bwd_da float16 n=777 k=336", "bwd_db float16 n=777 k=336", "bwd_dbias float16 n=777",
    ]
    assert labels[14:18] == ["fwd bfloat16 n=8192 k=8192 bias=True (bench)",
                             "bwd_da bfloat16 n=8192 k=8192 (bench)",
                             "bwd_db bfloat16 n=8192 k=8192 (bench)",
                             "bwd_dbias bfloat16 n=8192 (bench)"]
    assert labels[-4:] == ["fwd bfloat16 n=2048 k=2048 bias=True (bench sweep)",
                           "bwd_da bfloat16 n=2048 k=2048 (bench sweep)",
                           "bwd_db bfloat16 n=2048 k=2048 (bench sweep)",
                           "bwd_dbias bfloat16 n=2048 (bench sweep)"]
    fwd, _, da, db, dbias = p.compile_jobs[:5]
    assert (fwd.factory, fwd.args, fwd.tiling) == (
        "x_fwd", (777, 336, "float16", True), p.kernels["fwd"].tiling)
    assert (da.factory, da.args) == ("x_bwd_da", (777, 336, "float16"))
    assert (db.factory, db.args) == ("x_bwd_db", (777, 336, "float16"))
    assert (dbias.factory, dbias.args) == ("x_bwd_dbias", (777, "float16"))
    plain = plan_of(project, MINIMAL + 'dtypes = ["bfloat16"]\n')
    assert len(plain.compile_jobs) == 3 + 2 * 3 + 3 * 3
    assert not any("dbias" in j.label or "bias=True" in j.label for j in plain.compile_jobs)


def test_plan_compile_jobs_build_a_shared_variant_once(project):
    """Two bench shapes with one n, k (only m differs) are one kernel variant: one job each."""
    p = plan_of(project, MINIMAL + 'dtypes = ["bfloat16"]\n[bench]\nshapes = [{ m = 4096, n = 512, '
                "k = 256 }, { m = 77, n = 512, k = 256 }]\n")
    keys = [(j.factory, j.args) for j in p.compile_jobs]
    assert len(keys) == len(set(keys)) == 3 + 3 + 5 * 3  # and the five sweep sizes


def test_plan_bench_flops(project):
    p = plan_of(project)
    first = p.bench_cases[0]
    assert first.values == (4096, 4096, 4096)
    assert (first.fwd_flops, first.bwd_flops) == (2 * 4096**3, 4 * 4096**3)
    assert flops(2, 3, 5) == (60, 120)


def test_explain_tables(project):
    p = plan_of(project, BIAS)
    tables = dict(explain(p, {"m": 1000, "n": 777, "k": 336, "dtype": "float16"}))
    kernels = tables["kernels"]
    assert kernels[0] == ["factory", "phase", "grid", "tiling", "smem (estimate)", "computes"]
    grids = {row[0]: row[2].rsplit("= ", 1)[1] for row in kernels[1:]}
    # n = 777 is no multiple of 8: no TMA, so the 128 x 256 tiles launch 128 wide.
    assert grids == {"x_fwd": "(7, 8)", "x_bwd_da": "(3, 8)", "x_bwd_db": "(7, 3)",
                     "x_bwd_dbias": "(4, 32)"}
    assert kernels[1][4] == "144.0 KiB" and kernels[4][4] == "-"
    aligned = dict(explain(p, {"m": 1000, "n": 768, "k": 336, "dtype": "float16"}))["kernels"]
    assert aligned[1][2].endswith("= (3, 8)")  # 768 / 256 columns of C
    saved = {row[0]: row[1] for row in tables["saved for backward"][1:]}
    assert saved["a"] == "656.2 KiB"  # 1000 x 336 x 2 bytes
    dbias = tables["gradient reductions"][3]
    assert dbias[:2] == ["dbias", "split"] and "[32, 777]" in dbias[2]
    assert dbias[3] == "97.1 KiB"  # 32 x 777 fp32
    flop_rows = tables["FLOPs (what the benchmark divides by)"]
    assert flop_rows[1][1] == f"{2 * 1000 * 777 * 336 / 1e12:.3f} TFLOP"
    assert flop_rows[2][1] == f"{4 * 1000 * 777 * 336 / 1e12:.3f} TFLOP"
    plain = dict(explain(plan_of(project), {"m": 64, "n": 64, "k": 64}))
    assert [row[0] for row in plain["gradient reductions"][1:]] == ["da", "db"]


def test_explain_rejects_impossible_shapes(project):
    p = plan_of(project)
    with pytest.raises(OpgenError, match="dtype must be one of"):
        explain(p, {"m": 1, "n": 1, "k": 1, "dtype": "float32"})
    with pytest.raises(OpgenError, match="m, n and k must be >= 1"):
        explain(p, {"m": 0, "n": 1, "k": 1})


def test_explain_cli_default_shape(repo_root, cli):
    result = cli("explain", "specs/matmul.toml")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("specs/matmul.toml: matmul 'matmul'\n")
    assert "m=4096 n=4096 k=4096 dtype=bfloat16" in result.stdout
    result = cli("explain", "specs/matmul.toml", "--shape", "m=1000,n=777,k=336")
    assert result.exit_code == 0, result.output
    assert "matmul_bwd_db" in result.stdout


# --- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [MINIMAL, BIAS_BF16])
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


def test_generated_signature_follows_the_bias_switch(project):
    plain = generate(write(project, MINIMAL)).files
    biased = generate(write(project, BIAS)).files
    assert "def x(a, b):" in plain["autograd.py"]
    assert "check_new_inputs(a, b, None)" in plain["autograd.py"]
    assert "def x(a, b, bias):" in biased["autograd.py"]
    assert "x_bwd_dbias" not in plain["kernels.py"] and "x_bwd_dbias" in biased["kernels.py"]
    assert 'torch.library.custom_op("opgen::x_bwd_dbias", dbias_phase,' in biased["autograd.py"]
    assert "opgen::x_bwd_dbias" not in plain["autograd.py"]
    assert "dbias_op" not in plain["autograd.py"] + plain["test_x.py"]
    assert "dbias_phase" not in plain["autograd.py"]
    assert "return apply_op(a, b, None)" in plain["autograd.py"]
    assert "test_dbias_partials" not in plain["test_x.py"]
    assert "test_dbias_partials" in biased["test_x.py"]
    assert 'pytest.param(False, id="no-bias")' in biased["test_x.py"]
    assert 'id="bias"' not in plain["test_x.py"]
    assert "torch.addmm(bias, a, b)" in biased["bench_x.py"]


def test_scaffold_builds_and_is_the_shipped_spec(project):
    preset = matmul.FAMILY.scaffolds["matmul"]
    text = environment().get_template("new/matmul.toml.jinja").render(name="matmul", preset=preset)
    assert text == (REPO_ROOT / "specs" / "matmul.toml").read_text()
    spec = validate(Spec, read_spec(write(project, text)))
    assert spec.matmul.bias is True and spec.tiling.fwd == DEFAULT_TILING["fwd"]
    assert any(s.m == s.n == s.k for s in spec.test.shapes)


def test_generated_package_is_current(repo_root):
    """generated/matmul/ is what the shipped spec renders to (the golden test covers it too)."""
    gen = generate(Path("specs/matmul.toml"))
    from opgen.output import diff

    assert diff(gen, repo_root) == []  # the manifest's compile flag is the last build's


# --- the real lowering: WGMMA for sm_90a ----------------------------------------------------------


@pytest.fixture
def fresh_compiles():
    """Compile for real: a kernel from TileLang's disk cache carries no lowering artifact."""
    import tilelang

    enabled = tilelang.is_cache_enabled()
    tilelang.disable_cache()
    yield
    if enabled:
        tilelang.enable_cache()


@pytest.mark.compile
def test_gemm_kernels_are_wgmma_for_sm90a(project, monkeypatch, fresh_compiles):
    """Lower the fwd, dA and dB GEMMs at the tail shape (TileLang + nvcc, on the CPU) and read the
    PTX: every one must issue wgmma.mma_async for sm_90a. A WGMMA kernel built for plain sm_90, or
    a tile TileLang cannot give to WGMMA, compiles without them: it would run
    mma.sync or, worse, skip the products. Also: the shared memory stays within the estimate, and
    the loads that cannot use TMA (rows of 777 elements are not 16-byte aligned) are guarded."""
    from opgen.output import write as write_package

    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", '{"kind": "cuda", "arch": "sm_90a"}')
    gen = generate(write(project, BIAS_BF16.replace('"x"', '"mm"'), name="mm"))
    write_package(gen, project)
    path = project / gen.out_dir / "kernels.py"
    spec = importlib.util.spec_from_file_location("_matmul_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jobs = {job.label.split()[0]: job for job in gen.plan.compile_jobs
            if "bench" not in job.label and "bias=False" not in job.label}
    assert set(jobs) == {"fwd", "bwd_da", "bwd_db", "bwd_dbias"}
    for phase, key in (("fwd", "fwd"), ("bwd_da", "da"), ("bwd_db", "db")):
        job = jobs[phase]
        kernel = getattr(module, job.factory)(*job.args, **job.tiling)
        ptx = kernel._get_ptx()
        assert ".target sm_90a" in ptx, phase
        assert "wgmma.mma_async" in ptx, f"{phase}: no WGMMA in the PTX"
        smem = max(int(f.attrs["dyn_shared_memory_buf"])
                   for f in kernel.artifact.device_mod.functions.values()
                   if f.attrs and "dyn_shared_memory_buf" in f.attrs)
        assert smem <= gen.plan.smem[key], (phase, smem, gen.plan.smem[key])
        # Rows of 777 elements: loaded element by element, zero past the edge (TMA needs 16 bytes).
        assert "condval" in kernel.get_kernel_source(), f"{phase}: no guarded loads"


@pytest.mark.compile
def test_db_compiles_where_neither_operand_takes_tma(project, monkeypatch, fresh_compiles):
    """dB reduces over the symbolic m: its pipelined loop has an unknown length. At n = k = 333
    (rows of A and dC not 16-byte aligned) neither operand takes TMA, and the pipeline's drain
    after the loop waits on cp.async groups with counts that must be constants in PTX; CUDA
    codegen once failed there ('Downcast from tirx.Sub to ir.IntImm'; the fwd and dA kernels,
    with a static reduction, compiled). Lowered and compiled with nvcc for sm_90a, m still
    symbolic."""
    from opgen.output import write as write_package

    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", '{"kind": "cuda", "arch": "sm_90a"}')
    text = MINIMAL.replace('"x"', '"mm333"') + "[test]\nshapes = [{ m = 333, n = 333, k = 333 }]\n"
    gen = generate(write(project, text, name="mm333"))
    write_package(gen, project)
    path = project / gen.out_dir / "kernels.py"
    spec = importlib.util.spec_from_file_location("_matmul333_kernels", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    job = next(j for j in gen.plan.compile_jobs if j.label == "bwd_db float16 n=333 k=333")
    kernel = getattr(module, job.factory)(*job.args, **job.tiling)
    source = kernel.get_kernel_source()
    assert "tma_load" not in source  # the path under test: no operand through TMA
    assert re.search(r"__global__ void[^{]*\bint m\)", source), "m is no longer a kernel argument"
    assert re.search(r"cp_async_wait<\d+>", source)  # the drain's waits, constant counts
    assert "wgmma.mma_async" in kernel._get_ptx()
