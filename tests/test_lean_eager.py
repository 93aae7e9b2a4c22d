"""The lean eager path (EagerFunction with its CallPlans) of matmul, swiglu and linear_attention,
on the CPU: the host logic around the launches (call plans, matrix views, dense gradients,
needs_input_grad, gradient buffers, empty work) with every kernel's entry point replaced by a
PyTorch emulation that asserts what the real entry point and the kernels need (2-D or 4-D shapes,
the row strides the kernel was built for, dtypes, 16-byte aligned starts) and writes its outputs
in place, as the kernels do. The output and every gradient must equal the reference's. The
kernels themselves run in the generated GPU tests; on a GPU, EagerFunction is what the public
function runs (eager())."""

from __future__ import annotations

import pytest
import torch

from conftest import import_generated
from test_swiglu import import_golden

BF16 = torch.bfloat16
ALIGNMENT = 16


def check(t, shape, dtype, row_stride=None):
    """What an entry point and the kernels need of a tensor argument."""
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shape), (tuple(t.shape), shape)
    assert t.dtype == dtype, (t.dtype, dtype)
    assert t.data_ptr() % ALIGNMENT == 0, "a kernel argument starts off a 16-byte boundary"
    if row_stride is None:
        assert t.is_contiguous(), f"strides {t.stride()} for shape {tuple(t.shape)}"
    else:
        assert t.dim() == 2 and t.stride(1) == 1
        assert t.shape[0] == 1 or t.stride(0) == row_stride, (t.stride(), row_stride)


class Kernels:
    """autograd.kernel replaced: emulations by factory name, and a record of what was built and
    launched."""

    def __init__(self, autograd, emulations):
        self.autograd, self.emulations = autograd, emulations
        self.built, self.launched = [], []

    def __call__(self, factory, *args, **tiling):
        name = next(n for n in self.emulations if getattr(self.autograd, n) is factory)
        self.built.append(name)
        run = self.emulations[name](*args, **tiling)

        def launch(*tensors):
            self.launched.append(name)
            with torch.no_grad():
                run(*tensors)

        return launch


@pytest.fixture
def emulate(monkeypatch):
    """emulate(autograd, emulations) -> Kernels: the module's kernels emulated, its plans fresh."""

    def install(autograd, emulations):
        kernels = Kernels(autograd, emulations)
        monkeypatch.setattr(autograd, "kernel", kernels)
        monkeypatch.setattr(autograd, "PLANS", {})
        return kernels

    return install


def dtype_of(name):
    return getattr(torch, name)


def grads(out, inputs, grad_out):
    wanted = [t for t in inputs if t is not None and t.requires_grad]
    return torch.autograd.grad(out, wanted, grad_out)


def assert_same(label, got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, label
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=label)


def offset(t):
    """t's values in a contiguous tensor that starts 2 bytes past a 16-byte boundary."""
    storage = torch.empty(t.numel() + 1, dtype=t.dtype)
    view = storage[1:].view(t.shape)
    view.copy_(t)
    return view


# --- matmul ----------------------------------------------------------------------------------


