"""RMSNorm y = x * rstd * w over the last dim, rstd = 1 / sqrt(mean(x^2) + eps), forward and
backward (save vs recompute of the per-row rstd; per-channel dw partials).

x has any shape [..., C]; the kernels take it as a [rows, C] matrix. w is one learnable weight per
channel. A forward block normalises block_rows rows at once; a backward block walks its block_rows
rows one at a time. Both loop over C in chunks of block_channels (the last chunk guarded), staging
the rows in shared memory so that x (and dy) are read from HBM once; max_channels bounds C so
that the staged rows fit. dx is written once per element. dw sums dy * x * rstd over the rows: a
backward block accumulates its rows in fp32 in registers (each thread the same channels of every
row), then issues one fp32 atomic per
channel (atomic) or writes one fp32 partial per channel (split, summed on the host in a fixed
order: deterministic).

Spec section, validation beyond field types, and plan(): the kernels and their grids, the shared
memory they need, the gradient buffers and how each is reduced, what the forward saves, the test
matrix, the compile jobs and the bytes the benchmark divides by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field

from opgen.families.contract import Family, scaffold
from opgen.plan import (DTYPE_BYTES, NO_GRAD_CHOICE, SM90_SMEM_LIMIT, TESTED_SAVES, CompileJob,
                        SavedAuxPlan, ShapeCase, SourceInfo, Table, bytes_moved_table, ceildiv,
                        distinct_jobs, explain_tables, format_bytes, kernel_plan, not_positive,
                        refuse_shape, saved_aux_fields, saved_aux_jobs, tuned_tables, weight_dtype,
                        weight_grads_table, weighted_bytes_moved)
from opgen.spec import (BenchSection, Block, MatrixShape, PositiveInt, RowBlock, StrictModel,
                        TensorShape, TestSection, Threads, WeightGrads, family_spec, shapes_of,
                        too_few_elements, too_many_elements, untested_tail)

# Each thread keeps its share of a chunk's fp32 row sums (x^2, w * dy * x) in registers until the
# in-block reduction: at most this many elements of a chunk per thread.
MAX_CHUNK_ELEMENTS_PER_THREAD = 64
# The backward keeps w and its block's dw sums in registers, each thread the same channels of
# every row: at most this many of each (fp32) per thread, across the padded row.
MAX_ROW_ELEMENTS_PER_THREAD = 64
ACCUM_BYTES = 4  # fp32: rstd, the row sums' workspaces


class RowTiling(StrictModel):
    """Tiles of a row phase: a block covers `block_rows` rows and loops over C in chunks of
    `block_channels` channels, with `threads` threads."""

    block_rows: RowBlock
    block_channels: Block
    threads: Threads


class RowBwdTiling(RowTiling):
    """The bwd's tiles, and how many rows of x and dy it keeps in shared memory when it copies
    them ahead: 2 (the next row in flight while one is reduced) or 3 (the next two: more bytes in
    flight where few blocks share an SM, as at C = 8192 with one block an SM). Where the rows do
    not fit (or are off the 16-byte grid) it keeps fewer (copied_rows)."""

    # Left out of the tiling (and the spec's hash) at its default, as before the key existed.
    row_stages: Annotated[Literal[2, 3], Field(exclude_if=lambda v: v == 2)] = 2


# Hopper defaults for a memory-bound op, timed on an H200 at 4096x8192, 16384x4096 and
# 65536x1024 (bf16): fwd one row a block of 128 threads in chunks of 1024 channels (8 per thread),
# as many blocks as rows, the one tiling among the six fastest at all three shapes (82-92% of a
# copy); bwd 16 rows a block, one at a time, in chunks of 1024 on 256 threads: at 4096 rows twice
# the blocks of 32 rows (256, over the 132 SMs), one dw atomic (partial) per channel per 16 rows.
# Against 4 x 1024 fwd and 32 x 2048 bwd: bwd 2446 -> 3121 GB/s at 4096x8192, 2215 -> 2629 at
# 65536x1024.
DEFAULT_TILING = {
    "fwd": RowTiling(block_rows=1, block_channels=1024, threads=128),
    "bwd": RowBwdTiling(block_rows=16, block_channels=1024, threads=256),
}
PHASES = ("fwd", "bwd")
PHASE_TILING = {"fwd": RowTiling, "bwd": RowBwdTiling}


class TunedRowTiling(StrictModel):
    """One [[tiling.tuned]] entry (written by `opgen tune`): the fwd and/or bwd tiling of calls
    whose x has `channels` channels (C); calls at any other C use [tiling.fwd] / [tiling.bwd].
    The best tiling differs per C: blocks of more rows where C is narrow, fewer where few rows
    would leave SMs idle."""

    channels: PositiveInt
    fwd: RowTiling | None = None
    bwd: RowBwdTiling | None = None


DEFAULT_MAX_CHANNELS = 16384
# Any x shapes [..., C]. Keep sizes that are not a multiple of any block (rows and C): tail blocks
# are where guard bugs hide.
DEFAULT_TEST_SHAPES = ((3, 333, 77), (37, 5000), (4097,), (65, 8192))
# A Llama-sized activation (16384 tokens x 4096 channels), a wide one with few rows (4096 x 8192:
# fewer blocks than a wave takes is where a row tiling loses) and a narrow one with many rows.
DEFAULT_BENCH_SHAPES = ((16384, 4096), (4096, 8192), (65536, 1024))

# `opgen new <scaffold>`: the data each commented scaffold is rendered from; "tuned" as in the
# attention family's scaffolds.
SCAFFOLDS = {
    "rmsnorm": scaffold(
        "RMSNorm y = x * rstd * w with a learnable per-channel w, fwd and bwd",
        DEFAULT_TILING, eps="1e-6", weight_dtype="input", max_channels=DEFAULT_MAX_CHANNELS,
        dw="atomic", rstd="auto", shapes=list(DEFAULT_TEST_SHAPES), bench_dtype="bfloat16",
        bench=list(DEFAULT_BENCH_SHAPES), tuned="new/tuned/rmsnorm.toml.jinja",
    ),
}


class RmsnormSection(StrictModel):
    # Added to mean(x^2) under the square root; > 0 keeps an all-zero row finite.
    eps: Annotated[float, Field(gt=0, lt=1)] = 1e-6
    # dtype of w and dw: x's dtype (as in most models), or float32 (a master weight).
    weight_dtype: Literal["input", "float32"] = "input"
    # The largest C the op accepts: the kernels stage whole rows in shared memory.
    max_channels: PositiveInt = DEFAULT_MAX_CHANNELS


class RmsnormSaved(StrictModel):
    # save: the forward writes one fp32 rstd per row for the backward (4 bytes a row). recompute:
    # the backward sums x^2 again from the row it loads anyway (a few FLOPs per element). auto:
    # calls of at least AUTO_SAVE_FROM_ELEMENTS elements save it, smaller ones recompute it (the
    # default since GPU run 179; the numbers behind it are at AUTO_SAVE_FROM_ELEMENTS).
    rstd: Literal["save", "recompute", "auto"] = "auto"


# saved.rstd = "auto": the smallest call (elements of x) that saves rstd. Below it a call is
# host-bound: the rstd buffer's allocation and hand-off cost the forward ~4 us of host time
# (H100, [8, 1024]: 24.3 us saved against 20.0 recomputed, eager 13.4-14.3, GPU run 142; run
# 179, the shipped spec against a copy with "auto": 23.8 against 20.0, eager 13.6), while the
# recomputing backward's extra GPU time, a few FLOPs an element, stays under the launch's host
# time. Far above it the backward is bandwidth-bound and recomputing costs 3-25% (4096 x 8192:
# 0.118 ms against 0.094, GPU run 142).
AUTO_SAVE_FROM_ELEMENTS = 1 << 20


def saves_rstd(choice: str, elements: int) -> bool:
    """Whether a call on an x of `elements` elements saves rstd under saved.rstd = choice."""
    return choice == "save" or (choice == "auto" and elements >= AUTO_SAVE_FROM_ELEMENTS)


def matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, C): the [rows, C] view of an x of `shape` that the kernels take."""
    return math.prod(shape) // shape[-1], shape[-1]


