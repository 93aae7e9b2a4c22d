"""Plan pieces every family uses: kernels, compile jobs, shared-memory budget, header data.

A plan holds every derived value the templates print. Templates make no decisions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opgen.errors import SpecError

# sm_90 (H100/H200): 227 KB of dynamic shared memory per block.
SM90_SMEM_LIMIT = 227 * 1024

TORCH_DTYPES = {"float16": "torch.float16", "bfloat16": "torch.bfloat16", "float32": "torch.float32"}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
# The torch.library namespace of every generated custom op: torch.ops.opgen.<name>_<phase>.
OP_NAMESPACE = "opgen"


def custom_op_names(name: str, *phases: str) -> dict[str, str]:
    """The qualified torch.library names of a package's custom ops, by phase ("opgen::x_fwd")."""
    return {phase: f"{OP_NAMESPACE}::{name}_{phase}" for phase in phases}


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


@dataclass(frozen=True)
class CompileJob:
    """One kernel instance the compile check builds: factory(*args)."""

    factory: str
    args: tuple
    tiling: dict[str, int]
    label: str


@dataclass(frozen=True)
class SourceInfo:
    """What the header of every generated file records."""

    spec_path: str
    spec_sha256: str
    opgen_version: str

    @property
    def short_hash(self) -> str:
        return self.spec_sha256[:16]


@dataclass(frozen=True)
class GradPlan:
    """How one gradient is produced: by which reduction into which buffer."""

    grad: str  # dq
    input: str  # q
    reduction: str  # direct | atomic | split
    buffer_dtype: str  # float32 for atomic targets, else the input's dtype
    alloc: str  # torch.zeros (atomic target) | torch.empty (written once per element)
    note: str = field(default="")


def require_every_gradient_checked(
    spec_path: str, differentiable: tuple[str, ...], checked: tuple[str, ...]
) -> None:
    """Refuse a plan whose generated test would leave a differentiable input unasserted.

    Families list the inputs that get a gradient and, separately, the inputs the generated test
    asserts; a variant that adds one without the other is caught here, at build time.
    """
    missing = [name for name in differentiable if name not in checked]
    if missing:
        raise SpecError(spec_path, [("grads", (
            f"the generated test would not check the gradient of {', '.join(missing)}; every "
            "differentiable input needs its own assertion"
        ))])


def format_bytes(n: float) -> str:
    """A byte count for people: 512 B, 1.5 KiB, 64.0 MiB, 2.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
