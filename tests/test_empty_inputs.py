"""Empty inputs of the committed packages, on the CPU: a dim 0 is empty work, for which every
package returns the reference's results (empty, or zeros where a sum runs over an empty dim)
without building or launching a kernel; k and v with 0 heads next to a q with some are a shape
error.

The custom ops run their implementations on real CPU tensors here (apply_op takes them; the
public functions run the reference on CPU tensors instead), with every kernel factory replaced by
a trap: the empty path must return before any of them. The public functions' CUDA path runs on
FakeTensorMode tensors of a fake CUDA device. The generated tests run the same cases on the GPU through the public functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import REPO_ROOT, import_generated

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


@dataclass
class Case:
    inputs: dict[str, torch.Tensor]  # the differentiable tensors, in argument order
    flags: tuple = ()  # apply_op's arguments after the tensors
    kwargs: dict = field(default_factory=dict)  # the public function's and reference's keywords
    frozen: tuple[str, ...] = ()  # inputs whose gradient is not asked for


def attention_case(package, batch, heads, kv_heads, seq_len, layout="bshd", device="cpu"):
    """q, k, v (and sinks for attention_sink), head_dim 64."""

    def shape(h):
        return (batch, seq_len, h, 64) if layout == "bshd" else (batch, h, seq_len, 64)

    inputs = {"q": shape(heads), "k": shape(kv_heads), "v": shape(kv_heads)}
    inputs = {name: torch.randn(s, device=device).to(BF16) for name, s in inputs.items()}
    causal, window = True, None
    kwargs = {"causal": causal, "layout": layout}
    if package == "attention_sink":
        inputs["sinks"] = torch.randn(heads, device=device)
        kwargs = {"causal": causal, "window": window, "layout": layout}
    return Case(inputs, (causal, window, layout), kwargs)


def linear_attention_case(batch, seq_len, heads, device="cpu"):
    shapes = {"q": (batch, seq_len, heads, 40), "k": (batch, seq_len, heads, 40),
              "v": (batch, seq_len, heads, 24)}
    return Case({name: torch.randn(s, device=device).to(F16) for name, s in shapes.items()})


def matmul_case(lead, m, n, k, device="cpu"):
    inputs = {"a": torch.randn(*lead, m, k, device=device).to(BF16),
              "b": torch.randn(k, n, device=device).to(BF16),
              "bias": torch.randn(n, device=device).to(BF16)}
    # With K = 0, dbias still sums a non-empty dC: a kernel's work (the GPU tests check it).
    return Case(inputs, frozen=("bias",) if k == 0 else ())


def weighted_case(package, x_shape, save, reduction, device="cpu"):
    """x and w of rmsnorm or scaled_silu, with the saved-tensor flag and the dw reduction."""
    module = import_generated(package, "autograd")
    x = torch.randn(x_shape, device=device).to(BF16 if package == "rmsnorm" else F16)
    channel = package == "rmsnorm" or module.WEIGHT == "channel"
    w = torch.randn(x_shape[-1:] if channel else (), device=device).to(module.weight_dtype(x))
    return Case({"x": x, "w": w}, (save, reduction))


# package -> {case id: make(device) -> Case}: every empty dim of each family.
EMPTY = {
    "attention": {
        f"{layout}-{label}": lambda device, layout=layout, dims=dims: attention_case(
            "attention", *dims, layout=layout, device=device)
        for layout in ("bshd", "bhsd")
        for label, dims in (("batch0", (0, 4, 4, 77)), ("heads0", (2, 0, 0, 77)),
                            ("seq_len0", (2, 4, 4, 0)))
    },
    **{
        package: {
            label: lambda device, package=package, dims=dims: attention_case(
                package, *dims, device=device)
            for label, dims in (("batch0", (0, 8, 2, 77)), ("heads0", (2, 0, 0, 77)),
                                ("seq_len0", (2, 8, 2, 0)))
        }
        for package in ("attention_sink", "gqa")
    },
    "linear_attention": {
        label: lambda device, dims=dims: linear_attention_case(*dims, device=device)
        for label, dims in (("batch0", (0, 77, 2)), ("seq_len0", (1, 0, 2)), ("heads0", (1, 77, 0)))
    },
    "matmul": {
        label: lambda device, lead=lead, dims=dims: matmul_case(lead, *dims, device=device)
        for label, lead, dims in (("m0", (), (0, 24, 40)), ("n0", (), (33, 0, 40)),
                                  ("k0", (), (33, 24, 0)), ("batch0", (0,), (33, 24, 40)))
    },
    **{
        package: {
            f"{'x'.join(map(str, shape))}-save{save}-{reduction}": (
                lambda device, package=package, shape=shape, save=save, reduction=reduction:
                weighted_case(package, shape, save, reduction, device=device))
            for shape in ((0, 40), (3, 0, 40), (3, 5, 0))
            for save in (False, True)
            for reduction in ("atomic", "split")
        }
        for package in ("rmsnorm", "scaled_silu")
    },
    "swiglu": {
        f"{'x'.join(map(str, shape))}-save{save}": (
            lambda device, shape=shape, save=save: Case(
                {name: torch.randn(shape, device=device).to(F16) for name in ("a", "b")}, (save,)))
        for shape in ((0, 40), (3, 0, 40), (3, 5, 0))
        for save in (False, True)
    },
}
PARAMS = [
    pytest.param(package, make, id=f"{package}-{case_id}")
    for package, cases in EMPTY.items()
    for case_id, make in cases.items()
]
ATTENTION = ["attention", "attention_sink", "gqa"]


def test_every_shipped_package_has_empty_cases():
    shipped = {p.name for p in (REPO_ROOT / "generated").iterdir() if (p / "autograd.py").exists()}
    assert shipped == set(EMPTY)


@pytest.fixture
def trap_kernels(monkeypatch):
    """Replace every kernel factory of a package's autograd module by one that fails the test."""

    def trap_package(package):
        autograd = import_generated(package, "autograd")
        kernels = import_generated(package, "kernels")
        factories = [name for name in vars(kernels) if name.startswith(f"{package}_")]
        assert factories and all(hasattr(autograd, name) for name in factories)

        def trap(*args, **kwargs):
            pytest.fail("a kernel was built or launched for empty work")

        for name in factories:
            monkeypatch.setattr(autograd, name, trap)

    return trap_package