def padded(channels: int, block_channels: int) -> int:
    """C rounded up to whole chunks: the width of a row staged in shared memory."""
    return ceildiv(channels, block_channels) * block_channels


def copied_rows(tiling: dict[str, int], channels: int, elem: int) -> int:
    """Rows of x and dy the bwd kernel stages in shared memory at C = channels: the tiling's
    row_stages (rows copied ahead asynchronously) where every row is on a 16-byte boundary and
    that many fit, else the most down to 2 that fit, else 1 (the row loaded by the first pass).
    The generated kernels.py makes the same choice at run time (copied_rows; a test keeps the
    two in step)."""
    width = padded(channels, tiling["block_channels"])
    aligned = channels * elem % 16 == 0
    for stages in range(tiling.get("row_stages", 2), 1, -1):
        staged = width * stages * 2 * elem + 2 * ACCUM_BYTES * tiling["threads"]
        if aligned and staged <= SM90_SMEM_LIMIT:
            return stages
    return 1


def shared_bytes(phase: str, tiling: dict[str, int], channels: int, elem: int) -> int:
    """Shared memory of one block at C = channels (TileLang places these buffers; the compile
    check reads the real figure). fwd: its block_rows rows of x in x's dtype, the fp32 rstd per
    row, the reduction's workspace. bwd: its staged rows of x and dy (copied_rows) in x's
    dtype, one workspace per row sum (x^2 and w * dy * x); its w and dw sums are registers
    (row_register_problem)."""
    width = padded(channels, tiling["block_channels"])
    workspace = ACCUM_BYTES * tiling["threads"]
    if phase == "fwd":
        return tiling["block_rows"] * (width * elem + ACCUM_BYTES) + workspace
    rows = copied_rows(tiling, channels, elem)
    return width * rows * 2 * elem + 2 * workspace


