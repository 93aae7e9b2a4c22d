"""Multi-head attention (flash attention), forward and backward.

Spec section, validation beyond field types, and plan(): the kernels and their grids, the gradient
buffers and how each is reduced, what the forward saves, the test matrix, the compile jobs and the
FLOP count the benchmark reports.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Literal

from pydantic import AfterValidator, Field, StrictBool

from opgen.families import attention_launch
from opgen.families.attention_launch import (DQ_TILE, has_paired_forward, heads_per_block,
                                              launch_grid, padded_rows, paired_block_n,
                                              paired_tiling, pairs_query_blocks,
                                              postprocess_tiling, tuned_tiling, walks_heads)
from opgen.families.contract import Family
from opgen.plan import (DTYPE_BYTES, CompileJob, FlopsBenchCase, GradPlan, PlanBase, SourceInfo,
                        Sweep, Table, base_fields, ceildiv, explain_tables,
                        flops_table, format_bytes, kernel_plan, over_smem_limit, refuse_shape,
                        whole_kib)
from opgen.plan import tuned_tables as plan_tuned_tables
from opgen.spec import (BenchSection, GemmTiling, PositiveInt, Reduction, ReductionKind, RowTiling,
                        StrictModel, TestSection, echo, family_spec, not_whole_warpgroups)

# `opgen new <scaffold>`: the data each commented scaffold is rendered from. "tuned": the template
# of its [[tiling.tuned]] entries, those of the shipped spec of that name (specs/ holds each
# scaffold as `opgen new` writes it), so that a new package starts on the tilings measured fastest.
SCAFFOLDS = {
    "attention": {
        "title": "multi-head flash attention, forward and backward",
        "layouts": ["bshd", "bhsd"], "causal": False, "gqa": False, "sinks": False,
        "sliding_window": False, "dkv": "direct", "windows": [],
        "shapes": [(2, 4, 4, 1000), (1, 3, 3, 77)],
        "bench_dtype": "float16",
        "bench": [(4, 16, 16, 4096, 128, False, None), (4, 16, 16, 4096, 128, True, None),
                  (4, 16, 16, 4096, 64, False, None), (4, 16, 16, 4096, 64, True, None)],
        "tuned": "new/tuned/attention.toml.jinja",
    },
    "attention_sink": {
        "title": "attention with learnable sinks, a sliding window and GQA (gpt-oss style)",
        "layouts": ["bshd"], "causal": True, "gqa": True, "sinks": True,
        "sliding_window": True, "dkv": "in_block", "windows": [16, 700],
        "shapes": [(2, 4, 4, 1000), (1, 8, 2, 1000), (1, 8, 1, 333)],
        "bench_dtype": "bfloat16",
        # The last: gpt-oss's attention (64 query / 8 KV heads, head_dim 64, window 128).
        "bench": [(2, 32, 8, 4096, 128, True, None), (2, 32, 8, 4096, 128, True, 1024),
                  (1, 64, 8, 4096, 64, True, 128)],
        "tuned": "new/tuned/attention_sink.toml.jinja",
    },
    "gqa": {
        "title": "grouped-query attention with deterministic (in-block) dK/dV",
        "layouts": ["bshd"], "causal": True, "gqa": True, "sinks": False,
        "sliding_window": False, "dkv": "in_block", "windows": [],
        "shapes": [(2, 4, 4, 1000), (1, 8, 2, 1000), (1, 8, 1, 333)],
        "bench_dtype": "bfloat16",
        "bench": [(2, 32, 8, 4096, 128, True, None), (2, 32, 8, 4096, 128, False, None)],
        "tuned": "new/tuned/gqa.toml.jinja",
    },
}

Layout = Literal["bshd", "bhsd"]
HeadDim = Annotated[int, Field(ge=16, le=256, multiple_of=16)]
Keep = Literal["save", "recompute"]
LAYOUT_DIMS = {"bshd": "[batch, seq_len, heads, head_dim]", "bhsd": "[batch, heads, seq_len, head_dim]"}


# A WGMMA's N: at most 256 columns, in steps of 8 (of 16 for a GEMM's K).
MAX_WGMMA_N = 256


def whole_warpgroup_rows(value: int) -> int:
    if (value >= 16 and not value & (value - 1)) or (value > 0 and value % 64 == 0):
        return value
    raise ValueError("must be a power of two >= 16 or a multiple of 64 (64 query rows per "
                     "consumer warpgroup)")


def key_block_rows(value: int) -> int:
    if value >= 16 and (not value & (value - 1) or (value % 16 == 0 and value <= MAX_WGMMA_N)):
        return value
    raise ValueError(f"must be a power of two >= 16 or a multiple of 16 up to {MAX_WGMMA_N} (the "
                     "widest score tile one WGMMA computes)")


class AttentionTiling(GemmTiling):
    """A fwd/bwd tiling: GemmTiling plus how many blocks share an SM."""

    # 2: two blocks of one consumer warpgroup (threads 128) share an SM, their registers split
    # 232 / 24 between consumers and producer, each in at most half the SM's shared memory: one
    # block's loads and stores overlap the other's GEMMs. 1: a block has the SM alone (its
    # registers fill it). Left out of the tiling (and the spec's hash) when 1. At three blocks
    # (80 registers a thread) the backward's dK and dV accumulators spill.
    blocks_per_sm: Literal[1, 2] = Field(1, exclude_if=lambda v: v == 1)


class FwdTiling(AttentionTiling):
    """The forward's tiling: AttentionTiling plus the schedule of its key loop."""

    # Query rows: besides powers of two, three warpgroups of 64 rows (192 on 384 threads: at
    # head_dim 64 the tensor cores wait less on the softmax, GPU run 86: +9-10% without a mask).
    block_m: Annotated[int, AfterValidator(whole_warpgroup_rows)]

    # Key rows a step: besides powers of two, any multiple of 16 a WGMMA takes as its N (the
    # scores) and K (the output): a wider step spreads the softmax's row reductions and the
    # barriers of a step over more keys.
    block_n: Annotated[int, AfterValidator(key_block_rows)]

    # true: the QK^T GEMM of key block s is issued (async WGMMA) next to the PV GEMM of block
    # s - 1 and the softmax of s runs while PV is in flight (GPU run 36: +3-8% at 128x128, two
    # stages). Left out of the tiling (and the spec's hash) when false.
    overlap: StrictBool = Field(False, exclude_if=lambda v: not v)

    # true (block_m 128, threads 256): each consumer warpgroup owns 64 query rows and keeps the
    # overlapped schedule, and the two take turns at the tensor cores, so one's softmax runs
    # during the other's GEMMs; a producer warp loads the tiles by TMA (H100, GPU runs 175 and
    # 177: D128 causal 5-9% faster than overlap, full level to 3%, D64 full 8% slower). Left out
    # of the tiling (and the spec's hash) when false.
    pingpong: StrictBool = Field(False, exclude_if=lambda v: not v)

    # Also 3 or 4 blocks an SM (the kernel built to 80 or 64 registers a thread, enough for a
    # 64-row forward whose accumulators fit: register_problems): more blocks to hide each
    # other's loads and stores where a block is mostly prologue and epilogue (a short window's
    # few key blocks).
    blocks_per_sm: Literal[1, 2, 3, 4] = Field(1, exclude_if=lambda v: v == 1)


