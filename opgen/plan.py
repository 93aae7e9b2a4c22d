"""Plan pieces every family uses: the fields every plan has (PlanBase), kernels, gradients and
their buffers, compile jobs, shared-memory budget, header data, and the tables of `explain`.

A plan holds every derived value the templates print. Templates make no decisions.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from pydantic import BaseModel

from opgen import TILELANG_VERSION
from opgen.errors import OpgenError, SpecError
from opgen.spec import BenchSection, ReductionKind, Tolerance

# sm_90 (H100/H200): 227 KB of dynamic shared memory per block.
SM90_SMEM_LIMIT = 227 * 1024


TORCH_DTYPES = {"float16": "torch.float16", "bfloat16": "torch.bfloat16", "float32": "torch.float32"}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# Bytes: the boundary on which the kernels' 16-byte vector loads and TMA need a tensor to start
# (TMA: also every stride but the last). The packages copy an input that does not.
LOAD_ALIGNMENT = 16
def custom_op_names(namespace: str, name: str, *phases: str) -> dict[str, str]:
    """The qualified torch.library names of a package's custom ops, by phase ("opgen::x_fwd":
    torch.ops.opgen.x_fwd); the namespace is the spec's."""
    return {phase: f"{namespace}::{name}_{phase}" for phase in phases}


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def whole_kib(nbytes: int) -> int:
    """nbytes rounded up to whole KiB: TileLang aligns TMA and swizzled shared buffers."""
    return ceildiv(nbytes, 1024) * 1024


def over_smem_limit(need: int, at: str, lower: str, about: bool = True) -> str | None:
    """For a family's rules: why a kernel that needs `need` bytes of shared memory (an estimate:
    "about") at `at` (" at head_dim 64", or "") cannot run on sm_90, and what to `lower`."""
    if need <= SM90_SMEM_LIMIT:
        return None
    return (f"needs {'about ' if about else ''}{need // 1024} KB of shared memory{at}, over the "
            f"sm_90 limit of {SM90_SMEM_LIMIT // 1024} KB; lower {lower}")


@dataclass(frozen=True)
class KernelPlan:
    """One @tilelang.jit factory in kernels.py."""

    factory: str  # function name in kernels.py
    phase: str  # fwd | bwd_preprocess | bwd | bwd_postprocess | bwd_param
    summary: str  # one line: what it computes
    grid: str  # the launch grid, in the factory's argument names
    tiling_name: str  # the constant in kernels.py holding its tiling keyword arguments
    tiling: dict[str, int]
    out_idx: tuple[int, ...] | None  # outputs the kernel allocates and returns


def kernel_plan(op: str, key: str, factory: str, phase: str, summary: str, grid: str,
                tiling: BaseModel | dict[str, int], out_idx: tuple[int, ...] | None = None
                ) -> KernelPlan:
    """The kernel of [tiling.<key>]: factory <op>_<factory>, its tiling in <KEY>_TILING."""
    if isinstance(tiling, BaseModel):
        tiling = tiling.model_dump()
    return KernelPlan(f"{op}_{factory}", phase, summary, grid, f"{key.upper()}_TILING", tiling,
                      out_idx)


@dataclass(frozen=True)
class CompileJob:
    """One kernel instance the compile check builds: factory(*args)."""

    factory: str
    args: tuple
    tiling: dict[str, int]
    label: str


def distinct_jobs(jobs) -> tuple[CompileJob, ...]:
    """jobs without repeats of one kernel instance (factory and arguments), in first-seen order:
    with symbolic runtime dims, shapes that differ only in those dims build one kernel."""
    seen, unique = set(), []
    for job in jobs:
        if (job.factory, job.args) not in seen:
            seen.add((job.factory, job.args))
            unique.append(job)
    return tuple(unique)


@dataclass(frozen=True)
class SourceInfo:
    """What the header of every generated file records."""

    spec_path: str
    spec_sha256: str  # of the validated spec (opgen.spec.spec_digest), not of the file's bytes
    opgen_version: str
    tilelang_version: str = TILELANG_VERSION  # the TileLang the package is generated for
    # The output root as a dotted module path ("generated"), or "" where it is not one (an
    # absolute or non-identifier path): what the docstring examples import the package from.
    import_root: str = "generated"

    @property
    def short_hash(self) -> str:
        return self.spec_sha256[:16]

    def import_path(self, name: str) -> str:
        """The module path of package `name`: its examples' `from <this> import ...`."""
        return f"{self.import_root}.{name}" if self.import_root else name


