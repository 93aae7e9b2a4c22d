"""Matrix multiply C = A @ B (+ bias), forward and backward.

A is [M, K] (leading batch dims of A are flattened into M), B is [K, N], bias is [N]; inputs are
fp16 or bf16 and every GEMM accumulates in fp32. The backward is two more GEMMs, each reading one
operand transposed straight from its row-major tensor (no host transposes): dA = dC @ B^T
(transpose_B) and dB = A^T @ dC (transpose_A). Each output tile is computed by one block that
runs the whole reduction, so dA, dB and C are written once. dbias = the column sums of dC: one
fp32 partial per block of rows, summed on the host in a fixed order (deterministic).

Spec section, validation beyond field types, and plan(): the kernels and their grids, the gradient
buffers, the shared-memory estimate per GEMM phase, the test matrix, the compile jobs and the FLOP
counts the benchmark divides by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import StrictBool

from opgen.families.contract import Family, scaffold
from opgen.plan import (DTYPE_BYTES, CompileJob, FlopsBenchCase, GradPlan, PlanBase, SourceInfo,
                        Sweep, Table, base_fields, ceildiv, distinct_jobs, explain_tables, flops_table,
                        format_bytes, kernel_plan, not_positive, over_smem_limit, refuse_shape,
                        whole_kib)
from opgen.spec import (BenchSection, Block, DirectGrad, PositiveInt, Stages, StrictModel,
                        TestSection, Threads, Tolerance, family_spec, not_whole_warpgroups,
                        shapes_of, too_few_elements, too_many_elements, untested_tail)

# The three GEMM phases: the key of each in [tiling] and the plan, and the axes of the problem
# that its output rows, output columns and reduction run along.
GEMM_PHASES = ("fwd", "da", "db")
GEMM_AXES = {"fwd": ("m", "n", "k"), "da": ("m", "k", "n"), "db": ("k", "n", "m")}

# WGMMA: a warpgroup (4 warps) computes 64-row slices; each warp owns a multiple of 16 rows and 8
# columns of the tile (TileLang's warp partition for T.gemm on Hopper).
WGMMA_MIN_M = 64
WARP_ROWS, WARP_COLS = 16, 8

# The dbias kernel keeps block_m x block_n fp32 terms in registers until the column reduction.
MAX_DBIAS_ELEMENTS_PER_THREAD = 64


class GemmTiling(StrictModel):
    """Tiles of a GEMM phase: a block computes a block_m x block_n tile of the phase's output,
    stepping block_k along its reduction through a num_stages-deep pipeline of shared tiles."""

    block_m: Block
    block_n: Block
    block_k: Block
    threads: Threads
    num_stages: Stages


class ReduceTiling(StrictModel):
    """Tiles of the dbias reduction: a block sums block_m rows of block_n columns of dC."""

    block_m: Block
    block_n: Block
    threads: Threads


# Hopper defaults: 128x256 output tiles, K steps of 64, two consumer warpgroups (each a 64x256
# WGMMA slice, 128 fp32 accumulators a thread), three stages of TMA loads in flight: 3 x 48 KiB of
# operand tiles and the epilogue's 64 KiB staging tile. The fastest of a sweep on an H200 (bf16,
# 4096^3 and 8192^3): 0.93-0.99x cuBLAS in all three GEMMs, where 128x128 tiles ran 0.73-0.80x.
# dbias: 32 x 256 tiles, one column per thread (coalesced rows), 32 fp32 terms each.
DEFAULT_TILING = {
    "fwd": GemmTiling(block_m=128, block_n=256, block_k=64, threads=256, num_stages=3),
    "da": GemmTiling(block_m=128, block_n=256, block_k=64, threads=256, num_stages=3),
    "db": GemmTiling(block_m=128, block_n=256, block_k=64, threads=256, num_stages=3),
    "dbias": ReduceTiling(block_m=32, block_n=256, threads=256),
}

# An fp32-accumulated GEMM rounded once to fp16/bf16 differs from the fp32 reference by about one
# unit in the last place of each element (rtol), plus accumulation-order noise that grows with the
# reduction length and the size of the terms, not with the element: so atol is a fraction of the
# largest |reference| of the tensor compared (outputs grow like sqrt(K)). A doubled, zeroed,
# sign-flipped or swapped gradient is off by about the size of the tensor itself and fails.
DEFAULT_TOLERANCES = {
    "float16": Tolerance(rtol=1e-2, atol=1e-3),
    "bfloat16": Tolerance(rtol=2e-2, atol=5e-3),
}

# Keep sizes that are not a multiple of any block (tail tiles are where guard bugs hide), a skinny
# one or two, and a square one (m = n = k: only there do dA and dB have one shape, so the tests
# can check that swapping them fails).
DEFAULT_TEST_SHAPES = ((1000, 777, 336), (64, 4096, 64), (4097, 128, 1024), (333, 333, 333))
DEFAULT_BENCH_SHAPES = ((4096, 4096, 4096), (8192, 8192, 8192))

# `opgen new <scaffold>`: the data each commented scaffold is rendered from.
SCAFFOLDS = {
    "matmul": scaffold(
        "matrix multiply C = A @ B + bias, fp32 accumulation, fwd and bwd (dA, dB, dbias)",
        DEFAULT_TILING, DEFAULT_TOLERANCES, bias=True, shapes=DEFAULT_TEST_SHAPES,
        bench_dtype="bfloat16", bench=DEFAULT_BENCH_SHAPES,
    ),
}


class MatmulSection(StrictModel):
    # true: C = A @ B + bias with bias [N] (A's dtype), a third input with its own gradient.
    bias: StrictBool = False


class SplitGrad(StrictModel):
    # Column sums of dC: one fp32 partial per block of rows, written once, summed on the host in a
    # fixed order (deterministic).
    reduction: Literal["split"] = "split"


class MatmulGrads(StrictModel):
    # dA, dB: GEMMs; each output tile is computed by one block over the whole reduction.
    da: DirectGrad = DirectGrad()
    db: DirectGrad = DirectGrad()
    dbias: SplitGrad = SplitGrad()


class MatmulShape(StrictModel):
    """One problem: A [m, k] @ B [k, n]."""

    m: PositiveInt
    n: PositiveInt
    k: PositiveInt

    @property
    def id(self) -> str:
        return f"m{self.m}-n{self.n}-k{self.k}"


def wgmma_warps(tiling: GemmTiling) -> tuple[int, int] | None:
    """(warps along rows, warps along columns) that TileLang's FullRow policy gives a WGMMA tile,
    or None when no split of the warps into whole warpgroups fits it: the most row warps (a
    multiple of 4) such that each warp owns a multiple of 16 rows and 8 columns."""
    warps = tiling.threads // 32
    for rows in range(warps - warps % 4, 0, -4):
        cols = warps // rows
        if (rows * cols == warps and tiling.block_m % (rows * WARP_ROWS) == 0
                and tiling.block_n % (cols * WARP_COLS) == 0):
            return rows, cols
    return None


# Where n or k is not a multiple of TMA_ROW_ELEMENTS, some operand's rows are not 16-byte
# aligned and load without TMA; TileLang's producer is then a whole second group of threads, the
# consumers keep the launch's 128-register cap, and the output tile narrows (block_n halves)
# until a thread holds at most ACCUM_PER_THREAD_WITHOUT_TMA fp32 accumulators. The same rule is
# printed into the generated kernels.py, which applies it.
TMA_ROW_ELEMENTS = 8
ACCUM_PER_THREAD_WITHOUT_TMA = 64


def launched_block_n(tiling: dict[str, int], n: int, k: int) -> int:
    """The block_n a GEMM phase launches with at these n, k."""
    block_n = tiling["block_n"]
    tma = n % TMA_ROW_ELEMENTS == 0 and k % TMA_ROW_ELEMENTS == 0
    while (not tma and tiling["block_m"] * block_n // tiling["threads"] > ACCUM_PER_THREAD_WITHOUT_TMA
           and block_n > 64):
        block_n //= 2
    return block_n


def smem_bytes(tiling: GemmTiling) -> int:
    """Shared memory of a GEMM kernel (16-bit operands): num_stages A and B tiles for the pipeline
    (at least one), or the epilogue's C staging tile when that is larger; TileLang places the
    staging tile in the pipeline's space once the loop is done. Buffers count rounded up to
    1 KiB (TMA and swizzled layouts are aligned). The compile check reads the real number."""
    elem = DTYPE_BYTES["float16"]
    t = tiling
    stages = max(1, t.num_stages)
    loop = stages * (whole_kib(elem * t.block_m * t.block_k)
                     + whole_kib(elem * t.block_k * t.block_n))
    return max(loop, whole_kib(elem * t.block_m * t.block_n))


def axis_blocks(spec_tiling: Any) -> dict[str, int]:
    """The smallest block along each problem axis (m, n, k) over every phase that tiles it: a
    size that is not a multiple of it is a multiple of no block (blocks are powers of two)."""
    smallest = {"m": spec_tiling.dbias.block_m, "n": spec_tiling.dbias.block_n, "k": 1 << 30}
    for phase in GEMM_PHASES:
        t = getattr(spec_tiling, phase)
        for axis, block in zip(GEMM_AXES[phase], (t.block_m, t.block_n, t.block_k)):
            smallest[axis] = min(smallest[axis], block)
    return smallest


def gemm_tiles_fit_wgmma(spec: Spec):
    for phase in GEMM_PHASES:
        t = getattr(spec.tiling, phase)
        where = f"tiling.{phase}"
        if threads_problem := not_whole_warpgroups(t.threads):
            yield f"{where}.threads", threads_problem
        elif t.block_m < WGMMA_MIN_M:
            yield f"{where}.block_m", (
                f"must be at least {WGMMA_MIN_M}: WGMMA computes 64-row slices, and a smaller tile "
                f"silently falls back to mma.sync (got {t.block_m})"
            )
        elif wgmma_warps(t) is None:
            yield where, (
                f"a {t.block_m} x {t.block_n} tile cannot be split over {t.threads // 32} warps in "
                f"whole warpgroups (each warp a multiple of {WARP_ROWS} rows and {WARP_COLS} "
                "columns); raise block_m or block_n, or lower threads"
            )


def gemm_tiles_fit_shared_memory(spec: Spec):
    for phase in GEMM_PHASES:
        if problem := over_smem_limit(smem_bytes(getattr(spec.tiling, phase)), "",
                                      "block_m, block_n, block_k or num_stages"):
            yield f"tiling.{phase}", problem


def dbias_tile_fits_threads(spec: Spec):
    r = spec.tiling.dbias
    elements = r.block_m * r.block_n
    problems = (too_many_elements(elements, r.threads, MAX_DBIAS_ELEMENTS_PER_THREAD,
                                  "its fp32 terms"),
                too_few_elements(elements, r.threads))
    for problem in filter(None, problems):
        yield "tiling.dbias", f"block_m x block_n {problem}"


def tested_shapes_have_tails(spec: Spec):
    for axis, block in axis_blocks(spec.tiling).items():
        yield from untested_tail(spec.test.shapes, lambda s: getattr(s, axis), block, f"{axis} is",
                                 f"the smallest block along {axis}",
                                 "{ m = 1000, n = 777, k = 336 }", "tail tiles are")


def tested_shapes_include_a_square(spec: Spec):
    shapes = spec.test.shapes
    if shapes and not any(s.m == s.n == s.k for s in shapes):
        yield "test.shapes", (
            "add a square shape (m = n = k), e.g. { m = 333, n = 333, k = 333 }: only there "
            "do dA and dB have one shape, so the tests can check that swapping them fails"
        )


# The matmul rules, in the order their problems are reported (after the shared ones).
RULES = (gemm_tiles_fit_wgmma, gemm_tiles_fit_shared_memory, dbias_tile_fits_threads,
         tested_shapes_have_tails, tested_shapes_include_a_square)


Spec = family_spec(
    "matmul", RULES, matmul=MatmulSection, grads=MatmulGrads, tiling=DEFAULT_TILING,
    test=TestSection.of(MatmulShape, shapes_of(MatmulShape, DEFAULT_TEST_SHAPES),
                        DEFAULT_TOLERANCES),
    bench=BenchSection.of(MatmulShape, shapes_of(MatmulShape, DEFAULT_BENCH_SHAPES), "bfloat16"),
)


def tail_count(shape: MatmulShape, blocks: dict[str, int]) -> int:
    """How many of the shape's axes end in a partial tile."""
    return sum(bool(getattr(shape, axis) % block) for axis, block in blocks.items())