class BwdTiling(AttentionTiling):
    """The backward's tiling: AttentionTiling plus how its dQ tiles reach the accumulator."""

    # true: each step's dQ tile is staged in shared memory and added into the fp32 accumulator by
    # bulk asynchronous reduce-adds (16 rows each), instead of one atomic per element from
    # registers; the accumulator is then laid out in 16-row tiles. Fewer instructions where the
    # loop is short (head_dim 64: GPU runs 126, 136, 5-6% faster); no gain at head_dim 128.
    # Left out of the tiling (and the spec's hash) when false.
    bulk_dq: StrictBool = Field(False, exclude_if=lambda v: not v)

    # true: a block walks its query blocks from the last one down. Under a causal mask the blocks
    # of a head start at different query blocks (their diagonals) and all end at the last one:
    # walking down can keep the blocks that run together on the same q and dO tiles and dQ rows,
    # so more of them come from L2. Whether it does depends on which blocks run together, so it
    # is measured per entry (H100, runs 162 and 164: GQA D128 causal 11-12% faster, with sinks
    # 15%; MHA D128 level, D64 4% slower; sinks at window 1024 34% slower). Left out of the
    # tiling (and the spec's hash) when false.
    descending: StrictBool = Field(False, exclude_if=lambda v: not v)


# Hopper defaults. fwd 128x64 with a 256-thread consumer group and one pipeline stage, bwd 128x32
# with two stages: the sm_90 configurations of TileLang's GQA and attention-sink examples, which
# fit both head_dim 64 and 128 in shared memory.
DEFAULT_TILING = {
    "fwd": FwdTiling(block_m=128, block_n=64, threads=256, num_stages=1),
    "bwd": BwdTiling(block_m=128, block_n=32, threads=256, num_stages=2),
    "preprocess": RowTiling(block_m=32, threads=128),
    "postprocess": RowTiling(block_m=64, threads=128),
    # Used only with attention.sinks: one block a head walks batch x seq_len rows, so a wide
    # block (1024 rows a step) takes fewer serial steps: 4% off the gpt-oss-shape backward.
    "dsinks": RowTiling(block_m=1024, threads=1024),
}


class AttentionSection(StrictModel):
    layouts: tuple[Layout, ...] = ("bshd",)
    head_dims: tuple[HeadDim, ...] = (64, 128)
    causal: StrictBool = False  # default of the generated function's `causal` argument
    # Grouped-query attention: k and v may have fewer heads than q (heads = groups * kv_heads).
    gqa: StrictBool = False
    # One learnable logit per query head that joins every row's softmax denominator (gpt-oss).
    sinks: StrictBool = False
    # The sinks' dtype in the docs, tests and bench: float32, or q's ("input"). The op takes any
    # float dtype (computed in fp32, the gradient returned in the sinks' dtype).
    sinks_dtype: Literal["float32", "input"] = "float32"
    # A `window` argument: query i sees keys i - window < j <= i (causal only).
    sliding_window: StrictBool = False


# The choices of each reduction depend on the gradient and the variant: checked in
# grad_reductions_allowed().
class AttentionGrads(StrictModel):
    # dQ gathers one contribution per KV block: fp32 atomics (or bulk reduce-adds, the bwd
    # tiling's bulk_dq), then a cast (postprocess).
    dq: Reduction = Reduction(reduction="atomic")
    # dK/dV: with one query head per KV head each KV block owns its rows: written directly.
    # With GQA the query heads of a group all add to them: fp32 atomics then a cast ("atomic"),
    # one partial per group summed afterwards ("split": deterministic), or one block per KV
    # head walking every query head of its group, summing in registers ("in_block":
    # deterministic, no extra buffer).
    dk: Reduction | None = None
    dv: Reduction | None = None
    # dsinks: per-row terms from lse and Delta, summed over batch and rows afterwards.
    dsinks: Reduction | None = None


class AttentionSaved(StrictModel):
    # P is always recomputed from lse (flash attention); O and lse are saved or recomputed by
    # running the forward kernel again inside backward (less memory held between fwd and bwd).
    o: Keep = "save"
    lse: Keep = "save"


class AttentionTestShape(StrictModel):
    batch: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = None  # default: heads
    seq_len: PositiveInt


DEFAULT_TEST_SHAPES = (
    AttentionTestShape(batch=2, heads=4, seq_len=1000),
    AttentionTestShape(batch=1, heads=3, seq_len=77),
)


class AttentionBenchShape(StrictModel):
    batch: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt | None = None  # default: heads
    seq_len: PositiveInt
    head_dim: PositiveInt
    causal: StrictBool
    window: PositiveInt | None = None


DEFAULT_BENCH_SHAPES = (
    AttentionBenchShape(batch=4, heads=16, seq_len=4096, head_dim=128, causal=False),
    AttentionBenchShape(batch=4, heads=16, seq_len=4096, head_dim=128, causal=True),
    AttentionBenchShape(batch=4, heads=16, seq_len=4096, head_dim=64, causal=False),
    AttentionBenchShape(batch=4, heads=16, seq_len=4096, head_dim=64, causal=True),
)


# The phases whose tiling [[tiling.tuned]] may set per (head_dim, causal, max_window): the GEMM
# kernels, with the model of each one's tiling table.
TUNED_PHASES = ("fwd", "bwd")
PHASE_TILING = {"fwd": FwdTiling, "bwd": BwdTiling}


class TunedTiling(StrictModel):
    """One [[tiling.tuned]] entry: the fwd and/or bwd tiling of calls at head_dim with this
    causal flag (sliding-window calls are causal); with max_window, only of sliding-window calls
    whose window is at most that (the narrowest such entry wins: tuned_tiling). Other calls use
    [tiling.fwd] / [tiling.bwd]."""

    head_dim: HeadDim
    causal: StrictBool
    # Left out of the spec's hash when not given, so an entry without it hashes as before.
    max_window: PositiveInt | None = Field(None, exclude_if=lambda v: v is None)
    fwd: FwdTiling | None = None
    bwd: BwdTiling | None = None


def tuned_key(entry: TunedTiling) -> tuple[int, bool, int]:
    """An entry's key in the package's tables and tuned_tiling: (head_dim, causal, max_window),
    max_window 0 where it has none."""
    return (entry.head_dim, entry.causal, entry.max_window or 0)


def gemm_tilings(spec: "Spec") -> Iterator[GemmTiling]:
    """Every fwd/bwd tiling the package launches: the base ones, then the tuned ones."""
    for phase in TUNED_PHASES:
        yield getattr(spec.tiling, phase)
    for entry in spec.tiling.tuned:
        yield from (t for t in (entry.fwd, entry.bwd) if t is not None)


def gemm_blocks(spec: "Spec") -> tuple[int, ...]:
    """The block sizes of every fwd/bwd tiling (the tests' tails and windows must cover them)."""
    return tuple(b for t in gemm_tilings(spec) for b in (t.block_m, t.block_n))


# dK/dV reductions across the query heads of a group (attention.gqa).
GROUPED_REDUCTIONS = ("atomic", "split", "in_block")


def allowed_reductions(section: AttentionSection) -> dict[str, tuple[str, ...]]:
    """The reductions each gradient supports, given the variant switches."""
    allowed = {
        "dq": ("atomic",),
        "dk": GROUPED_REDUCTIONS if section.gqa else ("direct",),
        "dv": GROUPED_REDUCTIONS if section.gqa else ("direct",),
    }
    if section.sinks:
        allowed["dsinks"] = ("split",)
    return allowed