def import_root(out_root: str) -> str:
    """out_root (a path relative to where Python runs) as a dotted module path, or "" where it is
    not one: then the package is imported by its name, with out_root itself on sys.path."""
    parts = out_root.replace("\\", "/").strip("/").split("/")
    if out_root.startswith("/") or not all(p.isidentifier() for p in parts):
        return ""
    return ".".join(parts)


# The buffer each reduction writes into, as code: fp32 atomic targets start at zero; direct writes
# and split partials are written once per element. Generated code prints this table (ALLOC) and
# explain describes buffers with it.
BUFFER_ALLOC = {"atomic": "torch.zeros", "direct": "torch.empty", "split": "torch.empty"}
BUFFER_KIND = {"atomic": "fp32 atomic target", "direct": "written once",
               "split": "fp32 partials, summed after"}


def buffer_description(reduction: str) -> str:
    """How explain names a reduction's buffer: "fp32 atomic target (torch.zeros)"."""
    return f"{BUFFER_KIND[reduction]} ({BUFFER_ALLOC[reduction]})"


@dataclass(frozen=True)
class GradPlan:
    """How one gradient is produced: by which reduction into which buffer."""

    grad: str  # dq
    input: str  # q
    reduction: ReductionKind
    note: str = field(default="")

    @property
    def buffer_dtype(self) -> str:
        """float32 for reduced gradients (atomic targets, partials), else the input's dtype."""
        return "input" if self.reduction == "direct" else "float32"

    @property
    def alloc(self) -> str:
        """torch.zeros for atomic targets; every other buffer is written once per element."""
        return BUFFER_ALLOC[self.reduction]


@dataclass(frozen=True)
class Sweep:
    """The benchmark's --sweep: the first [bench] shape with one size (`axis`) stepped over a few
    points, for a plot of speed against size. A few points only: each costs the baselines'
    compiles (torch.compile, FlexAttention) and every implementation's warm-up and repeats, and a
    sweep should stay near two minutes on an H200."""

    axis: str  # the bench field the plot's x axis reads
    label: str  # the x axis in words
    points: tuple[int, ...]  # the values of axis, smallest first
    cases: tuple[Any, ...]  # bench cases (the family's type), one per point


# The row-wise families (rmsnorm, scaled_silu, swiglu) sweep the row count at the first bench
# shape's channels, up to 2^29 elements in a tensor (1 GiB in 16 bits): the largest points are
# bandwidth-bound already, and every point stays far from the int32 index limit.
ROWS_SWEEP = (256, 1024, 4096, 16384, 65536)
MAX_SWEEP_ELEMENTS = 2**29


def rows_sweep(channels: int) -> tuple[int, ...]:
    """The row counts a row-wise family sweeps at `channels` (elements of its widest tensor's
    row)."""
    return tuple(rows for rows in ROWS_SWEEP if rows * channels <= MAX_SWEEP_ELEMENTS)


