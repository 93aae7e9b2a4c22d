"""Scaled SiLU y = w * silu(x) = w * x * sigmoid(x), forward and backward (seed 003).

w is a learnable scalar or one weight per channel (the last dim of x). The op is elementwise, so
the kernels take x as a [rows, cols] matrix: a scalar weight sees every element alike and views x
as one row of x.numel() elements; a channel weight views it as [x.numel() // C, C] with C its last
dim. dx is elementwise (written once); dw is a reduction over every element (scalar) or over the
rows (channel): an in-block fp32 reduction, then one fp32 atomic per block (per channel) or one
partial per block summed on the host (deterministic).

Spec section, validation beyond field types, and plan(): the kernels and their grids, the gradient
buffers and how each is reduced, what the forward saves, the test matrix, the compile jobs and the
bytes the benchmark divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from opgen.errors import OpgenError
from opgen.plan import (
    DTYPE_BYTES,
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
    "scaled SiLU w * silu(x), w a scalar or per channel: fwd, bwd (dx direct; dw atomic or split)"
)

# Templates per output file; "{name}" is the spec's name.
TEMPLATES = {
    "__init__.py": "scaled_silu/__init__.py.jinja",
    "kernels.py": "scaled_silu/kernels.py.jinja",
    "autograd.py": "scaled_silu/autograd.py.jinja",
    "reference.py": "scaled_silu/reference.py.jinja",
    "test_{name}.py": "scaled_silu/test_op.py.jinja",
    "bench_{name}.py": "scaled_silu/bench_op.py.jinja",
}

# The largest bwd block per thread: each thread keeps the fp32 dw terms of its elements in
# registers until the in-block reduction.
MAX_BWD_ELEMENTS_PER_THREAD = 64


Shape = Annotated[tuple[PositiveInt, ...], Field(min_length=1)]


class ElementwiseTiling(StrictModel):
    """Tiles of an elementwise phase: `block` elements per thread block, `threads` threads.

    With a scalar weight a block is `block` consecutive elements. With a channel weight it is a
    [block // block_channels, block_channels] tile of the [rows, C] view: a block reduces dw over
    its rows for block_channels channels, so a larger tile issues fewer dw atomics (partials).
    """

    block: Block
    threads: Threads
    block_channels: Block  # used only with scaled_silu.weight = "channel"


# Hopper defaults for a memory-bound op: 256 threads; fwd 4096 elements per block (16 per thread,
# 16-byte vector loads of 16-bit data), bwd 8192 (32 per thread) so that dw needs half as many
# atomics or partials; channel tiles 256 channels wide (512-byte fp16 rows, coalesced).
DEFAULT_TILING = {
    "fwd": ElementwiseTiling(block=4096, threads=256, block_channels=256),
    "bwd": ElementwiseTiling(block=8192, threads=256, block_channels=256),
}


# `opgen new <scaffold>`: the data each commented scaffold is rendered from.
SCAFFOLDS = {
    "scaled_silu": {
        "title": "scaled SiLU y = w * silu(x) with a learnable scalar w (seed 003), fwd and bwd",
        "weight": "scalar",
        "weight_dtype": "float32",
        "dw": "atomic",
        "sigmoid": "recompute",
        "shapes": [(3, 1000, 77), (4097,), (64, 1024)],
        "bench_dtype": "float16",
        "bench": [(8192, 8192)],
        "tiling": {phase: t.model_dump() for phase, t in DEFAULT_TILING.items()},
        "tolerance": {dtype: t.model_dump() for dtype, t in DEFAULT_TOLERANCES.items()},
    },
}


class ScaledSiluSection(StrictModel):
    # "scalar": one learnable number (shape () or (1,)); "channel": one per channel, shape [C]
    # with C = x.shape[-1], broadcast over the other dims.
    weight: Literal["scalar", "channel"] = "scalar"
    # dtype of w and dw: float32 (a master weight: dw sums millions of terms), or x's dtype.
    weight_dtype: Literal["float32", "input"] = "float32"


class DxGrad(StrictModel):
    # Elementwise: each element of dx is written once by the block that owns it.
    reduction: Literal["direct"] = "direct"


class DwGrad(StrictModel):
    # atomic: in-block fp32 reduction, then one fp32 atomic add per block (per channel) into a
    # zeroed buffer. split: each block writes its fp32 partial once; the partials are summed on
    # the host in a fixed order (deterministic, a little more memory).
    reduction: Literal["atomic", "split"] = "atomic"


class ScaledSiluGrads(StrictModel):
    dx: DxGrad = DxGrad()
    dw: DwGrad = DwGrad()


class ScaledSiluSaved(StrictModel):
    # recompute: the forward saves x, the backward recomputes sigmoid(x) (a few FLOPs per element,
    # seed 003's choice). save: the forward also writes sigmoid(x) in fp32 for the backward (in
    # x's dtype its rounding would show in dw): 4 more bytes per element held between forward and
    # backward, no exp in the backward.
    sigmoid: Literal["recompute", "save"] = "recompute"


class ScaledSiluTiling(StrictModel):
    fwd: ElementwiseTiling
    bwd: ElementwiseTiling

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        return merge_defaults(data, DEFAULT_TILING)


class ScaledSiluTest(TestSection):
    # Any shapes; with channel weights the last dim is C. Keep sizes that are not a multiple of any
    # block: tail blocks are where guard bugs hide.
    shapes: tuple[Shape, ...] = ((3, 1000, 77), (4097,), (64, 1024))


class ScaledSiluBenchShape(StrictModel):
    """One benchmark input: x of shape [rows, channels] (channels = C for channel weights)."""

    rows: PositiveInt
    channels: PositiveInt


class ScaledSiluBench(BenchSection):
    dtype: Dtype = "float16"
    # One 64M-element tensor: large enough to measure HBM bandwidth, not the launch.
    shapes: tuple[ScaledSiluBenchShape, ...] = (ScaledSiluBenchShape(rows=8192, channels=8192),)


class Spec(SpecBase):
    family: Literal["scaled_silu"]
    scaled_silu: ScaledSiluSection = ScaledSiluSection()
    grads: ScaledSiluGrads = ScaledSiluGrads()
    saved: ScaledSiluSaved = ScaledSiluSaved()
    tiling: ScaledSiluTiling = ScaledSiluTiling.model_validate({})
    test: ScaledSiluTest = ScaledSiluTest()
    bench: ScaledSiluBench = ScaledSiluBench()

    @classmethod
    def rules(cls):
        return super().rules() + RULES


def tile(weight: str, tiling: ElementwiseTiling) -> tuple[int, int]:
    """(block_rows, block_cols) of a phase: a scalar weight views x as one row."""
    if weight == "scalar":
        return 1, tiling.block
    return tiling.block // tiling.block_channels, tiling.block_channels


def matrix(weight: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, cols): the [rows, cols] view of an x of `shape` that the kernels take."""
    numel = math.prod(shape)
    if weight == "scalar":
        return 1, numel
    return numel // shape[-1], shape[-1]


def blocks_cover_threads(spec: Spec):
    for phase in ("fwd", "bwd"):
        tiling = getattr(spec.tiling, phase)
        if tiling.block < tiling.threads:
            yield f"tiling.{phase}.block", (
                f"must be at least threads ({tiling.threads}): one element per thread or more "
                f"(got {tiling.block})"
            )


def channel_tiles_fit_blocks(spec: Spec):
    if spec.scaled_silu.weight != "channel":
        return
    for phase in ("fwd", "bwd"):
        tiling = getattr(spec.tiling, phase)
        if tiling.block_channels > tiling.block:
            yield f"tiling.{phase}.block_channels", (
                f"must be at most block ({tiling.block}): a tile is [block // block_channels, "
                f"block_channels] (got {tiling.block_channels})"
            )


def bwd_block_fits_registers(spec: Spec):
    bwd = spec.tiling.bwd
    if bwd.block > MAX_BWD_ELEMENTS_PER_THREAD * bwd.threads:
        yield "tiling.bwd.block", (
            f"must be at most {MAX_BWD_ELEMENTS_PER_THREAD} x threads "
            f"({MAX_BWD_ELEMENTS_PER_THREAD * bwd.threads}): each thread holds the fp32 dw terms "
            f"of its elements in registers (got {bwd.block})"
        )


def tested_shapes_have_tails(spec: Spec):
    weight = spec.scaled_silu.weight
    shapes = spec.test.shapes
    if not shapes:
        return
    if weight == "scalar":
        smallest = min(spec.tiling.fwd.block, spec.tiling.bwd.block)
        if all(math.prod(s) % smallest == 0 for s in shapes):
            yield "test.shapes", (
                f"add a shape whose element count is not a multiple of {smallest} (the smallest "
                "block), e.g. [4097]: tail blocks are where guard bugs hide"
            )
        return
    tiles = [tile(weight, getattr(spec.tiling, p)) for p in ("fwd", "bwd")]
    cols = min(c for _, c in tiles)
    rows = min(r for r, _ in tiles)
    if all(s[-1] % cols == 0 for s in shapes):
        yield "test.shapes", (
            f"add a shape whose last dim (C) is not a multiple of {cols} (the smallest "
            "block_channels), e.g. [3, 1000, 77]: tail channels are where guard bugs hide"
        )
    if rows > 1 and all(matrix(weight, s)[0] % rows == 0 for s in shapes):
        yield "test.shapes", (
            f"add a shape whose rows (elements / last dim) are not a multiple of {rows} (the "
            "smallest tile's rows), e.g. [3, 1000, 77]: tail rows are where guard bugs hide"
        )


# The scaled_silu rules, in the order their problems are reported (after the shared ones).
RULES = (blocks_cover_threads, channel_tiles_fit_blocks, bwd_block_fits_registers,
         tested_shapes_have_tails)


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
    weight: str  # scalar | channel
    weight_dtype: str  # float32 | input (x's dtype)
    weight_doc: str  # what w is, for docstrings
    weight_dtype_expr: str  # the dtype w must have, as code over x: torch.float32 or x.dtype
    weight_shape_expr: str  # the shape w must have, as code over x: () / (1,) or (x.shape[-1],)
    weight_shape_doc: str  # the same, for error messages
    test_weight_shape_expr: str  # the shape of w the tests make for an x of `shape`, as code
    cols_expr: str  # the cols of the [rows, cols] view of x, as code over x
    reference_weight_expr: str  # w in float32, broadcastable against x, as code
    kernels: dict[str, KernelPlan]
    grads: tuple[GradPlan, ...]
    grad_check_order: tuple[tuple[str, str], ...]  # (label, input) in the order tests assert them
    dw_reduction: str  # the spec's: the public function's
    test_reductions: tuple[str, ...]  # dw reductions the generated tests run (atomic also split)
    save_sigmoid: bool  # the spec's: the public function's
    saved: tuple[str, ...]  # tensors the forward saves, with the spec's saved.sigmoid
    recomputed: tuple[str, ...]
    test_cases: tuple[TestCase, ...]
    tail_case: TestCase  # a shape with tail blocks: strided dy, atomics, split, broken grads
    tolerances: dict[str, Tolerance]
    bench: ScaledSiluBench
    bench_cases: tuple[BenchCase, ...]
    compile_jobs: tuple[CompileJob, ...]

    @property
    def atomic_grads(self) -> tuple[GradPlan, ...]:
        return tuple(g for g in self.grads if g.reduction == "atomic")


def weight_numel(weight: str, channels: int) -> int:
    return 1 if weight == "scalar" else channels


def bytes_moved(weight: str, numel: int, channels: int, elem: int, w_elem: int) -> tuple[int, int]:
    """(fwd, bwd) bytes of the op itself, whatever computes it: every input read once and every
    output written once. fwd: x, w -> y. bwd: dy, x, w -> dx, dw."""
    w_bytes = weight_numel(weight, channels) * w_elem
    return 2 * numel * elem + w_bytes, 3 * numel * elem + 2 * w_bytes


def plan(spec: Spec, source: SourceInfo) -> Plan:
    section = spec.scaled_silu
    weight = section.weight
    reduction = spec.grads.dw.reduction
    save_sigmoid = spec.saved.sigmoid == "save"

    def kernel(key, factory, phase, summary, tiling):
        block_rows, block_cols = tile(weight, tiling)
        return KernelPlan(
            f"{spec.name}_{factory}", phase, summary,
            "(ceildiv(cols, block_cols), ceildiv(rows, block_rows))", f"{key.upper()}_TILING",
            {"block_rows": block_rows, "block_cols": block_cols, "threads": tiling.threads}, None,
        )

    dw_summary = {
        "scalar": "dw: the block's fp32 sum of dy * silu(x), one atomic add or partial per block",
        "channel": "dw: the block's fp32 sums over its rows, one atomic add or partial per channel",
    }[weight]
    kernels = {
        "fwd": kernel("fwd", "fwd", "fwd",
                      "y = w * x * sigmoid(x) in fp32 (and fp32 sigmoid(x) when saved)",
                      spec.tiling.fwd),
        "bwd": kernel("bwd", "bwd", "bwd",
                      f"dx = dy * w * s * (1 + x * (1 - s)), s = sigmoid(x); {dw_summary}",
                      spec.tiling.bwd),
    }
    per_block = "per block and channel" if weight == "channel" else "per block"
    dw_notes = {
        "atomic": f"in-block fp32 reduction, one fp32 atomic add {per_block} into a zeroed buffer, "
                  "then cast to w's dtype",
        "split": f"one fp32 partial {per_block} written once, summed on the host in a fixed order "
                 "(deterministic), then cast",
    }
    grads = (
        GradPlan("dx", "x", "direct", "input", "torch.empty", "elementwise: written once per element"),
        GradPlan("dw", "w", reduction, "float32",
                 "torch.zeros" if reduction == "atomic" else "torch.empty", dw_notes[reduction]),
    )
    # Seed 000: the elementwise dx before the reduced dw.
    grad_check_order = (("dx", "x"), ("dw", "w"))
    require_every_gradient_checked(
        source.spec_path, tuple(g.input for g in grads), tuple(i for _, i in grad_check_order)
    )
    # The tests always run split (deterministic, checked bitwise); an atomic spec is also checked
    # against it.
    test_reductions = ("atomic", "split") if reduction == "atomic" else ("split",)
    test_cases = tuple(TestCase(tuple(s)) for s in spec.test.shapes)
    tail_case = next(c for c in test_cases if _has_tail(spec, c.shape))  # validation found one

    w_elem = DTYPE_BYTES[spec.bench.dtype if section.weight_dtype == "input" else "float32"]
    bench_cases = tuple(
        BenchCase(s.rows, s.channels, *bytes_moved(weight, s.rows * s.channels, s.channels,
                                                     DTYPE_BYTES[spec.bench.dtype], w_elem))
        for s in spec.bench.shapes
    )
    scalar = weight == "scalar"
    return Plan(
        family="scaled_silu",
        name=spec.name,
        ops=custom_op_names(spec.name, "fwd", "bwd"),
        source=source,
        dtypes=spec.dtypes,
        torch_dtypes=tuple(TORCH_DTYPES[d] for d in spec.dtypes),
        weight=weight,
        weight_dtype=section.weight_dtype,
        weight_doc=("a learnable scalar: shape () or (1,)" if scalar
                    else "one learnable weight per channel: shape (C,), C = x.shape[-1]"),
        weight_dtype_expr="torch.float32" if section.weight_dtype == "float32" else "x.dtype",
        weight_shape_expr="((), (1,))" if scalar else "((x.shape[-1],),)",
        weight_shape_doc="() or (1,)" if scalar else "(C,) with C = x.shape[-1]",
        test_weight_shape_expr="()" if scalar else "(shape[-1],)",
        cols_expr="x.numel()" if scalar else "x.shape[-1]",
        reference_weight_expr="w.float().reshape(())" if scalar else "w.float()",
        kernels=kernels,
        grads=grads,
        grad_check_order=grad_check_order,
        dw_reduction=reduction,
        test_reductions=test_reductions,
        save_sigmoid=save_sigmoid,
        saved=("x", "w", "sigmoid") if save_sigmoid else ("x", "w"),
        recomputed=() if save_sigmoid else ("sigmoid",),
        test_cases=test_cases,
        tail_case=tail_case,
        tolerances={d: spec.test.tolerance_for(d) for d in spec.dtypes},
        bench=spec.bench,
        bench_cases=bench_cases,
        compile_jobs=_compile_jobs(spec, kernels, tail_case, test_reductions),
    )


def _has_tail(spec: Spec, shape: tuple[int, ...]) -> bool:
    weight = spec.scaled_silu.weight
    rows, cols = matrix(weight, shape)
    for phase in ("fwd", "bwd"):
        block_rows, block_cols = tile(weight, getattr(spec.tiling, phase))
        if rows % block_rows or cols % block_cols:
            return True
    return False


def _compile_jobs(spec, kernels, tail_case, test_reductions) -> tuple[CompileJob, ...]:
    """Every kernel variant the package launches, at a test shape with tail blocks: per dtype, fwd
    with and without the saved sigmoid, bwd for each of those and each dw reduction the tests run;
    then the benchmark's shapes with the spec's choices (the no-tail, vectorised path)."""
    weight = spec.scaled_silu.weight
    save_default = spec.saved.sigmoid == "save"

    def w_dtype(dtype):
        return "float32" if spec.scaled_silu.weight_dtype == "float32" else dtype

    def jobs_for(rows, cols, dtype, saves, reductions, tag):
        fwd, bwd = kernels["fwd"], kernels["bwd"]
        for save in saves:
            sig = "save" if save else "recompute"
            yield CompileJob(fwd.factory, (rows, cols, weight, dtype, w_dtype(dtype), save),
                             fwd.tiling, f"fwd {dtype} {rows}x{cols} sigmoid={sig}{tag}")
            for reduction in reductions:
                label = f"bwd {dtype} {rows}x{cols} sigmoid={sig} dw={reduction}{tag}"
                yield CompileJob(bwd.factory,
                                 (rows, cols, weight, dtype, w_dtype(dtype), save, reduction),
                                 bwd.tiling, label)

    rows, cols = matrix(weight, tail_case.shape)
    jobs = []
    for dtype in spec.dtypes:
        jobs += jobs_for(rows, cols, dtype, (False, True), test_reductions, "")
    for shape in spec.bench.shapes:
        b_rows, b_cols = matrix(weight, (shape.rows, shape.channels))
        jobs += jobs_for(b_rows, b_cols, spec.bench.dtype, (save_default,),
                         (spec.grads.dw.reduction,), " (bench)")
    return tuple(jobs)


EXPLAIN_SHAPE_KEYS = ("rows", "channels", "dtype")
EXPLAIN_REQUIRED_KEYS = ("rows", "channels")


def explain(p: Plan, shape: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    """The plan for one runtime shape (x of [rows, channels]), as titled tables: kernels and grids,
    saved tensors and their bytes, the gradient buffers and their atomics, bytes moved."""
    n_rows, channels = shape["rows"], shape["channels"]
    dtype = shape.get("dtype", p.dtypes[0])
    _check_shape(p, n_rows, channels, dtype)
    elem = DTYPE_BYTES[dtype]
    w_elem = DTYPE_BYTES["float32" if p.weight_dtype == "float32" else dtype]
    numel = n_rows * channels
    rows, cols = matrix(p.weight, (n_rows, channels))

    def ceil(a, m):
        return -(-a // m)

    def blocks(key):
        t = p.kernels[key].tiling
        return ceil(cols, t["block_cols"]), ceil(rows, t["block_rows"])

    kernels = [[k.factory, k.phase, f"{k.grid} = {blocks(key)}",
                ", ".join(f"{n}={v}" for n, v in k.tiling.items()), k.summary]
               for key, k in p.kernels.items()]
    w_numel = weight_numel(p.weight, channels)
    sizes = {"x": numel * elem, "w": w_numel * w_elem, "sigmoid": numel * 4}  # sigmoid: fp32
    saved = [[name, format_bytes(sizes[name]), "saved"] for name in p.saved]
    saved += [[name, format_bytes(sizes[name]), "recomputed in backward from x"]
              for name in p.recomputed]
    saved.append(["total held between fwd and bwd", format_bytes(sum(sizes[n] for n in p.saved)), ""])

    col_blocks, row_blocks = blocks("bwd")
    n_blocks = col_blocks * row_blocks
    parts = n_blocks if p.weight == "scalar" else row_blocks * cols  # split partials
    reductions = []
    for g in p.grads:
        if g.grad == "dx":
            reductions.append([g.grad, g.reduction, "written once (torch.empty)",
                               format_bytes(numel * elem), "-", g.note])
        elif g.reduction == "atomic":
            # One add per block (scalar) or per block and channel: each address gets one per block
            # (per row block) that covers it.
            per_address = n_blocks if p.weight == "scalar" else row_blocks
            reductions.append([g.grad, g.reduction, "fp32 atomic target (torch.zeros)",
                               format_bytes(4 * w_numel),
                               f"{per_address * w_numel} ({per_address} per address)", g.note])
        else:
            reductions.append([g.grad, g.reduction, "fp32 partials, summed after (torch.empty)",
                               format_bytes(4 * parts), "0", g.note])
    fwd_bytes, bwd_bytes = bytes_moved(p.weight, numel, channels, elem, w_elem)
    sigmoid = sizes["sigmoid"] if "sigmoid" in p.saved else 0
    partials = 0 if p.dw_reduction == "atomic" else 4 * parts
    moved = [
        ["forward", format_bytes(fwd_bytes), format_bytes(fwd_bytes + sigmoid), "x, w read; y written"
         + ("; the kernel also writes sigmoid(x)" if sigmoid else "")],
        ["backward", format_bytes(bwd_bytes), format_bytes(bwd_bytes + sigmoid + 2 * partials),
         "dy, x, w read; dx, dw written" + ("; the kernel also reads sigmoid(x)" if sigmoid else "")
         + ("; dw partials written, then read by the sum" if partials else "")],
    ]
    title = (f"shape: rows={n_rows} channels={channels} dtype={dtype} ({numel} elements; "
             f"{p.weight} weight; kernels see [{rows}, {cols}])")
    return [
        (title, []),
        ("kernels", [["factory", "phase", "grid", "tiling", "computes"], *kernels]),
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
    if dtype not in p.dtypes:
        problems.append(f"dtype must be one of {', '.join(p.dtypes)} (got {dtype!r})")
    if problems:
        raise OpgenError("--shape: " + "; ".join(problems))
