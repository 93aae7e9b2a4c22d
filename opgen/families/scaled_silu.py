"""Scaled SiLU y = w * silu(x) = w * x * sigmoid(x), forward and backward.

w is a learnable scalar or one weight per channel (the last dim of x). The op is elementwise, so
the kernels take x as a [rows, cols] matrix: a scalar weight sees every element alike and views x
as one row of x.numel() elements; a channel weight views it as [x.numel() // C, C] with C its last
dim. The kernels take the element count (scalar) or the row count (channel) as a symbol: a kernel
variant is its C (channel weight), never the rest of the shape. dx is elementwise (written once);
dw is a reduction over every element (scalar) or over the rows (channel): an in-block fp32
reduction, then one fp32 atomic per block (per channel) or one partial per block summed on the
host (deterministic).

Spec section, validation beyond field types, and plan(): the kernels and their grids, the gradient
buffers and how each is reduced, what the forward saves, the test matrix, the compile jobs and the
bytes the benchmark divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from opgen.families.contract import Family, scaffold
from opgen.plan import (DTYPE_BYTES, NO_GRAD_CHOICE, TESTED_SAVES, CompileJob, SavedAuxPlan,
                        SourceInfo, Table, bytes_moved_table, ceildiv, distinct_jobs,
                        explain_tables, kernel_plan, not_positive, refuse_shape, saved_aux_fields,
                        saved_aux_jobs, weight_dtype, weight_grads_table, weighted_bytes_moved)
from opgen.spec import (BenchSection, Block, MatrixShape, SavedSigmoid, StrictModel, TensorShape,
                        TestSection, Threads, WeightGrads, family_spec, shapes_of, too_few_elements,
                        too_many_elements, untested_tail)

# The largest bwd block per thread: each thread keeps the fp32 dw terms of its elements in
# registers until the in-block reduction.
MAX_BWD_ELEMENTS_PER_THREAD = 64


class ElementwiseTiling(StrictModel):
    """Tiles of an elementwise phase: `block` elements per thread block, `threads` threads.

    With a scalar weight a block is `block` consecutive elements. With a channel weight it is a
    [block // block_channels, block_channels] tile of the [rows, C] view: a block reduces dw over
    its rows for block_channels channels, so a larger tile issues fewer dw atomics (partials).
    """

    block: Block
    threads: Threads
    block_channels: Block  # used only with scaled_silu.weight = "channel"


# Hopper defaults for a memory-bound op: 256 threads, 4096 elements per block (16 per thread,
# 16-byte vector loads of 16-bit data) in both phases; the bwd at 8192 (32 per thread, half the dw
# atomics) held 93 registers a thread, 2 blocks an SM, and ran 0.84x as fast on the H200. Channel
# tiles 256 channels wide (512-byte fp16 rows, coalesced).
DEFAULT_TILING = {
    "fwd": ElementwiseTiling(block=4096, threads=256, block_channels=256),
    "bwd": ElementwiseTiling(block=4096, threads=256, block_channels=256),
}

# Any shapes; with channel weights the last dim is C. Keep sizes that are not a multiple of any
# block: tail blocks are where guard bugs hide.
DEFAULT_TEST_SHAPES = ((3, 1000, 77), (4097,), (64, 1024))
# x [rows, channels] (channels = C for channel weights). One 64M-element tensor: large enough to
# measure HBM bandwidth, not the launch.
DEFAULT_BENCH_SHAPES = ((8192, 8192),)

# `opgen new <scaffold>`: the data each commented scaffold is rendered from.
SCAFFOLDS = {
    "scaled_silu": scaffold(
        "scaled SiLU y = w * silu(x) with a learnable scalar w, fwd and bwd",
        DEFAULT_TILING, weight="scalar", weight_dtype="float32", dw="atomic", sigmoid="recompute",
        shapes=list(DEFAULT_TEST_SHAPES), bench_dtype="float16", bench=list(DEFAULT_BENCH_SHAPES),
    ),
}


class ScaledSiluSection(StrictModel):
    # "scalar": one learnable number (shape () or (1,)); "channel": one per channel, shape [C]
    # with C = x.shape[-1], broadcast over the other dims.
    weight: Literal["scalar", "channel"] = "scalar"
    # dtype of w and dw: float32 (a master weight: dw sums millions of terms), or x's dtype.
    weight_dtype: Literal["float32", "input"] = "float32"


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
        if problem := too_few_elements(tiling.block, tiling.threads):
            yield f"tiling.{phase}.block", problem


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
    if problem := too_many_elements(bwd.block, bwd.threads, MAX_BWD_ELEMENTS_PER_THREAD,
                                    "the fp32 dw terms of its elements"):
        yield "tiling.bwd.block", problem


def tested_shapes_have_tails(spec: Spec):
    weight = spec.scaled_silu.weight
    shapes = spec.test.shapes
    if weight == "scalar":
        smallest = min(spec.tiling.fwd.block, spec.tiling.bwd.block)
        yield from untested_tail(shapes, math.prod, smallest, "element count is",
                                 "the smallest block", "[4097]", "tail blocks are")
        return
    tiles = [tile(weight, getattr(spec.tiling, p)) for p in ("fwd", "bwd")]
    yield from untested_tail(shapes, lambda s: s[-1], min(c for _, c in tiles), "last dim (C) is",
                             "the smallest block_channels", "[3, 1000, 77]", "tail channels are")
    yield from untested_tail(shapes, lambda s: matrix(weight, s)[0], min(r for r, _ in tiles),
                             "rows (elements / last dim) are", "the smallest tile's rows",
                             "[3, 1000, 77]", "tail rows are")


# The scaled_silu rules, in the order their problems are reported (after the shared ones).
RULES = (blocks_cover_threads, channel_tiles_fit_blocks, bwd_block_fits_registers,
         tested_shapes_have_tails)


Spec = family_spec(
    "scaled_silu", RULES, scaled_silu=ScaledSiluSection, grads=WeightGrads, saved=SavedSigmoid,
    tiling=DEFAULT_TILING, test=TestSection.of(TensorShape, DEFAULT_TEST_SHAPES),
    bench=BenchSection.of(MatrixShape, shapes_of(MatrixShape, DEFAULT_BENCH_SHAPES), "float16"),
)


@dataclass(frozen=True, kw_only=True)
class Plan(SavedAuxPlan):
    weight: str  # scalar | channel
    weight_doc: str  # what w is, for docstrings
    weight_shape_expr: str  # the shape w must have, as code over x: () / (1,) or (x.shape[-1],)
    weight_shape_doc: str  # the same, for error messages
    test_weight_shape_expr: str  # the shape of w the tests make for an x of `shape`, as code
    cols_expr: str  # the cols of the [rows, cols] view of x, as code over x
    channels_expr: str  # the kernels' channels argument, as code over rows, cols: cols or None
    symbolic_expr: str  # the view's symbolic dim, as code over rows, cols: cols or rows
    symbolic_doc: str  # what that symbol is, in words (plural)
    int32_extent: int  # the longest symbolic dim an int32 symbol takes (see int32_extent())
    reference_weight_expr: str  # w in float32, broadcastable against x, as code
    save_sigmoid: bool  # the spec's: the public function's


def int32_extent(weight: str, kernels) -> int:
    """The longest symbolic dim (cols with a scalar weight, rows with a channel weight) the
    kernels take as an int32 symbol: ceildiv and the tile bounds add up to a block to it. A longer
    one takes the kernels' int64 variant."""
    along = "block_cols" if weight == "scalar" else "block_rows"
    return 2**31 - 1 - max(k.tiling[along] for k in kernels.values())


def weight_numel(weight: str, channels: int) -> int:
    return 1 if weight == "scalar" else channels


def bytes_moved(weight: str, numel: int, channels: int, elem: int, w_elem: int) -> tuple[int, int]:
    """(fwd, bwd) bytes of the op itself (see weighted_bytes_moved)."""
    return weighted_bytes_moved(numel, weight_numel(weight, channels), elem, w_elem)


def plan(spec: Spec, source: SourceInfo) -> Plan:
    section = spec.scaled_silu
    weight = section.weight
    reduction = spec.grads.dw.reduction
    save_sigmoid = spec.saved.sigmoid == "save"

    # One grid dim: a second one stops at 65535 blocks, the row blocks of a channel weight do not.
    grid = ("(ceildiv(cols, block_cols),)" if weight == "scalar"
            else "(ceildiv(rows, block_rows) * ceildiv(cols, block_cols),)")

    def kernel(key, summary, tiling):
        block_rows, block_cols = tile(weight, tiling)
        return kernel_plan(
            spec.name, key, key, key, summary, grid,
            {"block_rows": block_rows, "block_cols": block_cols, "threads": tiling.threads},
        )

    dw_summary = {
        "scalar": "dw: the block's fp32 sum of dy * silu(x), one atomic add or partial per block",
        "channel": "dw: the block's fp32 sums over its rows, one atomic add or partial per channel",
    }[weight]
    kernels = {
        "fwd": kernel("fwd", "y = w * x * sigmoid(x) in fp32 (and fp32 sigmoid(x) when saved)",
                      spec.tiling.fwd),
        "bwd": kernel("bwd",
                      f"dx = dy * w * s * (1 + x * (1 - s)), s = sigmoid(x); {dw_summary}",
                      spec.tiling.bwd),
    }
    per_block = "per block and channel" if weight == "channel" else "per block"
    dw_notes = {
        "atomic": f"in-block fp32 reduction, one fp32 atomic add {per_block} into fp32 sums that "
                  "the last block casts into dw and zeroes again (one launch)",
        "split": f"one fp32 partial {per_block} written once, summed on the host in a fixed order "
                 "(deterministic), then cast",
    }
    fields = saved_aux_fields(spec, source, section, "sigmoid", save_sigmoid,
                              "elementwise: written once per element", dw_notes[reduction],
                              lambda channels: weight_numel(weight, channels))
    # A shape with tail blocks: validation found one.
    tail_case = next(c for c in fields["test_cases"] if _has_tail(spec, c.shape))
    scalar = weight == "scalar"
    return Plan(
        **fields,
        weight=weight,
        weight_doc=("a learnable scalar: shape () or (1,)" if scalar
                    else "one learnable weight per channel: shape (C,), C = x.shape[-1]"),
        weight_shape_expr="((), (1,))" if scalar else "((x.shape[-1],),)",
        weight_shape_doc="() or (1,)" if scalar else "(C,) with C = x.shape[-1]",
        test_weight_shape_expr="()" if scalar else "(shape[-1],)",
        cols_expr="x.numel()" if scalar else "x.shape[-1]",
        channels_expr="None" if scalar else "cols",
        symbolic_expr="cols" if scalar else "rows",
        symbolic_doc="element counts" if scalar else "row counts",
        int32_extent=int32_extent(weight, kernels),
        reference_weight_expr="w.float().reshape(())" if scalar else "w.float()",
        kernels=kernels,
        save_sigmoid=save_sigmoid,
        tail_case=tail_case,
        compile_jobs=_compile_jobs(spec, kernels, tail_case, fields["test_reductions"]),
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
    """Every kernel variant the package launches: per dtype, fwd with and without the saved
    sigmoid, bwd for each of those and each dw reduction the tests run; then the benchmark's with
    the spec's choices, and its forward without the saved sigmoid (a call no backward follows
    saves nothing); then the spec's choices with int64 dims (a view too long for int32). The
    element count (scalar weight) or row count (channel weight) is symbolic: a variant is its C
    with a channel weight (the tail shape's, the benchmark's), nothing of the shape with a scalar
    one (the benchmark's jobs are then the tests')."""
    weight = spec.scaled_silu.weight
    save_default = spec.saved.sigmoid == "save"

    def jobs_for(channels, dims, dtype, saves, reductions, tag):
        args = (weight, channels, dims, dtype, weight_dtype(spec.scaled_silu.weight_dtype, dtype))
        size = dtype if channels is None else f"{dtype} C={channels}"
        return saved_aux_jobs(kernels, args, saves, reductions, "sigmoid", size, tag)

    def channels(shape):
        return None if weight == "scalar" else shape[-1]

    jobs = []
    for dtype in spec.dtypes:
        jobs += jobs_for(channels(tail_case.shape), "int32", dtype, TESTED_SAVES, test_reductions,
                         "")
    spec_choice = ((save_default,), (spec.grads.dw.reduction,))
    for shape in spec.bench.shapes:
        jobs += jobs_for(channels((shape.rows, shape.channels)), "int32", spec.bench.dtype,
                         *spec_choice, " (bench)")
        jobs += jobs_for(channels((shape.rows, shape.channels)), "int32", spec.bench.dtype,
                         *NO_GRAD_CHOICE, " (bench, no grad)")
    jobs += jobs_for(channels(tail_case.shape), "int64", spec.dtypes[0], *spec_choice,
                     " (int64 dims)")
    return distinct_jobs(jobs)


def explain(p: Plan, shape: dict[str, Any]) -> list[Table]:
    """The plan for one runtime shape (x of [rows, channels]), as titled tables: kernels and grids,
    saved tensors and their bytes, the gradient buffers and their atomics, bytes moved."""
    n_rows, channels = shape["rows"], shape["channels"]
    dtype = shape.get("dtype", p.dtypes[0])
    refuse_shape(p, dtype, not_positive({"rows": n_rows, "channels": channels}))
    elem = DTYPE_BYTES[dtype]
    w_elem = DTYPE_BYTES[weight_dtype(p.weight_dtype, dtype)]
    numel = n_rows * channels
    rows, cols = matrix(p.weight, (n_rows, channels))
    tiles = {key: (ceildiv(cols, k.tiling["block_cols"]), ceildiv(rows, k.tiling["block_rows"]))
             for key, k in p.kernels.items()}
    grids = {key: (col_blocks * row_blocks,) for key, (col_blocks, row_blocks) in tiles.items()}
    w_numel = weight_numel(p.weight, channels)
    sizes = {"x": numel * elem, "w": w_numel * w_elem, "sigmoid": numel * 4}  # sigmoid: fp32
    col_blocks, row_blocks = tiles["bwd"]
    n_blocks = col_blocks * row_blocks
    # dw: one atomic add or partial per block (scalar), or per row block and channel.
    per_address = n_blocks if p.weight == "scalar" else row_blocks
    parts = n_blocks if p.weight == "scalar" else row_blocks * cols
    fwd_bytes, bwd_bytes = bytes_moved(p.weight, numel, channels, elem, w_elem)
    partials = 0 if p.dw_reduction == "atomic" else 4 * parts
    symbolic = cols if p.weight == "scalar" else rows
    dims = "int32" if symbolic <= p.int32_extent else "int64"
    return explain_tables(
        p, (f"rows={n_rows} channels={channels} dtype={dtype} ({numel} elements; {p.weight} "
            f"weight; kernels see [{rows}, {cols}], {p.symbolic_expr} symbolic, {dims})"),
        grids, sizes, "recomputed in backward from x",
        weight_grads_table(p, numel * elem, w_numel, per_address, parts),
        bytes_moved_table(fwd_bytes, bwd_bytes, "sigmoid(x)",
                          sizes["sigmoid"] if p.save_sigmoid else 0, partials),
    )


FAMILY = Family(
    Spec, plan, explain, SCAFFOLDS,
    description=("scaled SiLU w * silu(x), w a scalar or per channel: fwd, bwd (dx direct; dw "
                 "atomic or split)"),
    shape_keys=("rows", "channels", "dtype"),
)