def reductions(spec: "Spec") -> dict[str, str]:
    """Each gradient's reduction: the spec's choice, else the first allowed one."""
    chosen = {}
    for grad, choices in allowed_reductions(spec.attention).items():
        given = getattr(spec.grads, grad)
        chosen[grad] = given.reduction if given else choices[0]
    return chosen


def grad_reductions_allowed(spec: Spec):
    allowed = allowed_reductions(spec.attention)
    for grad in AttentionGrads.model_fields:
        given = getattr(spec.grads, grad)
        if given is None:
            continue
        if grad not in allowed:
            yield f"grads.{grad}", "only exists with attention.sinks = true"
        elif given.reduction not in allowed[grad]:
            why = {
                "dk": " (direct without attention.gqa; atomic, split or in_block with it)",
                "dv": " (direct without attention.gqa; atomic, split or in_block with it)",
            }.get(grad, "")
            yield f"grads.{grad}.reduction", (
                f"must be one of {', '.join(allowed[grad])}{why} (got {echo(given.reduction)})"
            )
    chosen = reductions(spec)
    if spec.attention.gqa and (chosen["dk"] == "in_block") != (chosen["dv"] == "in_block"):
        yield "grads.dv.reduction", (
            "must equal grads.dk.reduction when either is in_block: one block walks the group "
            f"for both (got dk {echo(chosen['dk'])}, dv {echo(chosen['dv'])})"
        )


def tested_kv_heads_fit(spec: Spec):
    for i, shape in enumerate(spec.test.shapes):
        kv_heads = shape.kv_heads or shape.heads
        if shape.heads % kv_heads:
            yield f"test.shapes.{i}.kv_heads", (
                f"must divide heads ({shape.heads}) (got {kv_heads})"
            )
        elif kv_heads != shape.heads and not spec.attention.gqa:
            yield f"test.shapes.{i}.kv_heads", (
                f"must equal heads without attention.gqa = true (got {kv_heads})"
            )


def gqa_tests_a_grouped_shape(spec: Spec):
    shapes = spec.test.shapes
    if spec.attention.gqa and shapes and all((s.kv_heads or s.heads) == s.heads for s in shapes):
        yield "test.shapes", (
            "with attention.gqa = true, add a shape with kv_heads < heads: the grouped dK/dV "
            "reductions are tested only on one"
        )


def tested_windows_cover_the_blocks(spec: Spec):
    windows = spec.test.windows
    if spec.attention.sliding_window:
        blocks = gemm_blocks(spec)
        if not windows or min(windows) >= min(blocks) or max(windows) <= max(blocks):
            yield "test.windows", (
                f"list a window smaller than {min(blocks)} and one larger than {max(blocks)} "
                f"(the smallest and largest block) (got {echo(windows)})"
            )
    elif windows:
        yield "test.windows", "only with attention.sliding_window = true"


def bench_shapes_fit_the_variant(spec: Spec):
    section = spec.attention
    for i, shape in enumerate(spec.bench.shapes):
        kv_heads = shape.kv_heads or shape.heads
        if shape.heads % kv_heads or (kv_heads != shape.heads and not section.gqa):
            yield f"bench.shapes.{i}.kv_heads", (
                f"must divide heads, and equal it without attention.gqa (got {kv_heads})"
            )
        if shape.window is not None and not (section.sliding_window and shape.causal):
            yield f"bench.shapes.{i}.window", (
                "needs attention.sliding_window = true and causal = true"
            )


def layouts_and_head_dims_listed_once(spec: Spec):
    section = spec.attention
    if not section.layouts:
        yield "attention.layouts", "must list at least one of bshd, bhsd"
    if len(set(section.layouts)) != len(section.layouts):
        yield "attention.layouts", "must not repeat a layout"
    if not section.head_dims:
        yield "attention.head_dims", "must list at least one head dim"
    if len(set(section.head_dims)) != len(section.head_dims):
        yield "attention.head_dims", "must not repeat a head dim"


def tested_shapes_have_a_tail(spec: Spec):
    smallest_block = min(gemm_blocks(spec))
    shapes = spec.test.shapes
    if shapes and all(s.seq_len % smallest_block == 0 for s in shapes):
        yield "test.shapes", (
            f"add a seq_len that is not a multiple of {smallest_block} (the smallest block): "
            "tail blocks are where masking and atomic-guard bugs hide"
        )


def head_dim_not_built(spec: Spec, head_dim: int, holder: str) -> str:
    """The problem of a bench shape or tuned entry (holder) at a head dim the spec does not build,
    with both fixes."""
    return (f"must be one of attention.head_dims {echo(spec.attention.head_dims)} "
            f"(got {head_dim}); remove this {holder}, or add {head_dim} to attention.head_dims")


def bench_head_dims_built(spec: Spec):
    for i, shape in enumerate(spec.bench.shapes):
        if shape.head_dim not in spec.attention.head_dims:
            yield f"bench.shapes.{i}.head_dim", head_dim_not_built(spec, shape.head_dim, "shape")


def shared_smem_limit(blocks_per_sm: int) -> int:
    """What each of blocks_per_sm blocks sharing an SM may hold of its 228 KB of shared memory
    (each block reserves 1 KB)."""
    return (228 - blocks_per_sm) // blocks_per_sm * 1024


def smem_problems(phase: str, tiling: GemmTiling, head_dims, causal: bool = False) -> Iterator[str]:
    """Why the fwd/bwd kernel of `tiling` does not fit shared memory at one of `head_dims` (half
    an SM's with blocks_per_sm = 2); with causal, a forward tiling is also the paired causal
    forward's (smem_bytes)."""
    for dim in head_dims:
        kernels = [(smem_bytes(phase, tiling, dim), "")]
        if phase == "fwd" and causal:
            kernels.append((smem_bytes(phase, tiling, dim, paired=True), " (the paired causal forward)"))
        for need, which in kernels:
            at = f" at head_dim {dim}{which}"
            if problem := over_smem_limit(need, at, "block_m, block_n or num_stages"):
                yield problem
                break
            blocks = getattr(tiling, "blocks_per_sm", 1)
            if blocks > 1 and need > shared_smem_limit(blocks):
                yield (f"needs about {need // 1024} KB of shared memory{at}, over the "
                       f"{shared_smem_limit(blocks) // 1024} KB each of {blocks} blocks an SM may "
                       f"hold (blocks_per_sm = {blocks}); lower block_m, block_n or num_stages, "
                       "or blocks_per_sm")
                break


# The registers a consumer thread has at three or four blocks an SM: ptxas builds the whole
# kernel to its launch share (80 or 64), whatever the consumers' later raise (H100 tune run of
# session 30: C7602 "insufficient registers" at 80 wherever the tiles need more).
MANY_BLOCKS_ACCUMULATOR_REGISTERS = 64


def register_problems(tiling: GemmTiling, head_dims) -> Iterator[str]:
    """Why a forward on three or four blocks an SM does not build at one of head_dims: its fp32
    score and output accumulators, block_m x (block_n + head_dim) over the threads, past
    MANY_BLOCKS_ACCUMULATOR_REGISTERS a thread (64x64 at head_dim 64 is 64: it builds without
    spilling; 64x32 at 128 is 80: it does not build)."""
    blocks = getattr(tiling, "blocks_per_sm", 1)
    if blocks < 3:
        return
    for dim in head_dims:
        need = tiling.block_m * (tiling.block_n + dim) // tiling.threads
        if need > MANY_BLOCKS_ACCUMULATOR_REGISTERS:
            yield (f"blocks_per_sm = {blocks} leaves a thread {MANY_BLOCKS_ACCUMULATOR_REGISTERS} "
                   f"registers for its accumulators; {tiling.block_m}x{tiling.block_n} tiles at "
                   f"head_dim {dim} need {need}: lower block_n, or blocks_per_sm = 2")
            return


