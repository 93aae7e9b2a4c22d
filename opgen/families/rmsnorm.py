"""RMSNorm y = x * rstd * w over the last dim, rstd = 1 / sqrt(mean(x^2) + eps), forward and
backward (seed 003: save vs recompute of the per-row rstd; per-channel dw partials).

x has any shape [..., C]; the kernels take it as a [rows, C] matrix. w is one learnable weight per
channel. A forward block normalises block_rows rows at once; a backward block walks its block_rows
rows one at a time. Both loop over C in chunks of block_channels (the last chunk guarded), staging
the rows in shared memory so that x (and dy) are read from HBM once; max_channels bounds C so
that the staged rows fit. dx is written once per element. dw sums dy * x * rstd over the rows: a
backward block accumulates its rows in fp32 in shared memory, then issues one fp32 atomic per
channel (atomic) or writes one fp32 partial per channel (split, summed on the host in a fixed
order: deterministic).

Spec section, validation beyond field types, and plan(): the kernels and their grids, the shared
memory they need, the gradient buffers and how each is reduced, what the forward saves, the test
matrix, the compile jobs and the bytes the benchmark divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, model_validator

from opgen.errors import OpgenError
from opgen.plan import (
    DTYPE_BYTES,
    SM90_SMEM_LIMIT,
    TORCH_DTYPES,
    CompileJob,
    GradPlan,
    KernelPlan,
    SourceInfo,
    custom_op_names,
    format_bytes,
    require_every_gradient_checked,
)
from opgen.spec import (
    BenchSection,
    Block,
    DEFAULT_TOLERANCES,
    Dtype,
    PositiveInt,
    SpecBase,
    StrictModel,
    TestSection,
    Threads,
    Tolerance,
    merge_defaults,
)

DESCRIPTION = (
    "RMSNorm x * rstd * w, w per channel: fwd (rstd saved or recomputed), bwd (dx direct; dw "
    "atomic or split)"
)

# Templates per output file; "{name}" is the spec's name.
TEMPLATES = {
    "__init__.py": "rmsnorm/__init__.py.jinja",
    "kernels.py": "rmsnorm/kernels.py.jinja",
    "autograd.py": "rmsnorm/autograd.py.jinja",
    "reference.py": "rmsnorm/reference.py.jinja",
    "test_{name}.py": "rmsnorm/test_op.py.jinja",
    "bench_{name}.py": "rmsnorm/bench_op.py.jinja",
}

# Each thread keeps its share of a chunk's fp32 row sums (x^2, w * dy * x) in registers until the
# in-block reduction: at most this many elements of a chunk per thread.
MAX_CHUNK_ELEMENTS_PER_THREAD = 64
ACCUM_BYTES = 4  # fp32: rstd, the backward's staged w and its dw sums


def _power_of_two_rows(value: int) -> int:
    if value < 1 or value & (value - 1):
        raise ValueError("must be a power of two >= 1")
    return value


Rows = Annotated[int, AfterValidator(_power_of_two_rows)]
Shape = Annotated[tuple[PositiveInt, ...], Field(min_length=1)]


class RowTiling(StrictModel):
    """Tiles of a row phase: a block covers `block_rows` rows and loops over C in chunks of
    `block_channels` channels, with `threads` threads."""

    block_rows: Rows
    block_channels: Block
    threads: Threads


# Hopper defaults for a memory-bound op at C in the thousands: 256 threads. fwd: 4 rows x 1024
# channels a chunk (16 elements per thread), 4096 blocks at [16384, 4096]. bwd: 32 rows a block,
# one at a time, in chunks of 2048 channels (8 per thread): one dw atomic (partial) per channel
# per 32 rows, and 512 blocks at [16384, 4096] that fit one wave of an H200.
DEFAULT_TILING = {
    "fwd": RowTiling(block_rows=4, block_channels=1024, threads=256),
    "bwd": RowTiling(block_rows=32, block_channels=2048, threads=256),
}

DEFAULT_MAX_CHANNELS = 16384
DEFAULT_TEST_SHAPES = ((3, 333, 77), (37, 5000), (4097,), (65, 8192))

# `opgen new <scaffold>`: the data each commented scaffold is rendered from.
SCAFFOLDS = {
    "rmsnorm": {
        "title": "RMSNorm y = x * rstd * w with a learnable per-channel w (seed 003), fwd and bwd",
        "eps": "1e-6",
        "weight_dtype": "input",
        "max_channels": DEFAULT_MAX_CHANNELS,
        "dw": "atomic",
        "rstd": "save",
        "shapes": list(DEFAULT_TEST_SHAPES),
        "bench_dtype": "bfloat16",
        "bench": [(16384, 4096)],
        "tiling": {phase: t.model_dump() for phase, t in DEFAULT_TILING.items()},
        "tolerance": {dtype: t.model_dump() for dtype, t in DEFAULT_TOLERANCES.items()},
    },
}


class RmsnormSection(StrictModel):
    # Added to mean(x^2) under the square root; > 0 keeps an all-zero row finite.
    eps: Annotated[float, Field(gt=0, lt=1)] = 1e-6
    # dtype of w and dw: x's dtype (as in most models), or float32 (a master weight).
    weight_dtype: Literal["input", "float32"] = "input"
    # The largest C the op accepts: the kernels stage whole rows in shared memory.
    max_channels: PositiveInt = DEFAULT_MAX_CHANNELS


class DxGrad(StrictModel):
    # Each element of dx is written once, by the block that owns its row.
    reduction: Literal["direct"] = "direct"


class DwGrad(StrictModel):
    # atomic: a block sums its rows in fp32, then one fp32 atomic add per channel into a zeroed
    # buffer. split: each block writes its fp32 partial per channel once; the [row blocks, C]
    # partials are summed on the host in a fixed order (deterministic, a little more memory).
    reduction: Literal["atomic", "split"] = "atomic"


class RmsnormGrads(StrictModel):
    dx: DxGrad = DxGrad()
    dw: DwGrad = DwGrad()


class RmsnormSaved(StrictModel):
    # save: the forward writes one fp32 rstd per row for the backward (4 bytes a row). recompute:
    # the backward sums x^2 again from the row it loads anyway (a few FLOPs per element).
    rstd: Literal["save", "recompute"] = "save"


class RmsnormTiling(StrictModel):
    fwd: RowTiling
    bwd: RowTiling

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        return merge_defaults(data, DEFAULT_TILING)


class RmsnormTest(TestSection):
    # Any x shapes [..., C]. Keep sizes that are not a multiple of any block (rows and C): tail
    # blocks are where guard bugs hide.
    shapes: tuple[Shape, ...] = DEFAULT_TEST_SHAPES


class RmsnormBenchShape(StrictModel):
    """One benchmark input: x of shape [rows, channels]."""

    rows: PositiveInt
    channels: PositiveInt


class RmsnormBench(BenchSection):
    dtype: Dtype = "bfloat16"
    # A Llama-sized activation: 16384 tokens x 4096 channels.
    shapes: tuple[RmsnormBenchShape, ...] = (RmsnormBenchShape(rows=16384, channels=4096),)


class Spec(SpecBase):
    family: Literal["rmsnorm"]
    rmsnorm: RmsnormSection = RmsnormSection()
    grads: RmsnormGrads = RmsnormGrads()
    saved: RmsnormSaved = RmsnormSaved()
    tiling: RmsnormTiling = RmsnormTiling.model_validate({})
    test: RmsnormTest = RmsnormTest()
    bench: RmsnormBench = RmsnormBench()

    @classmethod
    def rules(cls):
        return super().rules() + RULES


def matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, C): the [rows, C] view of an x of `shape` that the kernels take."""
    return math.prod(shape) // shape[-1], shape[-1]