def matmul_emulations(block_m):
    def fwd(n, k, dtype, bias, **tiling):
        def run(a, b, *rest):
            c, dtype_ = rest[-1], dtype_of(dtype)
            check(a, (a.shape[0], k), dtype_)
            check(b, (k, n), dtype_)
            check(c, (a.shape[0], n), dtype_)
            out = a.float() @ b.float()
            if bias:
                check(rest[0], (n,), dtype_)
                out += rest[0].float()
            c.copy_(out)

        return run

    def da(n, k, dtype, **tiling):
        def run(dc, b, da_):
            m = dc.shape[0]
            for t, shape in ((dc, (m, n)), (b, (k, n)), (da_, (m, k))):
                check(t, shape, dtype_of(dtype))
            da_.copy_(dc.float() @ b.float().T)

        return run

    def db(n, k, dtype, **tiling):
        def run(a, dc, db_):
            m = a.shape[0]
            for t, shape in ((a, (m, k)), (dc, (m, n)), (db_, (k, n))):
                check(t, shape, dtype_of(dtype))
            db_.copy_(a.float().T @ dc.float())

        return run

    def dbias(n, dtype, **tiling):
        def run(dc, partials):
            m = dc.shape[0]
            check(dc, (m, n), dtype_of(dtype))
            check(partials, (-(-m // block_m), n), torch.float32)
            for i in range(partials.shape[0]):
                partials[i] = dc[i * block_m : (i + 1) * block_m].float().sum(0)

        return run

    return {"matmul_fwd": fwd, "matmul_bwd_da": da, "matmul_bwd_db": db, "matmul_bwd_dbias": dbias}


@pytest.fixture
def matmul(emulate):
    autograd = import_generated("matmul", "autograd")
    kernels = emulate(autograd, matmul_emulations(autograd.DBIAS_TILING["block_m"]))
    reference = import_generated("matmul", "reference").matmul_reference
    return autograd, kernels, reference


def matmul_inputs(lead, m, n, k, bias=True, frozen=()):
    gen = torch.Generator().manual_seed(0)
    inputs = {
        "a": torch.randn(*lead, m, k, generator=gen).to(BF16),
        "b": torch.randn(k, n, generator=gen).to(BF16),
        "bias": torch.randn(n, generator=gen).to(BF16) if bias else None,
    }
    for name, t in inputs.items():
        if t is not None and name not in frozen:
            t.requires_grad_()
    return inputs, torch.randn(*lead, m, n, generator=gen).to(BF16)


@pytest.mark.parametrize("lead", [(), (2, 3)], ids=["flat", "batched"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_matmul_eager_matches_the_reference(matmul, lead, bias):
    autograd, kernels, reference = matmul
    inputs, dc = matmul_inputs(lead, 37, 24, 40, bias)
    tensors = list(inputs.values())
    for _ in range(2):  # the second call reuses the first one's plan and kernels
        c = autograd.EagerFunction.apply(*tensors)
        got = grads(c, tensors, dc)
    want_c = reference(*tensors)
    assert_same("C", c, want_c)
    for name, g, w in zip(("dA", "dB", "dbias"), got, grads(want_c, tensors, dc)):
        assert_same(name, g, w)
    assert len(autograd.PLANS) == 1
    phases = ["matmul_fwd", "matmul_bwd_da", "matmul_bwd_db"] + (
        ["matmul_bwd_dbias"] if bias else []
    )
    assert sorted(kernels.built) == sorted(phases), "each kernel is resolved once per plan"


@pytest.mark.parametrize("frozen", [("b",), ("a",), ("bias",), ("a", "bias")])
def test_matmul_eager_launches_only_the_asked_gradients(matmul, frozen):
    autograd, kernels, reference = matmul
    inputs, dc = matmul_inputs((), 33, 16, 24, frozen=frozen)
    tensors = list(inputs.values())
    c = autograd.EagerFunction.apply(*tensors)
    got = grads(c, tensors, dc)
    want = grads(reference(*tensors), tensors, dc)
    for g, w in zip(got, want):
        assert_same("grad", g, w)
    skipped = {"a": "matmul_bwd_da", "b": "matmul_bwd_db", "bias": "matmul_bwd_dbias"}
    assert not {skipped[name] for name in frozen} & set(kernels.launched + kernels.built)


@pytest.mark.parametrize("layout", ["expanded", "strided", "offset", "float32"])
def test_matmul_eager_takes_any_upstream_gradient(matmul, layout):
    autograd, _, reference = matmul
    inputs, dc = matmul_inputs((2,), 9, 24, 16)
    tensors = list(inputs.values())
    upstream = {
        "expanded": dc[:1, :1].expand(dc.shape),
        "strided": torch.stack([dc, dc], dim=-1)[..., 0],
        "offset": offset(dc),
        "float32": dc.float(),
    }[layout]
    c = autograd.EagerFunction.apply(*tensors)
    got = grads(c, tensors, upstream)
    want = grads(reference(*tensors), tensors, upstream.to(BF16).contiguous())
    for g, w in zip(got, want):
        assert_same(layout, g, w)


@pytest.mark.parametrize("shape", [(0, 24, 16), (9, 0, 16), (9, 24, 0)], ids=["m0", "n0", "k0"])
def test_matmul_eager_empty_work(matmul, shape):
    """M or N 0 launches nothing; K = 0 launches only the dbias kernel (dbias is dC's column sums:
    not empty)."""
    autograd, kernels, reference = matmul
    inputs, dc = matmul_inputs((), *shape)
    tensors = list(inputs.values())
    c = autograd.EagerFunction.apply(*tensors)
    got = grads(c, tensors, dc)
    want_c = reference(*tensors)
    assert torch.equal(c, want_c)
    for g, w in zip(got, grads(want_c, tensors, dc)):
        assert_same("grad", g, w)
    assert set(kernels.launched) <= ({"matmul_bwd_dbias"} if shape[2] == 0 else set())
    assert not autograd.PLANS


# --- swiglu ----------------------------------------------------------------------------------


def swiglu_emulations():
    def fwd(cols, a_stride, b_stride, dtype, save_sigmoid, **tiling):
        def run(a, b, y, *s):
            rows, dtype_ = a.shape[0], dtype_of(dtype)
            check(a, (rows, cols), dtype_, a_stride)
            check(b, (rows, cols), dtype_, b_stride)
            check(y, (rows, cols), dtype_)
            assert len(s) == save_sigmoid
            sig = torch.sigmoid(a.float())
            y.copy_(a.float() * sig * b.float())
            if save_sigmoid:
                check(s[0], (rows, cols), torch.float32)
                s[0].copy_(sig)

        return run

    def bwd(cols, a_stride, b_stride, da_stride, db_stride, dtype, save_sigmoid, **tiling):
        def run(a, b, *rest):
            rows, dtype_ = a.shape[0], dtype_of(dtype)
            assert len(rest) == 3 + save_sigmoid
            dy, da, db = rest[-3:]
            for t, stride in ((a, a_stride), (b, b_stride), (da, da_stride), (db, db_stride)):
                check(t, (rows, cols), dtype_, stride)
            check(dy, (rows, cols), dtype_)
            sig = torch.sigmoid(a.float())
            if save_sigmoid:
                check(rest[0], (rows, cols), torch.float32)
                sig = rest[0]
            silu = a.float() * sig
            da.copy_(dy.float() * b.float() * (sig + silu * (1 - sig)))
            db.copy_(dy.float() * silu)

        return run

    return {"swiglu_fwd": fwd, "swiglu_bwd": bwd}


@pytest.fixture
def swiglu(emulate):
    autograd = import_generated("swiglu", "autograd")
    kernels = emulate(autograd, swiglu_emulations())
    return autograd, kernels, import_generated("swiglu", "reference").swiglu_reference


def pair_inputs(layout, shape):
    """(a, b) leaves or views of a leaf, and the tensors to differentiate."""
    gen = torch.Generator().manual_seed(0)
    if layout == "halves":  # the halves of one wider tensor: strided rows
        wide = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen).to(BF16).requires_grad_()
        return wide.chunk(2, dim=-1), [wide]
    a, b = (torch.randn(shape, generator=gen).to(BF16).requires_grad_() for _ in range(2))
    return (a, b), [a, b]


@pytest.mark.parametrize("save", [False, True], ids=["recompute", "save"])
@pytest.mark.parametrize(
    "layout, shape",
    [
        ("contiguous", (37, 40)),
        ("contiguous", (3, 5, 40)),
        ("contiguous", (1, 40)),
        ("halves", (3, 5, 64)),
        ("halves", (7, 77)),
        ("halves", (1, 64)),
    ],
)
def test_swiglu_eager_matches_the_reference(swiglu, layout, shape, save):
    """Contiguous inputs, 2-D or not, and the strided halves of a wider tensor: read in place where
    aligned (C = 64), b copied where not (C = 77)."""
    autograd, kernels, reference = swiglu
    (a, b), leaves = pair_inputs(layout, shape)
    dy = torch.randn(shape).to(BF16)
    for _ in range(2):
        y = autograd.EagerFunction.apply(a, b, save)
        got = grads(y, leaves, dy)
    want = reference(a, b)
    assert_same("y", y, want)
    for g, w in zip(got, grads(want, leaves, dy)):
        assert_same("grad", g, w)
    assert sorted(kernels.built) == ["swiglu_bwd", "swiglu_fwd"]


@pytest.mark.parametrize("layout", ["expanded", "transposed", "offset", "float32"])
def test_swiglu_eager_takes_any_upstream_gradient(swiglu, layout):
    autograd, _, reference = swiglu
    (a, b), leaves = pair_inputs("contiguous", (3, 16, 16))
    dy = torch.randn(3, 16, 16).to(BF16)
    upstream = {
        "expanded": dy[:1].expand(dy.shape),
        "transposed": dy.transpose(1, 2).contiguous().transpose(1, 2),
        "offset": offset(dy),
        "float32": dy.float(),
    }[layout]
    got = grads(autograd.EagerFunction.apply(a, b, False), leaves, upstream)
    want = grads(reference(a, b), leaves, upstream.to(BF16).contiguous())
    for g, w in zip(got, want):
        assert_same(layout, g, w)


def test_swiglu_eager_empty_work(swiglu):
    autograd, kernels, reference = swiglu
    (a, b), leaves = pair_inputs("contiguous", (3, 0, 16))
    y = autograd.EagerFunction.apply(a, b, True)
    got = grads(y, leaves, torch.randn(y.shape).to(BF16))
    assert y.shape == a.shape and all(
        torch.equal(g, torch.zeros_like(t)) for g, t in zip(got, leaves)
    )
    assert not kernels.built and not autograd.PLANS


@pytest.mark.parametrize("save", [False, True], ids=["recompute", "save"])
@pytest.mark.parametrize("shape", [(37, 40), (3, 5, 77), (1, 64)])
def test_swiglu_fused_eager_matches_the_reference(emulate, shape, save):
    """The fused form (golden package): x's halves, b copied where it does not start aligned
    (C = 77), dx's db half written through a buffer of its own there."""
    autograd = import_golden("swiglu_fused", "autograd")
    reference = import_golden("swiglu_fused", "reference").swiglu_fused_reference
    emulations = swiglu_emulations()
    kernels = emulate(
        autograd,
        {
            "swiglu_fused_fwd": emulations["swiglu_fwd"],
            "swiglu_fused_bwd": emulations["swiglu_bwd"],
        },
    )
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape[:-1], 2 * shape[-1], generator=gen).to(BF16).requires_grad_()
    dy = torch.randn(shape, generator=gen).to(BF16)
    for _ in range(2):
        y = autograd.EagerFunction.apply(x, save)
        (got,) = grads(y, [x], dy)
    want = reference(x)
    assert_same("y", y, want)
    assert_same("dx", got, grads(want, [x], dy)[0])
    assert sorted(kernels.built) == ["swiglu_fused_bwd", "swiglu_fused_fwd"]


# --- linear_attention ------------------------------------------------------------------------


def linear_attention_emulations(reference):
    def float_reference(q, k, v):
        """The reference's formula without its final cast."""
        scores = torch.einsum("bthd,bshd->bhts", q, k).tril()
        return torch.einsum("bhts,bshd->bthd", scores, v) * q.shape[-1] ** -0.5

    def fwd(heads, dim_k, dim_v, dtype, scale, **tiling):
        def run(q, k, v, o):
            batch, seq_len = q.shape[:2]
            for t, d in ((q, dim_k), (k, dim_k), (v, dim_v), (o, dim_v)):
                check(t, (batch, seq_len, heads, d), dtype_of(dtype))
            o.copy_(reference(q, k, v))

        return run

    summed_grads = import_generated("linear_attention", "kernels").summed_grads

    def bwd(heads, dim_k, dim_v, dtype, scale, **tiling):
        summed_qk, summed_v = summed_grads(dim_k, dim_v, tiling["block_dk"], tiling["block_dv"])

        def run(q, k, v, do, dq, dk, dv):
            batch, seq_len = q.shape[:2]
            for t, d in ((q, dim_k), (k, dim_k), (v, dim_v), (do, dim_v)):
                check(t, (batch, seq_len, heads, d), dtype_of(dtype))
            summed = (summed_qk, summed_qk, summed_v)
            for t, d, s in zip((dq, dk, dv), (dim_k, dim_k, dim_v), summed):
                check(t, (batch, seq_len, heads, d), torch.float32 if s else dtype_of(dtype))
            leaves = [t.float().requires_grad_() for t in (q, k, v)]
            with torch.enable_grad():
                found = torch.autograd.grad(float_reference(*leaves), leaves, do.float())
            for buffer, g, s in zip((dq, dk, dv), found, summed):
                # The kernel's atomics add into an fp32 buffer; a gradient of one tile is written once.
                buffer.add_(g) if s else buffer.copy_(g)

        return run

    return {"linear_attention_fwd": fwd, "linear_attention_bwd": bwd}


@pytest.fixture
def linear_attention(emulate):
    autograd = import_generated("linear_attention", "autograd")
    reference = import_generated("linear_attention", "reference").linear_attention_reference
    kernels = emulate(autograd, linear_attention_emulations(reference))
    return autograd, kernels, reference


def qkv(batch, seq_len, heads, dim_k, dim_v):
    gen = torch.Generator().manual_seed(0)
    shapes = ((batch, seq_len, heads, dim_k),) * 2 + ((batch, seq_len, heads, dim_v),)
    return [torch.randn(s, generator=gen).to(BF16).requires_grad_() for s in shapes]


# The last: head dims wider than the bwd tiles (every gradient summed in fp32).
@pytest.mark.parametrize("dims", [(2, 9, 2, 16, 16), (1, 3, 1, 5, 5), (1, 7, 3, 16, 8), (1, 5, 1, 144, 136)])
def test_linear_attention_eager_matches_the_reference(linear_attention, dims):
    autograd, kernels, reference = linear_attention
    q, k, v = qkv(*dims)
    do = torch.randn(v.shape).to(BF16)
    for _ in range(2):
        o = autograd.EagerFunction.apply(q, k, v)
        got = grads(o, [q, k, v], do)
    want = reference(q, k, v)
    assert_same("O", o, want)
    for name, g, w in zip(("dQ", "dK", "dV"), got, grads(want, [q, k, v], do)):
        assert_same(name, g, w)
    assert len(autograd.PLANS) == 1
    assert sorted(kernels.built) == ["linear_attention_bwd", "linear_attention_fwd"]
    assert kernels.launched.count("linear_attention_bwd") == 2


@pytest.mark.parametrize("layout", ["expanded", "offset", "float32"])
def test_linear_attention_eager_takes_any_upstream_gradient(linear_attention, layout):
    autograd, _, reference = linear_attention
    q, k, v = qkv(1, 6, 2, 8, 8)
    do = torch.randn(v.shape).to(BF16)
    upstream = {
        "expanded": do[:, :1].expand(do.shape),
        "offset": offset(do),
        "float32": do.float(),
    }[layout]
    got = grads(autograd.EagerFunction.apply(q, k, v), [q, k, v], upstream)
    want = grads(reference(q, k, v), [q, k, v], upstream.to(BF16).contiguous())
    for g, w in zip(got, want):
        assert_same(layout, g, w)


def test_linear_attention_eager_empty_work(linear_attention):
    autograd, kernels, _ = linear_attention
    q, k, v = qkv(2, 0, 2, 8, 4)
    o = autograd.EagerFunction.apply(q, k, v)
    got = grads(o, [q, k, v], torch.randn(o.shape).to(BF16))
    assert o.shape == v.shape and all(g.shape == t.shape for g, t in zip(got, (q, k, v)))
    assert not kernels.built and not autograd.PLANS