@pytest.mark.parametrize("package, make", PARAMS)
def test_empty_work_gives_the_reference_results_without_a_kernel(package, make, trap_kernels):
    """The output and every gradient through the custom ops and their autograd formula equal the
    reference's: shape, dtype and values."""
    trap_kernels(package)
    autograd = import_generated(package, "autograd")
    reference = getattr(import_generated(package, "reference"), f"{package}_reference")
    case = make("cpu")
    differentiable = {n: t.requires_grad_() for n, t in case.inputs.items() if n not in case.frozen}
    out = autograd.apply_op(*case.inputs.values(), *case.flags)
    grad_out = torch.randn(out.shape).to(out.dtype)
    grads = torch.autograd.grad(out, list(differentiable.values()), grad_out)
    expected = reference(*case.inputs.values(), **case.kwargs)
    expected_grads = torch.autograd.grad(expected, list(differentiable.values()), grad_out)
    assert (out.shape, out.dtype) == (expected.shape, expected.dtype)
    assert torch.equal(out, expected)
    for name, grad, want in zip(differentiable, grads, expected_grads):
        assert (grad.shape, grad.dtype) == (want.shape, want.dtype), f"d{name}"
        assert torch.equal(grad, want), f"d{name}"


@pytest.mark.parametrize("package, make", PARAMS)
def test_public_function_accepts_empty_work(package, make, trap_kernels):
    """The input checks let empty CUDA inputs through (then the fake functions give the shapes)."""
    trap_kernels(package)
    public = getattr(import_generated(package, "autograd"), package)
    with FakeTensorMode():
        case = make("cuda")
        out = public(*case.inputs.values(), **case.kwargs)
    assert out.device.type == "cuda"


@pytest.mark.parametrize("package, make", PARAMS)
def test_public_function_on_empty_cpu_inputs_runs_the_reference(package, make, trap_kernels):
    """Empty CPU inputs pass the checks and get the reference's (empty) result."""
    trap_kernels(package)
    public = getattr(import_generated(package, "autograd"), package)
    reference = getattr(import_generated(package, "reference"), f"{package}_reference")
    case = make("cpu")
    out = public(*case.inputs.values(), **case.kwargs)
    assert torch.equal(out, reference(*case.inputs.values(), **case.kwargs))


@pytest.mark.parametrize("package", ATTENTION)
def test_zero_kv_heads_with_query_heads_is_a_shape_error(package):
    autograd = import_generated(package, "autograd")
    with FakeTensorMode():
        case = attention_case(package, 2, 8, 0, 77, device="cuda")
        with pytest.raises(ValueError, match="k and v have 0 heads but q has 8"):
            autograd.check_inputs(*case.inputs.values(), *case.flags)


@pytest.mark.parametrize("package", sorted(EMPTY))
def test_empty_work_under_torch_compile(package, trap_kernels):
    """torch.compile(fullgraph=True) of apply_op traces the fake functions and then runs the ops'
    empty path: the eager result."""
    trap_kernels(package)
    autograd = import_generated(package, "autograd")
    case = next(iter(EMPTY[package].values()))("cpu")
    tensors = list(case.inputs.values())

    def fn(*tensors):
        return autograd.apply_op(*tensors, *case.flags)

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*tensors)
    assert torch.equal(compiled, fn(*tensors))