def warpgroup_problems(tiling: GemmTiling) -> Iterator[tuple[str, str]]:
    """(key below the tiling table, problem) of threads that TileLang cannot lay out."""
    if threads_problem := not_whole_warpgroups(tiling.threads):
        yield ".threads", threads_problem
    elif not warpgroup_rows_fit(tiling):
        groups = tiling.threads // 128
        yield "", (
            f"block_m = {tiling.block_m} over {tiling.threads} threads has no TileLang "
            f"layout: use block_m = 64 * threads / 128 (= {64 * groups}), or threads = 128 "
            "with block_m >= 64"
        )


def overlap_problems(tiling: GemmTiling) -> Iterator[tuple[str, str]]:
    """(key, problem) of an overlapped forward outside what it was built and checked for: two
    consumer warpgroups (each issues its own async GEMMs) fed by a TMA pipeline. A bwd tiling
    (no overlap key) has none."""
    if getattr(tiling, "overlap", False) and (tiling.threads != 256 or tiling.num_stages < 1):
        yield ".overlap", (
            "overlap = true needs threads = 256 and num_stages >= 1 (two consumer warpgroups "
            f"fed by the pipelined loads; got threads = {tiling.threads}, num_stages = "
            f"{tiling.num_stages}): set them, or overlap = false")


def pingpong_problems(tiling: GemmTiling) -> Iterator[tuple[str, str]]:
    """(key, problem) of a ping-pong forward outside what it was built for: two consumer
    warpgroups of 64 query rows fed by a pipeline of at least one stage, its own schedule (not
    also overlap). A bwd tiling (no pingpong key) has none."""
    if getattr(tiling, "pingpong", False) and (
            tiling.threads != 256 or tiling.block_m != 128 or tiling.num_stages < 1
            or getattr(tiling, "overlap", False)):
        yield ".pingpong", (
            "pingpong = true needs block_m = 128, threads = 256, num_stages >= 1 and overlap = "
            "false (two consumer warpgroups of 64 query rows, each with the overlapped schedule "
            f"built in; got block_m = {tiling.block_m}, threads = {tiling.threads}, num_stages = "
            f"{tiling.num_stages}, overlap = {echo(getattr(tiling, 'overlap', False))}): set "
            "them, or pingpong = false")


def blocks_problems(tiling: GemmTiling) -> Iterator[tuple[str, str]]:
    """(key, problem) of two blocks an SM outside what their register split is for: one consumer
    warpgroup beside TileLang's producer (pipelined loads)."""
    blocks = getattr(tiling, "blocks_per_sm", 1)
    if blocks > 1 and (tiling.threads != 128 or tiling.num_stages < 1):
        yield ".blocks_per_sm", (
            f"blocks_per_sm = {blocks} needs threads = 128 and num_stages >= 1 (one consumer "
            "warpgroup beside the producer of the pipelined loads: such blocks share an SM's "
            f"registers; got threads = {tiling.threads}, num_stages = {tiling.num_stages}): set "
            "them, or blocks_per_sm = 1")


def tiling_problems(phase: str, tiling: GemmTiling, head_dims, causal: bool = False
                    ) -> list[tuple[str, str]]:
    """Every problem of one fwd/bwd tiling, as (key below its table, message): what the spec's
    rules report and what `opgen tune` filters its candidates with. causal: the tiling also
    serves causal calls."""
    return [("", p) for p in smem_problems(phase, tiling, head_dims, causal)] + list(
        warpgroup_problems(tiling)) + list(overlap_problems(tiling)) + list(
        pingpong_problems(tiling)) + list(blocks_problems(tiling)) + [
        (".blocks_per_sm", p) for p in register_problems(tiling, head_dims)]


def tiles_fit_shared_memory(spec: Spec):
    # Causal calls take the base tiling at every head dim without a tuned causal entry for every
    # window (both masks are built, whatever the `causal` default).
    tuned_causal = {(e.head_dim, phase) for e in spec.tiling.tuned if e.causal and not e.max_window
                    for phase in TUNED_PHASES if getattr(e, phase) is not None}
    for phase in TUNED_PHASES:
        tiling, dims = getattr(spec.tiling, phase), spec.attention.head_dims
        causal_dims = [d for d in dims if (d, phase) not in tuned_causal]
        problems = dict.fromkeys([*smem_problems(phase, tiling, dims),
                                  *smem_problems(phase, tiling, causal_dims, causal=True)])
        for problem in problems:
            yield f"tiling.{phase}", problem


def base_tiling_problems(spec: Spec,
                         problems_of: Callable[[GemmTiling], Iterator[tuple[str, str]]]):
    """(field, problem) of problems_of's verdict on the base fwd and bwd tilings."""
    for phase in TUNED_PHASES:
        for key, problem in problems_of(getattr(spec.tiling, phase)):
            yield f"tiling.{phase}{key}", problem


def tiles_fill_warpgroups(spec: Spec):
    yield from base_tiling_problems(spec, warpgroup_problems)


def fwd_overlap_fits(spec: Spec):
    yield from base_tiling_problems(spec, overlap_problems)  # a bwd tiling has no overlap


def fwd_pingpong_fits(spec: Spec):
    yield from base_tiling_problems(spec, pingpong_problems)  # a bwd tiling has no pingpong


def blocks_per_sm_fits(spec: Spec):
    yield from base_tiling_problems(spec, blocks_problems)
    for problem in register_problems(spec.tiling.fwd, spec.attention.head_dims):
        yield "tiling.fwd.blocks_per_sm", problem


def tuned_tilings_fit(spec: Spec):
    """[[tiling.tuned]] entries: a built head dim, one entry per (head_dim, causal, max_window),
    a max_window only on causal entries of a sliding-window spec whose tests run a window that
    short, and tilings under the rules of the base tiling, at that head dim."""
    seen = set()
    for i, entry in enumerate(spec.tiling.tuned):
        where = f"tiling.tuned.{i}"
        if entry.head_dim not in spec.attention.head_dims:
            yield f"{where}.head_dim", head_dim_not_built(spec, entry.head_dim, "entry")
        if tuned_key(entry) in seen:
            window = f", max_window = {entry.max_window}" if entry.max_window else ""
            yield where, (f"repeats head_dim = {entry.head_dim}, causal = {echo(entry.causal)}"
                          f"{window}: one entry per (head_dim, causal, max_window)")
        seen.add(tuned_key(entry))
        if entry.max_window:
            if not (spec.attention.sliding_window and entry.causal):
                yield f"{where}.max_window", ("needs attention.sliding_window = true and "
                                              "causal = true (sliding-window calls are causal)")
            elif not any(w <= entry.max_window for w in spec.test.windows):
                yield f"{where}.max_window", (
                    f"list a test window of at most {entry.max_window} in test.windows, so that "
                    f"the generated tests run this tiling (got {echo(spec.test.windows)})")
        if entry.fwd is None and entry.bwd is None:
            yield where, "give fwd, bwd or both (a tiling table each)"
        for phase in TUNED_PHASES:
            tiling = getattr(entry, phase)
            if tiling is not None:
                for key, problem in tiling_problems(phase, tiling, (entry.head_dim,), entry.causal):
                    yield f"{where}.{phase}{key}", problem


