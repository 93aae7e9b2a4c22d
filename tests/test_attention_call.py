"""The attention packages' softmax_scale and torch.autocast handling, on the CPU.

The scale's math on CPU tensors (reference.py) is checked against torch's SDPA with `scale=` in
test_cpu_fallback.py. Here: a bad scale is refused before any kernel or the reference runs; the
scale, resolved to a float, is what the custom op receives (the kernels' factory argument); the
module passes its own; the default is the one the compile check builds; and under autocast q, k
and v are cast like SDPA's, on the CPU path and (forward only, fake tensors) on the CUDA path.
The generated tests run the kernels at another scale and under CUDA autocast on the GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from conftest import REPO_ROOT, import_generated
from opgen.families.attention import default_softmax_scale
from opgen.render import load_plan

ATTENTION = ["attention", "attention_sink", "gqa"]
F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
HEAD_DIM = 64


def public(package):
    return getattr(import_generated(package, "autograd"), package)


def make_inputs(package, dtypes=(BF16, BF16, BF16), device="cpu"):
    """{name: tensor} of q, k, v in `dtypes` (bshd, head_dim 64; grouped for gqa and
    attention_sink) and float32 sinks where the package has them."""
    heads, kv_heads = (4, 2) if package != "attention" else (4, 4)
    gen = torch.Generator().manual_seed(0)
    shapes = {"q": (2, 9, heads, HEAD_DIM), "k": (2, 9, kv_heads, HEAD_DIM),
              "v": (2, 9, kv_heads, HEAD_DIM)}
    inputs = {name: torch.randn(shape, generator=gen).to(dtype)
              for (name, shape), dtype in zip(shapes.items(), dtypes)}
    if package == "attention_sink":
        inputs["sinks"] = torch.randn(heads, generator=gen)
    if device != "cpu":
        inputs = {name: torch.empty(t.shape, dtype=t.dtype, device=device)
                  for name, t in inputs.items()}
    return inputs


KWARGS = {"causal": True}


@pytest.fixture
def trap(monkeypatch):
    """Replace every kernel factory and the reference in a package's autograd module by a
    function that fails the test: what must raise before anything runs."""

    def trap_package(package):
        autograd = import_generated(package, "autograd")
        kernels = import_generated(package, "kernels")

        def fail(*args, **kwargs):
            pytest.fail("a kernel or the reference ran for inputs that must be refused")

        factories = [n for n in vars(kernels) if n.startswith(f"{package}_")]
        for name in [*factories, f"{package}_reference"]:
            assert hasattr(autograd, name), name
            monkeypatch.setattr(autograd, name, fail)

    return trap_package


@pytest.fixture
def cuda_autocast():
    """CUDA autocast switched on (torch.autocast("cuda") refuses without a CUDA device), for
    forward calls on fake CUDA tensors; off again afterwards."""

    def enable(dtype):
        torch.set_autocast_dtype("cuda", dtype)
        torch.set_autocast_enabled("cuda", True)

    saved = torch.get_autocast_dtype("cuda")
    yield enable
    torch.set_autocast_enabled("cuda", False)
    torch.set_autocast_dtype("cuda", saved)


BAD_SCALES = [
    pytest.param(0.0, ValueError, id="zero"),
    pytest.param(-0.125, ValueError, id="negative"),
    pytest.param(math.nan, ValueError, id="nan"),
    pytest.param(math.inf, ValueError, id="inf"),
    pytest.param("0.125", TypeError, id="str"),
    pytest.param(True, TypeError, id="bool"),
    pytest.param(torch.tensor(0.125), TypeError, id="tensor"),
]


@pytest.mark.parametrize("scale, error", BAD_SCALES)
@pytest.mark.parametrize("package", ATTENTION)
def test_bad_softmax_scale_is_refused_before_anything_runs(package, scale, error, trap):
    trap(package)
    with pytest.raises(error, match="softmax_scale must be"):
        public(package)(*make_inputs(package).values(), **KWARGS, softmax_scale=scale)
    with FakeTensorMode():
        inputs = make_inputs(package, device="cuda")
        with pytest.raises(error, match="softmax_scale must be"):
            public(package)(*inputs.values(), **KWARGS, softmax_scale=scale)


@pytest.mark.parametrize("package", ATTENTION)
def test_softmax_scale_is_keyword_only(package):
    inputs = make_inputs(package)
    positional = [True, None, "bshd"] if package == "attention_sink" else [True, "bshd"]
    with pytest.raises(TypeError):
        public(package)(*inputs.values(), *positional, 0.3)


@pytest.mark.parametrize("package", ATTENTION)
def test_the_op_gets_the_scale_as_a_float(package, forward_calls):
    """None becomes 1 / sqrt(head_dim) (the default of the kernels), an int a float: the forward
    op's last argument, the kernels' factory argument."""
    calls = forward_calls(package)
    with FakeTensorMode():
        inputs = make_inputs(package, device="cuda")
        for scale in (None, 0.3, 2):
            public(package)(*inputs.values(), **KWARGS, softmax_scale=scale)
    kernels = import_generated(package, "kernels")
    got = [call[-1] for call in calls]
    assert got == [kernels.default_softmax_scale(HEAD_DIM), 0.3, 2.0]
    assert all(type(scale) is float for scale in got)


@pytest.mark.parametrize("package", ATTENTION)
def test_cpu_default_scale_is_one_over_sqrt_head_dim(package):
    inputs = make_inputs(package)
    fn = public(package)
    default = fn(*inputs.values(), **KWARGS)
    explicit = fn(*inputs.values(), **KWARGS, softmax_scale=1 / math.sqrt(HEAD_DIM))
    assert torch.equal(default, explicit)
    assert not torch.equal(default, fn(*inputs.values(), **KWARGS, softmax_scale=0.3))


@pytest.mark.parametrize("package", ATTENTION)
def test_compile_check_builds_the_default_scale(package):
    """The compile jobs' fwd and bwd kernels carry the scale the package uses by default."""
    plan, _ = load_plan(REPO_ROOT / "specs" / f"{package}.toml")
    kernels = import_generated(package, "kernels")
    factories = (plan.kernels["fwd"].factory, plan.kernels["bwd"].factory)
    jobs = [job for job in plan.compile_jobs if job.factory in factories]
    assert jobs
    for job in jobs:  # (heads, kv_heads, dim, causal, window, layout, dtype, softmax_scale, ...)
        dim, scale = job.args[2], job.args[7]
        assert scale == default_softmax_scale(dim) == kernels.default_softmax_scale(dim), job.label


