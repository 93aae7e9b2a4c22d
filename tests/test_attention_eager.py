"""The attention packages' host logic around their kernels, on the CPU: the call plans, the
buffers each backward phase gets (all allocated empty: the preprocess zeroes the fp32 atomic
targets), the dK/dV reductions, the eager autograd.Function and the custom ops. Every kernel's
entry point is replaced by a PyTorch emulation of what the kernel does to its buffers (flash
attention's math from the given lse and Delta, dQ added into its accumulator, dK/dV written,
split into per-head partials, added, or summed per group (in_block), the postprocess's sums
and casts), which also asserts
what the real entry point needs (shapes, dtypes, dense 16-byte aligned buffers). The output and
every gradient must match the reference; one backward launches the package's kernels and no
other torch kernel. The kernels themselves run in the generated GPU tests."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import import_generated

BF16 = torch.bfloat16
LN2 = math.log(2)
ALIGNMENT = 16


def check(t, shape, dtype, dense=True):
    """What an entry point and the kernels need of a tensor argument."""
    assert isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(shape), (tuple(t.shape), shape)
    assert t.dtype == dtype, (t.dtype, dtype)
    assert t.data_ptr() % ALIGNMENT == 0, "a kernel argument starts off a 16-byte boundary"
    if dense:
        assert t.is_contiguous(), f"strides {t.stride()} for shape {tuple(t.shape)}"
    else:  # q, k, v: read by TMA with their strides
        assert t.stride(-1) == 1


def bhsd(t, layout):
    """A [batch, heads, seq_len, head_dim] view of t (a view: writes go to t)."""
    return t.transpose(1, 2) if layout == "bshd" else t


def shape_of(layout, batch, heads, seq_len, dim):
    return (batch, seq_len, heads, dim) if layout == "bshd" else (batch, heads, seq_len, dim)


def padded(seq_len):
    """The rows of lse, Delta and dQ: the packages' own rule (one for every attention package)."""
    return import_generated("attention", "kernels").padded_rows(seq_len)