@dataclass(frozen=True, kw_only=True)
class PlanBase:
    """The fields every family's plan has; a family's Plan adds its own."""

    family: str
    name: str
    ops: dict[str, str]  # phase -> torch.library name of its custom op
    source: SourceInfo
    dtypes: tuple[str, ...]
    torch_dtypes: tuple[str, ...]
    kernels: dict[str, KernelPlan]
    grads: tuple[GradPlan, ...]
    grad_check_order: tuple[tuple[str, str], ...]  # (label, input) in the order tests assert them
    saved: tuple[str, ...]  # tensors the forward saves for backward
    recomputed: tuple[str, ...] = ()  # what backward recomputes instead of reading it
    test_cases: tuple[Any, ...]
    tolerances: dict[str, Tolerance]
    bench: BenchSection
    # The benchmark: its cases (the spec's [bench] shapes; each case's `row` is what the generated
    # SHAPES holds: the values named by bench_fields, then the fwd and bwd FLOPs or bytes), what
    # their throughput is counted in, and the --sweep.
    bench_cases: tuple[Any, ...]
    bench_fields: tuple[str, ...]
    bench_unit: str  # TFLOP/s | GB/s
    sweep: Sweep
    compile_jobs: tuple[CompileJob, ...]

    def __post_init__(self) -> None:
        # Families list the inputs that get a gradient and, separately, the inputs the generated
        # test asserts; a variant that adds one without the other is refused at build time.
        checked = {i for _, i in self.grad_check_order}
        missing = [g.input for g in self.grads if g.input not in checked]
        if missing:
            raise SpecError(self.source.spec_path, [("grads", (
                f"the generated test would not check the gradient of {', '.join(missing)}; every "
                "differentiable input needs its own assertion"
            ))])

    @property
    def alignment(self) -> int:
        """LOAD_ALIGNMENT, for the generated ALIGNMENT / TMA_ALIGNMENT constants."""
        return LOAD_ALIGNMENT

    @property
    def buffer_alloc(self) -> dict[str, str]:
        """Reduction -> the allocator of its buffer, for the generated ALLOC table."""
        return BUFFER_ALLOC

    @property
    def atomic_grads(self) -> tuple[GradPlan, ...]:
        return tuple(g for g in self.grads if g.reduction == "atomic")


def base_fields(spec: Any, source: SourceInfo, *op_phases: str) -> dict[str, Any]:
    """The PlanBase fields that come straight from the spec; op_phases name the custom ops
    (default fwd, bwd)."""
    return {
        "family": spec.family,
        "name": spec.name,
        "ops": custom_op_names(spec.namespace, spec.name, *(op_phases or ("fwd", "bwd"))),
        "source": source,
        "dtypes": spec.dtypes,
        "torch_dtypes": tuple(TORCH_DTYPES[d] for d in spec.dtypes),
        "tolerances": {d: spec.test.tolerance_for(d) for d in spec.dtypes},
        "bench": spec.bench,
    }


def format_bytes(n: float) -> str:
    """A byte count for people: 512 B, 1.5 KiB, 64.0 MiB, 2.0 GiB."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in ("KiB", "MiB"):
        n /= 1024
        if n < 1024:
            return f"{n:.1f} {unit}"
    return f"{n / 1024:.1f} GiB"


# --- explain: the plan at one runtime shape, as titled tables ------------------------------------

# (title, rows); the first row is the header.
Table = tuple[str, list[list[str]]]


def refuse_shape(p: PlanBase, dtype: str, problems: list[str]) -> None:
    """Raise what the generated op's input checks would reject at a --shape: the family's problems
    and a dtype the package is not built for."""
    if dtype not in p.dtypes:
        problems.append(f"dtype must be one of {', '.join(p.dtypes)} (got {dtype!r})")
    if problems:
        raise OpgenError("--shape: " + "; ".join(problems))


def not_positive(sizes: dict[str, int]) -> list[str]:
    """One problem naming every size of a shape when any of them is below 1."""
    if min(sizes.values()) >= 1:
        return []
    *rest, last = sizes
    return [f"{', '.join(rest)} and {last} must be >= 1" if rest else f"{last} must be >= 1"]


def explain_tables(p: PlanBase, shape: str, grids: dict[str, tuple[int, ...]],
                   sizes: dict[str, int], recomputed_how: str, grads: Table, cost: Table,
                   kernel_column: tuple[str, dict[str, str]] | None = None,
                   tilings: dict[str, dict[str, Any]] | None = None) -> list[Table]:
    """What `explain` prints, in the order of every family: the runtime shape (a title alone),
    the kernels with their grids there (and kernel_column), what the forward saves (sizes: bytes
    per tensor), the gradient buffers, and what the benchmark divides by (FLOPs or bytes).
    tilings: the tiling a kernel launches with at this shape, where not its plan's own."""
    return [
        (f"shape: {shape}", []),
        kernels_table(p.kernels, grids, kernel_column, tilings),
        saved_table(p, sizes, recomputed_how),
        grads,
        cost,
    ]


