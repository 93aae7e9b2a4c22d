"""A backward whose query step is not a power of two: dQ computed transposed (not used by any
package yet; MHA, layout bshd, dK/dV written directly, no window).

The shipped backward computes a query step's dQ tile as dS^T K, [block_n queries, dim], split
over the two consumer warpgroups; a WGMMA's M is 64 rows a warpgroup, so block_n is 64 or 128
(TileLang: "M=80, N=128 cannot be evenly covered by 8 warps"). Computed transposed, dQ^T =
K^T dS, [dim, block_n], the warpgroups split dim (64 rows each at D128) and block_n is the
WGMMA's N, any multiple of 16: FlashAttention-3 runs its D128 non-causal backward on 80 query
rows a step that way (its dQ tiles then go out by bulk reduce-adds that a producer warp
issues; here by the shipped kernel's atomics). More queries a step: fewer steps, each with the
same fixed costs (the pipeline's barriers, dS's exchange through shared memory), and 25% more
work for the tensor cores between them; the price is registers (the scores and dP tiles grow to
40 a thread).

The dQ accumulator here (fp32, [batch, padded rows, heads, dim]) is row-major or in the
transposed GEMM's fragment order (fragment_dq), not the shipped kernel's, so the shipped
postprocess does not apply: the probe below reorders, scales and compares it itself.
CPU (session 53): `python docs/profiling/bwd_swapped_dq.py ptxas` (ptxas's registers, spills and
WGMMA notes): at D128, full and causal, 64 and 80 query rows
compile without spills or serialized WGMMAs, with either dQ layout; 96 spills 256-284 bytes.
row_major's undoing of fragment_layout checked on the CPU against an element-by-element scatter.
GPU: `python docs/profiling/bwd_swapped_dq.py` checks dQ, dK, dV against float64 at odd lengths,
then times the main kernel at B16 H4 S4096 D128 (the bench's B4 H16 in work) against the shipped
one, in turns (WIDTHS=64,80 the query steps tried, ROUNDS=5, DQ_LAYOUT=fragment or rowmajor).
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T
from generated.attention.kernels import (ACCUM, LOG2E, _indexers, _input, _needs_mask, _shape,
                                         _visibility, padded_dim, runtime_dims)


def fragment_layout(b, l, h, d):
    # The shipped accumulator's 8x8 fragment order with rows and columns swapped: a thread of the
    # transposed GEMM holds two adjacent queries of one dim row; lane t adds at 4 * (d % 8) +
    # (l % 8) // 2 = t for a fixed pair slot l % 2.
    return [b, l // 8, h, d // 8, l % 2, 4 * (d % 8) + (l % 8) // 2]


def row_major(dq, fragment_dq):
    """The accumulator [b, padded rows, h, d] in row-major order (undoing fragment_layout)."""
    if not fragment_dq:
        return dq
    b, rows, h, d = dq.shape
    # physical [b, rows/8, h, d/8, l%2, d%8, (l%8)//2] -> [b, rows/8, (l%8)//2, l%2, h, d/8, d%8]
    phys = dq.reshape(b, rows // 8, h, d // 8, 2, 8, 4)
    return phys.permute(0, 1, 6, 4, 2, 3, 5).reshape(b, rows, h, d)


@tilelang.jit(
    pass_configs={
        tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
        tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True,
    }
)
def bwd_swapped(heads, dim, causal, dtype, softmax_scale, block_m, block_n, threads, num_stages,
                fragment_dq=False):
    """fragment_dq: the accumulator in the transposed GEMM's 8x8 fragment order (fragment_layout),
    so that each atomic instruction of a warp adds 32 consecutive floats; else row-major."""
    batch, seq_len = runtime_dims()
    scale = softmax_scale * LOG2E
    layout = "bshd"
    q_shape = _shape(layout, batch, heads, seq_len, dim)
    dq_shape = _shape(layout, batch, heads, padded_dim(), dim)
    rows, elem, _ = _indexers(layout)
    visible = _visibility(seq_len, causal, 0)
    needs_mask = _needs_mask(seq_len, causal, 0)
    stat_rows = -(-block_n // 32) * 32

    @T.prim_func
    def bwd(
        Q: _input(q_shape, dtype, "q"),
        K: _input(q_shape, dtype, "k"),
        V: _input(q_shape, dtype, "v"),
        dO: T.Tensor(q_shape, dtype),
        lse: T.Tensor([batch, heads, padded_dim()], ACCUM),
        Delta: T.Tensor([batch, heads, padded_dim()], ACCUM),
        dQ: T.Tensor(dq_shape, ACCUM),
        dK: T.Tensor(q_shape, dtype),
        dV: T.Tensor(q_shape, dtype),
    ):
        # Key blocks fastest (full), heads fastest (causal), as the shipped grid.
        grid = (heads, T.ceildiv(seq_len, block_m)) if causal else (T.ceildiv(seq_len, block_m), heads)
        with T.Kernel(grid[0], grid[1], batch, threads=threads) as (launch_x, launch_y, bz):
            by, bx = (launch_y, launch_x) if causal else (launch_x, launch_y)
            K_shared = T.alloc_shared([block_m, dim], dtype)
            V_shared = T.alloc_shared([block_m, dim], dtype)
            q = T.alloc_shared([block_n, dim], dtype)
            do = T.alloc_shared([block_n, dim], dtype)
            dsT_shared = T.alloc_shared([block_m, block_n], dtype)
            qkT = T.alloc_fragment([block_m, block_n], ACCUM)
            dsT = T.alloc_fragment([block_m, block_n], ACCUM)
            qkT_cast = T.alloc_fragment([block_m, block_n], dtype)
            dsT_cast = T.alloc_fragment([block_m, block_n], dtype)
            dv = T.alloc_fragment([block_m, dim], ACCUM)
            dk = T.alloc_fragment([block_m, dim], ACCUM)
            dqT = T.alloc_fragment([dim, block_n], ACCUM)
            dv_shared = T.alloc_shared([block_m, dim], dtype)
            dk_shared = T.alloc_shared([block_m, dim], dtype)
            # lse and Delta rows by TMA, whose shared destination must be 128-byte aligned in
            # every pipeline stage: whole 32-float rows (80 queries would leave the second
            # stage's at 320 bytes: "misaligned address", run 228).
            lse_shared = T.alloc_shared([stat_rows], ACCUM)
            delta = T.alloc_shared([stat_rows], ACCUM)
            if fragment_dq:
                T.annotate_layout({dQ: T.Layout(dQ.shape, fragment_layout)})
            T.copy(rows(K, bz, bx, by * block_m, block_m), K_shared)
            T.copy(rows(V, bz, bx, by * block_m, block_m), V_shared)
            T.clear(dv)
            T.clear(dk)
            n_blocks = T.ceildiv(seq_len, block_n)
            loop_start = T.floordiv(by * block_m, block_n) if causal else 0
            for step in T.Pipelined(n_blocks - loop_start, num_stages=num_stages):
                k = loop_start + step
                T.copy(rows(Q, bz, bx, k * block_n, block_n), q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(lse[bz, bx, k * block_n : k * block_n + stat_rows], lse_shared)
                for i, j in T.Parallel(block_m, block_n):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                if needs_mask(k * block_n, block_n, by * block_m, block_m):
                    for i, j in T.Parallel(block_m, block_n):
                        qkT[i, j] = T.if_then_else(
                            visible(k * block_n + j, by * block_m + i), qkT[i, j], 0
                        )
                T.copy(rows(dO, bz, bx, k * block_n, block_n), do)
                T.clear(dsT)
                T.gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(qkT, qkT_cast)
                T.gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)
                T.copy(Delta[bz, bx, k * block_n : k * block_n + stat_rows], delta)
                for i, j in T.Parallel(block_m, block_n):
                    dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j])
                T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)
                T.copy(dsT_cast, dsT_shared)
                # dQ^T = K^T dS: dim rows split over the warpgroups, the query step as N.
                T.clear(dqT)
                T.gemm(K_shared, dsT_shared, dqT, transpose_A=True, policy=T.GemmWarpPolicy.FullRow)
                if k * block_n + block_n <= seq_len:
                    for i, j in T.Parallel(dim, block_n):
                        T.atomic_add(elem(dQ, bz, bx, k * block_n + j, i), dqT[i, j])
                else:
                    for i, j in T.Parallel(dim, block_n):
                        if k * block_n + j < seq_len:
                            T.atomic_add(elem(dQ, bz, bx, k * block_n + j, i), dqT[i, j])
            T.copy(dv, dv_shared)
            T.copy(dv_shared, rows(dV, bz, bx, by * block_m, block_m))
            for i, j in T.Parallel(block_m, dim):
                dk[i, j] *= softmax_scale  # the scale dS left out
            T.copy(dk, dk_shared)
            T.copy(dk_shared, rows(dK, bz, bx, by * block_m, block_m))

    return bwd


def ptxas():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ptxas_check import ptxas_notes

    for causal in (False, True):
        for block_n in (64, 80, 96):
            try:
                kernel = bwd_swapped(16, 128, causal, "float16", 128 ** -0.5, 128, block_n, 256, 2)
                regs, spills, notes = ptxas_notes(kernel, f"swapped{block_n}")
                print(f"D128 {'causal' if causal else 'full'} 128x{block_n}: registers {regs} "
                      f"spill {spills} {notes or 'no C75xx note'}", flush=True)
            except Exception as exc:
                print(f"D128 128x{block_n}: FAILED {str(exc).splitlines()[-1][:300]}", flush=True)


def inputs(b, h, s, d, dtype, seed=0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def forward_state(A, q, k, v, do, causal, dtype_name):
    """The package forward's O and lse (log2 domain, padded rows) and Delta = rowsum(O * dO)."""
    import torch

    b, s, h, d = q.shape
    calls = A.variant_calls(h, h, d, causal, 0, "bshd", dtype_name, d ** -0.5, "direct", "direct")
    o = torch.empty_like(q)
    lse = torch.zeros(b, h, A.padded_rows(s), device="cuda")
    A.launcher(calls["fwd"])(q, k, v, o, lse)
    delta = torch.zeros_like(lse)
    delta[..., :s] = (o.float() * do.float()).sum(-1).transpose(1, 2)
    return calls, lse, delta