def row_register_problem(t: RowTiling, channels: int) -> str | None:
    """Why a bwd tiling's threads cannot keep w and the dw sums of a padded row of C = channels
    in registers, or None."""
    return too_many_elements(padded(channels, t.block_channels), t.threads,
                             MAX_ROW_ELEMENTS_PER_THREAD, "w and the dw sums (fp32) of its channels")


def widest_element(spec: Spec) -> int:
    """Bytes of the spec's widest x dtype: the shared-memory rules hold at it."""
    return max((DTYPE_BYTES[d] for d in spec.dtypes), default=2)


def chunk_problems(phase: str, t: RowTiling) -> list[tuple[str, str]]:
    """(key, problem) of a phase's tiling whose chunk gives its threads too few or too many
    elements."""
    # A fwd chunk is [block_rows, block_channels]; a bwd chunk is one row of block_channels.
    chunk = t.block_channels * (t.block_rows if phase == "fwd" else 1)
    what = "block_rows x block_channels" if phase == "fwd" else "block_channels"
    problems = (too_few_elements(chunk, t.threads),
                too_many_elements(chunk, t.threads, MAX_CHUNK_ELEMENTS_PER_THREAD,
                                  "the fp32 row sums of its elements of a chunk"))
    return [(".block_channels", f"{what} {problem}") for problem in problems if problem]


def chunks_fit_threads(spec: Spec):
    for phase in PHASES:
        for key, problem in chunk_problems(phase, getattr(spec.tiling, phase)):
            yield f"tiling.{phase}{key}", problem


def bwd_row_fits_registers(spec: Spec):
    limit = spec.rmsnorm.max_channels
    problem = row_register_problem(spec.tiling.bwd, limit)
    if problem:
        yield "tiling.bwd.threads", (f"at C = max_channels ({limit}, rounded up to whole "
                                     f"block_channels chunks) the row {problem}; raise threads "
                                     f"or lower rmsnorm.max_channels")


def rows_fit_shared_memory(spec: Spec):
    elem = widest_element(spec)
    limit = spec.rmsnorm.max_channels
    for phase in ("fwd", "bwd"):
        need = shared_bytes(phase, getattr(spec.tiling, phase).model_dump(), limit, elem)
        if need > SM90_SMEM_LIMIT:
            staged, lower = (
                ("its block_rows rows of x", "max_channels or tiling.fwd.block_rows")
                if phase == "fwd" else
                ("its rows of x and dy", "max_channels")
            )
            yield "rmsnorm.max_channels", (
                f"the {phase} kernel stages {staged} in shared memory: {need} bytes at "
                f"C = {limit} (rounded up to whole block_channels chunks), over the sm_90 limit "
                f"{SM90_SMEM_LIMIT}; lower {lower} (got {limit})"
            )