@pytest.mark.parametrize("package", ATTENTION)
def test_module_takes_the_scale_at_construction(package):
    module_type = import_generated(package, "modules").Attention
    inputs = make_inputs(package)
    qkv = [inputs[n] for n in ("q", "k", "v")]
    heads = [4] if package == "attention_sink" else []  # the sinks module's num_heads
    module = module_type(*heads, causal=True, softmax_scale=0.3)
    assert "softmax_scale=0.3" in repr(module)
    extra = [module.sinks] if package == "attention_sink" else []
    want = public(package)(*qkv, *extra, causal=True, softmax_scale=0.3)
    assert torch.equal(module(*qkv), want)
    default = module_type(*heads, causal=True)
    assert default.softmax_scale is None
    assert not torch.equal(default(*qkv), want)


AUTOCAST_CASES = [
    pytest.param(dtype, given, id=f"{str(dtype)[6:]}-{label}")
    for dtype in (BF16, F16)
    for label, given in (("float32", (F32, F32, F32)), ("mixed", (F32, None, F32)))
]


@pytest.mark.parametrize("dtype, given", AUTOCAST_CASES)
@pytest.mark.parametrize("package", ATTENTION)
def test_cpu_autocast_casts_q_k_v(package, dtype, given):
    """Under torch.autocast("cpu"), float32 (or mixed) q, k, v give what the call with q, k, v cast
    by hand gives outside autocast, bit for bit (the reference keeps its float32 math), and each
    gradient comes back in its leaf's dtype; sinks keep theirs."""
    values = make_inputs(package, tuple(d or dtype for d in given))
    results = []
    for autocast in (True, False):
        leaves = {name: t.clone().requires_grad_() for name, t in values.items()}
        if autocast:
            with torch.autocast("cpu", dtype=dtype):
                out = public(package)(*leaves.values(), **KWARGS, softmax_scale=0.3)
        else:
            args = [t.to(dtype) if name in ("q", "k", "v") else t for name, t in leaves.items()]
            out = public(package)(*args, **KWARGS, softmax_scale=0.3)
        grads = torch.autograd.grad(out.float().square().sum(), list(leaves.values()))
        results.append((out, dict(zip(leaves, grads))))
    (out, got), (want, want_grads) = results
    assert out.dtype == dtype
    assert torch.equal(out, want)
    for name, t in values.items():
        assert got[name].dtype == t.dtype, f"d{name}"
        assert torch.equal(got[name], want_grads[name]), f"d{name}"