def flops(m: int, n: int, k: int) -> tuple[int, int]:
    """(fwd, bwd) FLOPs: one GEMM of 2MNK forward; two of the same size backward (dbias is
    M x N additions, left out, as cuBLAS counts do)."""
    return 2 * m * n * k, 4 * m * n * k


# The benchmark's --sweep: square problems, m = n = k at each of these. n and k are compile-time
# in the kernels, so each point is a variant of its own (in the compile jobs; built at its first
# call, outside the timing).
SIZE_SWEEP = (512, 1024, 2048, 4096, 8192)


def bench_case(m: int, n: int, k: int) -> FlopsBenchCase:
    return FlopsBenchCase((m, n, k), *flops(m, n, k))


@dataclass(frozen=True, kw_only=True)
class Plan(PlanBase):
    bias: bool  # the spec's: whether the public function takes (and differentiates) a bias
    bias_variants: tuple[bool, ...]  # what the generated tests run: with a bias also without
    tensor_inputs: tuple[str, ...]  # a, b (, bias)
    params: str  # the public function's parameters
    apply_args: str  # what the public function passes to check_inputs and apply_op
    tail_case: MatmulShape  # the shape with the most tail tiles: strided dC, batched A, ...
    square_case: MatmulShape  # m = n = k: the swapped-gradient check
    bench_cases: tuple[FlopsBenchCase, ...]
    smem: dict[str, int]  # GEMM phase -> shared-memory estimate in bytes
    tma_row_elements: int  # launched_block_n's rule, printed into kernels.py
    accum_per_thread_without_tma: int


