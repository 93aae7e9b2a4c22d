"""The swiglu family (opgen/families/swiglu.py): spec models, invalid specs through load_plan with
their field paths, plan(), explain(), the math of the backward in float64, the generated package's
strided-input handling on CPU tensors, and deterministic rendering."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import REPO_ROOT, TESTS_DIR, import_generated, plan_from, spec_problems as problems
from conftest import write_spec as write

from opgen.errors import OpgenError
from opgen.families import FAMILIES, swiglu
from opgen.families.swiglu import DEFAULT_TILING, Spec, bytes_moved, explain, matrix
from opgen.render import environment, generate, load_plan
from opgen.spec import DEFAULT_TOLERANCES, read_spec, validate

MINIMAL = 'name = "x"\nfamily = "swiglu"\n'
FUSED = MINIMAL + '[swiglu]\ninput = "fused"\n'


def plan_of(project, text: str = MINIMAL) -> swiglu.Plan:
    return plan_from(swiglu.FAMILY, project, text)


# --- registry and defaults ------------------------------------------------------------------------


def test_registered_with_the_family_interface():
    family = FAMILIES["swiglu"]
    assert family is swiglu.FAMILY
    assert set(family.scaffolds) == {"swiglu"}


def test_minimal_spec_loads_every_default(project):
    spec = validate(Spec, read_spec(write(project, MINIMAL)))
    assert spec.swiglu.input == "pair"
    assert (spec.grads.da.reduction, spec.grads.db.reduction) == ("direct", "direct")
    assert spec.saved.sigmoid == "recompute"
    assert spec.tiling.fwd == DEFAULT_TILING["fwd"] and spec.tiling.bwd == DEFAULT_TILING["bwd"]
    assert spec.test.shapes == ((3, 333, 77), (4097,), (64, 1024), (9, 1100))
    assert spec.bench.dtype == "bfloat16"
    assert [(s.rows, s.channels) for s in spec.bench.shapes] == [(8192, 11008), (4096, 14336)]


def test_shipped_spec_is_the_defaults(project):
    """specs/swiglu.toml shows the defaults: it validates to the spec that leaves every key out
    (the tolerance tables written out equal the defaults)."""
    shipped = validate(Spec, read_spec(REPO_ROOT / "specs" / "swiglu.toml"))
    minimal = validate(Spec, read_spec(write(project, 'name = "swiglu"\nfamily = "swiglu"\n')))
    assert {d: shipped.test.tolerance_for(d) for d in shipped.dtypes} == DEFAULT_TOLERANCES
    unset = shipped.model_copy(update={"test": shipped.test.model_copy(update={"tolerance": {}})})
    assert unset == minimal


def test_partial_tiling_override_keeps_the_other_defaults(project):
    p = plan_of(project, MINIMAL + "[tiling.bwd]\nthreads = 128\n")
    assert p.kernels["bwd"].tiling == {"block_rows": 8, "block_cols": 512, "threads": 128}
    assert p.kernels["fwd"].tiling == {"block_rows": 8, "block_cols": 512, "threads": 256}


# --- invalid specs through load_plan: field paths and messages ------------------------------------


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ('[swiglu]\ninput = "halves"\n', "swiglu.input", "must be one of pair, fused"),
        ('[grads.da]\nreduction = "atomic"\n', "grads.da.reduction", "must be one of direct"),
        ("[grads.dx]\nreduction = \"direct\"\n", "grads.dx", "unknown key; allowed keys here: da, db"),
        ('[saved]\nsigmoid = "keep"\n', "saved.sigmoid", "must be one of recompute, save"),
        ("[tiling.fwd]\nblock_rows = 3\n", "tiling.fwd.block_rows", "power of two >= 1"),
        ("[tiling.fwd]\nblock_cols = 8\n", "tiling.fwd.block_cols", "power of two >= 16"),
        ("[tiling.bwd]\nthreads = 100\n", "tiling.bwd.threads", "multiple of 32"),
        ("[tiling.bwd]\nblock = 4096\n", "tiling.bwd.block", "unknown key"),
        ("[test]\nshapes = [[3, 0, 77]]\n", "test.shapes.0.1", "greater than or equal to 1"),
        ("[bench]\nshapes = [{ rows = 8192 }]\n", "bench.shapes.0.channels", "required key is missing"),
    ],
)
def test_field_errors(project, text, field, fragment):
    found = problems(project, MINIMAL + text)
    assert [f for f, _ in found] == [field], found
    assert fragment in found[0][1], found


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ("[tiling.fwd]\nblock_rows = 1\nblock_cols = 64\nthreads = 128\n", "tiling.fwd",
         "(64) must be a multiple of threads (128)"),
        ("[tiling.fwd]\nblock_rows = 1\nblock_cols = 32\nthreads = 96\n", "tiling.fwd",
         "multiple of threads (96)"),
        ("[tiling.bwd]\nblock_rows = 64\nblock_cols = 512\nthreads = 256\n", "tiling.bwd",
         "at most 64 x threads (16384)"),
        ("[test]\nshapes = [[63, 1024]]\n", "test.shapes", "not a multiple of 512"),
        ("[test]\nshapes = [[8, 77]]\n", "test.shapes", "rows (elements / last dim) are not a multiple of 8"),
        ("[test]\nshapes = []\n", "test.shapes", "at least one shape"),
    ],
)
def test_consistency_errors(project, text, field, fragment):
    found = problems(project, MINIMAL + text)
    assert [f for f, _ in found] == [field], found
    assert fragment in found[0][1], found


def test_row_tails_are_not_required_with_one_row_blocks(project):
    text = "[tiling.fwd]\nblock_rows = 1\n[tiling.bwd]\nblock_rows = 1\n[test]\nshapes = [[8, 77]]\n"
    assert plan_of(project, MINIMAL + text).tail_case.shape == (8, 77)


# --- plan -----------------------------------------------------------------------------------------


def test_plan_is_frozen(project):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan_of(project).fused = True


def test_plan_pair_form(project):
    p = plan_of(project)
    assert (p.family, p.fused, p.inputs) == ("swiglu", False, ("a", "b"))
    assert p.ops == {"fwd": "opgen::x_fwd", "bwd": "opgen::x_bwd"}
    assert [(g.grad, g.input, g.reduction, g.alloc) for g in p.grads] == [
        ("da", "a", "direct", "torch.empty"), ("db", "b", "direct", "torch.empty")]
    assert p.grad_check_order == (("da", "a"), ("db", "b"))
    assert (p.saved, p.recomputed) == (("a", "b"), ("sigmoid",))
    assert p.tail_case.shape == (3, 333, 77)
    assert [k.factory for k in p.kernels.values()] == ["x_fwd", "x_bwd"]


def test_plan_fused_form_and_saved_sigmoid(project):
    p = plan_of(project, FUSED + '[saved]\nsigmoid = "save"\n')
    assert (p.fused, p.inputs, p.save_sigmoid) == (True, ("x",), True)
    assert [(g.grad, g.input) for g in p.grads] == [("dx", "x")]
    assert p.grad_check_order == (("dx", "x"),)
    assert (p.saved, p.recomputed) == (("x", "sigmoid"), ())


def test_matrix():
    assert matrix((3, 333, 77)) == (999, 77)
    assert matrix((4097,)) == (1, 4097)


def test_plan_compile_jobs(project):
    p = plan_of(project)
    labels = [j.label for j in p.compile_jobs]
    # The row count is symbolic (not an argument). Per dtype: {recompute, save} x {contiguous, halves} x {fwd, bwd}; then fwd + bwd per bench shape.
    assert len(labels) == 2 * 2 * 2 * 2 + 2 * 2
    fwd, bwd = p.compile_jobs[:2]
    assert fwd.factory == "x_fwd" and fwd.args == (77, 77, 77, "float16", False)
    assert bwd.factory == "x_bwd" and bwd.args == (77, 77, 77, 77, 77, "float16", False)
    # The halves of a [rows, 2C] tensor: a in place (row stride 2C), b copied (C = 77 is odd).
    halves = [j for j in p.compile_jobs if "halves" in j.label and j.factory == "x_bwd"]
    assert halves[0].args == (77, 154, 77, 77, 77, "float16", False)
    assert labels[-2:] == ["fwd bfloat16 C=14336 sigmoid=recompute contiguous (bench)",
                           "bwd bfloat16 C=14336 sigmoid=recompute contiguous (bench)"]
    fused = plan_of(project, FUSED).compile_jobs
    assert len(fused) == 2 * 2 * 2 + 2 * 2
    # dx's halves as x's: da in place (row stride 2C), db written into its own buffer (row stride C:
    # its start in dx is not 16-byte aligned at an odd C), as the package launches it.
    assert fused[1].args == (77, 154, 77, 154, 77, "float16", False)
    assert fused[-1].args == (14336, 28672, 28672, 28672, 28672, "bfloat16", False)
    # At a C of whole 16-byte units b (and db in dx) starts aligned: in place, row stride 2C.
    aligned = FUSED + "[test]\nshapes = [[3, 333, 80]]\n"
    assert plan_of(project, aligned).compile_jobs[1].args == (80, 160, 160, 160, 160, "float16", False)
    # A spec that saves sigmoid(a): each bench shape's forward without it too (a call under
    # no_grad saves nothing), and no backward of that choice.
    saving = [j.label for j in plan_of(project, MINIMAL + '[saved]\nsigmoid = "save"\n').compile_jobs]
    assert saving[-3:] == ["fwd bfloat16 C=14336 sigmoid=save contiguous (bench)",
                           "bwd bfloat16 C=14336 sigmoid=save contiguous (bench)",
                           "fwd bfloat16 C=14336 sigmoid=recompute contiguous (bench, no grad)"]
    assert [j.args for j in plan_of(project, MINIMAL + "[test]\nshapes = [[3, 333, 80]]\n").compile_jobs
            if "halves" in j.label][1] == (80, 160, 160, 80, 80, "float16", False)


def test_plan_bench_bytes(project):
    (first, _) = plan_of(project).bench_cases
    n = 8192 * 11008
    # fwd: a, b read, y written; bwd: dy, a, b read, da, db written; bf16.
    assert (first.rows, first.channels, first.fwd_bytes, first.bwd_bytes) == (
        8192, 11008, 3 * 2 * n, 5 * 2 * n)
    assert bytes_moved(10, 4) == (120, 200)


def test_explain_tables(project):
    tables = dict(explain(plan_of(project), {"rows": 8192, "channels": 11008}))
    assert tables["kernels"][1][2].endswith("= (22, 1024)")
    assert [row[0] for row in tables["saved for backward"][1:]] == [
        "a", "b", "sigmoid", "total held between fwd and bwd"]
    assert [row[0] for row in tables["gradients"][1:]] == ["da", "db"]
    fused = dict(explain(plan_of(project, FUSED + '[saved]\nsigmoid = "save"\n'),
                         {"rows": 4, "channels": 8, "dtype": "bfloat16"}))
    assert [row[0] for row in fused["gradients"][1:]] == ["dx"]
    assert "the kernel also writes sigmoid(a)" in fused["bytes moved (the benchmark divides the "
                                                       "first column by the time)"][1][3]


def test_explain_rejects_impossible_shapes(project):
    with pytest.raises(OpgenError, match="rows and channels must be >= 1"):
        explain(plan_of(project), {"rows": 0, "channels": 8})
    with pytest.raises(OpgenError, match="dtype must be one of"):
        explain(plan_of(project), {"rows": 1, "channels": 8, "dtype": "float32"})


# --- the math -------------------------------------------------------------------------------------


def test_backward_formulas_match_autograd_in_float64():
    """The kernels' da = dy * b * (s + a * s * (1 - s)) and db = dy * a * s, s = sigmoid(a), equal
    autograd's gradients of silu(a) * b (float64, CPU), including the flat ends of the sigmoid."""
    torch.manual_seed(0)
    a = (8 * torch.randn(4096, dtype=torch.float64)).requires_grad_()
    b = torch.randn(4096, dtype=torch.float64).requires_grad_()
    dy = torch.randn(4096, dtype=torch.float64)
    (torch.nn.functional.silu(a) * b).backward(dy)
    with torch.no_grad():
        s = torch.sigmoid(a)
        silu = a * s
        da = dy * b * (s + silu * (1 - s))
        db = dy * silu
    torch.testing.assert_close(da, a.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(db, b.grad, rtol=1e-12, atol=1e-12)


# --- the generated package's strided inputs (pure torch: CPU tensors) -------------------------------


@pytest.fixture(scope="module")
def autograd():
    return import_generated("swiglu", "autograd")


def test_as_matrix_keeps_aligned_strided_rows_in_place(autograd):
    wide = torch.zeros(3, 5, 2 * 64, dtype=torch.float16)
    a, b = wide[..., :64], wide[..., 64:]
    for half in (a, b):
        m = autograd.as_matrix(half)
        assert m.shape == (15, 64) and m.stride() == (128, 1) and m.data_ptr() == half.data_ptr()


def test_as_matrix_copies_what_the_kernels_cannot_read_in_place(autograd):
    wide = torch.zeros(15, 2 * 77, dtype=torch.float16)
    odd = wide[:, 77:]  # starts 154 bytes in: not 16-byte aligned
    m = autograd.as_matrix(odd)
    assert m.is_contiguous() and m.data_ptr() != odd.data_ptr()
    # Leading dims that no single row stride describes (a transpose of the row dims).
    t = torch.zeros(4, 6, 64, dtype=torch.float16).transpose(0, 1)
    m = autograd.as_matrix(t)
    assert m.shape == (24, 64) and m.is_contiguous()
    assert torch.equal(m, t.reshape(24, 64))
    # Expanded (stride-0) rows.
    e = torch.zeros(1, 64, dtype=torch.float16).expand(8, 64)
    assert autograd.as_matrix(e).is_contiguous()


def test_as_matrix_gives_one_row_the_dense_stride(autograd):
    """One row reads the same at any row stride: as_matrix gives it its width (in place), whatever
    stride the input's size-1 dims have, so that every single row takes one kernel (the kernels
    take the row stride as an argument)."""
    wide = torch.zeros(3, 5, 2 * 64, dtype=torch.float16)
    for t in (wide[0, 0, 64:], wide[1:2, 4:5, :64], wide[:1, -1:], torch.zeros(64, 1).t()):
        m = autograd.as_matrix(t)
        assert m.stride() == (t.shape[-1], 1) and m.data_ptr() == t.data_ptr(), t.stride()


def import_golden(package: str, module: str):
    """tests/golden/<package>.<module>, imported as _golden_<package>: a name no spec can take
    (the golden package's own name would then look importable to the spec checks)."""
    name = f"_golden_{package}"
    if name not in sys.modules:
        root = TESTS_DIR / "golden" / package
        spec = importlib.util.spec_from_file_location(name, root / "__init__.py",
                                                      submodule_search_locations=[str(root)])
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return importlib.import_module(f"{name}.{module}")


# Where each form's package is: the committed pair form and the fused form's golden tree.
FORMS = {
    "pair": ("specs/swiglu.toml", lambda: import_generated("swiglu", "autograd")),
    "fused": ("tests/specs/swiglu_fused.toml", lambda: import_golden("swiglu_fused", "autograd")),
}
# The leading dims of the generated test_new_lengths_compile_nothing's length_cases.
LENGTHS = ((1,), (77,), (3, 5), (1000,))


@pytest.mark.parametrize("cols", [77, 80], ids=["C77", "C80"])  # b = x[..., C:] unaligned, aligned
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_row_count_launches_the_same_compiled_variants(project, form, cols, monkeypatch):
    """The kernel variants (factory and arguments: the KERNELS keys) that fwd and bwd launch are
    the same at every row count of one C, 1 row included, and are compile jobs of the plan whose
    tail shape has that C: after the first call a new length builds no kernel (on the GPU, the
    generated test_new_lengths_compile_nothing), and the compile check built what runs. CPU
    tensors through the kernel path (the ops' own functions), the launches recorded, not run."""
    spec, load = FORMS[form]
    package = load_plan(REPO_ROOT / spec)[0]
    autograd = load()
    phases = [(getattr(autograd, k.factory), phase) for phase, k in package.kernels.items()]
    launched = []

    def record(factory, *args, **tiling):
        phase = next(phase for f, phase in phases if f is factory)  # a JITImpl does not hash
        launched.append((phase, args))
        return lambda *tensors: None

    monkeypatch.setattr(autograd, "kernel", record)
    monkeypatch.setattr(autograd, "PLANS", {})  # plans hold the kernels they looked up
    width = 2 * cols if package.fused else cols
    per_length = []
    for lead in LENGTHS:
        launched.clear()
        for dtype in package.dtypes:
            inputs = [torch.randn(*lead, width).to(getattr(torch, dtype)) for _ in package.inputs]
            for save in (False, True):
                y, s = autograd.forward(*inputs, save)
                autograd.backward_phases(*inputs, s if save else None, torch.randn_like(y))
        per_length.append(sorted(launched))
    assert len(per_length[0]) == 4 * len(package.dtypes)
    for lead, variants in zip(LENGTHS[1:], per_length[1:]):
        assert variants == per_length[0], f"new variants at leading dims {lead}"
    text = (MINIMAL + f"dtypes = {list(package.dtypes)}\n"
            + ('[swiglu]\ninput = "fused"\n' if package.fused else "")
            + f"[test]\nshapes = [[3, 333, {cols}]]\n")
    jobs = {(job.factory.removeprefix("x_"), job.args) for job in plan_of(project, text).compile_jobs}
    assert set(per_length[0]) <= jobs, sorted(set(per_length[0]) - jobs)


def test_check_inputs_messages(autograd):
    meta = torch.zeros(4, 8, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="a must be on a CUDA device, or the CPU"):
        autograd.check_inputs(meta, meta)
    cpu = torch.zeros(4, 8, dtype=torch.float16)
    autograd.check_inputs(cpu, cpu)  # the public function then runs the reference
    with FakeTensorMode():  # fake CUDA tensors (views of them need a CUDA build: none here)
        def fake(shape, strides=None, dtype=torch.float16):
            strides = strides or torch.empty(shape).stride()
            return torch.empty_strided(shape, strides, dtype=dtype, device="cuda")

        a = fake((4, 8))
        autograd.check_inputs(a, a)
        autograd.check_inputs(fake((4, 8), (16, 1)), fake((4, 8), (16, 1)))  # strided rows
        with pytest.raises(TypeError, match="b must be a torch.Tensor"):
            autograd.check_inputs(a, 1.0)
        with pytest.raises(ValueError, match="one shape"):
            autograd.check_inputs(a, fake((4, 7)))
        with pytest.raises(TypeError, match="one dtype"):
            autograd.check_inputs(a, fake((4, 8), dtype=torch.bfloat16))
        with pytest.raises(TypeError, match="supported"):
            autograd.check_inputs(fake((4, 8), dtype=torch.float32), a)
        with pytest.raises(ValueError, match="last dim of a must be contiguous"):
            autograd.check_inputs(fake((4, 8), (1, 4)), a)
        with pytest.raises(ValueError, match="at least one dim"):
            autograd.check_inputs(fake(()), fake(()))


# --- rendering ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [MINIMAL, FUSED + '[saved]\nsigmoid = "save"\n'])
def test_generate_is_deterministic_and_compiles(project, text):
    path = write(project, text)
    first, second = generate(path), generate(path)
    assert first.files == second.files
    assert sorted(first.files) == ["__init__.py", "autograd.py", "bench_x.py", "kernels.py", "modules.py",
                                   "opgen-manifest.json", "reference.py", "spec.toml", "test_x.py"]
    for name, source in first.files.items():
        if name.endswith(".py"):
            compile(source, name, "exec")


def test_generated_test_asserts_each_gradient_by_name(project):
    pair = generate(write(project, MINIMAL)).files["test_x.py"]
    assert 'assert_close("da", got["a"], ref["a"], dtype)' in pair
    assert 'assert_close("db", got["b"], ref["b"], dtype)' in pair
    assert 'assert_catches_broken("da"' in pair and 'assert_catches_broken("db"' in pair
    fused = generate(write(project, FUSED)).files["test_x.py"]
    assert 'assert_close("dx", got["x"], ref["x"], dtype)' in fused
    assert "def x(x):" in generate(write(project, FUSED)).files["autograd.py"]


def test_scaffold_matches_the_defaults():
    """`opgen new swiglu` renders the defaults of the models (tiling, tolerances, shapes)."""
    preset = FAMILIES["swiglu"].scaffolds["swiglu"]
    text = environment().get_template("new/swiglu.toml.jinja").render(name="swiglu", preset=preset)
    assert text == (REPO_ROOT / "specs" / "swiglu.toml").read_text(encoding="utf-8")