@pytest.mark.parametrize("package", ATTENTION)
def test_cuda_autocast_casts_before_the_op(package, forward_calls, cuda_autocast):
    """With CUDA autocast on, fake CUDA float32 q, k, v reach the forward op in autocast's dtype
    (dense), sinks in their own; the output is in autocast's dtype."""
    calls = forward_calls(package)
    cuda_autocast(BF16)
    with FakeTensorMode():
        inputs = make_inputs(package, (F32, F16, F32), device="cuda")
        out = public(package)(*inputs.values(), **KWARGS)
    assert out.dtype == BF16
    (args,) = calls
    assert [t.dtype for t in args[:3]] == [BF16] * 3
    assert all(t.is_contiguous() for t in args[:3])
    if package == "attention_sink":
        assert args[3].dtype == F32


@pytest.mark.parametrize("package", ATTENTION)
def test_mixed_dtypes_outside_autocast_are_refused(package, trap):
    trap(package)
    inputs = make_inputs(package, (F32, BF16, BF16))
    with pytest.raises(TypeError, match="q has dtype torch.float32"):
        public(package)(*inputs.values(), **KWARGS)
    with pytest.raises(TypeError, match="one dtype"):
        public(package)(*make_inputs(package, (BF16, F16, BF16)).values(), **KWARGS)


@pytest.mark.parametrize("package", ATTENTION)
def test_autocast_dtype_the_package_lacks_is_refused(package, trap, monkeypatch):
    trap(package)
    autograd = import_generated(package, "autograd")
    monkeypatch.setattr(autograd, "DTYPE_NAMES", {F16: "float16"})  # a float16-only spec
    with torch.autocast("cpu", dtype=BF16):
        with pytest.raises(TypeError, match="autocast's dtype torch.bfloat16 is not supported"):
            public(package)(*make_inputs(package, (F32, F32, F32)).values(), **KWARGS)


def fused_views(package, pad=0, device="cuda"):
    """q, k, v split from one [2, 9, heads + 2 kv_heads, 64] bf16 projection (a model's fused
    qkv), each a strided view; with pad, from rows of 2 * pad more elements, the heads' from
    pad on."""
    heads, kv_heads = (4, 2) if package != "attention" else (4, 4)
    width = (heads + 2 * kv_heads) * HEAD_DIM
    rows = torch.empty(2, 9, width + 2 * pad, dtype=BF16, device=device)
    base = rows.narrow(2, pad, width).unflatten(2, (heads + 2 * kv_heads, HEAD_DIM))
    return base.split([heads, kv_heads, kv_heads], dim=2)


@pytest.mark.parametrize("package", ATTENTION)
def test_views_reach_the_kernels_in_place(package, forward_calls):
    """q, k, v split from a fused projection, and transposed from [batch, heads, seq, dim], reach
    the forward op as they are (the kernels read their strides): no copy."""
    calls = forward_calls(package)
    with FakeTensorMode():
        split = fused_views(package)
        # (clone, not .contiguous(): a CPU build of torch fails that on fake CUDA tensors)
        transposed = [t.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)
                      for t in split]
        extra = [torch.empty(4, device="cuda")] if package == "attention_sink" else []
        for views in (split, transposed):
            assert not any(t.is_contiguous() for t in views)
            public(package)(*views, *extra, **KWARGS)
    for (args, views) in zip(calls, (split, transposed)):
        for got, view in zip(args[:3], views):
            assert (got.stride(), got.storage_offset()) == (view.stride(), view.storage_offset())


@pytest.mark.parametrize("package", ATTENTION)
def test_views_off_16_bytes_are_copied_once(package, forward_calls):
    """A view whose strides or start are not on 16 bytes (TMA's rule), or whose last dim is
    strided, reaches the op as a dense copy."""
    calls = forward_calls(package)
    autograd = import_generated(package, "autograd")
    with FakeTensorMode():
        unaligned = fused_views(package, pad=4)
        assert not any(autograd.read_in_place(t) for t in unaligned)
        extra = [torch.empty(4, device="cuda")] if package == "attention_sink" else []
        public(package)(*unaligned, *extra, **KWARGS)
    (args,) = calls
    assert all(t.is_contiguous() and t.storage_offset() == 0 for t in args[:3])