def plan(spec: Spec, source: SourceInfo) -> Plan:
    t = spec.tiling
    bias = spec.matmul.bias

    def kernel(key, factory, phase, summary, grid, tiling):
        return kernel_plan(spec.name, key, factory, phase, summary, grid, tiling)

    kernels = {
        "fwd": kernel("fwd", "fwd", "fwd",
                      "C [M, N] = A [M, K] @ B [K, N] (+ bias [N]), fp32 accumulation, one cast",
                      "(ceildiv(n, block_n), ceildiv(m, block_m))", t.fwd),
        "da": kernel("da", "bwd_da", "bwd",
                     "dA [M, K] = dC [M, N] @ B^T: B's [K, N] tiles read transposed (transpose_B)",
                     "(ceildiv(k, block_n), ceildiv(m, block_m))", t.da),
        "db": kernel("db", "bwd_db", "bwd",
                     "dB [K, N] = A^T @ dC [M, N]: A's [M, K] tiles read transposed (transpose_A)",
                     "(ceildiv(n, block_n), ceildiv(k, block_m))", t.db),
    }
    grads = [
        GradPlan("da", "a", "direct",
                 "one block per output tile over the whole N reduction: written once"),
        GradPlan("db", "b", "direct",
                 "one block per output tile over the whole M reduction: written once"),
    ]
    grad_check_order = [("dA", "a"), ("dB", "b")]
    if bias:
        kernels["dbias"] = kernel("dbias", "bwd_dbias", "bwd_param",
                                  "dbias partials: fp32 column sums of dC, one per block_m rows",
                                  "(ceildiv(n, block_n), ceildiv(m, block_m))", t.dbias)
        grads.append(GradPlan("dbias", "bias", "split",
                              "one fp32 partial per block of rows, written once, summed on the "
                              "host in a fixed order (deterministic), then cast"))
        grad_check_order.append(("dbias", "bias"))
    tensor_inputs = ("a", "b", "bias") if bias else ("a", "b")

    blocks = axis_blocks(t)
    test_cases = spec.test.shapes
    tail_case = max(test_cases, key=lambda s: tail_count(s, blocks))  # the first of the most
    square_case = next(s for s in test_cases if s.m == s.n == s.k)  # validation found one
    bias_variants = (True, False) if bias else (False,)
    # One custom op per kernel, named like its factory: fwd, bwd_da, bwd_db (, bwd_dbias); each
    # backward product is its own op, so the backward launches only the ones autograd asks for.
    op_phases = [k.factory.removeprefix(f"{spec.name}_") for k in kernels.values()]
    return Plan(
        **base_fields(spec, source, *op_phases),
        bias=bias,
        bias_variants=bias_variants,
        tensor_inputs=tensor_inputs,
        params=", ".join(tensor_inputs),
        apply_args="a, b, bias" if bias else "a, b, None",
        tma_row_elements=TMA_ROW_ELEMENTS,
        accum_per_thread_without_tma=ACCUM_PER_THREAD_WITHOUT_TMA,
        kernels=kernels,
        grads=tuple(grads),
        grad_check_order=tuple(grad_check_order),
        saved=("a", "b"),
        test_cases=test_cases,
        tail_case=tail_case,
        square_case=square_case,
        bench_cases=tuple(bench_case(s.m, s.n, s.k) for s in spec.bench.shapes),
        bench_fields=("m", "n", "k"),
        bench_unit="TFLOP/s",
        sweep=Sweep("m", "M = N = K", SIZE_SWEEP,
                    tuple(bench_case(size, size, size) for size in SIZE_SWEEP)),
        compile_jobs=_compile_jobs(spec, kernels, tail_case, bias_variants),
        smem={phase: smem_bytes(getattr(t, phase)) for phase in GEMM_PHASES},
    )


