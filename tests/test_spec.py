"""Unit tests of the spec models (opgen/spec.py, opgen/families/attention.py) and of plan()."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import textwrap
from pathlib import Path

import pydantic
import pytest

from conftest import REPO_ROOT, spec_problems

from opgen import __version__
from opgen.errors import SpecError
from opgen.families import FAMILIES, attention
from opgen.families.attention import DEFAULT_TILING, Spec, plan, smem_bytes
from opgen.plan import SM90_SMEM_LIMIT, SourceInfo
from opgen.render import load_plan
from opgen.spec import (
    DEFAULT_TOLERANCES,
    MAX_NAME_LENGTH,
    MAX_SPEC_BYTES,
    RESERVED_MODULES,
    check_identifier,
    echo,
    field_path,
    read_spec,
    spec_digest,
    validate,
)

MINIMAL = 'name = "x"\nfamily = "attention"\n'


def load(project: Path, text: str, name: str = "x") -> Spec:
    path = project / "specs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return validate(Spec, read_spec(path))


def plan_of(project: Path, text: str = "") -> attention.Plan:
    spec = load(project, MINIMAL + textwrap.dedent(text))
    return plan(spec, SourceInfo("specs/x.toml", "0" * 64, __version__))


def problems(project: Path, text: str) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        load(project, text)
    return info.value.problems


# --- models: defaults, frozen, strict -------------------------------------------------------------


def test_minimal_spec_loads_every_default(project):
    spec = load(project, MINIMAL)
    assert spec.name == "x"
    assert spec.family == "attention"
    assert spec.dtypes == ("float16", "bfloat16")
    assert spec.attention.layouts == ("bshd",)
    assert spec.attention.head_dims == (64, 128)
    assert spec.attention.causal is False
    assert (spec.saved.o, spec.saved.lse) == ("save", "save")
    for phase, default in DEFAULT_TILING.items():
        assert getattr(spec.tiling, phase) == default
    assert spec.tiling.fwd.model_dump() == dict(block_m=128, block_n=64, threads=256, num_stages=1)
    assert spec.tiling.bwd.model_dump() == dict(block_m=128, block_n=32, threads=256, num_stages=2)
    assert spec.tiling.preprocess.model_dump() == dict(block_m=32, threads=128)
    assert spec.tiling.postprocess.model_dump() == dict(block_m=64, threads=128)
    assert [s.seq_len for s in spec.test.shapes] == [1000, 77]
    assert spec.test.tolerance == {}
    assert spec.bench.dtype == "float16"
    assert [s.head_dim for s in spec.bench.shapes] == [128, 128, 64, 64]


def test_shipped_spec_shows_the_defaults(project):
    """specs/attention.toml says keys left out take the defaults it shows: only its layouts and
    its [[tiling.tuned]] entries differ from a spec that leaves everything out."""
    shipped = validate(Spec, read_spec(REPO_ROOT / "specs" / "attention.toml"))
    minimal = load(project, 'name = "attention"\nfamily = "attention"\n')
    assert shipped.attention.layouts == ("bshd", "bhsd")
    assert shipped.attention.model_copy(update={"layouts": ("bshd",)}) == minimal.attention
    for key in ("name", "dtypes", "saved"):
        assert getattr(shipped, key) == getattr(minimal, key), key
    # The per-head-dim [[tiling.tuned]] entries are measurements, not defaults.
    assert shipped.tiling.model_copy(update={"tuned": ()}) == minimal.tiling

    def bench(spec):  # kv_heads left out means kv_heads = heads
        data = spec.bench.model_dump()
        for shape in data["shapes"]:
            shape["kv_heads"] = shape["kv_heads"] or shape["heads"]
        return data

    assert bench(shipped) == bench(minimal)
    source = SourceInfo("specs/attention.toml", "0" * 64, __version__)
    shipped_plan, minimal_plan = plan(shipped, source), plan(minimal, source)
    for field in ("grads", "test_cases", "tolerances", "kernels", "saved"):
        assert getattr(shipped_plan, field) == getattr(minimal_plan, field), field


@pytest.mark.parametrize(
    "path",
    [
        ("name",),
        ("dtypes",),
        ("tiling", "fwd", "block_m"),
        ("saved", "o"),
        ("attention", "layouts"),
    ],
)
def test_models_are_frozen(project, path):
    spec = load(project, MINIMAL)
    *parents, leaf = path
    owner = spec
    for part in parents:
        owner = getattr(owner, part)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        setattr(owner, leaf, getattr(owner, leaf))


def test_plan_is_frozen(project):
    p = plan_of(project)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "y"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.kernels["fwd"].factory = "y"


def test_lists_become_tuples(project):
    spec = load(
        project,
        MINIMAL + '[attention]\nlayouts = ["bhsd", "bshd"]\nhead_dims = [32]\n'
        "[bench]\nshapes = [{batch=1, heads=1, seq_len=64, head_dim=32, causal=false}]\n",
    )
    assert spec.attention.layouts == ("bhsd", "bshd")
    assert isinstance(spec.bench.shapes, tuple)


def test_unknown_top_level_key_is_rejected_with_the_allowed_keys(project):
    assert problems(project, MINIMAL + "colour = 1\n") == [
        (
            "colour",
            "unknown key; allowed keys here: attention, bench, dtypes, family, grads, name, "
            "namespace, saved, test, tiling",
        ),
    ]


def test_unknown_nested_key_is_rejected_with_the_allowed_keys(project):
    assert problems(project, MINIMAL + "[tiling.fwd]\nblock_k = 64\n") == [
        (
            "tiling.fwd.block_k",
            "unknown key; allowed keys here: block_m, block_n, blocks_per_sm, num_stages, overlap, pingpong, threads",
        ),
    ]


def test_unknown_tiling_phase_is_rejected(project):
    [(field, message)] = problems(project, MINIMAL + "[tiling.fwdd]\nblock_m = 64\n")
    assert field == "tiling.fwdd"
    assert message.startswith("unknown key; allowed keys here: ")
    assert {"fwd", "bwd", "preprocess", "postprocess"} <= set(message.split(": ")[1].split(", "))


@pytest.mark.parametrize(
    "text, field",
    [
        ('[tiling.fwd]\nthreads = "256"\n', "tiling.fwd.threads"),
        ("[tiling.fwd]\nthreads = 256.0\n", "tiling.fwd.threads"),
        ("[tiling.fwd]\nthreads = true\n", "tiling.fwd.threads"),
        ("[attention]\ncausal = 1\n", "attention.causal"),
        ('[attention]\ncausal = "yes"\n', "attention.causal"),
        ('dtypes = "float16"\n', "dtypes"),
    ],
)
def test_no_silent_coercion(project, text, field):
    [(got_field, message)] = problems(project, MINIMAL + text)
    assert got_field == field
    assert "(got " in message


def test_every_field_error_is_reported_at_once(project):
    found = problems(
        project,
        'name = "my-op"\nfamily = "attention"\ndtypes = ["float8"]\ncolour = 1\n'
        "[tiling.fwd]\nblock_m = 48\nthreads = 16\n",
    )
    assert [field for field, _ in found] == [
        "name",
        "dtypes.0",
        "tiling.fwd.block_m",
        "tiling.fwd.threads",
        "colour",
    ]


# --- tiling overrides -----------------------------------------------------------------------------


def test_partial_tiling_override_keeps_the_other_defaults(project):
    spec = load(project, MINIMAL + "[tiling.bwd]\nblock_n = 64\n")
    assert spec.tiling.bwd.model_dump() == dict(block_m=128, block_n=64, threads=256, num_stages=2)
    assert spec.tiling.fwd == DEFAULT_TILING["fwd"]
    assert spec.tiling.preprocess == DEFAULT_TILING["preprocess"]
    assert spec.tiling.postprocess == DEFAULT_TILING["postprocess"]


def test_partial_override_of_two_phases(project):
    spec = load(
        project, MINIMAL + "[tiling.fwd]\nnum_stages = 2\n[tiling.postprocess]\nthreads = 256\n"
    )
    assert spec.tiling.fwd.model_dump() == dict(block_m=128, block_n=64, threads=256, num_stages=2)
    assert spec.tiling.postprocess.model_dump() == dict(block_m=64, threads=256)
    assert spec.tiling.bwd == DEFAULT_TILING["bwd"]


def test_tiling_override_does_not_leak_into_the_defaults(project):
    load(project, MINIMAL + "[tiling.bwd]\nblock_n = 64\n")
    assert load(project, MINIMAL).tiling.bwd.block_n == 32


@pytest.mark.parametrize(
    "text, field, fragment",
    [
        ("[tiling.fwd]\nblock_m = 48\n", "tiling.fwd.block_m", "power of two >= 16"),
        ("[tiling.fwd]\nblock_n = 8\n", "tiling.fwd.block_n", "power of two >= 16"),
        ("[tiling.fwd]\nblock_n = 40\n", "tiling.fwd.block_n", "or a multiple of 16 up to 256"),
        ("[tiling.fwd]\nblock_n = 272\n", "tiling.fwd.block_n", "or a multiple of 16 up to 256"),
        ("[tiling.bwd]\nblock_n = 48\n", "tiling.bwd.block_n", "must be a power of two >= 16 (got 48)"),
        ("[tiling.bwd]\nthreads = 16\n", "tiling.bwd.threads", "multiple of 32"),
        ("[tiling.bwd]\nthreads = 0\n", "tiling.bwd.threads", "greater than or equal to 32"),
        ("[tiling.bwd]\nthreads = 100\n", "tiling.bwd.threads", "multiple of 32"),
        ("[tiling.bwd]\nthreads = 2048\n", "tiling.bwd.threads", "less than or equal to 1024"),
        ("[tiling.fwd]\nnum_stages = 9\n", "tiling.fwd.num_stages", "less than or equal to 4"),
        ("[tiling.fwd]\nnum_stages = -1\n", "tiling.fwd.num_stages", "greater than or equal to 0"),
        ("[attention]\nhead_dims = [8]\n", "attention.head_dims.0", "multiple of 16"),
        ("[attention]\nhead_dims = [0]\n", "attention.head_dims.0", "greater than or equal to 16"),
        ("[attention]\nhead_dims = [72]\n", "attention.head_dims.0", "multiple of 16"),
        ("[attention]\nhead_dims = [512]\n", "attention.head_dims.0", "less than or equal to 256"),
        ('dtypes = ["float8"]\n', "dtypes.0", 'must be one of float16, bfloat16 (got "float8")'),
        ('[grads.dq]\nreduction = "split"\n', "grads.dq.reduction", "must be one of"),
        ('[saved]\nlse = "drop"\n', "saved.lse", 'must be one of save, recompute (got "drop")'),
    ],
)
def test_field_ranges(project, text, field, fragment):
    [(got_field, message)] = problems(project, MINIMAL + text)
    assert got_field == field
    assert fragment in message


def test_forward_key_blocks_take_any_wgmma_width(project):
    """The forward's key rows a step: any multiple of 16 up to 256 a WGMMA takes as N and K
    (wider key blocks spread a step's softmax reductions and barriers), not just powers of two."""
    spec = load(project, MINIMAL + "[tiling.fwd]\nblock_m = 128\nblock_n = 176\n")
    assert spec.tiling.fwd.block_n == 176


def test_threads_must_be_whole_warpgroups(project):
    assert problems(project, MINIMAL + "[tiling.fwd]\nthreads = 96\n") == [
        ("tiling.fwd.threads", "must be a multiple of 128 (whole warpgroups for WGMMA) (got 96)"),
    ]


# --- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["x", "attention", "my_op", "op2", "_private"])
def test_good_names(project, name):
    assert load(project, f'name = "{name}"\nfamily = "attention"\n').name == name


@pytest.mark.parametrize(
    "name, fragment",
    [
        ("../evil", "Python identifier"),
        ("my-op", "Python identifier"),
        ("2op", "Python identifier"),
        ("", "Python identifier"),
        ("op\u00e9", "Python identifier"),
        ("class", "keyword"),
        ("__init__", "start with '__'"),
        ("Attention", "lower case"),
    ],
)
def test_bad_names(project, name, fragment):
    [(field, message)] = problems(project, f'name = "{name}"\nfamily = "attention"\n')
    assert field == "name"
    assert fragment in message
    assert message.endswith(f'(got "{name}")')


SHADOW = "the generated package would be imported instead of it; choose another name"


@pytest.mark.parametrize("name", sorted(RESERVED_MODULES))
def test_names_of_the_modules_packages_import_are_refused_on_every_machine(name):
    with pytest.raises(ValueError) as info:
        check_identifier(name)
    assert str(info.value) == (
        f"must not shadow the module '{name}' (imported by opgen, the generated packages or "
        f"their tests): {SHADOW}"
    )


@pytest.mark.parametrize(
    "name, kind",
    [("os", "standard library"), ("math", "standard library"), ("json", "standard library"),
     ("pydantic_core", "installed"), ("annotated_types", "installed")],
)
def test_names_that_shadow_a_module_are_refused(project, name, kind):
    assert problems(project, f'name = "{name}"\nfamily = "attention"\n') == [
        ("name", f"must not shadow the module '{name}' ({kind}): {SHADOW} (got \"{name}\")"),
    ]


def test_name_length_is_capped(project):
    longest = "x" * MAX_NAME_LENGTH
    assert load(project, f'name = "{longest}"\nfamily = "attention"\n').name == longest
    [(field, message)] = problems(project, f'name = "{longest}y"\nfamily = "attention"\n')
    assert field == "name"
    assert message.startswith(f"must be at most {MAX_NAME_LENGTH} characters")


@pytest.mark.parametrize("name, fragment", [("torch", "must not shadow the module 'torch'"),
                                            ("a" * 300, "must be at most 64 characters")])
def test_new_refuses_the_names_a_spec_refuses(project, cli, name, fragment):
    result = cli("new", "attention", "--name", name)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("--name: ") and fragment in result.stderr
    assert list(project.iterdir()) == []


# --- tolerances -----------------------------------------------------------------------------------


def test_tolerance_defaults_per_dtype(project):
    spec = load(project, MINIMAL)
    assert spec.test.tolerance_for("float16").model_dump() == {"rtol": 1e-2, "atol": 1e-2}
    assert spec.test.tolerance_for("bfloat16").model_dump() == {"rtol": 2e-2, "atol": 2e-2}
    assert plan_of(project).tolerances == DEFAULT_TOLERANCES


def test_tolerance_override_of_one_dtype_keeps_the_other_default(project):
    p = plan_of(project, "[test.tolerance.float16]\nrtol = 5e-3\natol = 1e-3\n")
    assert p.tolerances["float16"].model_dump() == {"rtol": 5e-3, "atol": 1e-3}
    assert p.tolerances["bfloat16"] == DEFAULT_TOLERANCES["bfloat16"]


def test_tolerances_follow_the_spec_dtypes(project):
    p = plan_of(project, 'dtypes = ["bfloat16"]\n[bench]\ndtype = "bfloat16"\n')
    assert list(p.tolerances) == ["bfloat16"]
    assert p.torch_dtypes == ("torch.bfloat16",)


@pytest.mark.parametrize(
    "text", ["rtol = 0\natol = 1e-2\n", "rtol = 1e-2\natol = 2\n", "rtol = 1e-2\n"]
)
def test_bad_tolerances(project, text):
    assert problems(project, MINIMAL + "[test.tolerance.float16]\n" + text)


# --- whole-spec checks ----------------------------------------------------------------------------


def test_smem_over_the_sm90_limit(project):
    found = problems(
        project, MINIMAL + "[tiling.bwd]\nblock_m = 256\nblock_n = 256\nthreads = 512\nnum_stages = 4\n"
    )
    assert [field for field, _ in found] == ["tiling.bwd", "tiling.bwd"]
    assert "at head_dim 64, over the sm_90 limit of 227 KB" in found[0][1]
    assert "at head_dim 128, over the sm_90 limit of 227 KB" in found[1][1]


@pytest.mark.parametrize(
    "block_m, threads, fits",
    [(64, 128, True), (128, 128, True), (256, 128, True), (128, 256, True), (256, 512, True),
     (32, 128, False), (64, 256, False), (256, 256, False), (64, 512, False), (128, 512, False)],
)
def test_rows_over_threads_follow_tilelang_layouts(project, block_m, threads, fits):
    """The block_m x threads pairs that the compile sweep in docs/compile-sweeps/ found to lower
    (fits) or to fail TileLang's layout inference, for both GEMM phases."""
    for phase in ("fwd", "bwd"):
        text = MINIMAL + f"[tiling.{phase}]\nblock_m = {block_m}\nthreads = {threads}\n"
        try:
            load(project, text)
            found = []
        except SpecError as exc:
            found = exc.problems
        layout = [m for f, m in found if f == f"tiling.{phase}" and "has no TileLang layout" in m]
        assert bool(layout) != fits, (phase, found)


def test_test_shapes_need_a_tail_block(project):
    [(field, message)] = problems(
        project, MINIMAL + "[test]\nshapes = [{batch=1, heads=1, seq_len=512}]\n"
    )
    assert field == "test.shapes"
    assert "not a multiple of 32 (the smallest block)" in message


def test_bench_head_dim_must_be_a_spec_head_dim(project):
    assert problems(project, MINIMAL + "[attention]\nhead_dims = [64]\n") == [
        ("bench.shapes.0.head_dim", "must be one of attention.head_dims [64] (got 128); remove "
                                    "this shape, or add 128 to attention.head_dims"),
        ("bench.shapes.1.head_dim", "must be one of attention.head_dims [64] (got 128); remove "
                                    "this shape, or add 128 to attention.head_dims"),
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('dtypes = ["float16", "float16"]\n', ("dtypes", "must not repeat a dtype")),
        ("dtypes = []\n", ("dtypes", "must list at least one dtype")),
        (
            '[attention]\nlayouts = ["bshd", "bshd"]\n',
            ("attention.layouts", "must not repeat a layout"),
        ),
        (
            "[attention]\nlayouts = []\n",
            ("attention.layouts", "must list at least one of bshd, bhsd"),
        ),
        ("[test]\nshapes = []\n", ("test.shapes", "must list at least one shape")),
    ],
)
def test_collections(project, text, expected):
    assert problems(project, MINIMAL + text) == [expected]