def tuned_problems(phase: str, t: RowTiling, channels: int, elem: int) -> list[tuple[str, str]]:
    """(key, problem) of a tiling for calls at C = channels: the chunk rule, and its staged rows
    within the sm_90 shared memory at that C."""
    problems = chunk_problems(phase, t)
    if phase == "bwd" and (problem := row_register_problem(t, channels)):
        problems.append((".threads", f"at C = {channels} the row {problem}; raise threads"))
    need = shared_bytes(phase, t.model_dump(), channels, elem)
    if need > SM90_SMEM_LIMIT:
        lower = "block_rows" if phase == "fwd" else "block_channels (rows are padded to whole chunks)"
        problems.append(("", f"the {phase} kernel stages {need} bytes of shared memory at C = "
                             f"{channels}, over the sm_90 limit {SM90_SMEM_LIMIT}; lower {lower}"))
    return problems


def tuned_tilings_fit(spec: Spec):
    """[[tiling.tuned]] entries: a C the op takes, one entry per C, and tilings under the rules
    of the base tiling at that C."""
    elem = widest_element(spec)
    seen = set()
    for i, entry in enumerate(spec.tiling.tuned):
        where = f"tiling.tuned.{i}"
        if entry.channels > spec.rmsnorm.max_channels:
            yield f"{where}.channels", (f"must be at most rmsnorm.max_channels "
                                        f"({spec.rmsnorm.max_channels}) (got {entry.channels})")
        if entry.channels in seen:
            yield where, f"repeats channels = {entry.channels}: one entry per channel count"
        seen.add(entry.channels)
        if entry.fwd is None and entry.bwd is None:
            yield where, "give fwd, bwd or both (a tiling table each)"
        for phase in PHASES:
            tiling = getattr(entry, phase)
            if tiling is not None:
                for key, problem in tuned_problems(phase, tiling, entry.channels, elem):
                    yield f"{where}.{phase}{key}", problem


def tested_shapes_within_max_channels(spec: Spec):
    limit = spec.rmsnorm.max_channels
    for i, shape in enumerate(spec.test.shapes):
        if shape[-1] > limit:
            yield f"test.shapes.{i}", (
                f"last dim (C) must be at most rmsnorm.max_channels ({limit}) (got {shape[-1]})"
            )


def tested_shapes_have_tails(spec: Spec):
    shapes = spec.test.shapes
    yield from untested_tail(shapes, lambda s: s[-1], _smallest_block_channels(spec),
                             "last dim (C) is", "the smallest block_channels", "[3, 333, 77]",
                             "tail chunks are")
    yield from untested_tail(shapes, lambda s: matrix(s)[0], _smallest_block_rows(spec),
                             "rows (elements / last dim) are", "the smallest block_rows",
                             "[3, 333, 77]", "tail rows are")


def bench_shapes_within_max_channels(spec: Spec):
    limit = spec.rmsnorm.max_channels
    for i, shape in enumerate(spec.bench.shapes):
        if shape.channels > limit:
            yield f"bench.shapes.{i}.channels", (
                f"must be at most rmsnorm.max_channels ({limit}) (got {shape.channels})"
            )


# The rmsnorm rules, in the order their problems are reported (after the shared ones).
RULES = (chunks_fit_threads, bwd_row_fits_registers, rows_fit_shared_memory,
         tested_shapes_within_max_channels,
         tested_shapes_have_tails, bench_shapes_within_max_channels, tuned_tilings_fit)


Spec = family_spec(
    "rmsnorm", RULES, rmsnorm=RmsnormSection, grads=WeightGrads, saved=RmsnormSaved,
    tiling=DEFAULT_TILING,
    # [[tiling.tuned]]: tilings per C, written by `opgen tune`. Left out of the spec's hash when
    # empty, so a spec without it hashes as before the key existed.
    tiling_keys={"tuned": (tuple[TunedRowTiling, ...], Field((), exclude_if=lambda v: not v))},
    test=TestSection.of(TensorShape, DEFAULT_TEST_SHAPES),
    bench=BenchSection.of(MatrixShape, shapes_of(MatrixShape, DEFAULT_BENCH_SHAPES), "bfloat16"),
)


def _smallest_block_rows(spec: Spec) -> int:
    """The smallest block_rows above 1: a row count not a multiple of it leaves a tail block in
    every phase with more than one row a block (block_rows are powers of two)."""
    return min((r for r in (spec.tiling.fwd.block_rows, spec.tiling.bwd.block_rows) if r > 1),
               default=1)


def _smallest_block_channels(spec: Spec) -> int:
    return min(spec.tiling.fwd.block_channels, spec.tiling.bwd.block_channels)


def _column_tail(spec: Spec, shape: tuple[int, ...]) -> bool:
    return shape[-1] % _smallest_block_channels(spec) != 0


