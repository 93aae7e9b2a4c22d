"""Multi-head attention (flash attention), forward and backward.

Spec section, validation beyond field types, and plan(): the kernels and their grids, the gradient
buffers and how each is reduced, what the forward saves, the test matrix, the compile jobs and the
FLOP count the benchmark reports.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, model_validator

from opgen.plan import (
    DTYPE_BYTES,
    SM90_SMEM_LIMIT,
    TORCH_DTYPES,
    CompileJob,
    GradPlan,
    KernelPlan,
    SourceInfo,
)
from opgen.spec import (
    DEFAULT_TOLERANCES,
    Dtype,
    GemmTiling,
    PositiveInt,
    RowTiling,
    SpecBase,
    StrictModel,
    Tolerance,
    merge_defaults,
)

DESCRIPTION = "flash attention (MHA): fwd, Delta preprocess, bwd (dQ by fp32 atomics), dQ cast"

# Templates per output file; "{name}" is the spec's name.
TEMPLATES = {
    "__init__.py": "attention/__init__.py.jinja",
    "kernels.py": "attention/kernels.py.jinja",
    "autograd.py": "attention/autograd.py.jinja",
    "reference.py": "attention/reference.py.jinja",
    "test_{name}.py": "attention/test_op.py.jinja",
    "bench_{name}.py": "attention/bench_op.py.jinja",
}

Layout = Literal["bshd", "bhsd"]
HeadDim = Annotated[int, Field(ge=16, le=256, multiple_of=16)]
Keep = Literal["save", "recompute"]
LAYOUT_DIMS = {"bshd": "[batch, seq_len, heads, head_dim]", "bhsd": "[batch, heads, seq_len, head_dim]"}

# Hopper defaults. fwd 128x64 with a 256-thread consumer group and one pipeline stage, bwd 128x32
# with two stages: the sm_90 configurations of TileLang's GQA and attention-sink examples, which
# fit both head_dim 64 and 128 in shared memory.
DEFAULT_TILING = {
    "fwd": GemmTiling(block_m=128, block_n=64, threads=256, num_stages=1),
    "bwd": GemmTiling(block_m=128, block_n=32, threads=256, num_stages=2),
    "preprocess": RowTiling(block_m=32, threads=128),
    "postprocess": RowTiling(block_m=64, threads=128),
}


class AttentionSection(StrictModel):
    layouts: tuple[Layout, ...] = ("bshd",)
    head_dims: tuple[HeadDim, ...] = (64, 128)
    causal: StrictBool = False  # default of the generated function's `causal` argument


class ReductionDirect(StrictModel):
    reduction: Literal["direct"] = "direct"


class ReductionAtomic(StrictModel):
    reduction: Literal["atomic"] = "atomic"


class AttentionGrads(StrictModel):
    # dQ gathers one contribution per KV block: fp32 atomics, then a cast (postprocess).
    # dK/dV: each KV block owns its rows, so they are written directly (no reduction).
    dq: ReductionAtomic = ReductionAtomic()
    dk: ReductionDirect = ReductionDirect()
    dv: ReductionDirect = ReductionDirect()


class AttentionSaved(StrictModel):
    # P is always recomputed from lse (flash attention); O and lse are saved or recomputed by
    # running the forward kernel again inside backward (less memory held between fwd and bwd).
    o: Keep = "save"
    lse: Keep = "save"


class AttentionTiling(StrictModel):
    fwd: GemmTiling
    bwd: GemmTiling
    preprocess: RowTiling
    postprocess: RowTiling

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        return merge_defaults(data, DEFAULT_TILING)


class AttentionTestShape(StrictModel):
    batch: PositiveInt
    heads: PositiveInt
    seq_len: PositiveInt


class AttentionTest(StrictModel):
    shapes: tuple[AttentionTestShape, ...] = (
        AttentionTestShape(batch=2, heads=4, seq_len=1000),
        AttentionTestShape(batch=1, heads=3, seq_len=77),
    )
    tolerance: dict[Dtype, Tolerance] = {}

    def tolerance_for(self, dtype: str) -> Tolerance:
        return self.tolerance.get(dtype, DEFAULT_TOLERANCES[dtype])


class AttentionBenchShape(StrictModel):
    batch: PositiveInt
    heads: PositiveInt
    seq_len: PositiveInt
    head_dim: PositiveInt
    causal: StrictBool


class AttentionBench(StrictModel):
    dtype: Dtype = "float16"
    shapes: tuple[AttentionBenchShape, ...] = (
        AttentionBenchShape(batch=4, heads=16, seq_len=4096, head_dim=128, causal=False),
        AttentionBenchShape(batch=4, heads=16, seq_len=4096, head_dim=128, causal=True),
        AttentionBenchShape(batch=4, heads=16, seq_len=4096, head_dim=64, causal=False),
    )
    warmup_ms: PositiveInt = 25
    rep_ms: PositiveInt = 100


class Spec(SpecBase):
    family: Literal["attention"]
    attention: AttentionSection = AttentionSection()
    grads: AttentionGrads = AttentionGrads()
    saved: AttentionSaved = AttentionSaved()
    tiling: AttentionTiling = AttentionTiling.model_validate({})
    test: AttentionTest = AttentionTest()
    bench: AttentionBench = AttentionBench()

    @model_validator(mode="after")
    def _consistent(self) -> "Spec":
        problems = list(_problems(self))
        if problems:
            # One ValueError carries every problem; spec.validate splits them back out.
            raise ValueError("\n".join(f"{field}: {msg}" for field, msg in problems))
        return self


def _problems(spec: Spec):
    section = spec.attention
    if not section.layouts:
        yield "attention.layouts", "must list at least one of bshd, bhsd"
    if len(set(section.layouts)) != len(section.layouts):
        yield "attention.layouts", "must not repeat a layout"
    if not section.head_dims:
        yield "attention.head_dims", "must list at least one head dim"
    if len(set(section.head_dims)) != len(section.head_dims):
        yield "attention.head_dims", "must not repeat a head dim"
    if not spec.test.shapes:
        yield "test.shapes", "must list at least one shape"
    smallest_block = min(
        spec.tiling.fwd.block_m, spec.tiling.fwd.block_n, spec.tiling.bwd.block_m,
        spec.tiling.bwd.block_n,
    )
    if spec.test.shapes and all(s.seq_len % smallest_block == 0 for s in spec.test.shapes):
        yield "test.shapes", (
            f"add a seq_len that is not a multiple of {smallest_block} (the smallest block): "
            "tail blocks are where masking and atomic-guard bugs hide"
        )
    for i, shape in enumerate(spec.bench.shapes):
        if shape.head_dim not in section.head_dims:
            yield f"bench.shapes.{i}.head_dim", (
                f"must be one of attention.head_dims {list(section.head_dims)} (got {shape.head_dim})"
            )
    for phase in ("fwd", "bwd"):
        tiling = getattr(spec.tiling, phase)
        for dim in section.head_dims:
            need = smem_bytes(phase, tiling, dim)
            if need > SM90_SMEM_LIMIT:
                yield f"tiling.{phase}", (
                    f"needs about {need // 1024} KB of shared memory at head_dim {dim}, over the "
                    f"sm_90 limit of {SM90_SMEM_LIMIT // 1024} KB; lower block_m, block_n or "
                    "num_stages"
                )
        if tiling.threads % 128:
            yield f"tiling.{phase}.threads", (
                f"must be a multiple of 128 (whole warpgroups for WGMMA) (got {tiling.threads})"
            )


def smem_bytes(phase: str, tiling: GemmTiling, dim: int) -> int:
    """Shared memory of the fwd/bwd kernel, as TileLang lays it out (16-bit operands).

    Pipelined tiles are held once per stage; in bwd the dK/dV staging buffers reuse the loop's
    space after the loop, so the larger of the two counts.
    """
    elem = DTYPE_BYTES["float16"]
    stages = max(1, tiling.num_stages)
    m, n = tiling.block_m, tiling.block_n
    if phase == "fwd":
        return elem * (m * dim + 2 * stages * n * dim)
    loop = elem * (2 * m * dim + 2 * stages * n * dim + m * n) + 2 * stages * n * 4
    epilogue = elem * 2 * m * dim
    return max(loop, epilogue)


@dataclass(frozen=True)
class TestCase:
    batch: int
    heads: int
    seq_len: int
    head_dim: int

    @property
    def id(self) -> str:
        return f"b{self.batch}-h{self.heads}-s{self.seq_len}-d{self.head_dim}"


@dataclass(frozen=True)
class Plan:
    family: str
    name: str
    class_name: str
    source: SourceInfo
    layouts: tuple[str, ...]
    default_layout: str
    layout_dims: dict[str, str]  # layout -> "[batch, seq_len, heads, head_dim]"
    dtypes: tuple[str, ...]
    torch_dtypes: tuple[str, ...]
    head_dims: tuple[int, ...]
    causal_default: bool
    kernels: dict[str, KernelPlan]
    grads: tuple[GradPlan, ...]
    saved: tuple[str, ...]  # tensors passed to ctx.save_for_backward
    recompute_forward: bool  # backward reruns the forward kernel for O and/or lse
    recomputed: tuple[str, ...]
    recompute_targets: tuple[str, ...]  # how backward unpacks the rerun forward's (O, lse)
    layout_doc: str
    test_cases: tuple[TestCase, ...]
    tolerances: dict[str, Tolerance]
    bench: AttentionBench
    compile_jobs: tuple[CompileJob, ...]
    smem: dict[str, dict[int, int]]  # phase -> head_dim -> bytes (estimate)

    @property
    def atomic_grads(self) -> tuple[GradPlan, ...]:
        return tuple(g for g in self.grads if g.reduction == "atomic")

    def flops_fwd(self, batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
        """Two GEMMs of 2*S*S*D each per (batch, head); causal halves the work."""
        flops = 4.0 * batch * heads * seq_len * seq_len * head_dim
        return flops / 2 if causal else flops


def plan(spec: Spec, source: SourceInfo) -> Plan:
    t = spec.tiling
    kernels = {
        "fwd": KernelPlan(
            factory=f"{spec.name}_fwd", phase="fwd",
            summary="O = softmax(Q K^T * scale) V and the row log-sum-exp (log2 domain)",
            grid="(ceildiv(seq_len, block_m), heads, batch)", tiling_name="FWD_TILING",
            tiling=t.fwd.model_dump(),
        ),
        "preprocess": KernelPlan(
            factory=f"{spec.name}_bwd_preprocess", phase="bwd_preprocess",
            summary="Delta = rowsum(O * dO)",
            grid="(ceildiv(seq_len, block_m), heads, batch)", tiling_name="PREPROCESS_TILING",
            tiling=t.preprocess.model_dump(),
        ),
        "bwd": KernelPlan(
            factory=f"{spec.name}_bwd", phase="bwd",
            summary="dK, dV written per KV block; dQ accumulated by fp32 atomics",
            grid="(heads, ceildiv(seq_len, block_m), batch)", tiling_name="BWD_TILING",
            tiling=t.bwd.model_dump(),
        ),
        "postprocess": KernelPlan(
            factory=f"{spec.name}_bwd_postprocess", phase="bwd_postprocess",
            summary="cast the fp32 dQ accumulator (fragment layout) to the input dtype",
            grid="(ceildiv(seq_len, block_m), heads, batch)", tiling_name="POSTPROCESS_TILING",
            tiling=t.postprocess.model_dump(),
        ),
    }
    grads = (
        GradPlan("dq", "q", "atomic", "float32", "torch.zeros",
                 "fp32 atomics from every KV block, then the postprocess cast"),
        GradPlan("dk", "k", "direct", "input", "torch.empty", "written once by its KV block"),
        GradPlan("dv", "v", "direct", "input", "torch.empty", "written once by its KV block"),
    )
    recomputed = tuple(n for n in ("o", "lse") if getattr(spec.saved, n) == "recompute")
    saved = ("q", "k", "v") + tuple(n for n in ("o", "lse") if n not in recomputed)

    shapes = spec.test.shapes
    test_cases = tuple(
        TestCase(s.batch, s.heads, s.seq_len, d) for s, d in itertools.product(shapes, spec.attention.head_dims)
    )
    compile_seq = shapes[0].seq_len
    jobs = []
    for layout, dtype, dim in itertools.product(spec.attention.layouts, spec.dtypes, spec.attention.head_dims):
        common = (1, 1, compile_seq, dim)
        tag = f"{layout} {dtype} d{dim}"
        for causal in (False, True):
            for key in ("fwd", "bwd"):
                k = kernels[key]
                jobs.append(CompileJob(k.factory, (*common, causal, layout, dtype), k.tiling,
                                       f"{k.phase} {tag} causal={causal}"))
        for key in ("preprocess", "postprocess"):
            k = kernels[key]
            jobs.append(CompileJob(k.factory, (*common, layout, dtype), k.tiling, f"{k.phase} {tag}"))

    return Plan(
        family="attention",
        name=spec.name,
        class_name="".join(part.capitalize() for part in spec.name.split("_")) + "Function",
        source=source,
        layouts=spec.attention.layouts,
        default_layout=spec.attention.layouts[0],
        layout_dims={layout: LAYOUT_DIMS[layout] for layout in spec.attention.layouts},
        dtypes=spec.dtypes,
        torch_dtypes=tuple(TORCH_DTYPES[d] for d in spec.dtypes),
        head_dims=spec.attention.head_dims,
        causal_default=spec.attention.causal,
        kernels=kernels,
        grads=grads,
        saved=saved,
        recompute_forward=bool(recomputed),
        recomputed=recomputed,
        recompute_targets=tuple(n if n in recomputed else "_" for n in ("o", "lse")),
        layout_doc="; ".join(f"{LAYOUT_DIMS[layout]} for layout {layout!r}" for layout in spec.attention.layouts),
        test_cases=test_cases,
        tolerances={d: spec.test.tolerance_for(d) for d in spec.dtypes},
        bench=spec.bench,
        compile_jobs=tuple(jobs),
        smem={
            phase: {d: smem_bytes(phase, getattr(t, phase), d) for d in spec.attention.head_dims}
            for phase in ("fwd", "bwd")
        },
    )