def test_whole_spec_rules_run_beside_field_errors(project):
    """A field error in one section does not hide a rule about others."""
    found = problems(
        project,
        MINIMAL + '[grads.dk]\nreduction = "split"\n[tiling.fwd]\nblock_m = 48\nthreads = 16\n'
        "[tiling.bwd]\nnum_stages = 9\n[test]\nshapes = [{batch=0, heads=4, seq_len=1000}]\n",
    )
    assert [field for field, _ in found] == [
        "tiling.fwd.block_m", "tiling.fwd.threads", "tiling.bwd.num_stages", "test.shapes.0.batch",
        "grads.dk.reduction",
    ]
    assert found[-1][1].startswith("must be one of direct (direct without attention.gqa")


def test_a_rule_that_reads_a_failed_section_is_skipped(project):
    """Every test shape a block multiple would be reported, but the blocks are unknown while
    tiling fails; the layouts rule reads neither and still runs."""
    found = problems(
        project,
        MINIMAL + '[attention]\nlayouts = ["bshd", "bshd"]\n[tiling.fwd]\nblock_m = 48\n'
        "[test]\nshapes = [{batch=1, heads=1, seq_len=512}]\n",
    )
    assert found == [
        ("tiling.fwd.block_m", "must be a power of two >= 16 or a multiple of 64 (64 query rows "
                               "per consumer warpgroup) (got 48)"),
        ("attention.layouts", "must not repeat a layout"),
    ]