def _compile_jobs(spec, kernels, tail_case, bias_variants) -> tuple[CompileJob, ...]:
    """Every kernel variant the package launches. m is symbolic in the kernels, so a variant is
    (n, k, dtype, bias): per dtype at the tail shape's n, k (its loads guarded, TMA only where a
    row is 16-byte aligned), fwd with each bias variant the tests run, dA, dB and dbias; then the
    benchmark's n, k in its dtype with the spec's bias (block-aligned rows: the all-TMA path),
    and its sweep's. A variant two shapes share is built once."""

    def jobs_for(s, dtype, fwd_biases, tag):
        size = f"n={s.n} k={s.k}"
        for with_bias in fwd_biases:
            k = kernels["fwd"]
            yield CompileJob(k.factory, (s.n, s.k, dtype, with_bias), k.tiling,
                             f"fwd {dtype} {size} bias={with_bias}{tag}")
        for key in ("da", "db"):
            k = kernels[key]
            yield CompileJob(k.factory, (s.n, s.k, dtype), k.tiling,
                             f"{k.factory.removeprefix(spec.name + '_')} {dtype} {size}{tag}")
        if "dbias" in kernels:
            k = kernels["dbias"]
            yield CompileJob(k.factory, (s.n, dtype), k.tiling, f"bwd_dbias {dtype} n={s.n}{tag}")

    jobs = []
    for dtype in spec.dtypes:
        jobs += jobs_for(tail_case, dtype, bias_variants, "")
    for s in spec.bench.shapes:
        jobs += jobs_for(s, spec.bench.dtype, (spec.matmul.bias,), " (bench)")
    for size in SIZE_SWEEP:
        square = MatmulShape(m=size, n=size, k=size)
        jobs += jobs_for(square, spec.bench.dtype, (spec.matmul.bias,), " (bench sweep)")
    return distinct_jobs(jobs)