def kernels_table(kernels: dict[str, KernelPlan], grids: dict[str, tuple[int, ...]],
                  extra: tuple[str, dict[str, str]] | None = None,
                  tilings: dict[str, dict[str, Any]] | None = None) -> Table:
    """Each kernel with its grid at the shape, its tiling there (tilings[key], else its plan's),
    an optional extra column (title, value per kernel) and what it computes."""
    title, values = extra or ("", {})
    tilings = tilings or {}
    header = ["factory", "phase", "grid", "tiling", *([title] if extra else []), "computes"]
    rows = [[k.factory, k.phase, f"{k.grid} = {grids[key]}",
             ", ".join(f"{n}={v}" for n, v in tilings.get(key, k.tiling).items()),
             *([values[key]] if extra else []), k.summary]
            for key, k in kernels.items()]
    return "kernels", [header, *rows]


def saved_table(p: PlanBase, sizes: dict[str, int], recomputed_how: str = "") -> Table:
    """What the forward saves and what backward recomputes, with bytes; the total held."""
    rows = [[name, format_bytes(sizes[name]), "saved"] for name in p.saved]
    rows += [[name, format_bytes(sizes.get(name, 0)), recomputed_how] for name in p.recomputed]
    rows.append(["total held between fwd and bwd", format_bytes(sum(sizes[n] for n in p.saved)),
                 ""])
    return "saved for backward", [["tensor", "bytes", ""], *rows]


def flops_table(fwd: float, fwd_count: str, bwd: float, bwd_count: str) -> Table:
    return "FLOPs (what the benchmark divides by)", [
        ["pass", "FLOPs", "count"],
        ["forward", f"{fwd / 1e12:.3f} TFLOP", fwd_count],
        ["backward", f"{bwd / 1e12:.3f} TFLOP", bwd_count],
    ]


# --- the saved-aux families (scaled_silu, rmsnorm): y = f(x, w) with one learnable weight w, dx
# written once, dw reduced over blocks (atomic or split), one auxiliary tensor of the forward saved
# or recomputed, a memory-bound benchmark in bytes moved.


@dataclass(frozen=True)
class ShapeCase:
    """A test shape: any x [..., C]."""

    shape: tuple[int, ...]

    @property
    def id(self) -> str:
        return "x".join(map(str, self.shape))


class BenchRow:
    """A bench case (a frozen dataclass): its fields in order, the values named by the plan's
    bench_fields and then its fwd and bwd FLOPs or bytes, are its tuple in the bench's SHAPES."""

    @property
    def row(self) -> tuple:
        return astuple(self)


@dataclass(frozen=True)
class FlopsBenchCase(BenchRow):
    """A bench case of a compute-bound family: its shape's values (the plan's bench_fields name
    them) and the FLOPs its TF/s divide by."""

    values: tuple
    fwd_flops: int
    bwd_flops: int

    @property
    def row(self) -> tuple:
        return (*self.values, self.fwd_flops, self.bwd_flops)


@dataclass(frozen=True)
class BytesBenchCase(BenchRow):
    """A benchmark input x [rows, channels], with the bytes the op moves."""

    rows: int
    channels: int
    fwd_bytes: int  # x and w read once, y written once
    bwd_bytes: int  # dy, x and w read once, dx and dw written once


@dataclass(frozen=True, kw_only=True)
class SavedAuxPlan(PlanBase):
    weight_dtype: str  # input (x's dtype) | float32
    weight_dtype_expr: str  # the dtype w must have, as code over x: x.dtype or torch.float32
    dw_reduction: ReductionKind  # the spec's: the public function's
    test_reductions: tuple[ReductionKind, ...]  # dw reductions the generated tests run
    tail_case: ShapeCase  # tail blocks: strided dy, atomics, split, broken grads
    bench_cases: tuple[BytesBenchCase, ...]
    # [[tiling.tuned]] by phase: {C: tiling} (empty for a family without the table).
    tuned: Mapping[str, Mapping[int, dict[str, int]]] = field(default_factory=dict)
    # With the spec's "auto": calls of at least this many elements save the auxiliary tensor,
    # smaller ones recompute it. None: every call does as the spec says.
    save_from_elements: int | None = None

    def tiling_for(self, key: str, channels: int) -> dict[str, int]:
        """The tiling kernel `key` runs with at C = channels: its tuned one, else the base one."""
        return self.tuned.get(key, {}).get(channels, self.kernels[key].tiling)

    @property
    def tiling_exprs(self) -> dict[str, str]:
        """Per kernel, the code (over the call's `cols`) that picks its tiling in the package."""
        return {key: (f"{k.tiling_name}S.get(cols, {k.tiling_name})" if key in self.tuned
                      else k.tiling_name) for key, k in self.kernels.items()}