# The attention rules, in the order their problems are reported (after the shared ones).
RULES = (
    grad_reductions_allowed,
    tested_kv_heads_fit,
    gqa_tests_a_grouped_shape,
    tested_windows_cover_the_blocks,
    bench_shapes_fit_the_variant,
    layouts_and_head_dims_listed_once,
    tested_shapes_have_a_tail,
    bench_head_dims_built,
    tiles_fit_shared_memory,
    tiles_fill_warpgroups,
    fwd_overlap_fits,
    fwd_pingpong_fits,
    blocks_per_sm_fits,
    tuned_tilings_fit,
)


Spec = family_spec(
    "attention", RULES, attention=AttentionSection, grads=AttentionGrads, saved=AttentionSaved,
    tiling=DEFAULT_TILING,
    # [[tiling.tuned]]: tilings per (head_dim, causal, max_window), written by `opgen tune`. Left
    # out of the spec's hash when empty, so a spec without it hashes as before the key existed.
    tiling_keys={"tuned": (tuple[TunedTiling, ...], Field((), exclude_if=lambda v: not v))},
    # windows: the sliding windows to test (attention.sliding_window).
    test=TestSection.of(AttentionTestShape, DEFAULT_TEST_SHAPES,
                        windows=(tuple[PositiveInt, ...], ())),
    bench=BenchSection.of(AttentionBenchShape, DEFAULT_BENCH_SHAPES, "float16"),
)


def warpgroup_rows_fit(tiling: GemmTiling) -> bool:
    """Whether TileLang 0.1.15 finds one fragment layout for the [block_m, block_n] score tile of
    the fwd/bwd kernels: each of the threads / 128 warpgroups takes 64 rows, or a lone warpgroup
    takes block_m >= 64 rows. Found by compiling every block_m (32-256) x block_n (16-128) x
    threads (128-512) of both kernels; every other pair fails layout inference
    (docs/compile-sweeps/)."""
    groups = tiling.threads // 128
    return tiling.block_m == 64 * groups or (groups == 1 and tiling.block_m >= 64)


def smem_bytes(phase: str, tiling: GemmTiling, dim: int, paired: bool = False) -> int:
    """Shared memory of the fwd/bwd kernel (16-bit operands): an upper bound of what TileLang
    allocates, the compile check reads the real number.

    Pipelined tiles are held once per stage; every buffer is counted rounded up to 1 KiB (TileLang
    aligns TMA and swizzled buffers; small lse/Delta vectors grow when seq_len is block-aligned);
    in bwd the dK/dV staging buffers reuse the loop's space after the loop. fwd is the unpaired
    forward (O staged in Q's tile); with paired, the paired causal forward of the same tiling
    (its block_n capped, paired_block_n), which loads Q with every key step (so holds it per stage)
    and stages O in a tile of its own.
    """
    elem = DTYPE_BYTES["float16"]
    stages = max(1, tiling.num_stages)
    m, n = tiling.block_m, paired_block_n(tiling.block_n) if paired else tiling.block_n
    if phase == "fwd":
        q_tiles = stages + 1 if paired else 1  # paired: Q per stage, and O's own tile
        return q_tiles * whole_kib(elem * m * dim) + 2 * whole_kib(elem * stages * n * dim)
    loop = (2 * whole_kib(elem * m * dim) + 2 * whole_kib(elem * stages * n * dim)
            + whole_kib(elem * m * n) + 2 * whole_kib(4 * stages * n))
    if getattr(tiling, "bulk_dq", False):
        loop += whole_kib(4 * n * dim)  # the staged fp32 dQ tile
    epilogue = 2 * whole_kib(elem * m * dim)
    return max(loop, epilogue)


@dataclass(frozen=True)
class TestCase:
    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int

    @property
    def id(self) -> str:
        return f"b{self.batch}-h{self.heads}-kv{self.kv_heads}-s{self.seq_len}-d{self.head_dim}"


@dataclass(frozen=True)
class MaskCase:
    id: str
    causal: bool
    window: int | None


@dataclass(frozen=True)
class HfCase:
    """The tiny random-init transformers model of the generated hf.py tests, built from a config
    (no download): gpt-oss (sinks as `s_aux`, a sliding window on every other layer) for a package
    with sinks, Llama (causal GQA) for one without."""

    model: str  # "gpt_oss" or "llama"
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None  # gpt-oss's sliding layers; None: every layer full
    batch: int
    seq_len: int  # above the window, not a multiple of any block
    dtype: str  # the 16-bit dtype of the model (or of autocast around a float32 one)


@dataclass(frozen=True, kw_only=True)
class Plan(PlanBase):
    layouts: tuple[str, ...]
    default_layout: str
    layout_dims: dict[str, str]  # layout -> "[batch, seq_len, heads, head_dim]"
    layout_doc: str
    head_dims: tuple[int, ...]
    causal_default: bool
    gqa: bool
    sinks: bool
    sinks_dtype_expr: str  # the sinks' dtype in docs and tests, as code: torch.float32, or dtype (q's)
    sliding_window: bool
    tensor_inputs: tuple[str, ...]  # q, k, v (, sinks)
    params: str  # the public function's parameters, with defaults
    apply_args: str  # what the public function passes to check_inputs and apply_op
    grad_returns: str  # what the autograd backward returns: one gradient (or None) per op arg
    call_kwargs: str  # how the generated tests pass causal (and window) and layout
    # The spec's dK/dV reductions; a runtime shape with one query head per KV head writes directly.
    dk_reduction: ReductionKind
    dv_reduction: ReductionKind
    recompute_forward: bool  # backward reruns the forward kernel for O and/or lse
    recompute_targets: tuple[str, ...]  # how backward unpacks the rerun forward's (O, lse)
    mask_cases: tuple[MaskCase, ...]
    # The smallest test window (sliding-window specs): where the forward may walk several query
    # heads per block, which its own test forces.
    short_window: int | None
    # attention_launch.py's rules, as kernels.py holds them (the second only with windows)
    paired_forward_code: str
    short_window_code: str
    gqa_case: TestCase | None  # a grouped shape for the atomic-vs-deterministic checks
    # The deterministic grouped dK/dV reductions the package builds, each tested against atomic.
    deterministic_reductions: tuple[str, ...]
    atomic_case: TestCase  # the shape of the atomic double-run check (grouped if any)
    smem: dict[str, dict[int, int]]  # phase -> head_dim -> bytes (estimate)
    bench_cases: tuple[FlopsBenchCase, ...]
    # [[tiling.tuned]] as printed: kernel key -> {(head_dim, causal, max_window): tiling}, only
    # for the phases that have entries (kernels.py prints each as <KEY>_TILINGS), the expression
    # variant_calls picks each phase's tiling with, and the code of tuned_tiling (kernels.py's
    # copy of the rule).
    tuned: dict[str, dict[tuple[int, bool, int], dict[str, int]]]
    tiling_exprs: dict[str, str]
    tuned_tiling_code: str
    dq_accumulator_code: str
    launch_order_code: str

    def tiling_for(self, key: str, head_dim: int, causal: bool,
                   window: int | None = None) -> dict[str, int]:
        """The tiling kernel `key` launches with at (head_dim, causal, window)."""
        return tuned_tiling(self.tuned.get(key, {}), self.kernels[key].tiling, head_dim, causal,
                            window)
    # hf.py: the layout it passes transformers' [batch, heads, seq_len, head_dim] views in (bshd,
    # the transposed view, where the package has it: its output is the [batch, seq_len, heads,
    # head_dim] transformers wants), and the model its tests run.
    hf_layout: str
    hf_case: HfCase