def test_a_failed_name_or_dtypes_leaves_the_rules_that_need_neither(project):
    found = problems(project, 'name = 1\nfamily = "attention"\ndtypes = "float16"\n'
                              "[bench]\nshapes = []\n")
    assert found == [
        ("name", "must be a string (got 1)"),
        ("dtypes", 'must be an array (got "float16")'),
        ("bench.shapes", "must list at least one shape"),
    ]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bench_rules_are_shared_by_every_family(project, family):
    base = f'name = "x"\nfamily = "{family}"\n'
    assert spec_problems(project, base + "[bench]\nshapes = []\n") == [
        ("bench.shapes", "must list at least one shape"),
    ]
    assert spec_problems(project, base + 'dtypes = ["float16"]\n[bench]\ndtype = "bfloat16"\n') == [
        ("bench.dtype", 'must be one of the built dtypes float16 (got "bfloat16")'),
    ]


# --- messages: field paths and values as TOML writes them -----------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[tiling]\nfwd = [1, 2]\n", ("tiling.fwd", "must be a table (got [1, 2])")),  # model_type
        ("[test]\ntolerance = []\n", ("test.tolerance", "must be a table (got [])")),  # dict_type
        ('dtypes = "float16"\n', ("dtypes", 'must be an array (got "float16")')),  # tuple_type
        ('[tiling.fwd]\nthreads = "256"\n',
         ("tiling.fwd.threads", 'must be an integer (got "256")')),
        ("[tiling.fwd]\nthreads = 256.0\n",
         ("tiling.fwd.threads", "must be an integer (got 256.0)")),
        ("[attention]\ncausal = 1\n", ("attention.causal", "must be true or false (got 1)")),
        ("[grads.dk]\nreduction = 1\n",
         ("grads.dk.reduction", "must be one of direct, atomic, split, in_block (got 1)")),
        ('[test.tolerance.float16]\nrtol = "x"\natol = 0.1\n',
         ("test.tolerance.float16.rtol", 'must be a number (got "x")')),  # float_type
        ("[test.tolerance.float16]\nrtol = nan\natol = 0.1\n",
         ("test.tolerance.float16.rtol", "must be a finite number (got nan)")),
        ("[test.tolerance.float16]\nrtol = 0.1\natol = -inf\n",
         ("test.tolerance.float16.atol", "must be a finite number (got -inf)")),
        ("[test.tolerance.float16]\nrtol = 0.1\natol = 2\n",
         ("test.tolerance.float16.atol", "must be less than or equal to 1 (got 2)")),
        ('[saved]\no = true\n', ("saved.o", "must be one of save, recompute (got true)")),
        ('dtypes = [{ kind = "float16", "a b" = [1, 2.5] }]\n',
         ("dtypes.0",
          'must be one of float16, bfloat16 (got {kind = "float16", "a b" = [1, 2.5]})')),
        ("[bench]\nwarmup_ms = 1979-05-27\n",
         ("bench.warmup_ms", "must be an integer (got 1979-05-27)")),
        ("[test.tolerance.float32]\nrtol = \"x\"\n",
         ("test.tolerance.float32", "unknown key; allowed keys here: bfloat16, float16")),
        ("[test.tolerance.float16]\nrtol = 0.1\natol = 0.1\nbtol = 1\n",
         ("test.tolerance.float16.btol", "unknown key; allowed keys here: atol, rtol")),
        ('"tiling.fwd".block_m = 64\n', ('"tiling.fwd"', "unknown key; allowed keys here: "
         "attention, bench, dtypes, family, grads, name, namespace, saved, test, tiling")),
        ('[tiling]\n"fwd.block_m" = 64\n', ('tiling."fwd.block_m"', "unknown key; allowed keys "
         "here: bwd, dsinks, fwd, postprocess, preprocess, tuned")),
    ],
)
def test_messages_speak_toml(project, text, expected):
    assert problems(project, MINIMAL + text) == [expected]