def padded(channels: int, block_channels: int) -> int:
    """C rounded up to whole chunks: the width of a row staged in shared memory."""
    return -(-channels // block_channels) * block_channels


def shared_bytes(phase: str, tiling: dict[str, int], channels: int, elem: int) -> int:
    """Shared memory of one block at C = channels (TileLang places these buffers; the compile
    check reads the real figure). fwd: its block_rows rows of x in x's dtype, the fp32 rstd per
    row, the reduction's workspace. bwd: one row of x and of dy in x's dtype, w and the block's dw
    sums in fp32 across the row, one workspace per row sum (x^2 and w * dy * x)."""
    width = padded(channels, tiling["block_channels"])
    workspace = ACCUM_BYTES * tiling["threads"]
    if phase == "fwd":
        return tiling["block_rows"] * (width * elem + ACCUM_BYTES) + workspace
    return width * (2 * elem + 2 * ACCUM_BYTES) + 2 * workspace


def chunks_fit_threads(spec: Spec):
    for phase in ("fwd", "bwd"):
        t = getattr(spec.tiling, phase)
        # A fwd chunk is [block_rows, block_channels]; a bwd chunk is one row of block_channels.
        chunk = t.block_channels * (t.block_rows if phase == "fwd" else 1)
        what = "block_rows x block_channels" if phase == "fwd" else "block_channels"
        field = f"tiling.{phase}.block_channels"
        if chunk < t.threads:
            yield field, (
                f"{what} must be at least threads ({t.threads}): one element per thread or more "
                f"(got {chunk})"
            )
        if chunk > MAX_CHUNK_ELEMENTS_PER_THREAD * t.threads:
            yield field, (
                f"{what} must be at most {MAX_CHUNK_ELEMENTS_PER_THREAD} x threads "
                f"({MAX_CHUNK_ELEMENTS_PER_THREAD * t.threads}): each thread holds the fp32 row "
                f"sums of its elements of a chunk in registers (got {chunk})"
            )


def rows_fit_shared_memory(spec: Spec):
    elem = max((DTYPE_BYTES[d] for d in spec.dtypes), default=2)
    limit = spec.rmsnorm.max_channels
    for phase in ("fwd", "bwd"):
        need = shared_bytes(phase, getattr(spec.tiling, phase).model_dump(), limit, elem)
        if need > SM90_SMEM_LIMIT:
            staged, lower = (
                ("its block_rows rows of x", "max_channels or tiling.fwd.block_rows")
                if phase == "fwd" else
                ("a row of x and dy, and w and dw in fp32", "max_channels")
            )
            yield "rmsnorm.max_channels", (
                f"the {phase} kernel stages {staged} in shared memory: {need} bytes at "
                f"C = {limit} (rounded up to whole block_channels chunks), over the sm_90 limit "
                f"{SM90_SMEM_LIMIT}; lower {lower} (got {limit})"
            )


def tested_shapes_within_max_channels(spec: Spec):
    limit = spec.rmsnorm.max_channels
    for i, shape in enumerate(spec.test.shapes):
        if shape[-1] > limit:
            yield f"test.shapes.{i}", (
                f"last dim (C) must be at most rmsnorm.max_channels ({limit}) (got {shape[-1]})"
            )


def tested_shapes_have_tails(spec: Spec):
    shapes = spec.test.shapes
    if not shapes:
        return
    smallest = min(spec.tiling.fwd.block_channels, spec.tiling.bwd.block_channels)
    if not any(_column_tail(spec, s) for s in shapes):
        yield "test.shapes", (
            f"add a shape whose last dim (C) is not a multiple of {smallest} (the smallest "
            "block_channels), e.g. [3, 333, 77]: tail chunks are where guard bugs hide"
        )
    rows = _smallest_block_rows(spec)
    if rows > 1 and not any(_row_tail(spec, s) for s in shapes):
        yield "test.shapes", (
            f"add a shape whose rows (elements / last dim) are not a multiple of {rows} (the "
            "smallest block_rows), e.g. [3, 333, 77]: tail rows are where guard bugs hide"
        )


def bench_shapes_within_max_channels(spec: Spec):
    limit = spec.rmsnorm.max_channels
    for i, shape in enumerate(spec.bench.shapes):
        if shape.channels > limit:
            yield f"bench.shapes.{i}.channels", (
                f"must be at most rmsnorm.max_channels ({limit}) (got {shape.channels})"
            )


# The rmsnorm rules, in the order their problems are reported (after the shared ones).
RULES = (chunks_fit_threads, rows_fit_shared_memory, tested_shapes_within_max_channels,
         tested_shapes_have_tails, bench_shapes_within_max_channels)


def _smallest_block_rows(spec: Spec) -> int:
    """The smallest block_rows above 1: a row count not a multiple of it leaves a tail block in
    every phase with more than one row a block (block_rows are powers of two)."""
    return min((r for r in (spec.tiling.fwd.block_rows, spec.tiling.bwd.block_rows) if r > 1),
               default=1)


def _column_tail(spec: Spec, shape: tuple[int, ...]) -> bool:
    chunk = min(spec.tiling.fwd.block_channels, spec.tiling.bwd.block_channels)
    return shape[-1] % chunk != 0


def _row_tail(spec: Spec, shape: tuple[int, ...]) -> bool:
    rows = _smallest_block_rows(spec)
    return rows > 1 and matrix(shape)[0] % rows != 0


@dataclass(frozen=True)
class TestCase:
    shape: tuple[int, ...]

    @property
    def id(self) -> str:
        return "x".join(map(str, self.shape))


@dataclass(frozen=True)
class BenchCase:
    rows: int
    channels: int
    fwd_bytes: int  # x and w read once, y written once
    bwd_bytes: int  # dy, x and w read once, dx and dw written once


@dataclass(frozen=True)
class Plan:
    family: str
    name: str
    ops: dict[str, str]  # phase -> torch.library name of its custom op
    source: SourceInfo
    dtypes: tuple[str, ...]
    torch_dtypes: tuple[str, ...]
    eps: float
    eps_literal: str  # eps as Python source
    weight_dtype: str  # input (x's dtype) | float32
    weight_dtype_expr: str  # the dtype w must have, as code over x: x.dtype or torch.float32
    max_channels: int
    kernels: dict[str, KernelPlan]
    grads: tuple[GradPlan, ...]
    grad_check_order: tuple[tuple[str, str], ...]  # (label, input) in the order tests assert them
    dw_reduction: str  # the spec's: the public function's
    test_reductions: tuple[str, ...]  # dw reductions the generated tests run (atomic also split)
    save_rstd: bool  # the spec's: the public function's
    saved: tuple[str, ...]  # tensors the forward saves, with the spec's saved.rstd
    recomputed: tuple[str, ...]
    test_cases: tuple[TestCase, ...]
    tail_case: TestCase  # tail rows and channels: strided dy, atomics, split, broken grads
    tolerances: dict[str, Tolerance]
    bench: RmsnormBench
    bench_cases: tuple[BenchCase, ...]
    compile_jobs: tuple[CompileJob, ...]

    @property
    def atomic_grads(self) -> tuple[GradPlan, ...]:
        return tuple(g for g in self.grads if g.reduction == "atomic")


def bytes_moved(numel: int, channels: int, elem: int, w_elem: int) -> tuple[int, int]:
    """(fwd, bwd) bytes of the op itself, whatever computes it: every input read once and every
    output written once. fwd: x, w -> y. bwd: dy, x, w -> dx, dw."""
    w_bytes = channels * w_elem
    return 2 * numel * elem + w_bytes, 3 * numel * elem + 2 * w_bytes


def plan(spec: Spec, source: SourceInfo) -> Plan:
    section = spec.rmsnorm
    reduction = spec.grads.dw.reduction
    save_rstd = spec.saved.rstd == "save"

    def kernel(key, summary):
        t = getattr(spec.tiling, key)
        return KernelPlan(f"{spec.name}_{key}", key, summary, "(ceildiv(rows, block_rows),)",
                          f"{key.upper()}_TILING", t.model_dump(), None)

    kernels = {
        "fwd": kernel("fwd", "y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), in fp32 (and "
                             "the fp32 rstd per row when saved)"),
        "bwd": kernel("bwd", "dx = rstd * (w * dy - x * rstd^2 * mean(w * dy * x)); dw: the "
                             "block's fp32 sums of dy * x * rstd over its rows, one atomic add or "
                             "partial per channel"),
    }
    dw_notes = {
        "atomic": "the block's rows summed in fp32, one fp32 atomic add per block and channel into "
                  "a zeroed buffer, then cast to w's dtype",
        "split": "one fp32 partial per block and channel written once, summed on the host in a "
                 "fixed order (deterministic), then cast",
    }
    grads = (
        GradPlan("dx", "x", "direct", "input", "torch.empty", "per row: written once per element"),
        GradPlan("dw", "w", reduction, "float32",
                 "torch.zeros" if reduction == "atomic" else "torch.empty", dw_notes[reduction]),
    )
    # Seed 000: the directly written dx before the reduced dw.
    grad_check_order = (("dx", "x"), ("dw", "w"))
    require_every_gradient_checked(
        source.spec_path, tuple(g.input for g in grads), tuple(i for _, i in grad_check_order)
    )
    # The tests always run split (deterministic, checked bitwise); an atomic spec is also checked
    # against it.
    test_reductions = ("atomic", "split") if reduction == "atomic" else ("split",)
    test_cases = tuple(TestCase(tuple(s)) for s in spec.test.shapes)
    # Prefer a shape with tails in both rows and channels; validation found one with each.
    tail_case = max(test_cases,
                    key=lambda c: _row_tail(spec, c.shape) + _column_tail(spec, c.shape))

    w_elem = DTYPE_BYTES[spec.bench.dtype if section.weight_dtype == "input" else "float32"]
    bench_cases = tuple(
        BenchCase(s.rows, s.channels, *bytes_moved(s.rows * s.channels, s.channels,
                                                   DTYPE_BYTES[spec.bench.dtype], w_elem))
        for s in spec.bench.shapes
    )
    return Plan(
        family="rmsnorm",
        name=spec.name,
        ops=custom_op_names(spec.name, "fwd", "bwd"),
        source=source,
        dtypes=spec.dtypes,
        torch_dtypes=tuple(TORCH_DTYPES[d] for d in spec.dtypes),
        eps=section.eps,
        eps_literal=repr(section.eps),
        weight_dtype=section.weight_dtype,
        weight_dtype_expr="x.dtype" if section.weight_dtype == "input" else "torch.float32",
        max_channels=section.max_channels,
        kernels=kernels,
        grads=grads,
        grad_check_order=grad_check_order,
        dw_reduction=reduction,
        test_reductions=test_reductions,
        save_rstd=save_rstd,
        saved=("x", "w", "rstd") if save_rstd else ("x", "w"),
        recomputed=() if save_rstd else ("rstd",),
        test_cases=test_cases,
        tail_case=tail_case,
        tolerances={d: spec.test.tolerance_for(d) for d in spec.dtypes},
        bench=spec.bench,
        bench_cases=bench_cases,
        compile_jobs=_compile_jobs(spec, kernels, tail_case, test_reductions),
    )


def _compile_jobs(spec, kernels, tail_case, test_reductions) -> tuple[CompileJob, ...]:
    """Every kernel variant the package launches, at a test shape with tail blocks: per dtype, fwd
    with and without the saved rstd, bwd for each of those and each dw reduction the tests run;
    then the benchmark's shapes with the spec's choices (the no-tail, vectorised path); then the
    spec's choices at C = max_channels (the most shared memory the op ever asks for)."""
    save_default = spec.saved.rstd == "save"
    eps = spec.rmsnorm.eps

    def w_dtype(dtype):
        return dtype if spec.rmsnorm.weight_dtype == "input" else "float32"

    def jobs_for(rows, cols, dtype, saves, reductions, tag):
        fwd, bwd = kernels["fwd"], kernels["bwd"]
        for save in saves:
            rstd = "save" if save else "recompute"
            yield CompileJob(fwd.factory, (rows, cols, dtype, w_dtype(dtype), eps, save),
                             fwd.tiling, f"fwd {dtype} {rows}x{cols} rstd={rstd}{tag}")
            for reduction in reductions:
                label = f"bwd {dtype} {rows}x{cols} rstd={rstd} dw={reduction}{tag}"
                yield CompileJob(bwd.factory,
                                 (rows, cols, dtype, w_dtype(dtype), eps, save, reduction),
                                 bwd.tiling, label)

    rows, cols = matrix(tail_case.shape)
    jobs = []
    for dtype in spec.dtypes:
        jobs += jobs_for(rows, cols, dtype, (False, True), test_reductions, "")
    spec_choice = ((save_default,), (spec.grads.dw.reduction,))
    for shape in spec.bench.shapes:
        jobs += jobs_for(shape.rows, shape.channels, spec.bench.dtype, *spec_choice, " (bench)")
    jobs += jobs_for(rows, spec.rmsnorm.max_channels, spec.dtypes[0], *spec_choice,
                     " (max_channels)")
    return tuple(jobs)


EXPLAIN_SHAPE_KEYS = ("rows", "channels", "dtype")
EXPLAIN_REQUIRED_KEYS = ("rows", "channels")


def explain(p: Plan, shape: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    """The plan for one runtime shape (x of [rows, channels]), as titled tables: kernels, grids
    and shared memory, saved tensors and their bytes, the gradient buffers and their atomics,
    bytes moved."""
    rows, channels = shape["rows"], shape["channels"]
    dtype = shape.get("dtype", p.dtypes[0])
    _check_shape(p, rows, channels, dtype)
    elem = DTYPE_BYTES[dtype]
    w_elem = DTYPE_BYTES[dtype if p.weight_dtype == "input" else "float32"]
    numel = rows * channels

    def blocks(key):
        return -(-rows // p.kernels[key].tiling["block_rows"])

    kernels = [[k.factory, k.phase, f"{k.grid} = ({blocks(key)},)",
                ", ".join(f"{n}={v}" for n, v in k.tiling.items()),
                format_bytes(shared_bytes(key, k.tiling, channels, elem)), k.summary]
               for key, k in p.kernels.items()]
    sizes = {"x": numel * elem, "w": channels * w_elem, "rstd": rows * 4}  # rstd: fp32 per row
    saved = [[name, format_bytes(sizes[name]), "saved"] for name in p.saved]
    saved += [[name, format_bytes(sizes[name]), "recomputed in backward from x"]
              for name in p.recomputed]
    held = sum(sizes[n] for n in p.saved)
    saved.append(["total held between fwd and bwd", format_bytes(held), ""])

    row_blocks = blocks("bwd")
    reductions = []
    for g in p.grads:
        if g.grad == "dx":
            reductions.append([g.grad, g.reduction, "written once (torch.empty)",
                               format_bytes(numel * elem), "-", g.note])
        elif g.reduction == "atomic":
            reductions.append([g.grad, g.reduction, "fp32 atomic target (torch.zeros)",
                               format_bytes(4 * channels),
                               f"{row_blocks * channels} ({row_blocks} per address)", g.note])
        else:
            reductions.append([g.grad, g.reduction, "fp32 partials, summed after (torch.empty)",
                               format_bytes(4 * row_blocks * channels), "0", g.note])
    fwd_bytes, bwd_bytes = bytes_moved(numel, channels, elem, w_elem)
    rstd = sizes["rstd"] if "rstd" in p.saved else 0
    partials = 0 if p.dw_reduction == "atomic" else 4 * row_blocks * channels
    moved = [
        ["forward", format_bytes(fwd_bytes), format_bytes(fwd_bytes + rstd),
         "x, w read; y written" + ("; the kernel also writes rstd" if rstd else "")],
        ["backward", format_bytes(bwd_bytes), format_bytes(bwd_bytes + rstd + 2 * partials),
         "dy, x, w read; dx, dw written" + ("; the kernel also reads rstd" if rstd else "")
         + ("; dw partials written, then read by the sum" if partials else "")],
    ]
    title = (f"shape: rows={rows} channels={channels} dtype={dtype} ({numel} elements; "
             f"eps={p.eps_literal}; C at most {p.max_channels})")
    return [
        (title, []),
        ("kernels",
         [["factory", "phase", "grid", "tiling", "shared memory", "computes"], *kernels]),
        ("saved for backward", [["tensor", "bytes", ""], *saved]),
        ("gradient reductions",
         [["grad", "reduction", "buffer", "bytes", "atomics", "why"], *reductions]),
        ("bytes moved (the benchmark divides the first column by the time)",
         [["pass", "op bytes", "kernel bytes", "what"], *moved]),
    ]


def _check_shape(p: Plan, rows: int, channels: int, dtype: str) -> None:
    """What the generated op's input checks would reject, as an explain error."""
    problems = []
    if min(rows, channels) < 1:
        problems.append("rows and channels must be >= 1")
    if channels > p.max_channels:
        problems.append(f"channels must be at most rmsnorm.max_channels ({p.max_channels}) "
                        f"(got {channels})")
    if dtype not in p.dtypes:
        problems.append(f"dtype must be one of {', '.join(p.dtypes)} (got {dtype!r})")
    if problems:
        raise OpgenError("--shape: " + "; ".join(problems))