def _row_tail(spec: Spec, shape: tuple[int, ...]) -> bool:
    rows = _smallest_block_rows(spec)
    return rows > 1 and matrix(shape)[0] % rows != 0


@dataclass(frozen=True, kw_only=True)
class Plan(SavedAuxPlan):
    eps: float
    eps_literal: str  # eps as Python source
    max_channels: int
    save_rstd: bool  # the spec's saved.rstd is "save" (with "auto": see save_from_elements)
    shared_memory_limit: int = SM90_SMEM_LIMIT
    element_bytes: Mapping[str, int] = field(default_factory=lambda: dict(DTYPE_BYTES))

    def saves_at(self, elements: int) -> bool:
        """Whether the public function's call on an x of `elements` elements saves rstd."""
        if self.save_from_elements is None:
            return self.save_rstd
        return elements >= self.save_from_elements


def plan(spec: Spec, source: SourceInfo) -> Plan:
    section = spec.rmsnorm
    reduction = spec.grads.dw.reduction
    save_rstd = spec.saved.rstd == "save"

    def kernel(key, summary):
        return kernel_plan(spec.name, key, key, key, summary, "(ceildiv(rows, block_rows),)",
                           getattr(spec.tiling, key))

    kernels = {
        "fwd": kernel("fwd", "y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), in fp32 (and "
                             "the fp32 rstd per row when saved)"),
        "bwd": kernel("bwd", "dx = rstd * (w * dy - x * rstd^2 * mean(w * dy * x)); dw: the "
                             "block's fp32 sums of dy * x * rstd over its rows, one atomic add or "
                             "partial per channel"),
    }
    dw_notes = {
        "atomic": "the block's rows summed in fp32, one fp32 atomic add per block and channel into "
                  "fp32 sums that the last block casts into dw and zeroes again (one launch)",
        "split": "one fp32 partial per block and channel written once, summed on the host in a "
                 "fixed order (deterministic), then cast",
    }
    auto = spec.saved.rstd == "auto"
    fields = saved_aux_fields(spec, source, section, "rstd", save_rstd or auto,
                              "per row: written once per element", dw_notes[reduction],
                              lambda channels: channels,
                              save_from_elements=AUTO_SAVE_FROM_ELEMENTS if auto else None)
    # Prefer a shape with tails in both rows and channels; validation found one with each.
    tail_case = max(fields["test_cases"],
                    key=lambda c: _row_tail(spec, c.shape) + _column_tail(spec, c.shape))
    tuned = tuned_tables(spec.tiling.tuned, lambda e: e.channels, PHASES)
    fields["test_cases"] += _tuned_test_cases(spec, tuned)
    return Plan(
        **fields,
        eps=section.eps,
        eps_literal=repr(section.eps),
        max_channels=section.max_channels,
        kernels=kernels,
        save_rstd=save_rstd,
        tail_case=tail_case,
        tuned=tuned,
        compile_jobs=_compile_jobs(spec, kernels, tuned, tail_case, fields["test_reductions"]),
    )


def _tuned_test_cases(spec: Spec, tuned: dict[str, dict[int, dict[str, int]]]
                      ) -> tuple[ShapeCase, ...]:
    """A test shape at each tuned C that no test shape has, so that the generated tests run every
    tuned tiling: an odd row count above every block_rows, for a tail block in each phase."""
    tested = {shape[-1] for shape in spec.test.shapes}
    channels = sorted({c for table in tuned.values() for c in table} - tested)
    block_rows = [t["block_rows"] for table in tuned.values() for t in table.values()]
    rows = 2 * max([spec.tiling.fwd.block_rows, spec.tiling.bwd.block_rows, *block_rows]) + 1
    return tuple(ShapeCase((rows, c)) for c in channels)