def test_every_type_error_kind_in_toml_words(project):
    """No pydantic wording, Python reprs or class names in any message."""
    found = problems(
        project,
        MINIMAL + 'dtypes = [1]\n[attention]\nlayouts = "bshd"\nhead_dims = [8]\ngqa = "no"\n'
        '[grads]\ndq = []\n[grads.dk]\nreduction = 2\n[saved]\no = "keep"\n'
        "[tiling]\nfwd = []\npreprocess = { block_m = 2.5, threads = 2000 }\n"
        "[test]\ntolerance = { float16 = { rtol = nan, atol = 0 } }\nwindows = [0]\n"
        "[bench]\nrep_ms = true\nshapes = [{}]\n",
    )
    assert len(found) >= 12
    for field, message in found:
        for leak in ("Input should", "valid", "instance of", "Tiling", "[key]", "'", "()", "None"):
            assert leak not in field + message, (field, message)


def test_echoed_values_are_cut_short():
    assert echo("x" * 78) == f'"{"x" * 78}"'  # 80 characters with the quotes
    assert echo("x" * 79) == f'"{"x" * 79}... (a string of 79 characters)'
    assert echo("x" * 100_000) == f'"{"x" * 79}... (a string of 100000 characters)'
    assert echo(tuple(range(1000))).endswith("... (4890 characters)")
    assert field_path(["a" * 200]) == "a" * 80 + "... (a key of 200 characters)"