def scores(q, k, heads, kv_heads, scale, causal, window):
    """fp32 scores [B, H, S, S] with -inf where a query does not see a key."""
    k = k.float().repeat_interleave(heads // kv_heads, dim=1)
    s = q.float() @ k.transpose(-1, -2) * scale
    n = q.shape[2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    visible = torch.ones(n, n, dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window:
        visible &= i - j < window
    return s.masked_fill(~visible, -math.inf)


def emulations(name, sinks):
    """Factory name -> (factory arguments -> run(*buffers)), the kernels of package `name`."""

    walks_heads = getattr(import_generated(name, "kernels"), "walks_heads", None)

    def fwd(heads, kv_heads, dim, causal, window, layout, dtype, scale, **tiling):
        # At a short window the kernel takes the query heads a block walks after its tensors.
        walks = walks_heads is not None and walks_heads(window, tiling["block_m"], tiling["block_n"])

        def run(q, k, v, *rest):
            sink, rest = (rest[0], rest[1:]) if sinks else (None, rest)
            o, lse, *scalars = rest
            assert len(scalars) == walks, (walks, scalars)
            if walks:
                assert heads % scalars[0] == 0, (heads, scalars)
            batch, seq_len = q.shape[0], bhsd(q, layout).shape[2]
            for t, h in ((q, heads), (k, kv_heads), (v, kv_heads)):
                check(t, shape_of(layout, batch, h, seq_len, dim), getattr(torch, dtype), dense=False)
            check(o, q.shape, q.dtype)
            check(lse, (batch, heads, padded(seq_len)), torch.float32)
            s = scores(bhsd(q, layout), bhsd(k, layout), heads, kv_heads, scale, causal, window)
            if sinks:
                check(sink, (heads,), torch.float32)
                s = torch.cat([s, sink.view(1, -1, 1, 1).expand(batch, heads, seq_len, 1)], dim=-1)
            lse_nat = torch.logsumexp(s, dim=-1)
            p = torch.exp(s - lse_nat[..., None])[..., :seq_len]
            v_rep = bhsd(v, layout).float().repeat_interleave(heads // kv_heads, dim=1)
            bhsd(o, layout).copy_(p @ v_rep)
            lse[:, :, :seq_len] = lse_nat / LN2  # log2 domain

        return run

    def dkv_shape(layout, reduction, batch, heads, kv_heads, seq_len, dim, dtype):
        rows = batch * (heads // kv_heads if reduction == "split" else 1)
        return shape_of(layout, rows, kv_heads, seq_len, dim), (
            getattr(torch, dtype) if reduction in ("direct", "in_block") else torch.float32)

    def preprocess(heads, kv_heads, dim, layout, dtype, dk_reduction, dv_reduction, **tiling):
        def run(o, do, delta, dq, dk, dv):
            batch, seq_len = o.shape[0], bhsd(o, layout).shape[2]
            check(do, o.shape, o.dtype)
            check(delta, (batch, heads, padded(seq_len)), torch.float32)
            check(dq, shape_of(layout, batch, heads, padded(seq_len), dim), torch.float32)
            delta[:, :, :seq_len] = (bhsd(o, layout).float() * bhsd(do, layout).float()).sum(-1)
            dq.zero_()
            for buffer, reduction in ((dk, dk_reduction), (dv, dv_reduction)):
                shape, buffer_dtype = dkv_shape(layout, reduction, batch, heads, kv_heads, seq_len, dim, dtype)
                check(buffer, shape, buffer_dtype)
                if reduction == "atomic":
                    buffer.zero_()

        return run

    def bwd(heads, kv_heads, dim, causal, window, layout, dtype, scale, dk_reduction, dv_reduction, **tiling):
        groups = heads // kv_heads

        def run(q, k, v, do, lse, delta, dq, dk, dv):
            batch, seq_len = q.shape[0], bhsd(q, layout).shape[2]
            check(do, q.shape, q.dtype)
            for t in (lse, delta):
                check(t, (batch, heads, padded(seq_len)), torch.float32)
            check(dq, shape_of(layout, batch, heads, padded(seq_len), dim), torch.float32)
            qb, kb, vb, dob = (bhsd(t, layout).float() for t in (q, k, v, do))
            s = scores(qb, kb, heads, kv_heads, scale, causal, window)
            p = torch.exp(s - lse[:, :, :seq_len, None] * LN2)
            dp = dob @ vb.repeat_interleave(groups, dim=1).transpose(-1, -2)
            ds = p * (dp - delta[:, :, :seq_len, None])
            # dQ unscaled, as the kernel's dS leaves the scale out: the postprocess applies it.
            bhsd(dq, layout)[:, :, :seq_len] += ds @ kb.repeat_interleave(groups, dim=1)
            per_head = {"dK": ds.transpose(-1, -2) @ qb * scale, "dV": p.transpose(-1, -2) @ dob}
            for label, buffer, reduction in (("dK", dk, dk_reduction), ("dV", dv, dv_reduction)):
                shape, buffer_dtype = dkv_shape(layout, reduction, batch, heads, kv_heads, seq_len, dim, dtype)
                check(buffer, shape, buffer_dtype)
                grouped = per_head[label].view(batch, kv_heads, groups, seq_len, dim)
                out = bhsd(buffer, layout)
                if reduction == "direct":
                    out.copy_(per_head[label])
                elif reduction == "in_block":
                    out.copy_(grouped.sum(2))
                elif reduction == "atomic":
                    out += grouped.sum(2)
                else:  # partial g of batch row b at g * batch + b
                    for g in range(groups):
                        out[g * batch:(g + 1) * batch] = grouped[:, :, g]

        return run

    def postprocess(heads, kv_heads, dim, layout, dtype, scale, dk_reduction, dv_reduction, **tiling):
        groups = heads // kv_heads

        def run(dq, dq_out, *dkv):
            batch, seq_len = dq_out.shape[0], bhsd(dq_out, layout).shape[2]
            check(dq, shape_of(layout, batch, heads, padded(seq_len), dim), torch.float32)
            check(dq_out, shape_of(layout, batch, heads, seq_len, dim), getattr(torch, dtype))
            bhsd(dq_out, layout).copy_(bhsd(dq, layout)[:, :, :seq_len] * scale)
            assert (len(dkv) == 4) == (dk_reduction not in ("direct", "in_block")), (
                "dK/dV buffers: finish them or not")
            for buffer, out, reduction in zip(dkv[::2], dkv[1::2], (dk_reduction, dv_reduction)):
                check(out, shape_of(layout, batch, kv_heads, seq_len, dim), getattr(torch, dtype))
                if reduction == "split":
                    buffer = buffer.view(groups, batch, *buffer.shape[1:]).sum(0)
                out.copy_(buffer)

        return run

    def dsinks(heads, **tiling):
        def run(sink, lse, delta, dsink, seq_len):
            batch = lse.shape[0]
            check(sink, (heads,), torch.float32)
            check(dsink, (heads,), torch.float32)
            for t in (lse, delta):
                check(t, (batch, heads, padded(seq_len)), torch.float32)
            p_sink = torch.exp2(sink.view(1, -1, 1) / LN2 - lse[:, :, :seq_len])
            dsink.copy_((-p_sink * delta[:, :, :seq_len]).sum((0, 2)))

        return run

    found = {"fwd": fwd, "bwd_preprocess": preprocess, "bwd": bwd, "bwd_postprocess": postprocess}
    if sinks:
        found["bwd_dsinks"] = dsinks
    return {f"{name}_{key}": emulation for key, emulation in found.items()}


class Kernels:
    """autograd.kernel replaced: emulations by factory name, and a record of what was built and
    launched."""

    def __init__(self, autograd, emulations):
        self.autograd, self.emulations = autograd, emulations
        self.built, self.launched = [], []
        self.inside = False

    def __call__(self, factory, *args, **tiling):
        name = next(n for n in self.emulations if getattr(self.autograd, n) is factory)
        self.built.append(name)
        run = self.emulations[name](*args, **tiling)

        def launch(*tensors):
            self.launched.append(name)
            self.inside = True
            try:
                with torch.no_grad():
                    run(*tensors)
            finally:
                self.inside = False

        return launch


class TorchOps(TorchDispatchMode):
    """The aten ops run outside the emulated kernels."""

    def __init__(self, kernels):
        super().__init__()
        self.kernels, self.ops = kernels, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.kernels.inside:
            self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


# What a backward may run besides its kernels: allocations and views, none a CUDA kernel.
ALLOCATIONS_AND_VIEWS = {"empty", "new_empty", "empty_strided", "new_empty_strided", "detach", "alias", "view"}
PACKAGES = {"attention": False, "gqa": False, "attention_sink": True}
# (heads, kv_heads, seq_len, layout, causal, window): odd lengths (padded rows), grouped or not.
CASES = {
    "attention": [(3, 3, 13, "bshd", False, None), (2, 2, 9, "bhsd", True, None)],
    "gqa": [(4, 2, 13, "bshd", True, None), (3, 3, 9, "bshd", False, None), (4, 1, 11, "bshd", False, None)],
    "attention_sink": [(4, 2, 13, "bshd", True, 5), (2, 2, 9, "bshd", True, None)],
}
PARAMS = [pytest.param(p, *case, id=f"{p}-h{case[0]}-kv{case[1]}-s{case[2]}-{case[3]}")
          for p, cases in CASES.items() for case in cases]


@pytest.fixture
def emulate(monkeypatch):
    """emulate(package) -> (autograd module, Kernels): its kernels emulated, its plans fresh."""

    def install(package):
        autograd = import_generated(package, "autograd")
        kernels = Kernels(autograd, emulations(package, PACKAGES[package]))
        monkeypatch.setattr(autograd, "kernel", kernels)
        monkeypatch.setattr(autograd, "prebuild", lambda calls: None)  # nothing to build
        monkeypatch.setattr(autograd, "PLANS", {})
        if hasattr(autograd, "sm_count"):
            # One SM (no CUDA device here): a short-window forward walks the most heads it may.
            monkeypatch.setattr(autograd, "sm_count", lambda device: 1)
        return autograd, kernels

    return install


def make_inputs(package, heads, kv_heads, seq_len, layout, head_dim=64, batch=2):
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(shape_of(layout, batch, h, seq_len, head_dim), generator=gen).to(BF16)
              for h in (heads, kv_heads, kv_heads)]
    if PACKAGES[package]:
        inputs.append(torch.randn(heads, generator=gen))
    for t in inputs:
        t.requires_grad_()
    return inputs, torch.randn(shape_of(layout, batch, heads, seq_len, head_dim), generator=gen).to(BF16)


def reference_grads(package, inputs, do, kwargs):
    reference = getattr(import_generated(package, "reference"), f"{package}_reference")
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = reference(*leaves, **kwargs)
    return out, torch.autograd.grad(out, leaves, do)


def call_kwargs(package, causal, window, layout):
    return {"causal": causal, "layout": layout, **({"window": window} if PACKAGES[package] else {})}


def assert_same(label, got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (label, got.shape, want.shape, got.dtype, want.dtype)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2, msg=label)


@pytest.mark.parametrize("path", ["eager", "custom op"])
@pytest.mark.parametrize("package, heads, kv_heads, seq_len, layout, causal, window", PARAMS)
def test_output_and_gradients_match_the_reference(emulate, package, heads, kv_heads, seq_len, layout,
                                                  causal, window, path):
    autograd, kernels = emulate(package)
    inputs, do = make_inputs(package, heads, kv_heads, seq_len, layout)
    kwargs = call_kwargs(package, causal, window, layout)
    scale = 64 ** -0.5
    args = (*inputs, causal, window or 0, layout, scale)
    out = autograd.EagerFunction.apply(*args) if path == "eager" else autograd.forward_op(*args)[0]
    got = torch.autograd.grad(out, inputs, do)
    want_out, want = reference_grads(package, inputs, do, kwargs)
    assert_same("o", out, want_out)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert_same(name, g, w)


@pytest.mark.parametrize("package, heads, kv_heads, seq_len, layout, causal, window", PARAMS)
def test_backward_launches_its_kernels_and_no_torch_kernel(emulate, package, heads, kv_heads, seq_len,
                                                           layout, causal, window):
    """The eager backward: the preprocess (Delta, and the zeros of the atomic targets), the main
    kernel, the postprocess (dQ, and grouped dK/dV finished) and, with sinks, the dsinks kernel;
    besides them only allocations, no zero fill, sum or cast. The kernels were looked up in the
    forward, and a second call of the same metadata looks up nothing."""
    autograd, kernels = emulate(package)
    inputs, do = make_inputs(package, heads, kv_heads, seq_len, layout)
    args = (*inputs, causal, window or 0, layout, 64 ** -0.5)
    for call in range(2):
        out = autograd.EagerFunction.apply(*args)
        built = list(kernels.built)
        kernels.launched.clear()
        with TorchOps(kernels) as ops:
            torch.autograd.grad(out, inputs, do)
        assert kernels.built == built, "the backward looked up kernels"
        expected = ["bwd_preprocess", "bwd", "bwd_postprocess", *(["bwd_dsinks"] if PACKAGES[package] else [])]
        assert kernels.launched == [f"{package}_{k}" for k in expected]
        assert set(ops.ops) <= ALLOCATIONS_AND_VIEWS, ops.ops
    # The fwd too, once; a causal variant without a window builds its paired fwd with it.
    assert len(kernels.built) == len(expected) + (2 if causal and not window else 1)


@pytest.mark.parametrize("reduction", ["atomic", "split", "in_block"])
def test_grouped_reductions_match_the_reference(emulate, reduction):
    """run_backward with each dK/dV reduction (the generated GPU tests compare them)."""
    autograd, kernels = emulate("gqa")
    inputs, do = make_inputs("gqa", 6, 2, 11, "bshd")
    tensors = [t.detach() for t in inputs]
    scale = 64 ** -0.5
    o, lse = autograd.run_forward(*tensors, True, None, "bshd", scale)
    got = autograd.run_backward(*tensors, o, lse, do, True, None, "bshd", scale, reduction, reduction)
    _, want = reference_grads("gqa", inputs, do, {"causal": True, "layout": "bshd"})
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_same(name, g, w)


def test_a_strided_or_offset_gradient_is_read_dense(emulate):
    """Autograd may hand the backward an expanded, transposed or offset dO, or one of another
    dtype: the kernels get a dense, aligned copy in q's dtype."""
    autograd, _ = emulate("gqa")
    inputs, do = make_inputs("gqa", 4, 2, 13, "bshd")
    _, want = reference_grads("gqa", inputs, do, {"causal": True, "layout": "bshd"})
    storage = torch.empty(do.numel() + 1, dtype=BF16)
    offset = storage[1:].view(do.shape)
    offset.copy_(do)
    transposed = do.transpose(1, 2).contiguous().transpose(1, 2)
    for given in (offset, transposed, do.float()):
        out = autograd.EagerFunction.apply(*inputs, True, 0, "bshd", 64 ** -0.5)
        got = torch.autograd.grad(out, inputs, given)
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            assert_same(name, g, w)