def _compile_jobs(spec, kernels, tuned, tail_case, test_reductions) -> tuple[CompileJob, ...]:
    """Every kernel variant the package launches, at the tail shape's C: per dtype, fwd with and
    without the saved rstd, bwd for each of those and each dw reduction the tests run; then the
    benchmark's C with the spec's choices, and its forward without rstd (a call no backward
    follows saves nothing); then the spec's choices at C = max_channels (the most
    shared memory the op ever asks for); then each tuned C at the first dtype with every saved
    and reduction choice the tests run. The row count is symbolic: a variant is its C (and the
    tiling it runs with there)."""
    section = spec.rmsnorm

    def jobs_for(cols, dtype, saves, reductions, tag):
        args = (cols, dtype, weight_dtype(section.weight_dtype, dtype), section.eps)
        tilings = {key: table[cols] for key, table in tuned.items() if cols in table}
        return saved_aux_jobs(kernels, args, saves, reductions, "rstd", f"{dtype} C={cols}", tag,
                              tilings)

    cols = matrix(tail_case.shape)[1]
    jobs = []
    for dtype in spec.dtypes:
        jobs += jobs_for(cols, dtype, TESTED_SAVES, test_reductions, "")
    reduction = (spec.grads.dw.reduction,)
    for shape in spec.bench.shapes:
        saves = (saves_rstd(spec.saved.rstd, shape.rows * shape.channels),)
        jobs += jobs_for(shape.channels, spec.bench.dtype, saves, reduction, " (bench)")
        jobs += jobs_for(shape.channels, spec.bench.dtype, *NO_GRAD_CHOICE, " (bench, no grad)")
    # "auto": one row of max_channels recomputes, AUTO_SAVE_FROM_ELEMENTS / C rows save.
    saves = (False, True) if spec.saved.rstd == "auto" else (spec.saved.rstd == "save",)
    jobs += jobs_for(spec.rmsnorm.max_channels, spec.dtypes[0], saves, reduction, " (max_channels)")
    for channels in sorted({c for table in tuned.values() for c in table}):
        jobs += jobs_for(channels, spec.dtypes[0], TESTED_SAVES, test_reductions, " (tuned)")
    return distinct_jobs(jobs)


def explain(p: Plan, shape: dict[str, Any]) -> list[Table]:
    """The plan for one runtime shape (x of [rows, channels]), as titled tables: kernels, grids
    and shared memory, saved tensors and their bytes, the gradient buffers and their atomics,
    bytes moved."""
    rows, channels = shape["rows"], shape["channels"]
    dtype = shape.get("dtype", p.dtypes[0])
    _check_shape(p, rows, channels, dtype)
    elem = DTYPE_BYTES[dtype]
    w_elem = DTYPE_BYTES[weight_dtype(p.weight_dtype, dtype)]
    numel = rows * channels
    tilings = {key: p.tiling_for(key, channels) for key in p.kernels}
    grids = {key: (ceildiv(rows, t["block_rows"]),) for key, t in tilings.items()}
    smem = {key: format_bytes(shared_bytes(key, t, channels, elem)) for key, t in tilings.items()}
    sizes = {"x": numel * elem, "w": channels * w_elem, "rstd": rows * 4}  # rstd: fp32 per row
    row_blocks = grids["bwd"][0]
    fwd_bytes, bwd_bytes = weighted_bytes_moved(numel, channels, elem, w_elem)
    partials = 0 if p.dw_reduction == "atomic" else 4 * row_blocks * channels
    # "auto": what this shape's call saves.
    saves = p.saves_at(numel)
    p = replace(p, saved=("x", "w", "rstd") if saves else ("x", "w"),
                recomputed=() if saves else ("rstd",))
    return explain_tables(
        p, (f"rows={rows} channels={channels} dtype={dtype} ({numel} elements; "
            f"eps={p.eps_literal}; C at most {p.max_channels})"),
        grids, sizes, "recomputed in backward from x",
        weight_grads_table(p, numel * elem, channels, row_blocks, row_blocks * channels),
        bytes_moved_table(fwd_bytes, bwd_bytes, "rstd", sizes["rstd"] if saves else 0, partials),
        kernel_column=("shared memory", smem), tilings=tilings,
    )


def _check_shape(p: Plan, rows: int, channels: int, dtype: str) -> None:
    """What the generated op's input checks would reject, as an explain error."""
    problems = not_positive({"rows": rows, "channels": channels})
    if channels > p.max_channels:
        problems.append(f"channels must be at most rmsnorm.max_channels ({p.max_channels}) "
                        f"(got {channels})")
    refuse_shape(p, dtype, problems)


FAMILY = Family(
    Spec, plan, explain, SCAFFOLDS,
    description=("RMSNorm x * rstd * w, w per channel: fwd (rstd saved or recomputed), bwd (dx "
                 "direct; dw atomic or split)"),
    shape_keys=("rows", "channels", "dtype"),
    tuner_module="opgen.families.rmsnorm_tune",
)