def test_echo_writes_toml():
    assert echo('a"b\\') == '"a\\"b\\\\"'
    assert echo((1, 2.5, True, (), {})) == "[1, 2.5, true, [], {}]"
    assert echo({"a": 1, "b c": "d"}) == '{a = 1, "b c" = "d"}'
    assert field_path(["test", "shapes", 0, "kv_heads"]) == "test.shapes.0.kv_heads"
    assert field_path(["tiling.fwd", "", "block-m"]) == '"tiling.fwd"."".block-m'


# --- reading spec files ---------------------------------------------------------------------------


def test_byte_order_mark_is_accepted_and_hashed_as_given(project):
    path = project / "specs" / "x.toml"
    path.parent.mkdir()
    raw = b"\xef\xbb\xbf" + MINIMAL.encode()
    path.write_bytes(raw)
    source = read_spec(path)
    assert validate(Spec, source).name == "x"
    assert source.sha256 == hashlib.sha256(raw).hexdigest()


def test_spec_over_the_size_limit_is_refused(project):
    path = project / "big.toml"
    path.write_bytes(MINIMAL.encode() + b"#" * MAX_SPEC_BYTES)
    with pytest.raises(SpecError) as info:
        read_spec(path)
    assert info.value.problems == [("", "too large for a spec (over 1 MiB)")]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_fifo_is_refused_without_opening_it(project):
    os.mkfifo(project / "pipe.toml")
    with pytest.raises(SpecError) as info:
        read_spec(project / "pipe.toml")
    assert info.value.problems == [("", "not a regular file (a FIFO)")]