def saved_aux_fields(spec: Any, source: SourceInfo, section: Any, aux: str, save: bool,
                     dx_note: str, dw_note: str, w_numel: Callable[[int], int],
                     save_from_elements: int | None = None) -> dict[str, Any]:
    """The SavedAuxPlan fields that follow from the spec: PlanBase's, dx and dw (their notes),
    w's dtype (section.weight_dtype), the aux tensor saved or recomputed (save: by some calls;
    save_from_elements: by those of at least that many elements, the rest recompute it), what
    the tests run, and the benchmark's cases (w_numel: w's elements at a channel count)."""
    reduction = spec.grads.dw.reduction
    return {
        **base_fields(spec, source),
        "grads": (GradPlan("dx", "x", "direct", dx_note), GradPlan("dw", "w", reduction, dw_note)),
        # The directly written dx before the reduced dw: a wrong dw then cannot hide a wrong dx.
        "grad_check_order": (("dx", "x"), ("dw", "w")),
        "dw_reduction": reduction,
        "test_reductions": reductions_to_test(reduction),
        "weight_dtype": section.weight_dtype,
        "weight_dtype_expr": "x.dtype" if section.weight_dtype == "input" else "torch.float32",
        "saved": ("x", "w", aux) if save else ("x", "w"),
        "recomputed": () if save else (aux,),
        "save_from_elements": save_from_elements,
        "test_cases": tuple(ShapeCase(tuple(s)) for s in spec.test.shapes),
        **bytes_bench_fields(spec.bench, section.weight_dtype, w_numel),
    }


def reductions_to_test(reduction: ReductionKind) -> tuple[ReductionKind, ...]:
    """The dw reductions the generated tests run: always split (deterministic, checked bitwise);
    an atomic spec is also checked against it."""
    return ("atomic", "split") if reduction == "atomic" else ("split",)


def weight_dtype(choice: str, dtype: str) -> str:
    """The dtype of w next to an x of `dtype`: x's ("input") or float32."""
    return dtype if choice == "input" else "float32"


def weighted_bytes_moved(numel: int, w_numel: int, elem: int, w_elem: int) -> tuple[int, int]:
    """(fwd, bwd) bytes of an op of x and a weight w, whatever computes it: every input read once
    and every output written once. fwd: x, w -> y. bwd: dy, x, w -> dx, dw."""
    w_bytes = w_numel * w_elem
    return 2 * numel * elem + w_bytes, 3 * numel * elem + 2 * w_bytes


def bytes_bench_fields(bench: Any, weight_dtype_choice: str,
                       w_numel: Callable[[int], int]) -> dict[str, Any]:
    """The PlanBase bench fields of an op of x [rows, channels] and w: the benchmark's shapes and
    its row sweep in its dtype, in bytes moved; w_numel: w's elements at a channel count."""
    elem = DTYPE_BYTES[bench.dtype]
    w_elem = DTYPE_BYTES[weight_dtype(weight_dtype_choice, bench.dtype)]

    def case(rows: int, channels: int) -> BytesBenchCase:
        return BytesBenchCase(rows, channels, *weighted_bytes_moved(
            rows * channels, w_numel(channels), elem, w_elem))

    channels = bench.shapes[0].channels
    points = rows_sweep(channels)
    return {
        "bench_cases": tuple(case(s.rows, s.channels) for s in bench.shapes),
        "bench_fields": ("rows", "channels"),
        "bench_unit": "GB/s",
        "sweep": Sweep("rows", "rows", points, tuple(case(rows, channels) for rows in points)),
    }