def explain(p: Plan, shape: dict[str, Any]) -> list[Table]:
    """The plan for one runtime shape (A [m, k] @ B [k, n]), as titled tables: kernels and grids,
    saved tensors and their bytes, the gradient buffers, FLOPs."""
    m, n, k = shape["m"], shape["n"], shape["k"]
    dtype = shape.get("dtype", p.dtypes[0])
    refuse_shape(p, dtype, not_positive({"m": m, "n": n, "k": k}))
    elem = DTYPE_BYTES[dtype]
    # (columns, rows) of each kernel's output, tiled by block_n x block_m.
    outputs = {"fwd": (n, m), "da": (k, m), "db": (n, k), "dbias": (n, m)}
    grids = {key: (ceildiv(outputs[key][0], kp.tiling["block_n"] if key == "dbias"
                           else launched_block_n(kp.tiling, n, k)),
                   ceildiv(outputs[key][1], kp.tiling["block_m"]))
             for key, kp in p.kernels.items()}
    smem = {key: format_bytes(p.smem[key]) if key in p.smem else "-" for key in p.kernels}
    sizes = {"a": m * k * elem, "b": k * n * elem}
    row_blocks = ceildiv(m, p.kernels["dbias"].tiling["block_m"]) if p.bias else 0
    buffers = {"da": m * k * elem, "db": k * n * elem, "dbias": row_blocks * n * 4}
    what = {"direct": "written once (torch.empty)",
            "split": f"fp32 partials [{row_blocks}, {n}], summed after (torch.empty)"}
    reductions = [[g.grad, g.reduction, what[g.reduction], format_bytes(buffers[g.grad]), g.note]
                  for g in p.grads]
    fwd, bwd = flops(m, n, k)
    return explain_tables(
        p, f"m={m} n={n} k={k} dtype={dtype} (A [{m}, {k}] @ B [{k}, {n}], bias={p.bias})",
        grids, sizes, "",
        ("gradient reductions", [["grad", "reduction", "buffer", "bytes", "why"], *reductions]),
        flops_table(fwd, "2 * M * N * K", bwd, "4 * M * N * K (dA and dB GEMMs)"),
        kernel_column=("smem (estimate)", smem),
    )


FAMILY = Family(
    Spec, plan, explain, SCAFFOLDS,
    description=("matmul C = A @ B (+ bias), fp32 accumulation: fwd GEMM; bwd dA = dC B^T and "
                 "dB = A^T dC (WGMMA on transposed tiles), dbias by split partials"),
    shape_keys=("m", "n", "k", "dtype"),
)
