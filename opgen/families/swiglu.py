"""SwiGLU y = silu(a) * b = a * sigmoid(a) * b, the gate of Llama-style MLPs, forward and backward.

Two input forms (spec swiglu.input): "pair" takes a and b, two tensors of one shape [..., C];
"fused" takes one x of shape [..., 2C] and splits its last dim in halves, a = x[..., :C] (the
first half, the gate) and b = x[..., C:] (the second). The op is elementwise: the kernels take a,
b and y as [rows, C] matrices with rows = numel // C. a and b may have strided rows (the last dim
contiguous): the kernels take each matrix's row stride, so the halves of a fused x, or of any
wider tensor, are read in place. da = dy * b * s * (1 + a * (1 - s)) and db = dy * silu(a),
s = sigmoid(a), each element written once; no reductions.

Spec section, validation beyond field types, and plan(): the kernels and their grids, the gradient
buffers, what the forward saves, the test matrix, the compile jobs and the bytes the benchmark
divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from opgen.families.contract import Family, scaffold
from opgen.plan import (DTYPE_BYTES, LOAD_ALIGNMENT, TESTED_SAVES, BytesBenchCase, CompileJob,
                        GradPlan, PlanBase, ShapeCase, SourceInfo, Sweep, Table, base_fields,
                        ceildiv, distinct_jobs, explain_tables, format_bytes, kernel_plan,
                        not_positive, refuse_shape, rows_sweep)
from opgen.spec import (BenchSection, Block, DirectGrad, MatrixShape, RowBlock, SavedSigmoid,
                        StrictModel, TensorShape, TestSection, Threads, family_spec, shapes_of,
                        untested_tail)

# Each thread keeps its elements' fp32 values in registers: at most this many per thread.
MAX_ELEMENTS_PER_THREAD = 64


class ElementwiseTiling(StrictModel):
    """A block of a phase is a [block_rows, block_cols] tile of the [rows, C] matrices."""

    block_rows: RowBlock
    block_cols: Block
    threads: Threads


# Hopper defaults for a memory-bound op, in both phases: 256 threads, 8 x 512 tiles (16 elements
# per thread, vector loads along rows of 1 KiB of 16-bit data).
DEFAULT_TILING = dict.fromkeys(("fwd", "bwd"),
                               ElementwiseTiling(block_rows=8, block_cols=512, threads=256))

# Shapes of a (and of b; a fused x has the last dim doubled). Keep a last dim and a row count
# (numel // last dim) that are not multiples of the blocks: tails are where guard bugs hide.
DEFAULT_TEST_SHAPES = ((3, 333, 77), (4097,), (64, 1024), (9, 1100))
# a and b of [rows, channels]: Llama-7B's (C = 11008) and Llama-3-8B's (C = 14336) MLP widths.
DEFAULT_BENCH_SHAPES = ((8192, 11008), (4096, 14336))

# `opgen new <scaffold>`: the data each commented scaffold is rendered from.
SCAFFOLDS = {
    "swiglu": scaffold(
        "SwiGLU y = silu(a) * b (the gate of Llama-style MLPs), fwd and bwd", DEFAULT_TILING,
        input="pair", sigmoid="recompute", shapes=list(DEFAULT_TEST_SHAPES),
        bench_dtype="bfloat16", bench=list(DEFAULT_BENCH_SHAPES),
    ),
}


class SwigluSection(StrictModel):
    # "pair": <name>(a, b), a and b of one shape [..., C]. "fused": <name>(x), x of [..., 2C]
    # split in halves: a = x[..., :C] (first half), b = x[..., C:]; its gradient dx holds da
    # and db in the same halves.
    input: Literal["pair", "fused"] = "pair"


class SwigluGrads(StrictModel):
    # Elementwise: each element is written once, by the block that owns it (in the fused form
    # into the two halves of dx).
    da: DirectGrad = DirectGrad()
    db: DirectGrad = DirectGrad()


def tiles_fit_threads(spec):
    for phase in ("fwd", "bwd"):
        t = getattr(spec.tiling, phase)
        elements = t.block_rows * t.block_cols
        if elements % t.threads:
            yield f"tiling.{phase}", (
                f"block_rows x block_cols ({elements}) must be a multiple of threads "
                f"({t.threads}): every thread takes the same number of elements"
            )
        elif elements > MAX_ELEMENTS_PER_THREAD * t.threads:
            yield f"tiling.{phase}", (
                f"block_rows x block_cols ({elements}) must be at most "
                f"{MAX_ELEMENTS_PER_THREAD} x threads ({MAX_ELEMENTS_PER_THREAD * t.threads}): "
                "each thread holds its elements in registers"
            )


def tested_shapes_have_tails(spec):
    shapes = spec.test.shapes
    tilings = (spec.tiling.fwd, spec.tiling.bwd)
    yield from untested_tail(shapes, lambda s: s[-1], min(t.block_cols for t in tilings),
                             "last dim (C) is", "the smallest block_cols", "[3, 333, 77]",
                             "tail columns are")
    yield from untested_tail(shapes, lambda s: matrix(s)[0],
                             min((t.block_rows for t in tilings if t.block_rows > 1), default=1),
                             "rows (elements / last dim) are", "the smallest block_rows above 1",
                             "[3, 333, 77]", "tail rows are")


# The swiglu rules, in the order their problems are reported (after the shared ones).
RULES = (tiles_fit_threads, tested_shapes_have_tails)


Spec = family_spec(
    "swiglu", RULES, swiglu=SwigluSection, grads=SwigluGrads, saved=SavedSigmoid,
    tiling=DEFAULT_TILING, test=TestSection.of(TensorShape, DEFAULT_TEST_SHAPES),
    bench=BenchSection.of(MatrixShape, shapes_of(MatrixShape, DEFAULT_BENCH_SHAPES), "bfloat16"),
)


def matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, C): the [rows, C] view of an a of `shape` that the kernels take."""
    return math.prod(shape[:-1]), shape[-1]