# The generated tests run both choices of a tensor the spec saves or recomputes (their RSTD and
# SIGMOID cases, written in the test templates): the compile jobs of the tested variants cover
# both too.
TESTED_SAVES = (False, True)
# A call that no backward follows (torch.no_grad, inference_mode, frozen inputs) saves nothing:
# the forward without the auxiliary tensor, and no backward (no reduction). As (saves, reductions)
# of saved_aux_jobs.
NO_GRAD_CHOICE = ((False,), ())


def saved_aux_jobs(kernels: dict[str, KernelPlan], args: tuple, saves: tuple[bool, ...],
                   reductions: tuple[str, ...], aux: str, size: str, tag: str,
                   tilings: Mapping[str, dict[str, int]] | None = None) -> Iterator[CompileJob]:
    """fwd(*args, save) and bwd(*args, save, dw reduction): each save choice of the auxiliary
    tensor, with each reduction; each kernel with its tiling of `tilings`, else its own."""
    fwd, bwd = kernels["fwd"], kernels["bwd"]
    tilings = tilings or {}
    for save in saves:
        kept = f"{aux}={'save' if save else 'recompute'}"
        yield CompileJob(fwd.factory, (*args, save), tilings.get("fwd", fwd.tiling),
                         f"fwd {size} {kept}{tag}")
        for reduction in reductions:
            yield CompileJob(bwd.factory, (*args, save, reduction), tilings.get("bwd", bwd.tiling),
                             f"bwd {size} {kept} dw={reduction}{tag}")


def tuned_tables(entries: Iterable[Any], key: Callable[[Any], Any], phases: Iterable[str]
                 ) -> dict[str, dict[Any, dict[str, int]]]:
    """[[tiling.tuned]] entries by phase: {key(entry): tiling}, sorted by key, phases without
    entries left out."""
    tables: dict[str, dict[Any, dict[str, int]]] = {}
    for entry in sorted(entries, key=key):
        for phase in phases:
            if (tiling := getattr(entry, phase)) is not None:
                tables.setdefault(phase, {})[key(entry)] = tiling.model_dump()
    return tables


def weight_grads_table(p: PlanBase, dx_bytes: int, w_numel: int, adds_per_address: int,
                       partials: int) -> Table:
    """dx written once; dw as fp32 atomic adds (adds_per_address into each of its w_numel
    elements) or as fp32 partials. The atomic adds go into fp32 sums the package keeps between
    calls (zeroed once; the backward's last block casts them into dw and zeroes them again)."""
    rows = []
    for g in p.grads:
        if g.reduction == "direct":
            rows.append([g.grad, g.reduction, buffer_description(g.reduction),
                         format_bytes(dx_bytes), "-", g.note])
        elif g.reduction == "atomic":
            rows.append([g.grad, g.reduction, "fp32 sums kept between calls (zero between them)",
                         format_bytes(4 * w_numel),
                         f"{adds_per_address * w_numel} ({adds_per_address} per address)", g.note])
        else:
            rows.append([g.grad, g.reduction, buffer_description(g.reduction),
                         format_bytes(4 * partials), "0", g.note])
    return "gradient reductions", [["grad", "reduction", "buffer", "bytes", "atomics", "why"], *rows]


def bytes_moved_table(fwd_bytes: int, bwd_bytes: int, aux: str, aux_bytes: int,
                      partial_bytes: int) -> Table:
    """The op's bytes (what the benchmark counts) and the kernels', which also write and read the
    saved auxiliary tensor and the dw partials."""
    moved = [
        ["forward", format_bytes(fwd_bytes), format_bytes(fwd_bytes + aux_bytes),
         "x, w read; y written" + (f"; the kernel also writes {aux}" if aux_bytes else "")],
        ["backward", format_bytes(bwd_bytes),
         format_bytes(bwd_bytes + aux_bytes + 2 * partial_bytes),
         "dy, x, w read; dx, dw written" + (f"; the kernel also reads {aux}" if aux_bytes else "")
         + ("; dw partials written, then read by the sum" if partial_bytes else "")],
    ]
    return ("bytes moved (the benchmark divides the first column by the time)",
            [["pass", "op bytes", "kernel bytes", "what"], *moved])