def test_directory_is_refused(project):
    (project / "dir.toml").mkdir()
    with pytest.raises(SpecError) as info:
        read_spec(project / "dir.toml")
    assert str(info.value) == "dir.toml: not a regular file (a directory)"


def test_deeply_nested_toml_is_refused(project):
    path = project / "deep.toml"
    path.write_text(MINIMAL + "x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SpecError) as info:
        read_spec(path)
    assert info.value.problems == [("", "invalid TOML: arrays or tables nested too deeply")]


# --- smem estimate --------------------------------------------------------------------------------


def test_smem_estimate_bounds_tilelang():
    # The numbers TileLang reports (dyn_shared_memory_buf) for the default Hopper tiles.
    assert smem_bytes("fwd", DEFAULT_TILING["fwd"], 128) == 65536
    assert smem_bytes("bwd", DEFAULT_TILING["bwd"], 128) == 108544  # TileLang: 107008 (seq 1000)
    assert smem_bytes("fwd", DEFAULT_TILING["fwd"], 64) == 32768
    assert smem_bytes("bwd", DEFAULT_TILING["bwd"], 64) == 59392  # TileLang: 57856 / 58624 (seq 1024)


def test_plan_smem_table(project):
    p = plan_of(project)
    assert p.smem == {"fwd": {64: 32768, 128: 65536}, "bwd": {64: 59392, 128: 108544}}
    assert all(v <= SM90_SMEM_LIMIT for phase in p.smem.values() for v in phase.values())


# --- plan -----------------------------------------------------------------------------------------


def test_plan_kernels(project):
    p = plan_of(project)
    assert {k: (v.factory, v.phase, v.tiling_name) for k, v in p.kernels.items()} == {
        "fwd": ("x_fwd", "fwd", "FWD_TILING"),
        "preprocess": ("x_bwd_preprocess", "bwd_preprocess", "PREPROCESS_TILING"),
        "bwd": ("x_bwd", "bwd", "BWD_TILING"),
        "postprocess": ("x_bwd_postprocess", "bwd_postprocess", "POSTPROCESS_TILING"),
    }
    assert p.kernels["fwd"].tiling == DEFAULT_TILING["fwd"].model_dump()
    assert p.kernels["bwd"].tiling == DEFAULT_TILING["bwd"].model_dump()
    assert p.kernels["preprocess"].tiling == {"block_m": 32, "threads": 128}


def test_plan_kernel_tiling_follows_the_spec(project):
    p = plan_of(project, "[tiling.bwd]\nblock_n = 64\n")
    assert p.kernels["bwd"].tiling == dict(block_m=128, block_n=64, threads=256, num_stages=2)
    assert all(job.tiling["block_n"] == 64 for job in p.compile_jobs if job.factory == "x_bwd")


def test_plan_names(project):
    p = plan_of(project)
    assert (p.family, p.name) == ("attention", "x")
    assert p.ops == {"fwd": "opgen::x_fwd", "bwd": "opgen::x_bwd"}
    spec = load(project, 'name = "attention_recompute"\nfamily = "attention"\n', name="ar")
    p = plan(spec, SourceInfo("specs/ar.toml", "0" * 64, __version__))
    assert p.ops["bwd"] == "opgen::attention_recompute_bwd"
    assert p.kernels["bwd"].factory == "attention_recompute_bwd"


def test_plan_ops_take_the_spec_namespace(project):
    spec = load(project, 'name = "x"\nfamily = "attention"\nnamespace = "mymodel"\n')
    p = plan(spec, SourceInfo("specs/x.toml", "0" * 64, __version__))
    assert p.ops == {"fwd": "mymodel::x_fwd", "bwd": "mymodel::x_bwd"}


@pytest.mark.parametrize("namespace, fragment", [
    ("My", "must be lower case"),
    ("my-ops", "must be a Python identifier"),
    ("_private", "not start with '_'"),
    ("aten", "namespace of torch's own ops"),
    ("class", "keyword"),
    ("n" * 65, "at most 64"),
])
def test_bad_namespace(project, namespace, fragment):
    with pytest.raises(SpecError) as info:
        load(project, f'name = "x"\nfamily = "attention"\nnamespace = "{namespace}"\n')
    assert f"namespace: " in str(info.value) and fragment in str(info.value), str(info.value)


def test_plan_grads(project):
    p = plan_of(project)
    by_grad = {g.grad: g for g in p.grads}
    assert list(by_grad) == ["dq", "dk", "dv"]
    dq, dk, dv = by_grad["dq"], by_grad["dk"], by_grad["dv"]
    assert (dq.input, dq.reduction, dq.buffer_dtype, dq.alloc) == (
        "q",
        "atomic",
        "float32",
        "torch.zeros",
    )
    for g, name in ((dk, "k"), (dv, "v")):
        assert (g.input, g.reduction, g.buffer_dtype, g.alloc) == (
            name,
            "direct",
            "input",
            "torch.empty",
        )
    assert p.atomic_grads == (dq,)


@pytest.mark.parametrize(
    "o, lse, saved, recomputed, targets",
    [
        ("save", "save", ("q", "k", "v", "o", "lse"), (), ("_", "_")),
        ("recompute", "save", ("q", "k", "v", "lse"), ("o",), ("o", "_")),
        ("save", "recompute", ("q", "k", "v", "o"), ("lse",), ("_", "lse")),
        ("recompute", "recompute", ("q", "k", "v"), ("o", "lse"), ("o", "lse")),
    ],
)
def test_plan_saved_and_recompute(project, o, lse, saved, recomputed, targets):
    p = plan_of(project, f'[saved]\no = "{o}"\nlse = "{lse}"\n')
    assert p.saved == saved
    assert p.recomputed == recomputed
    assert p.recompute_forward is bool(recomputed)
    assert p.recompute_targets == targets


def test_plan_test_cases_are_shapes_times_head_dims(project):
    p = plan_of(
        project,
        "[test]\nshapes = [{batch=2, heads=4, seq_len=1000}, {batch=1, heads=3, seq_len=77}]\n",
    )
    assert [(c.batch, c.heads, c.seq_len, c.head_dim) for c in p.test_cases] == [
        (2, 4, 1000, 64),
        (2, 4, 1000, 128),
        (1, 3, 77, 64),
        (1, 3, 77, 128),
    ]
    assert len({c.id for c in p.test_cases}) == 4, "pytest ids are unique"


@pytest.mark.parametrize(
    "text, count",
    [
        ("", 1 * 2 * 2 * 7),
        ('dtypes = ["float16"]\n', 1 * 1 * 2 * 7),
        ('[attention]\nlayouts = ["bshd", "bhsd"]\n', 2 * 2 * 2 * 7),
        (
            'dtypes = ["bfloat16"]\n[attention]\nlayouts = ["bhsd"]\nhead_dims = [64]\n'
            '[bench]\ndtype = "bfloat16"\n'
            "shapes = [{batch=1, heads=1, seq_len=64, head_dim=64, causal=true}]\n",
            7,
        ),
    ],
)
def test_plan_compile_job_count(project, text, count):
    p = plan_of(project, text)
    # Per layout, dtype and head dim: fwd full, causal and causal paired; bwd full and causal;
    # the preprocess and the postprocess.
    assert len(p.compile_jobs) == len(p.layouts) * len(p.dtypes) * len(p.head_dims) * 7 == count
    assert len({job.label for job in p.compile_jobs}) == count, "labels name each job uniquely"


def test_plan_compile_jobs_cover_every_phase_and_mask(project):
    p = plan_of(
        project,
        'dtypes = ["float16"]\n[attention]\nhead_dims = [64]\n'
        "[bench]\nshapes = [{batch=1, heads=1, seq_len=64, head_dim=64, causal=true}]\n",
    )
    factories = sorted(job.factory for job in p.compile_jobs)
    assert factories == [
        "x_bwd",
        "x_bwd",
        "x_bwd_postprocess",
        "x_bwd_preprocess",
        "x_fwd",
        "x_fwd",
        "x_fwd",
    ]
    by_factory = {k.factory: k for k in p.kernels.values()}
    paired = [job for job in p.compile_jobs if job.tiling.get("pair_blocks")]
    for job in p.compile_jobs:
        assert {64, "bshd", "float16"} <= set(job.args), job
        if job not in paired:
            assert job.tiling == by_factory[job.factory].tiling
    # fwd and bwd are each compiled once without and once with the causal mask; the causal fwd
    # once more paired (short causal calls run it), with the fwd tiling but for overlap.
    for factory in ("x_fwd", "x_bwd"):
        flags = sorted(
            a
            for job in p.compile_jobs
            if job.factory == factory and job not in paired
            for a in job.args
            if isinstance(a, bool)
        )
        assert flags == [False, True], factory
    fwd_tiling = {k: v for k, v in by_factory["x_fwd"].tiling.items() if k != "overlap"}
    assert [(job.factory, job.args[3], job.tiling) for job in paired] == [
        ("x_fwd", True, {**fwd_tiling, "pair_blocks": True})
    ]


def test_plan_layouts(project):
    p = plan_of(project, '[attention]\nlayouts = ["bhsd", "bshd"]\n')
    assert p.default_layout == "bhsd"
    assert p.layout_dims == {
        "bhsd": "[batch, heads, seq_len, head_dim]",
        "bshd": "[batch, seq_len, heads, head_dim]",
    }


def test_flops_fwd():
    # Two GEMMs (Q K^T, P V) of 2 * head_dim FLOPs per visible (query, key) pair per head.
    assert attention.flops_fwd(2, 4, 1000, 64, causal=False) == 4 * 2 * 4 * 64 * 1000 * 1000
    assert attention.flops_fwd(2, 4, 1000, 64, causal=True) == 4 * 2 * 4 * 64 * (1000 * 1001 // 2)
    assert attention.flops_fwd(4, 16, 4096, 128, causal=False) == 4 * 4 * 16 * 128 * 4096**2


def test_load_plan_records_the_source(project):
    path = project / "specs" / "x.toml"
    path.parent.mkdir()
    path.write_text(MINIMAL)
    p, family = load_plan(Path("specs/x.toml"))
    assert family is attention.FAMILY
    assert p.source.spec_path == "specs/x.toml"
    assert p.source.opgen_version == __version__
    assert p.source.spec_sha256 == spec_digest(validate(Spec, read_spec(path)))
    assert p.source.spec_sha256 != hashlib.sha256(MINIMAL.encode()).hexdigest()
    assert p.source.short_hash == p.source.spec_sha256[:16]


# --- variants: GQA, sinks, sliding window ----------------------------------------------------------

GROUPED_SHAPES = "[test]\nshapes = [{batch=2, heads=4, seq_len=1000}, {batch=1, heads=8, kv_heads=2, seq_len=333}]\n"


def grads_of(p) -> dict[str, tuple[str, str, str]]:
    return {g.grad: (g.reduction, g.buffer_dtype, g.alloc) for g in p.grads}


@pytest.mark.parametrize(
    "dk, dv",
    [
        (None, None),
        ("atomic", "atomic"),
        ("split", "split"),
        ("atomic", "split"),
        ("split", "atomic"),
    ],
)
def test_plan_gqa_reductions(project, dk, dv):
    text = "[attention]\ngqa = true\n" + GROUPED_SHAPES
    for grad, choice in (("dk", dk), ("dv", dv)):
        if choice:
            text += f'[grads.{grad}]\nreduction = "{choice}"\n'
    p = plan_of(project, text)
    atomic = ("atomic", "float32", "torch.zeros")  # fp32 atomics need a zeroed fp32 buffer
    split = (
        "split",
        "float32",
        "torch.empty",
    )  # fp32 partials written once each, summed afterwards
    expected = {"atomic": atomic, "split": split, None: atomic}  # atomic is the GQA default
    assert grads_of(p) == {"dq": atomic, "dk": expected[dk], "dv": expected[dv]}
    assert {g.grad for g in p.atomic_grads} == {"dq"} | {
        g for g, c in (("dk", dk), ("dv", dv)) if c != "split"
    }
    assert (p.dk_reduction, p.dv_reduction) == (dk or "atomic", dv or "atomic")
    assert p.gqa_case == p.test_cases[2]
    assert (p.gqa_case.heads, p.gqa_case.kv_heads) == (8, 2)


def test_plan_gqa_compiles_both_reductions(project):
    p = plan_of(
        project,
        '[attention]\ngqa = true\n[grads.dk]\nreduction = "split"\n'
        '[grads.dv]\nreduction = "split"\n' + GROUPED_SHAPES,
    )
    bwd = [job for job in p.compile_jobs if job.factory == "x_bwd"]
    # The generated tests compare atomic against split on a grouped shape: both must compile.
    assert {"atomic", "split"} <= {a for job in bwd for a in job.args if isinstance(a, str)}
    assert len(p.compile_jobs) > len(plan_of(project).compile_jobs)


def test_plan_without_gqa_writes_dk_dv_directly(project):
    p = plan_of(project)
    assert grads_of(p)["dk"] == grads_of(p)["dv"] == ("direct", "input", "torch.empty")
    assert p.gqa_case is None


def test_plan_sinks(project):
    p = plan_of(project, "[attention]\nsinks = true\n")
    assert "dsinks" in p.kernels
    assert p.kernels["dsinks"].factory == "x_bwd_dsinks"
    assert grads_of(p)["dsinks"] == ("split", "float32", "torch.empty")
    assert p.saved == ("q", "k", "v", "sinks", "o", "lse")
    assert p.tensor_inputs == ("q", "k", "v", "sinks")
    assert sum(job.factory == "x_bwd_dsinks" for job in p.compile_jobs) == 1
    assert "dsinks" not in plan_of(project).kernels


def test_plan_sinks_with_recompute_still_saves_the_sinks(project):
    p = plan_of(project, '[attention]\nsinks = true\n[saved]\no = "recompute"\nlse = "recompute"\n')
    assert p.saved == ("q", "k", "v", "sinks")


def test_plan_sliding_window_mask_cases(project):
    p = plan_of(project, "[attention]\nsliding_window = true\n[test]\nwindows = [16, 700]\n")
    assert [(m.id, m.causal, m.window) for m in p.mask_cases] == [
        ("full", False, None),
        ("causal", True, None),
        ("causal-w16", True, 16),
        ("causal-w700", True, 700),
    ]
    fwd = [job for job in p.compile_jobs if job.factory == "x_fwd" and not job.tiling.get("pair_blocks")]
    assert len(fwd) == len(p.layouts) * len(p.dtypes) * len(p.head_dims) * len(p.mask_cases)
    # The paired fwd: causal without a window only.
    paired = [job.args[3:5] for job in p.compile_jobs if job.tiling.get("pair_blocks")]
    assert paired == [(True, 0)] * len(p.layouts) * len(p.dtypes) * len(p.head_dims)


def test_visible_pairs_and_windowed_flops():
    assert attention.visible_pairs(10, causal=False, window=None) == 100
    assert attention.visible_pairs(10, causal=True, window=None) == 55
    # window 3: rows 0..2 see 1, 2, 3 keys; the other 7 rows see 3 each.
    assert attention.visible_pairs(10, causal=True, window=3) == 6 + 7 * 3
    assert attention.visible_pairs(10, causal=True, window=50) == 55
    assert attention.flops_fwd(1, 2, 10, 64, causal=True, window=3) == 4 * 2 * 64 * 27