# The benchmark's --sweep: the first bench shape at these sequence lengths (its batch, heads and
# head dim; five points, each a FlexAttention compile).
SEQ_LEN_SWEEP = (1024, 2048, 4096, 8192, 16384)
# The hf tests' sequence length: past the smallest test window and every block size, a multiple
# of none of them (a tail block).
HF_SEQ_LEN = 200
BENCH_FIELDS = ("batch", "heads", "kv_heads", "seq_len", "head_dim", "causal", "window")


def bench_case(s: AttentionBenchShape) -> FlopsBenchCase:
    """One bench shape with the FLOPs its TF/s divide by (bwd = 2.5 x fwd: 5 GEMMs vs 2)."""
    fwd = flops_fwd(s.batch, s.heads, s.seq_len, s.head_dim, s.causal, s.window)
    return FlopsBenchCase((s.batch, s.heads, s.kv_heads or s.heads, s.seq_len, s.head_dim,
                           s.causal, s.window), fwd, flops_bwd(fwd))


def visible_pairs(seq_len: int, causal: bool, window: int | None) -> int:
    """(query, key) pairs that attention computes: the FLOP count is 4 * D per pair per head."""
    if window:
        w = min(window, seq_len)
        return w * (w + 1) // 2 + (seq_len - w) * w
    return seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len


def flops_fwd(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool,
              window: int | None = None) -> int:
    """Two GEMMs (Q K^T and P V) of 2 * D FLOPs per visible pair; bwd is 2.5x this."""
    return 4 * batch * heads * head_dim * visible_pairs(seq_len, causal, window)


def flops_bwd(fwd: int) -> int:
    """dS, dP, dV, dK and dQ: 5 GEMMs to the forward's 2."""
    return fwd * 5 // 2


def plan(spec: Spec, source: SourceInfo) -> Plan:
    t = spec.tiling
    section = spec.attention
    chosen = reductions(spec)

    def kernel(key, factory, phase, summary, grid, tiling, out_idx):
        return kernel_plan(spec.name, key, factory, phase, summary, grid, tiling, out_idx)

    sink_arg = 1 if section.sinks else 0
    kernels = {
        "fwd": kernel("fwd", "fwd", "fwd",
                      "O = softmax(Q K^T * scale) V and the row log-sum-exp (log2 domain)"
                      + (", sinks in every row's denominator" if section.sinks else ""),
                      "(ceildiv(seq_len, block_m), heads, batch); causal: the first two swapped and "
                      "the longest query blocks first (heads fastest: every head's longest block "
                      "launches first), or at most PAIRED_MAX_QUERY_BLOCKS of them paired: "
                      "(ceildiv(n, 2), heads, batch)"
                      + ("; a short window: heads // heads_per_block" if section.sliding_window else ""),
                      t.fwd, (3 + sink_arg, 4 + sink_arg)),
        "preprocess": kernel("preprocess", "bwd_preprocess", "bwd_preprocess",
                             "Delta = rowsum(O * dO); zeroes the fp32 atomic targets of the bwd kernel",
                             "(ceildiv(seq_len, block_m), heads, batch)", t.preprocess, (2,)),
        "bwd": kernel("bwd", "bwd", "bwd",
                      f"dQ by fp32 atomics (bulk_dq: {DQ_TILE}-row tiles staged in shared memory, "
                      "added by bulk reduce-adds); dK, dV per query head, written, split or atomically added, "
                      "or per KV head summed over its group in the block (in_block)",
                      "(ceildiv(seq_len, block_m), heads (kv_heads with in_block dK/dV), batch); causal: "
                      "the first two swapped (heads fastest: the longest blocks launch first)",
                      t.bwd, None),
        "postprocess": kernel("postprocess", "bwd_postprocess", "bwd_postprocess",
                              "scale the fp32 dQ accumulator (laid out as the bwd kernel wrote it: by "
                              f"fragments, or by {DQ_TILE}-row tiles with bulk_dq) by softmax_scale, "
                              "which the bwd kernel's dS leaves out, and cast it to the input dtype; "
                              "split or atomic dK/dV: finished from their fp32 buffers too",
                              "(ceildiv(seq_len, block_m), heads (+ kv_heads: split or atomic dK/dV), batch)",
                              t.postprocess, (1,)),
    }
    if section.sinks:
        kernels["dsinks"] = kernel("dsinks", "bwd_dsinks", "bwd_param",
                                   "dsinks = sum over batch and rows of -exp(sink - lse) * Delta, "
                                   "in a fixed order", "(heads,)", t.dsinks, (3,))

    tuned = tuned_tables(spec)
    tiling_exprs = {
        key: (f"tuned_tiling({k.tiling_name}S, {k.tiling_name}, head_dim, causal, window)"
              if key in tuned else k.tiling_name)
        for key, k in kernels.items()
    }

    notes = {
        "atomic": "fp32 atomics into a buffer the preprocess zeroes, then the postprocess cast",
        "split": "one fp32 partial per query head of a group, summed by the postprocess in a fixed order",
        "in_block": "one block per (KV head, KV block) walks every query head of its group, "
                    "summing in registers in a fixed order; written once",
        "direct": "written once by its KV block",
    }
    grads = [
        GradPlan("dq", "q", chosen["dq"],
                 "fp32 atomics (or bulk reduce-adds of shared-memory tiles: bulk_dq) from every KV "
                 "block into a buffer the preprocess zeroes, then the postprocess cast"),
    ]
    for grad, inp in (("dk", "k"), ("dv", "v")):
        grads.append(GradPlan(grad, inp, chosen[grad], notes[chosen[grad]]))
    if section.sinks:
        grads.append(GradPlan("dsinks", "sinks", chosen["dsinks"],
                              "per-row terms summed over batch and rows by one block per head"))

    tensor_inputs = ("q", "k", "v", "sinks") if section.sinks else ("q", "k", "v")
    # The ops always take a window (0 when the spec has no sliding window), so their signatures
    # have one fixed shape; the public function exposes only what the spec enables.
    params = [*tensor_inputs, f"causal={section.causal}"]
    if section.sliding_window:
        params.append("window=None")
    params += [f'layout="{section.layouts[0]}"', "*", "softmax_scale=None"]
    window_arg = "window" if section.sliding_window else "None"
    grad_names = [g.grad for g in grads]

    recomputed = tuple(n for n in ("o", "lse") if getattr(spec.saved, n) == "recompute")
    saved = tensor_inputs + tuple(n for n in ("o", "lse") if n not in recomputed)

    test_cases = tuple(
        TestCase(s.batch, s.heads, s.kv_heads or s.heads, s.seq_len, d)
        for s, d in itertools.product(spec.test.shapes, section.head_dims)
    )
    mask_cases = [MaskCase("full", False, None), MaskCase("causal", True, None)]
    mask_cases += [MaskCase(f"causal-w{w}", True, w) for w in spec.test.windows]
    gqa_case = next((c for c in test_cases if c.kv_heads != c.heads), None)
    first = spec.bench.shapes[0]  # the sweep's other dims

    # dV and dK (direct or per-group) before dQ (atomics); extra parameters last.
    grad_check_order = (("dV", "v"), ("dK", "k"), ("dQ", "q")) + (
        (("dsinks", "sinks"),) if section.sinks else ()
    )

    return Plan(
        **base_fields(spec, source),
        layouts=section.layouts,
        default_layout=section.layouts[0],
        layout_dims={layout: LAYOUT_DIMS[layout] for layout in section.layouts},
        layout_doc="; ".join(f"{LAYOUT_DIMS[layout]} for layout {layout!r}" for layout in section.layouts),
        head_dims=section.head_dims,
        causal_default=section.causal,
        gqa=section.gqa,
        sinks=section.sinks,
        sinks_dtype_expr="torch.float32" if section.sinks_dtype == "float32" else "dtype",
        sliding_window=section.sliding_window,
        tensor_inputs=tensor_inputs,
        params=", ".join(params),
        apply_args=", ".join([*tensor_inputs, "causal", window_arg, "layout", "softmax_scale"]),
        grad_returns=", ".join([*grad_names, "None", "None", "None", "None"]),
        call_kwargs=", ".join(
            ["causal=causal", *(["window=window"] if section.sliding_window else []), "layout=layout"]
        ),
        grad_check_order=grad_check_order,
        kernels=kernels,
        grads=tuple(grads),
        dk_reduction=chosen["dk"],
        dv_reduction=chosen["dv"],
        saved=saved,
        recompute_forward=bool(recomputed),
        recomputed=recomputed,
        recompute_targets=tuple(n if n in recomputed else "_" for n in ("o", "lse")),
        test_cases=test_cases,
        mask_cases=tuple(mask_cases),
        short_window=min(spec.test.windows) if section.sliding_window else None,
        paired_forward_code=launch_code("paired causal forward"),
        short_window_code=launch_code("short windows") if section.sliding_window else "",
        gqa_case=gqa_case,
        deterministic_reductions=tuple(m for m in grouped_modes(chosen) if m != "atomic"),
        atomic_case=gqa_case or test_cases[0],
        compile_jobs=_compile_jobs(spec, kernels, tuned, chosen, test_cases, mask_cases),
        smem={
            phase: {d: smem_bytes(phase, getattr(t, phase), d) for d in section.head_dims}
            for phase in ("fwd", "bwd")
        },
        bench_cases=tuple(bench_case(s) for s in spec.bench.shapes),
        hf_layout="bshd" if "bshd" in section.layouts else "bhsd",
        hf_case=HfCase(
            model="gpt_oss" if section.sinks else "llama", heads=4, kv_heads=2 if section.gqa else 4,
            head_dim=section.head_dims[0],
            window=min(spec.test.windows) if section.sinks and section.sliding_window else None,
            batch=2, seq_len=HF_SEQ_LEN,
            dtype="bfloat16" if "bfloat16" in spec.dtypes else spec.dtypes[0]),
        bench_fields=BENCH_FIELDS,
        tuned=tuned,
        tiling_exprs=tiling_exprs,
        tuned_tiling_code=launch_code("tuned tilings"),
        dq_accumulator_code=launch_code("dq accumulator"),
        launch_order_code=launch_code("launch order"),
        bench_unit="TFLOP/s",
        sweep=Sweep("seq_len", "sequence length", SEQ_LEN_SWEEP, tuple(
            bench_case(first.model_copy(update={"seq_len": n})) for n in SEQ_LEN_SWEEP)),
    )