def bytes_moved(numel: int, elem: int) -> tuple[int, int]:
    """(fwd, bwd) bytes of the op itself, whatever computes it: every input read once and every
    output written once. fwd: a, b -> y. bwd: dy, a, b -> da, db."""
    return 3 * numel * elem, 5 * numel * elem


@dataclass(frozen=True, kw_only=True)
class Plan(PlanBase):
    fused: bool  # the spec's swiglu.input == "fused": the public function takes one x [..., 2C]
    inputs: tuple[str, ...]  # the public function's tensor arguments: (a, b) or (x,)
    save_sigmoid: bool  # the spec's saved.sigmoid: the public function's
    tail_case: ShapeCase  # tail blocks in rows and columns: strided inputs, broken grads
    bench_cases: tuple[BytesBenchCase, ...]


def plan(spec: Spec, source: SourceInfo) -> Plan:
    fused = spec.swiglu.input == "fused"
    save_sigmoid = spec.saved.sigmoid == "save"

    def kernel(key, summary):
        return kernel_plan(spec.name, key, key, key, summary,
                           "(ceildiv(cols, block_cols), ceildiv(rows, block_rows))",
                           getattr(spec.tiling, key))

    kernels = {
        "fwd": kernel("fwd", "y = a * sigmoid(a) * b in fp32 (and fp32 sigmoid(a) when saved)"),
        "bwd": kernel("bwd", "da = dy * b * s * (1 + a * (1 - s)), db = dy * a * s, "
                             "s = sigmoid(a), in fp32"),
    }
    if fused:
        grads = (GradPlan("dx", "x", "direct",
                          "elementwise: da into dx[..., :C], db into dx[..., C:], each once"),)
        grad_check_order = (("dx", "x"),)
    else:
        grads = (GradPlan("da", "a", "direct", "elementwise: written once per element"),
                 GradPlan("db", "b", "direct", "elementwise: written once per element"))
        # The gate's gradient (through the sigmoid) before the linear one.
        grad_check_order = (("da", "a"), ("db", "b"))
    inputs = ("x",) if fused else ("a", "b")
    test_cases = tuple(ShapeCase(tuple(s)) for s in spec.test.shapes)
    tail_case = next(c for c in test_cases if _has_tail(spec, c.shape))  # validation found one
    elem = DTYPE_BYTES[spec.bench.dtype]

    def bench_case(rows: int, channels: int) -> BytesBenchCase:
        return BytesBenchCase(rows, channels, *bytes_moved(rows * channels, elem))

    # The sweep's rows: y [rows, C] at the first bench shape's C, the fused form's x twice as wide.
    channels = spec.bench.shapes[0].channels
    sweep_rows = rows_sweep(2 * channels if fused else channels)
    return Plan(
        **base_fields(spec, source),
        fused=fused,
        inputs=inputs,
        save_sigmoid=save_sigmoid,
        kernels=kernels,
        grads=grads,
        grad_check_order=grad_check_order,
        saved=(*inputs, "sigmoid") if save_sigmoid else inputs,
        recomputed=() if save_sigmoid else ("sigmoid",),
        test_cases=test_cases,
        tail_case=tail_case,
        bench_cases=tuple(bench_case(s.rows, s.channels) for s in spec.bench.shapes),
        bench_fields=("rows", "channels"),
        bench_unit="GB/s",
        sweep=Sweep("rows", "rows", sweep_rows, tuple(bench_case(r, channels) for r in sweep_rows)),
        compile_jobs=_compile_jobs(spec, kernels, tail_case, fused),
    )


def _has_tail(spec, shape: tuple[int, ...]) -> bool:
    rows, cols = matrix(shape)
    return any(rows % t.block_rows or cols % t.block_cols
               for t in (spec.tiling.fwd, spec.tiling.bwd))


