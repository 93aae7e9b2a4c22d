"""The committed packages' torch.library custom ops, on the CPU: registration, fake functions,
autograd wiring and torch.export tracing, with fake tensors only (no kernel runs here).

Each generated package registers its forward and backward phases as custom ops so that
torch.compile sees one node per phase instead of breaking the graph. On this CPU-only machine the
ops are called with FakeTensorMode tensors on the CPU device (autograd over fake CUDA tensors needs
a CUDA build of torch): every call reaches the fake functions, and a kernel launch that escaped
the ops would fail on a fake tensor. The generated tests check the fake functions against the real
kernels on the GPU (torch.library.opcheck) and run torch.compile(fullgraph=True).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import REPO_ROOT, import_generated

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32


def autograd_module(package: str):
    return import_generated(package, "autograd")


def tensor(shape, dtype, grad=True):
    return torch.empty(shape, dtype=dtype).normal_().requires_grad_(grad)


@dataclass
class Case:
    args: tuple  # apply_op's arguments
    grads: dict[str, int]  # differentiable input -> its index in args
    ref_kwargs: dict = field(default_factory=dict)  # the reference's arguments after the tensors


def attention_case(heads, kv_heads, causal, window, layout, sinks=False):
    q_shape = (2, 77, heads, 64) if layout == "bshd" else (2, heads, 77, 64)
    kv_shape = (2, 77, kv_heads, 64) if layout == "bshd" else (2, kv_heads, 77, 64)
    tensors = [tensor(q_shape, F16), tensor(kv_shape, F16), tensor(kv_shape, F16)]
    tensors += [tensor((heads,), F32)] if sinks else []
    names = ["q", "k", "v", "sinks"][: len(tensors)]
    kwargs = {"causal": causal, "layout": layout} | ({"window": window} if sinks else {})
    return Case((*tensors, causal, window, layout), {n: i for i, n in enumerate(names)}, kwargs)


def weighted_case(x_shape, w_shape, dtype, w_dtype, save, reduction):
    return Case((tensor(x_shape, dtype), tensor(w_shape, w_dtype), save, reduction), {"x": 0, "w": 1})


# package -> {case id: make() -> Case}, made inside FakeTensorMode. Odd shapes on purpose.
CASES = {
    "attention": {
        f"{layout}-causal{causal}": lambda layout=layout, causal=causal: attention_case(
            4, 4, causal, None, layout)
        for layout in ("bshd", "bhsd") for causal in (False, True)
    },
    "attention_sink": {
        f"window{window}": lambda window=window: attention_case(8, 2, True, window, "bshd", True)
        for window in (None, 32)
    },
    "gqa": {"causal": lambda: attention_case(8, 2, True, None, "bshd")},
    "linear_attention": {
        "dk40-dv24": lambda: Case(
            (tensor((1, 77, 2, 40), F16), tensor((1, 77, 2, 40), F16), tensor((1, 77, 2, 24), F16)),
            {"q": 0, "k": 1, "v": 2})
    },
    "matmul": {
        "bias": lambda: Case(
            (tensor((3, 33, 40), BF16), tensor((40, 24), BF16), tensor((24,), BF16)),
            {"a": 0, "b": 1, "bias": 2}),
        "no-bias": lambda: Case(
            (tensor((33, 40), F16), tensor((40, 24), F16), None), {"a": 0, "b": 1}),
    },
    "scaled_silu": {
        f"{save}-{reduction}": lambda save=save, reduction=reduction: weighted_case(
            (3, 5, 7), (), F16, F32, save, reduction)
        for save in (False, True) for reduction in ("atomic", "split")
    },
    "rmsnorm": {
        f"{save}-{reduction}": lambda save=save, reduction=reduction: weighted_case(
            (3, 5, 40), (40,), BF16, BF16, save, reduction)
        for save in (False, True) for reduction in ("atomic", "split")
    },
    "swiglu": {
        f"save{save}": lambda save=save: Case(
            (tensor((3, 5, 77), F16), tensor((3, 5, 77), F16), save), {"a": 0, "b": 1})
        for save in (False, True)
    },
}
PARAMS = [
    pytest.param(package, make, id=f"{package}-{case_id}")
    for package, cases in CASES.items()
    for case_id, make in cases.items()
]


def test_every_shipped_package_has_cases():
    shipped = {p.name for p in (REPO_ROOT / "generated").iterdir() if (p / "autograd.py").exists()}
    assert shipped == set(CASES)


@pytest.mark.parametrize("package", sorted(CASES))
def test_ops_are_registered_under_the_opgen_namespace(package):
    module = autograd_module(package)
    fwd = getattr(torch.ops.opgen, f"{package}_fwd")
    assert fwd.default._schema.name == f"opgen::{package}_fwd"
    assert module.forward_op._qualname == f"opgen::{package}_fwd"


@pytest.mark.parametrize("package, make", PARAMS)
def test_fake_forward_and_backward_give_the_inputs_shapes(package, make):
    """Output and every gradient through the registered autograd formula, with fake tensors:
    each gradient has its input's shape and dtype, and the output has the reference's."""
    module = autograd_module(package)
    reference = import_generated(package, "reference")
    ref_fn = getattr(reference, f"{package}_reference")
    with FakeTensorMode():
        case = make()
        out = module.apply_op(*case.args)
        inputs = [case.args[i] for i in case.grads.values()]
        grads = torch.autograd.grad(out, inputs, torch.empty_like(out))
    for name, grad, arg in zip(case.grads, grads, inputs):
        assert (grad.shape, grad.dtype) == (arg.shape, arg.dtype), f"d{name}"
    # The reference on real CPU tensors of the same shapes gives what the op must return.
    expected = ref_fn(*(tensor(a.shape, a.dtype, False) for a in inputs), **case.ref_kwargs)
    assert (out.shape, out.dtype) == (expected.shape, expected.dtype)


@pytest.mark.parametrize("package, make", PARAMS)
def test_torch_export_traces_the_forward_op(package, make):
    """torch.export (dynamo, strict) traces apply_op without a graph break into a graph that calls
    the forward op; it runs only the fake functions."""
    module = autograd_module(package)
    args = make().args
    tensor_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]

    class Op(torch.nn.Module):
        def forward(self, *tensors):
            full = list(args)
            for i, t in zip(tensor_positions, tensors):
                full[i] = t
            return module.apply_op(*full)

    inputs = tuple(args[i].detach() for i in tensor_positions)
    program = torch.export.export(Op(), inputs, strict=True)
    targets = [str(node.target) for node in program.graph.nodes if node.op == "call_function"]
    assert f"opgen.{package}_fwd.default" in targets