def launch_code(section: str) -> str:
    """The code of attention_launch.py in a section (`# >>> section` to `# <<<`), as kernels.py
    holds it."""
    source = Path(attention_launch.__file__).read_text(encoding="utf-8")
    start = source.index(f"# >>> {section}\n") + len(f"# >>> {section}\n")
    return source[start:source.index("# <<<", start)].strip("\n")


# The SMs `opgen explain` assumes for the grids that depend on the GPU (an H100 or H200 SXM): it
# runs without one.
EXPLAIN_SM_COUNT = 132


def default_softmax_scale(head_dim: int) -> float:
    """1 / sqrt(head_dim), as the generated kernels.py computes it (`default_softmax_scale`): the
    scale the generated function uses when the caller gives none, and the one compile-checked."""
    return (1.0 / head_dim) ** 0.5


def tuned_tables(spec: Spec) -> dict[str, dict[tuple[int, bool, int], dict[str, int]]]:
    """[[tiling.tuned]] by phase: {(head_dim, causal, max_window): tiling}, sorted, phases
    without entries left out."""
    return plan_tuned_tables(spec.tiling.tuned, tuned_key, TUNED_PHASES)


def grouped_modes(chosen: dict[str, str]) -> tuple[str, ...]:
    """The grouped dK/dV reductions a GQA package builds: atomic and split (the generated tests
    compare them), and the spec's choice."""
    return tuple(sorted({"atomic", "split", chosen["dk"], chosen["dv"]}))


