"""Causal linear attention without normalisation, forward and backward (one monolithic backward
kernel; a gradient summed over several tiles is an fp32 atomic target).

    O_t = scale * sum_{s <= t} (q_t . k_s) v_s

q, k are [B, S, H, Dk], v is [B, S, H, Dv] (layout bshd), fp16 or bf16; every product accumulates
in fp32. Both kernels walk the sequence in chunks of `chunk` rows with a running state:

- forward, one block per (batch x head, Dv tile), all of Dk: per chunk O = mask(Q K^T) V + Q S,
  then S += K^T V (S [Dk, Dv tile] in fp32 registers). Each O element is written once.
- backward, one block per (batch x head, Dk tile, Dv tile): a forward loop gives dQ = mask(dO V^T)
  K + dO S^T with S^T += V^T K; a reverse loop gives dK = mask'(V dO^T) Q + V dS^T and dV =
  mask'(K Q^T) dO + K dS with dS += Q^T dO (mask: t >= s, mask': s <= t). A block only sees one Dk
  and one Dv tile, so dQ and dK are sums over the Dv tiles and dV over the Dk tiles: where there is
  more than one, an fp32 atomic target zeroed by the host, cast to the input dtype after
  (Tensor.to); where one tile spans the head dim, written once in the input dtype.

The forward saves only q, k, v: the states are recomputed by the backward, never stored (they
would take Dk x Dv x 4 bytes per chunk and head). scale is a compile-time constant of the package:
1/sqrt(Dk) (spec scale = "rsqrt_dk", as flash-linear-attention) or 1 ("none").

Spec section, validation beyond field types, and plan(): kernels and grids, gradient buffers,
the test matrix, the compile jobs and the FLOP counts the benchmark divides by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from opgen.families.contract import Family, scaffold
from opgen.plan import (DTYPE_BYTES, CompileJob, FlopsBenchCase, GradPlan, KernelPlan, PlanBase,
                        SourceInfo, Sweep, Table, base_fields, ceildiv, distinct_jobs,
                        explain_tables, flops_table, format_bytes, kernel_plan, not_positive,
                        over_smem_limit, refuse_shape)
from opgen.spec import (BenchSection, Block, PositiveInt, Reduction, ReductionKind, Stages,
                        StrictModel, TestSection, Threads, Tolerance, echo, family_spec,
                        not_whole_warpgroups, shapes_of, untested_tail)

# The forward keeps the whole Dk of q and k in shared memory and a [Dk, block_dv] fp32 state in
# registers: head dims above this are refused (by the spec's shapes and at run time).
MAX_HEAD_DIM = 256
# Tiles are padded to whole MMA steps of 16 (the padding loads as zeros).
MMA_STEP = 16


def tile_width(dim: int, block: int) -> int:
    """The width of a head-dim tile: block, or dim rounded up to 16 when that is smaller. The same
    rule is in the generated kernels.py."""
    return min(block, ceildiv(dim, MMA_STEP) * MMA_STEP)


class FwdTiling(StrictModel):
    """A block walks the sequence in chunks of `chunk` rows for one Dv tile of block_dv columns."""

    chunk: Block
    block_dv: Block
    threads: Threads
    num_stages: Stages


class BwdTiling(StrictModel):
    """A block walks the sequence (forward, then in reverse) in chunks of `chunk` rows for one
    block_dk x block_dv tile of the state."""

    chunk: Block
    block_dk: Block
    block_dv: Block
    threads: Threads
    num_stages: Stages


# Chunks of 64, a plain (not software-pipelined) loop without warp specialization: the loads are
# guarded element-wise copies (any S, Dk, Dv), not TMA. The fastest of a sweep on an H200 (bf16,
# D128 and D64, pipeline stages 0-2 timed alike): fwd 64-wide Dv tiles on one warpgroup; bwd
# 128 x 128 state tiles on two warpgroups (one at a Dk of 64), so that at head dims up to 128 one
# block covers the state and writes every gradient once, with no atomics (2.2x the 64 x 64 tiles
# at D128).
DEFAULT_TILING = {
    "fwd": FwdTiling(chunk=64, block_dv=64, threads=128, num_stages=0),
    "bwd": BwdTiling(chunk=64, block_dk=128, block_dv=128, threads=256, num_stages=0),
}

# Outputs grow with S (a sum over every earlier position, no normalisation), and the kernels round
# the running state and the masked chunk scores to fp16/bf16 before each product: atol is a
# fraction of the largest |reference| of the tensor compared, as in matmul, and looser than
# softmax attention's. A doubled, zeroed, sign-flipped or swapped gradient is off by about the
# size of the tensor itself and fails.
DEFAULT_TOLERANCES = {
    "float16": Tolerance(rtol=1e-2, atol=5e-3),
    "bfloat16": Tolerance(rtol=2e-2, atol=1.5e-2),
}

# Keep a seq_len that is not a multiple of the chunk (the tail chunk is where guard bugs hide), Dv
# above block_dv and Dk above block_dk (more than one tile: dQ/dK and dV atomics from several
# blocks) and a head dim that is not a multiple of 16 (padded tiles).
DEFAULT_TEST_SHAPES = ((2, 1000, 4, 64, 64), (1, 77, 2, 64, 128), (1, 200, 3, 40, 24),
                       (1, 150, 2, 192, 160))
DEFAULT_BENCH_SHAPES = ((8, 4096, 16, 128, 128), (4, 8192, 16, 64, 64))

SCALES = {"rsqrt_dk": "1 / sqrt(Dk)", "none": "1"}

# `opgen new <scaffold>`: the data each commented scaffold is rendered from.
SCAFFOLDS = {
    "linear_attention": scaffold(
        "causal linear attention (no normalisation), chunked fwd, monolithic atomic bwd",
        DEFAULT_TILING, DEFAULT_TOLERANCES, scale="rsqrt_dk", shapes=DEFAULT_TEST_SHAPES,
        bench_dtype="bfloat16", bench=DEFAULT_BENCH_SHAPES,
    ),
}


class LinearAttentionSection(StrictModel):
    # O = scale * causal((q k^T)) v: "rsqrt_dk" 1/sqrt(Dk), "none" 1.
    scale: Literal["rsqrt_dk", "none"] = "rsqrt_dk"


class Grad(Reduction):
    # Checked in gradients_are_atomic() with the reason: a Literal of "atomic" alone would not
    # say why.
    reduction: ReductionKind = "atomic"


class LinearAttentionGrads(StrictModel):
    dq: Grad = Grad()
    dk: Grad = Grad()
    dv: Grad = Grad()


class Saved(StrictModel):
    # What the forward keeps besides q, k, v: nothing; the backward recomputes the states.
    states: str = "recompute"


class Shape(StrictModel):
    """One problem: q, k [batch, seq_len, heads, dim_k], v [batch, seq_len, heads, dim_v]."""

    batch: PositiveInt
    seq_len: PositiveInt
    heads: PositiveInt
    dim_k: PositiveInt
    dim_v: PositiveInt

    @property
    def id(self) -> str:
        return f"b{self.batch}-s{self.seq_len}-h{self.heads}-dk{self.dim_k}-dv{self.dim_v}"

    @property
    def args(self) -> tuple[int, int, int, int, int]:
        return self.batch, self.seq_len, self.heads, self.dim_k, self.dim_v


def smem_bytes(phase: str, tiling: dict[str, int], dim_k: int, dim_v: int) -> int:
    """Shared memory of a kernel (16-bit tiles): fwd q, k [chunk, Dk], v [chunk, bv], the masked
    scores [chunk, chunk] and the state [Dk, bv]; bwd q, k [chunk, bk], v, dO [chunk, bv], two
    masked score tiles and the two states [bk, bv]. The compile check reads the real number."""
    c = tiling["chunk"]
    if phase == "fwd":
        dk, bv = tile_width(dim_k, 1 << 30), tile_width(dim_v, tiling["block_dv"])
        return 2 * (2 * c * dk + c * bv + c * c + dk * bv)
    bk, bv = tile_width(dim_k, tiling["block_dk"]), tile_width(dim_v, tiling["block_dv"])
    return 2 * (2 * c * bk + 2 * c * bv + 2 * c * c + 2 * bk * bv)


def gradients_are_atomic(spec: Spec):
    for name in ("dq", "dk", "dv"):
        got = getattr(spec.grads, name).reduction
        if got != "atomic":
            yield f"grads.{name}.reduction", (
                f"must be atomic (got {echo(got)}): a backward block sees one Dk and one Dv tile "
                "of the state, so a gradient is a sum over blocks wherever a tile is narrower "
                "than the head dim, added in fp32 with atomics (linear_attention has no split "
                "variant)"
            )


def states_are_recomputed(spec: Spec):
    if spec.saved.states != "recompute":
        yield "saved.states", (
            f"must be recompute (got {echo(spec.saved.states)}): the forward saves q, k, v only; "
            "the backward recomputes the running states chunk by chunk"
        )


def tiles_fit_warpgroups(spec: Spec):
    for phase in ("fwd", "bwd"):
        t = getattr(spec.tiling, phase)
        where = f"tiling.{phase}"
        if threads_problem := not_whole_warpgroups(t.threads):
            yield f"{where}.threads", threads_problem
        if t.chunk < 64:
            yield f"{where}.chunk", (
                f"must be at least 64: WGMMA computes 64-row slices of the chunk's products "
                f"(got {t.chunk})"
            )


def tiles_fit_shared_memory(spec: Spec):
    for phase in ("fwd", "bwd"):
        need = smem_bytes(phase, getattr(spec.tiling, phase).model_dump(), MAX_HEAD_DIM,
                          MAX_HEAD_DIM)
        if problem := over_smem_limit(need, f" at head dims of {MAX_HEAD_DIM}",
                                      "chunk or the blocks", about=False):
            yield f"tiling.{phase}", problem


def tested_shapes_have_tails(spec: Spec):
    shapes = spec.test.shapes
    for chunk in sorted({spec.tiling.fwd.chunk, spec.tiling.bwd.chunk}):
        yield from untested_tail(
            shapes, lambda s: s.seq_len, chunk, "seq_len is", "a chunk",
            "{ batch = 2, seq_len = 1000, heads = 4, dim_k = 64, dim_v = 64 }", "the tail chunk is")
    bk, bv = spec.tiling.bwd.block_dk, spec.tiling.bwd.block_dv
    if shapes and not any(s.dim_k > bk and s.dim_v > bv for s in shapes):
        yield "test.shapes", (
            f"add a shape with dim_k above tiling.bwd.block_dk ({bk}) and dim_v above "
            f"tiling.bwd.block_dv ({bv}), e.g. dim_k = {min(bk + bk // 2, MAX_HEAD_DIM)}, "
            f"dim_v = {min(bv + bv // 4, MAX_HEAD_DIM)}: only then do several blocks add into "
            "one dQ, dK and dV element (the atomic paths)"
        )


def head_dims_within_limit(spec: Spec):
    for where, group in (("test.shapes", spec.test.shapes), ("bench.shapes", spec.bench.shapes)):
        for i, s in enumerate(group):
            for dim in ("dim_k", "dim_v"):
                if getattr(s, dim) > MAX_HEAD_DIM:
                    yield f"{where}.{i}.{dim}", (
                        f"must be at most {MAX_HEAD_DIM} (the forward holds all of Dk in shared "
                        f"memory) (got {getattr(s, dim)})"
                    )


# The linear_attention rules, in the order their problems are reported (after the shared ones).
RULES = (gradients_are_atomic, states_are_recomputed, tiles_fit_warpgroups,
         tiles_fit_shared_memory, tested_shapes_have_tails, head_dims_within_limit)


Spec = family_spec(
    "linear_attention", RULES, linear_attention=LinearAttentionSection, grads=LinearAttentionGrads,
    saved=Saved, tiling=DEFAULT_TILING,
    test=TestSection.of(Shape, shapes_of(Shape, DEFAULT_TEST_SHAPES), DEFAULT_TOLERANCES),
    bench=BenchSection.of(Shape, shapes_of(Shape, DEFAULT_BENCH_SHAPES), "bfloat16"),
)


def flops(batch: int, seq_len: int, heads: int, dim_k: int, dim_v: int, chunk: int
          ) -> tuple[int, int]:
    """(fwd, bwd) FLOPs of the chunked algorithm (what the kernels compute, causal mask
    included as dense chunk products). Per chunk and head, fwd: Q K^T and the masked scores @ V
    (2 C^2 (Dk + Dv)), Q S and K^T V (4 C Dk Dv). bwd: three times that (dQ loop: dO V^T, @ K,
    dO S^T, V^T K; reverse loop: V dO^T, @ Q, V dS^T, K Q^T, @ dO, K dS, Q^T dO)."""
    chunks = ceildiv(seq_len, chunk)
    per_chunk = 2 * chunk * chunk * (dim_k + dim_v) + 4 * chunk * dim_k * dim_v
    fwd = batch * heads * chunks * per_chunk
    return fwd, 3 * fwd


# The benchmark's --sweep: the first bench shape at these sequence lengths (its batch, heads and
# head dims). The quadratic baseline runs out of memory at the longest: reported as n/a.
SEQ_LEN_SWEEP = (1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True, kw_only=True)
class Plan(PlanBase):
    scale: str  # the spec's: rsqrt_dk | none
    scale_expr: str  # the scale as code over dim_k
    max_head_dim: int
    tail_case: Shape  # seq_len not a multiple of the chunk, every gradient summed: atomics, double run
    bench_cases: tuple[FlopsBenchCase, ...]
    bench_chunk: int  # the chunk the benchmark's PyTorch chunked baseline uses (the fwd's)


def plan(spec: Spec, source: SourceInfo) -> Plan:
    t = spec.tiling
    kernels = {
        "fwd": kernel_plan(
            spec.name, "fwd", "fwd", "fwd",
            "O = scale * (mask(Q K^T) V + Q S) per chunk, S += K^T V (fp32 state, all of Dk, one "
            "Dv tile); O written once",
            "(ceildiv(dim_v, block_dv), batch * heads)", t.fwd),
        "bwd": kernel_plan(
            spec.name, "bwd", "bwd", "bwd",
            "dQ over the chunks forward (state V^T K), then dK and dV in reverse (state Q^T dO), "
            "one Dk x Dv tile a block; a gradient summed over tiles: fp32 atomic adds into a "
            "zeroed buffer, else written once",
            "(ceildiv(dim_v, block_dv), ceildiv(dim_k, block_dk), batch * heads)", t.bwd),
    }
    notes = {
        "dq": "summed over the Dv tiles: one fp32 atomic add per Dv tile and element into a "
              "zeroed buffer, cast to q's dtype after; written once where one tile spans Dv",
        "dk": "summed over the Dv tiles: one fp32 atomic add per Dv tile and element, cast "
              "after; written once where one tile spans Dv",
        "dv": "summed over the Dk tiles: one fp32 atomic add per Dk tile and element, cast "
              "after; written once where one tile spans Dk",
    }
    grads = tuple(GradPlan(g, g[1], "atomic", notes[g]) for g in ("dq", "dk", "dv"))
    test_cases = spec.test.shapes
    tail_case = max(test_cases, key=lambda s: (
        s.seq_len % t.fwd.chunk != 0 or s.seq_len % t.bwd.chunk != 0,
        s.dim_v > t.bwd.block_dv and s.dim_k > t.bwd.block_dk,
        ceildiv(s.dim_v, t.bwd.block_dv) + ceildiv(s.dim_k, t.bwd.block_dk)))

    def bench_case(s: Shape) -> FlopsBenchCase:
        return FlopsBenchCase(s.args, *flops(*s.args, t.fwd.chunk))

    first = spec.bench.shapes[0]  # the sweep's other dims

    return Plan(
        **base_fields(spec, source),
        scale=spec.linear_attention.scale,
        scale_expr="dim_k ** -0.5" if spec.linear_attention.scale == "rsqrt_dk" else "1.0",
        max_head_dim=MAX_HEAD_DIM,
        kernels=kernels,
        grads=grads,
        # The forward first, then dV and dK before the most atomic-prone dQ.
        grad_check_order=(("dV", "v"), ("dK", "k"), ("dQ", "q")),
        saved=("q", "k", "v"),
        recomputed=("the running states S = K^T V (dQ loop) and dS = Q^T dO (dK/dV loop)",),
        test_cases=test_cases,
        tail_case=tail_case,
        bench_cases=tuple(bench_case(s) for s in spec.bench.shapes),
        bench_fields=("batch", "seq_len", "heads", "dim_k", "dim_v"),
        bench_unit="TFLOP/s",
        sweep=Sweep("seq_len", "sequence length", SEQ_LEN_SWEEP, tuple(
            bench_case(first.model_copy(update={"seq_len": n})) for n in SEQ_LEN_SWEEP)),
        bench_chunk=t.fwd.chunk,
        compile_jobs=_compile_jobs(spec, kernels, test_cases),
    )


def _scale(spec: Spec, dim_k: int) -> float:
    return dim_k ** -0.5 if spec.linear_attention.scale == "rsqrt_dk" else 1.0


def _compile_jobs(spec: Spec, kernels: dict[str, KernelPlan], test_cases: tuple[Shape, ...]
                  ) -> tuple[CompileJob, ...]:
    """Every kernel variant the generated tests launch (each of the plan's test cases, each
    dtype: fwd and bwd), then the benchmark's shapes in its dtype. batch and seq_len are symbolic
    in the kernels, so a variant is (heads, dim_k, dim_v, dtype, scale); one two shapes share is
    built once."""

    def jobs_for(s: Shape, dtype: str, tag: str):
        args = (s.heads, s.dim_k, s.dim_v, dtype, _scale(spec, s.dim_k))
        size = f"h{s.heads} dk{s.dim_k} dv{s.dim_v}"
        for key in ("fwd", "bwd"):
            k = kernels[key]
            yield CompileJob(k.factory, args, k.tiling, f"{key} {dtype} {size}{tag}")

    jobs = []
    for dtype in spec.dtypes:
        for s in test_cases:
            jobs += jobs_for(s, dtype, "")
    for s in spec.bench.shapes:
        jobs += jobs_for(s, spec.bench.dtype, " (bench)")
    return distinct_jobs(jobs)


def explain(p: Plan, shape: dict[str, Any]) -> list[Table]:
    """The plan for one runtime shape, as titled tables: kernels, grids and shared memory, saved
    tensors and their bytes, the atomic gradient buffers, FLOPs."""
    b, s, h, dk, dv = shape["batch"], shape["seq_len"], shape["heads"], shape["dim_k"], shape["dim_v"]
    dtype = shape.get("dtype", p.dtypes[0])
    _check_shape(p, b, s, h, dk, dv, dtype)
    elem = DTYPE_BYTES[dtype]
    fwd_t, bwd_t = p.kernels["fwd"].tiling, p.kernels["bwd"].tiling
    k_tiles = ceildiv(dk, tile_width(dk, bwd_t["block_dk"]))
    v_tiles = ceildiv(dv, tile_width(dv, bwd_t["block_dv"]))
    grids = {"fwd": (ceildiv(dv, tile_width(dv, fwd_t["block_dv"])), b * h),
             "bwd": (v_tiles, k_tiles, b * h)}
    smem = {key: format_bytes(smem_bytes(key, k.tiling, dk, dv)) for key, k in p.kernels.items()}
    sizes = {"q": b * s * h * dk * elem, "k": b * s * h * dk * elem, "v": b * s * h * dv * elem}
    per_element = {"dq": v_tiles, "dk": v_tiles, "dv": k_tiles}
    dims = {"dq": dk, "dk": dk, "dv": dv}
    reductions = [
        [g.grad, g.reduction, "fp32 atomic target (torch.zeros), .to(dtype) after",
         format_bytes(4 * b * s * h * dims[g.grad]),
         f"{per_element[g.grad] * b * s * h * dims[g.grad]} ({per_element[g.grad]} per address)",
         g.note]
        if per_element[g.grad] > 1 else
        [g.grad, g.reduction, f"{dtype} (torch.empty), written once: one tile spans the dim",
         format_bytes(elem * b * s * h * dims[g.grad]), "0", g.note]
        for g in p.grads]
    fwd, bwd = flops(b, s, h, dk, dv, fwd_t["chunk"])
    return explain_tables(
        p, (f"batch={b} seq_len={s} heads={h} dim_k={dk} dim_v={dv} dtype={dtype} "
            f"(scale {SCALES[p.scale]})"),
        grids, sizes, "recomputed in backward",
        ("gradient reductions",
         [["grad", "reduction", "buffer", "bytes", "atomics", "why"], *reductions]),
        flops_table(fwd, "B H ceil(S/C) (2 C^2 (Dk + Dv) + 4 C Dk Dv), C = chunk",
                    bwd, "3 x forward"),
        kernel_column=("smem (estimate)", smem),
    )


def _check_shape(p: Plan, b: int, s: int, h: int, dk: int, dv: int, dtype: str) -> None:
    """What the generated op's input checks would reject, as an explain error."""
    problems = not_positive({"batch": b, "seq_len": s, "heads": h, "dim_k": dk, "dim_v": dv})
    if max(dk, dv) > p.max_head_dim:
        problems.append(f"dim_k and dim_v must be at most {p.max_head_dim} (got {dk}, {dv})")
    refuse_shape(p, dtype, problems)


FAMILY = Family(
    Spec, plan, explain, SCAFFOLDS,
    description=("causal linear attention without normalisation (bshd): chunked fwd with a running "
                 "fp32 state; one monolithic bwd, dQ/dK/dV fp32 atomics"),
    shape_keys=("batch", "seq_len", "heads", "dim_k", "dim_v", "dtype"),
)