def test_read_in_place_rule():
    autograd = import_generated("attention", "autograd")
    dense = torch.empty(2, 9, 4, HEAD_DIM, dtype=BF16)
    assert autograd.read_in_place(dense)
    assert autograd.read_in_place(dense.transpose(1, 2))  # another dim order
    assert autograd.read_in_place(dense[:, 1:])  # offset 4 * 64 elements
    assert not autograd.read_in_place(dense.transpose(-1, -2).contiguous().transpose(-1, -2))
    assert not autograd.read_in_place(torch.empty(dense.numel() + 4, dtype=BF16)[4:].view(dense.shape))
    assert not autograd.read_in_place(torch.empty(2, 9, 4 * HEAD_DIM + 4, dtype=BF16)[..., :-4]
                                      .view(dense.shape))  # rows of 260 elements
    assert not autograd.read_in_place(torch.empty(1, HEAD_DIM, dtype=BF16).expand(9, HEAD_DIM)
                                      .view(1, 9, 1, HEAD_DIM).expand(2, 9, 4, HEAD_DIM))  # stride 0
    # A dim of length 1 may have any stride.
    assert autograd.read_in_place(torch.empty(1, 9, 4, HEAD_DIM, dtype=BF16).as_strided(
        (1, 9, 4, HEAD_DIM), (3, 4 * HEAD_DIM, HEAD_DIM, 1)))
    # check_inputs (apply_op's callers, torch.compile) says what is wrong.
    bad = dense.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match="q needs a contiguous last dim and 16-byte aligned strides"):
        autograd.check_inputs(bad, dense, dense, True, None, "bshd")


def test_under_torch_compile_the_op_copies_a_view_off_16_bytes(monkeypatch):
    """torch.compile does not trace storage_offset(): there the public function leaves a view
    whose strides TMA can read to the op, and the op copies it if it starts off 16 bytes."""
    autograd = import_generated("attention", "autograd")
    unaligned, aligned = fused_views("attention", pad=4, device="cpu")[0], fused_views("attention", device="cpu")[0]
    unaligned.copy_(torch.randn(unaligned.shape))
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert autograd.dense(unaligned) is unaligned and autograd.dense(aligned) is aligned
    copy = autograd.aligned_start(unaligned)
    assert copy is not unaligned and copy.is_contiguous() and torch.equal(copy, unaligned)
    assert autograd.aligned_start(aligned) is aligned
    monkeypatch.undo()
    assert autograd.dense(unaligned) is not unaligned and autograd.dense(aligned) is aligned


def loop_readable(t, step):
    """strides_readable's rule, dim by dim (what its contiguous fast path must agree with)."""
    return t.stride(-1) == 1 and all(size == 1 or (stride > 0 and stride % step == 0)
                                     for size, stride in zip(t.shape[:-1], t.stride()[:-1]))


@pytest.mark.parametrize("package", ATTENTION)
def test_strides_readable_fast_path_agrees_with_the_rule(package):
    autograd = import_generated(package, "autograd")
    base = torch.empty(2, 9, 4, 64, dtype=BF16)
    views = [base, base[:, :5], base[..., :32], base[..., 1:33], base.transpose(1, 2),
             base[:, :, :1], torch.empty(1, 1, 1, 3, dtype=BF16), torch.empty(2, 0, 4, 64, dtype=BF16),
             torch.empty(3, 5, 2, 8, dtype=BF16), torch.empty(3, 5, 2, 12, dtype=BF16),
             torch.empty(4, 64, 2, 1, dtype=BF16).transpose(1, 3)]
    step = autograd.TMA_ALIGNMENT // 2
    for t in views:
        assert autograd.strides_readable(t) == loop_readable(t, step), (tuple(t.shape), t.stride())


@pytest.mark.parametrize("package", ATTENTION)
def test_a_0d_input_hears_of_its_rank(package):
    """A 0-D q, k or v is refused as not 4-D (before, reading its last dim's stride raised an
    IndexError)."""
    autograd = import_generated(package, "autograd")
    public = getattr(autograd, package)
    scalar = torch.tensor(1.0, dtype=BF16)
    args = (scalar, scalar, scalar) + ((torch.zeros(4),) if package == "attention_sink" else ())
    with pytest.raises(ValueError, match=f"^{package}: q must be 4-D"):
        public(*args)