def _compile_jobs(spec, kernels, tuned, chosen, test_cases, mask_cases) -> tuple[CompileJob, ...]:
    """Every kernel variant the package launches: per layout, dtype and head dim, each mask mode,
    and the bwd dK/dV modes (MHA shapes write directly; grouped shapes use the spec's reduction,
    and the generated tests also run the other one)."""
    section = spec.attention
    groups = sorted({c.heads // c.kv_heads for c in test_cases})
    bwd_modes = [(1, "direct", "direct")]  # one query head per KV head
    if section.gqa:
        g = max(groups) if max(groups) > 1 else 2
        bwd_modes += sorted({(g, chosen["dk"], chosen["dv"]), *((g, m, m) for m in grouped_modes(chosen))})
    jobs = []
    for layout, dtype, dim in itertools.product(section.layouts, spec.dtypes, section.head_dims):
        tag = f"{layout} {dtype} d{dim}"
        bulk_dq = set()  # the dQ layouts (bulk_dq or not) of this head dim's bwd kernels
        # The default scale: another scale is another constant in the same code.
        scale = default_softmax_scale(dim)
        for mask in mask_cases:
            window = mask.window or 0

            def tiling(key):
                return tuned_tiling(tuned.get(key, {}), kernels[key].tiling, dim, mask.causal,
                                    window)

            k = kernels["fwd"]
            jobs.append(CompileJob(k.factory, (1, 1, dim, mask.causal, window, layout, dtype, scale),
                                   tiling("fwd"), f"fwd {tag} {mask.id}"))
            if has_paired_forward(mask.causal, window):
                # The paired forward short causal calls run (the package's variant_calls).
                jobs.append(CompileJob(k.factory, (1, 1, dim, mask.causal, window, layout, dtype, scale),
                                       paired_tiling(tiling("fwd")), f"fwd pairs {tag} {mask.id}"))
            k = kernels["bwd"]
            bulk_dq.add(tiling("bwd").get("bulk_dq", False))
            for g, dk, dv in bwd_modes:
                modes = f"groups={g} dk={dk} dv={dv}"
                jobs.append(CompileJob(
                    k.factory, (g, 1, dim, mask.causal, window, layout, dtype, scale, dk, dv),
                    tiling("bwd"), f"bwd {tag} {mask.id} {modes}"))
        # The preprocess zeroes, and the postprocess finishes, the dK/dV buffers of each mode; the
        # postprocess reads dQ in the layout of the bwd kernel that wrote it.
        for g, dk, dv in bwd_modes:
            modes = f"groups={g} dk={dk} dv={dv}"
            k = kernels["preprocess"]
            jobs.append(CompileJob(k.factory, (g, 1, dim, layout, dtype, dk, dv), k.tiling,
                                   f"{k.phase} {tag} {modes}"))
            k = kernels["postprocess"]
            for bulk in sorted(bulk_dq):
                jobs.append(CompileJob(k.factory, (g, 1, dim, layout, dtype, scale, dk, dv),
                                       postprocess_tiling(k.tiling, bulk),
                                       f"{k.phase} {tag} {modes}" + (" bulk_dq" if bulk else "")))
    if "dsinks" in kernels:
        k = kernels["dsinks"]
        jobs.append(CompileJob(k.factory, (1,), k.tiling, "bwd_dsinks"))
    return tuple(jobs)


# Every backward buffer is allocated empty: the preprocess zeroes the fp32 atomic targets for the
# rows it covers (no fill launch), and the split partials and direct gradients are written once.
BUFFERS = {
    "atomic": "fp32 atomic target (torch.empty, zeroed by the preprocess)",
    "split": "fp32 partials, summed by the postprocess (torch.empty)",
    "in_block": "the gradient, written once (torch.empty)",
    "direct": "written once (torch.empty)",
}


def explain(p: Plan, shape: dict[str, Any]) -> list[Table]:
    """The plan for one runtime shape, as titled tables: kernels and grids, saved tensors and
    their bytes, fp32 atomic targets, split reductions, FLOPs."""
    b, h, s, d = shape["batch"], shape["heads"], shape["seq_len"], shape["head_dim"]
    # A bench shape without kv_heads holds None: one KV head per query head. A given value (0
    # too) is the user's and goes to the shape check.
    kv = h if shape.get("kv_heads") is None else shape["kv_heads"]
    causal, window = shape.get("causal", p.causal_default), shape.get("window")
    dtype = shape.get("dtype", p.dtypes[0])
    _check_shape(p, b, h, kv, s, d, causal, window, dtype)
    elem = DTYPE_BYTES[dtype]
    groups = h // kv

    def blocks(key):
        return ceildiv(s, p.tiling_for(key, d, causal, window)["block_m"])

    fwd_tiling = p.tiling_for("fwd", d, causal, window)
    bwd_tiling = p.tiling_for("bwd", d, causal, window)
    fwd_blocks = ceildiv(s, fwd_tiling["block_m"])
    # A short causal grid pairs query blocks i and n - 1 - i in one block; at a short window a
    # block walks several query heads.
    paired = pairs_query_blocks(causal, window, s, fwd_tiling["block_m"])
    walks = bool(window) and walks_heads(window, fwd_tiling["block_m"], fwd_tiling["block_n"])
    walked = heads_per_block(b, h, s, fwd_tiling, EXPLAIN_SM_COUNT) if walks else 1
    # The paired and head-walking forward kernels launch their own grids; the main one
    # launch_grid's.
    if paired:
        fwd_grid = (ceildiv(fwd_blocks, 2), h, b)
    elif walks:
        fwd_grid = (fwd_blocks, h // walked, b)
    else:
        fwd_grid = (*launch_grid(causal, fwd_blocks, h), b)
    grids = {
        "fwd": fwd_grid,
        "preprocess": (blocks("preprocess"), h, b),
        "bwd": (*launch_grid(causal, blocks("bwd"),
                          kv if groups > 1 and p.dk_reduction == "in_block" else h), b),
        # Grouped KV heads: kv more blocks finish dK and dV, unless the bwd kernel wrote them.
        "postprocess": (blocks("postprocess"),
                        h + kv if groups > 1 and p.dk_reduction != "in_block" else h, b),
        "dsinks": (h,),
    }
    sizes = {"q": b * h * s * d * elem, "k": b * kv * s * d * elem, "v": b * kv * s * d * elem,
             "sinks": h * (4 if p.sinks_dtype_expr == "torch.float32" else elem),
             "o": b * h * s * d * elem, "lse": b * h * padded_rows(s) * 4}
    reductions = []
    for g in p.grads:
        mode = g.reduction if groups > 1 or g.grad in ("dq", "dsinks") else "direct"
        if g.grad == "dq":
            size = b * h * padded_rows(s) * d * 4
        elif g.grad == "dsinks":
            size = h * 4
        else:
            size = b * kv * s * d * {"atomic": 4, "split": 4 * groups, "in_block": elem,
                                     "direct": elem}[mode]
        reductions.append([g.grad, mode, BUFFERS[mode] if g.grad != "dsinks" else "fp32 sums",
                           format_bytes(size), g.note])
    fwd = flops_fwd(b, h, s, d, causal, window)
    return explain_tables(
        p, (f"batch={b} heads={h} kv_heads={kv} seq_len={s} head_dim={d} causal={causal} "
            f"window={window} dtype={dtype} (groups={groups})"),
        grids, sizes, "recomputed in backward (forward kernel rerun)",
        ("gradient reductions", [["grad", "reduction", "buffer", "bytes", "why"], *reductions]),
        flops_table(fwd, "4 * B * H * D * visible (query, key) pairs",
                    flops_bwd(fwd), "2.5 x forward (5 GEMMs vs 2)"),
        tilings={**{key: p.tiling_for(key, d, causal, window) for key in p.kernels},
                 "fwd": paired_tiling(fwd_tiling) if paired else fwd_tiling,
                 "postprocess": postprocess_tiling(p.tiling_for("postprocess", d, causal, window),
                                                   bwd_tiling.get("bulk_dq", False))},
    )


def _check_shape(p: Plan, b, h, kv, s, d, causal, window, dtype) -> None:
    """What the generated op's input checks would reject, as an explain error."""
    problems = []
    small = [f"{key} must be >= 1 (got {value})"
             for key, value in (("batch", b), ("heads", h), ("kv_heads", kv), ("seq_len", s))
             if value < 1]
    if small:
        problems += small
    elif h % kv or (kv != h and not p.gqa):
        problems.append(f"kv_heads ({kv}) must divide heads ({h})"
                        + ("" if p.gqa else " and equal it: the spec has no attention.gqa"))
    if d not in p.head_dims:
        problems.append(f"head_dim must be one of {list(p.head_dims)} (got {d})")
    if window is not None and not (p.sliding_window and causal and window >= 1):
        problems.append("window needs attention.sliding_window = true, causal=1 and window >= 1")
    refuse_shape(p, dtype, problems)


FAMILY = Family(
    Spec, plan, explain, SCAFFOLDS,
    description=("flash attention: MHA, GQA/MQA (dK/dV atomic, split or in_block), learnable sinks, sliding "
                 "window; fwd, Delta preprocess, bwd, dQ cast, dsinks"),
    shape_keys=("batch", "heads", "kv_heads", "seq_len", "head_dim", "causal", "window", "dtype"),
    optional_shape_keys=("kv_heads", "causal", "window", "dtype"),
    # The Hugging Face transformers hookup: register() as an attention implementation.
    extra_outputs={"hf.py": "hf.py.jinja"},
    tuner_module="opgen.families.attention_tune",
)