def _compile_jobs(spec, kernels, tail_case, fused) -> tuple[CompileJob, ...]:
    """Every kernel variant the package launches at the tail shape, per dtype and saved.sigmoid:
    contiguous a and b (pair form), and the halves of a [rows, 2C] tensor (the fused form's x; in
    the pair form, a and b as views of one such tensor). Then the benchmark's shapes with the
    spec's choices, and their forward without sigmoid(a). The row count is symbolic: a variant is
    its C and the row strides of a, b, da and db, the same at every row count (one row included:
    autograd.py's as_matrix gives it the dense stride C, and the fused form's halves keep x's)."""
    fwd, bwd = kernels["fwd"], kernels["bwd"]

    def jobs_for(cols, dtype, saves, layouts, tag, backward=True):
        for save in saves:
            sig = "save" if save else "recompute"
            for (a_stride, b_stride, da_stride, db_stride), what in layouts:
                size = f"{dtype} C={cols} sigmoid={sig} {what}{tag}"
                yield CompileJob(fwd.factory, (cols, a_stride, b_stride, dtype, save),
                                 fwd.tiling, f"fwd {size}")
                if backward:
                    yield CompileJob(bwd.factory, (cols, a_stride, b_stride, da_stride,
                                                   db_stride, dtype, save), bwd.tiling,
                                     f"bwd {size}")

    def halves(cols, dtype):
        """Row strides of a = x[:, :C] and b = x[:, C:] of an x [rows, 2C], and of da and db: a in
        place (row stride 2C); b, which starts C elements into a row, in place where that start
        is aligned, else copied (row stride C). The gradients: fresh contiguous buffers in the
        pair form (C); in the fused form the halves of dx, as a and b of x."""
        half = 2 * cols if cols * DTYPE_BYTES[dtype] % LOAD_ALIGNMENT == 0 else cols
        return (2 * cols, half, *((2 * cols, half) if fused else (cols, cols)))

    cols = matrix(tail_case.shape)[1]
    jobs = []
    for dtype in spec.dtypes:
        layouts = [(halves(cols, dtype), "halves of [rows, 2C]")]
        if not fused:
            layouts.insert(0, ((cols,) * 4, "contiguous"))
        jobs += jobs_for(cols, dtype, TESTED_SAVES, layouts, "")
    for shape in spec.bench.shapes:
        c, dtype = shape.channels, spec.bench.dtype
        bench_layout = (halves(c, dtype), "fused") if fused else ((c,) * 4, "contiguous")
        jobs += jobs_for(c, dtype, (spec.saved.sigmoid == "save",), (bench_layout,), " (bench)")
        # A call that no backward follows saves nothing: the forward without sigmoid(a).
        jobs += jobs_for(c, dtype, (False,), (bench_layout,), " (bench, no grad)", backward=False)
    return distinct_jobs(jobs)


def explain(p: Plan, shape: dict[str, Any]) -> list[Table]:
    """The plan for one runtime shape (a and b of [rows, channels]), as titled tables: kernels
    and grids, saved tensors and their bytes, the gradient buffers, bytes moved."""
    rows, channels = shape["rows"], shape["channels"]
    dtype = shape.get("dtype", p.dtypes[0])
    refuse_shape(p, dtype, not_positive({"rows": rows, "channels": channels}))
    elem = DTYPE_BYTES[dtype]
    numel = rows * channels
    grids = {key: (ceildiv(channels, k.tiling["block_cols"]), ceildiv(rows, k.tiling["block_rows"]))
             for key, k in p.kernels.items()}
    sizes = {"a": numel * elem, "b": numel * elem, "x": 2 * numel * elem, "sigmoid": numel * 4}
    grad_rows = [[g.grad, g.reduction, "written once (torch.empty)",
                  format_bytes(numel * elem * (2 if p.fused else 1)), g.note] for g in p.grads]
    fwd_bytes, bwd_bytes = bytes_moved(numel, elem)
    aux = sizes["sigmoid"] if p.save_sigmoid else 0
    form = ("x of rows x 2*channels split in halves, a the first" if p.fused
            else "a and b of rows x channels")
    return explain_tables(
        p, f"rows={rows} channels={channels} dtype={dtype} ({form})", grids, sizes,
        "recomputed in backward from a",
        ("gradients", [["grad", "reduction", "buffer", "bytes", "why"], *grad_rows]),
        ("bytes moved (the benchmark divides the first column by the time)", [
            ["pass", "op bytes", "kernel bytes", "what"],
            ["forward", format_bytes(fwd_bytes), format_bytes(fwd_bytes + aux),
             "a, b read; y written" + ("; the kernel also writes sigmoid(a)" if aux else "")],
            ["backward", format_bytes(bwd_bytes), format_bytes(bwd_bytes + aux),
             "dy, a, b read; da, db written" + ("; the kernel also reads sigmoid(a)" if aux else "")],
        ]),
    )


FAMILY = Family(
    Spec, plan, explain, SCAFFOLDS,
    description="SwiGLU silu(a) * b, a and b two tensors or the halves of one: fwd, bwd (da, db)",
    shape_keys=("rows", "channels", "dtype"),
)