def reference(q, k, v, do, causal):
    """dq, dk, dv of softmax(q k^T / sqrt(d)) v in float64."""
    import torch

    q64, k64, v64 = (t.double().transpose(1, 2).requires_grad_() for t in (q, k, v))
    scores = q64 @ k64.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = q.shape[1]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    out = scores.softmax(-1) @ v64
    out.backward(do.double().transpose(1, 2))
    return [t.grad.transpose(1, 2) for t in (q64, k64, v64)]


def probe():
    import torch

    from generated.attention import autograd as A, bench_attention as B

    dtype_name, dtype = "float16", torch.float16
    widths = [int(n) for n in os.environ.get("WIDTHS", "64,80").split(",")]
    fragment_dq = os.environ.get("DQ_LAYOUT", "fragment") == "fragment"
    print(f"# dQ accumulator {'in fragment order' if fragment_dq else 'row-major'} (DQ_LAYOUT)")
    print("# correctness: max |error| / max |reference| of dq, dk, dv (swapped kernels, and the "
          "package's public function for scale)")
    # Four heads everywhere: heads is a factory argument, and each new count builds new kernels.
    for b, h, s, causal in [(2, 4, 333, False), (2, 4, 333, True), (1, 4, 77, False),
                            (1, 4, 1000, True), (1, 4, 4097, False)]:
        q, k, v, do = inputs(b, h, s, 128, dtype, seed=1)
        ref = reference(q, k, v, do, causal)
        calls, lse, delta = forward_state(A, q, k, v, do, causal, dtype_name)

        def rel(got):
            return " ".join(f"{(g.double() - r).abs().max().item() / r.abs().max().item():.1e}"
                            for g, r in zip(got, ref))

        for width in widths:
            kernel = bwd_swapped(h, 128, causal, dtype_name, 128 ** -0.5, 128, width, 256, 2,
                                 fragment_dq)
            dq = torch.zeros(b, A.padded_rows(s), h, 128, device="cuda")
            dk, dv = torch.empty_like(q), torch.empty_like(q)
            kernel(q, k, v, do, lse, delta, dq, dk, dv)
            dq = row_major(dq, fragment_dq)
            print(f"B{b} H{h} S{s} {'causal' if causal else 'full'} swapped 128x{width}: "
                  f"{rel([dq[:, :s] * 128 ** -0.5, dk, dv])}", flush=True)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        A.attention(qg, kg, vg, causal=causal).backward(do)
        print(f"B{b} H{h} S{s} {'causal' if causal else 'full'} package: "
              f"{rel([qg.grad, kg.grad, vg.grad])}", flush=True)

    rounds = int(os.environ.get("ROUNDS", "5"))
    print(f"# main kernel alone, ms (median of {rounds} rounds in turns)")
    # B16 H4: the blocks and work of the bench's B4 H16, with the kernels already built.
    for b, h, s, causal in [(16, 4, 4096, False), (16, 4, 4096, True)]:
        q, k, v, do = inputs(b, h, s, 128, dtype)
        calls, lse, delta = forward_state(A, q, k, v, do, causal, dtype_name)
        dq = torch.zeros(b, A.padded_rows(s), h, 128, device="cuda")
        dk, dv = torch.empty_like(q), torch.empty_like(q)
        shipped = A.launcher(calls["bwd"])
        fns = {"shipped": lambda: shipped(q, k, v, do, lse, delta, dq, dk, dv)}
        for width in widths:
            kernel = bwd_swapped(h, 128, causal, dtype_name, 128 ** -0.5, 128, width, 256, 2,
                                 fragment_dq)
            fns[f"swapped 128x{width}"] = lambda kernel=kernel: kernel(q, k, v, do, lse, delta, dq, dk, dv)
        # The bench's own turn-taking: each row the median of its rounds.
        ms = B.in_turns(fns, lambda fn: (B.stream_ms(fn),), rounds=rounds, times=1)
        row = ", ".join(f"{name} {t[0]:.3f}" if isinstance(t, tuple) else f"{name} {t}"
                        for name, t in ms.items())
        print(f"B{b} H{h} S{s} D128 {'causal' if causal else 'full'} (shipped tiling "
              f"{calls['bwd'][2]}): {row}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind":"cuda","arch":"sm_90a"}')
    ptxas() if sys.argv[1:] == ["ptxas"] else probe()
