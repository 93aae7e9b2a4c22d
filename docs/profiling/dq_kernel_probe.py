"""dQ by a kernel of its own instead of fp32 atomics: what it would save where the backward is
short of FlexAttention (sinks, windows; the gpt-oss shape above all, whose main kernel walks two
or three query blocks per key block and pays its dQ atomics, the accumulator's zeroing in the
preprocess and the postprocess's cast for little work).

`dq_kernel` walks, per query block, the key blocks it sees (as the forward does) and recomputes
P = exp2(Q K^T * scale - lse) and dP = dO V^T, then dQ += (P * (dP - Delta)) K, and stores dQ
times softmax_scale in the input dtype: no atomics, no fp32 accumulator, the same bits every run.
The main kernel then needs no dQ path (bwd_ablations' "no-dq": dS's store, the dQ GEMM and the
atomics cut); the preprocess no longer zeroes the accumulator and no postprocess runs (where
dK/dV are written directly). Both kernels are timed alone, back to back (CUDA events), next to the
package's four; the dq kernel's dQ is checked against the package's backward first at odd lengths.

    python docs/profiling/dq_kernel_probe.py
"""
import importlib
import os
import sys

import tilelang
import tilelang.language as T
import torch

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bwd_ablations import edited_kernels  # noqa: E402
from prepost_tiling_probe import timed  # noqa: E402

from generated.attention_sink import autograd as SINK  # noqa: E402
from generated.attention_sink.kernels import (  # noqa: E402
    ACCUM, LOG2E, _indexers, _input, _needs_mask, _shape, _visibility, padded_dim, runtime_dims,
    split_registers)

# (label, batch, heads, kv_heads, seq_len, head_dim, causal, window, dtype)
ODD = [("gpt-oss odd", 1, 64, 8, 1000, 64, True, 128, torch.bfloat16),
       ("D128 causal odd", 2, 8, 2, 333, 128, True, 0, torch.bfloat16),
       ("D128 full odd", 1, 8, 8, 77, 128, False, 0, torch.float16)]
CASES = [("gpt-oss B1 S4096 64/8 D64 w128", 1, 64, 8, 4096, 64, True, 128, torch.bfloat16),
         ("sinks B2 S4096 32/8 D128 w1024", 2, 32, 8, 4096, 128, True, 1024, torch.bfloat16),
         ("sinks B2 S4096 32/8 D128 causal", 2, 32, 8, 4096, 128, True, 0, torch.bfloat16)]
# dq kernel tilings (block_m query rows, block_n key rows, threads, stages) tried per head dim
# and blocks an SM (2: split_registers gives each block half the SM's registers)
TILINGS = {64: [(64, 64, 128, 1, 2), (64, 64, 128, 2, 2), (128, 64, 256, 2, 1), (64, 128, 128, 2, 1)],
           128: [(128, 64, 256, 2, 1), (64, 64, 128, 2, 2), (128, 128, 256, 2, 1)]}


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def dq_kernel(heads, kv_heads, dim, causal, window, layout, dtype, softmax_scale, block_m, block_n,
              threads, num_stages, blocks_per_sm=1):
    batch, seq_len = runtime_dims()
    scale = softmax_scale * LOG2E
    groups = heads // kv_heads
    q_shape = _shape(layout, batch, heads, seq_len, dim)
    kv_shape = _shape(layout, batch, kv_heads, seq_len, dim)
    rows, _, _ = _indexers(layout)
    # Rows past seq_len are computed from padding and never stored (the store is clipped).
    visible = _visibility(seq_len, causal, window, check_queries=False)
    needs_mask = _needs_mask(seq_len, causal, window, check_queries=False)

    @T.prim_func
    def dq(
        Q: _input(q_shape, dtype, "q"),
        K: _input(kv_shape, dtype, "k"),
        V: _input(kv_shape, dtype, "v"),
        dO: T.Tensor(q_shape, dtype),
        lse: T.Tensor([batch, heads, padded_dim()], ACCUM),
        Delta: T.Tensor([batch, heads, padded_dim()], ACCUM),
        dQ: T.Tensor(q_shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_m), heads, batch, threads=threads) as (bx, by, bz):
            split_registers(threads, blocks_per_sm)
            q_s = T.alloc_shared([block_m, dim], dtype)
            do_s = T.alloc_shared([block_m, dim], dtype)
            k_s = T.alloc_shared([block_n, dim], dtype)
            v_s = T.alloc_shared([block_n, dim], dtype)
            lse_s = T.alloc_shared([block_m], ACCUM)
            delta_s = T.alloc_shared([block_m], ACCUM)
            p = T.alloc_fragment([block_m, block_n], ACCUM)
            dp = T.alloc_fragment([block_m, block_n], ACCUM)
            ds = T.alloc_fragment([block_m, block_n], dtype)
            acc = T.alloc_fragment([block_m, dim], ACCUM)
            T.copy(rows(Q, bz, by, bx * block_m, block_m), q_s)
            T.copy(rows(dO, bz, by, bx * block_m, block_m), do_s)
            T.copy(lse[bz, by, bx * block_m : (bx + 1) * block_m], lse_s)
            T.copy(Delta[bz, by, bx * block_m : (bx + 1) * block_m], delta_s)
            T.clear(acc)
            n_blocks = T.ceildiv(seq_len, block_n)
            end = T.min(T.ceildiv((bx + 1) * block_m, block_n), n_blocks) if causal else n_blocks
            start = T.max(T.floordiv(bx * block_m - window + 1, block_n), 0) if window else 0
            for step in T.Pipelined(end - start, num_stages=num_stages):
                k = start + step
                T.copy(rows(K, bz, by // groups, k * block_n, block_n), k_s)
                T.copy(rows(V, bz, by // groups, k * block_n, block_n), v_s)
                T.clear(p)
                T.gemm(q_s, k_s, p, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.clear(dp)
                T.gemm(do_s, v_s, dp, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                for i, j in T.Parallel(block_m, block_n):
                    p[i, j] = T.exp2(p[i, j] * scale - lse_s[i])
                if needs_mask(bx * block_m, block_m, k * block_n, block_n):
                    for i, j in T.Parallel(block_m, block_n):
                        p[i, j] = T.if_then_else(visible(bx * block_m + i, k * block_n + j), p[i, j], 0)
                for i, j in T.Parallel(block_m, block_n):
                    ds[i, j] = p[i, j] * (dp[i, j] - delta_s[i])
                T.gemm(ds, k_s, acc, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_m, dim):
                acc[i, j] *= softmax_scale
            T.copy(acc, q_s)  # Q's tile is free: dQ staged there, stored clipped at seq_len
            T.copy(q_s, rows(dQ, bz, by, bx * block_m, block_m))

    return dq


def setup(b, h, kv, s, d, causal, window, dtype):
    torch.manual_seed(0)
    q = torch.randn(b, s, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=dtype) for _ in range(2))
    sinks = torch.randn(h, device="cuda")
    do = torch.randn_like(q)
    scale = d**-0.5
    plan = SINK.call_plan(q, k, causal, window, "bshd", scale)
    o, lse = SINK.run_forward(q, k, v, sinks, causal, window, "bshd", scale, plan)
    return q, k, v, sinks, do, o, lse, scale, plan


def dq_launch(q, k, v, do, lse, delta, out, h, kv, d, causal, window, dtype, scale, tiling):
    m, n, t, st, per_sm = tiling
    kern = SINK.kernel(dq_kernel, h, kv, d, causal, window, "bshd", SINK.DTYPE_NAMES[dtype], scale,
                       block_m=m, block_n=n, threads=t, num_stages=st, blocks_per_sm=per_sm)
    return lambda: kern(q, k, v, do, lse, delta, out)


def builds():
    """Every kernel this probe launches, as (factory, args, tiling): built at once, in threads."""
    no_dq = edited_kernels("attention_sink", "no-dq").attention_sink_bwd
    triples = []
    for _, b, h, kv, s, d, causal, window, dtype in ODD + CASES:
        name = SINK.DTYPE_NAMES[dtype]
        calls = SINK.variant_calls(h, kv, d, causal, window, "bshd", name, d**-0.5, *SINK.reductions(h, kv))
        triples += list(calls.values())
        _, args, tiling = calls["bwd"]
        triples.append((no_dq, args, tiling))
        triples += [(dq_kernel, (h, kv, d, causal, window, "bshd", name, d**-0.5),
                     dict(block_m=m, block_n=n, threads=t, num_stages=st, blocks_per_sm=per_sm))
                    for m, n, t, st, per_sm in TILINGS[d]]
    return triples


def main():
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    triples = builds()
    SINK.prebuild(triples)
    print(f"built {len(triples)} kernels", flush=True)
    for label, b, h, kv, s, d, causal, window, dtype in ODD:
        q, k, v, sinks, do, o, lse, scale, plan = setup(b, h, kv, s, d, causal, window, dtype)
        want = SINK.run_backward(q, k, v, sinks, o, lse, do, causal, window, "bshd", scale, plan=plan)[0]
        delta = (o.float() * do.float()).sum(-1).transpose(1, 2)  # [b, h, s]
        delta = torch.nn.functional.pad(delta, (0, lse.shape[-1] - s)).contiguous()
        for tiling in TILINGS[d]:
            got = torch.full_like(q, float("nan"))
            dq_launch(q, k, v, do, lse, delta, got, h, kv, d, causal, window, dtype, scale, tiling)()
            torch.cuda.synchronize()
            err = (got.float() - want.float()).abs().max().item()
            ok = torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)
            print(f"{'ok ' if ok else 'BAD'} {label} dq kernel {tiling}: max |diff| to the package's dQ {err:.2e}",
                  flush=True)

    for label, b, h, kv, s, d, causal, window, dtype in CASES:
        q, k, v, sinks, do, o, lse, scale, plan = setup(b, h, kv, s, d, causal, window, dtype)
        calls = SINK.variant_calls(h, kv, d, causal, window, "bshd", SINK.DTYPE_NAMES[dtype], scale,
                                   *SINK.reductions(h, kv))
        delta = torch.empty(plan.lse_shape, device="cuda")
        accum = torch.empty(plan.dq_accum_shape, device="cuda")
        dk = torch.empty(plan.dk_buffer[0], dtype=plan.dk_buffer[1], device="cuda")
        dv = torch.empty(plan.dv_buffer[0], dtype=plan.dv_buffer[1], device="cuda")
        dq = torch.empty_like(q)
        dsinks = torch.empty(h, device="cuda")
        pre = lambda: plan.preprocess(o, do, delta, accum, dk, dv)  # noqa: E731
        bwd = lambda: plan.bwd(q, k, v, do, lse, delta, accum, dk, dv)  # noqa: E731
        if plan.finish_dkv:
            fk, fv = torch.empty_like(k), torch.empty_like(v)
            post = lambda: plan.postprocess(accum, dq, dk, fk, dv, fv)  # noqa: E731
        else:
            post = lambda: plan.postprocess(accum, dq)  # noqa: E731
        ds = lambda: plan.dsinks(sinks, lse, delta, dsinks, s)  # noqa: E731
        factory, args, tiling = calls["bwd"]
        no_dq = SINK.kernel(edited_kernels("attention_sink", "no-dq").attention_sink_bwd, *args, **tiling)
        nodq = lambda: no_dq(q, k, v, do, lse, delta, accum, dk, dv)  # noqa: E731
        pre()
        times = {name: timed(fn) for name, fn in
                 (("preprocess", pre), ("bwd", bwd), ("postprocess", post), ("dsinks", ds), ("bwd no-dq", nodq))}
        package = times["preprocess"] + times["bwd"] + times["postprocess"] + times["dsinks"]
        print(f"## {label} (dK/dV {SINK.reductions(h, kv)}, bwd tiling {tiling})", flush=True)
        print("  package: " + ", ".join(f"{n} {t:.1f}" for n, t in times.items() if n != "bwd no-dq")
              + f" = {package:.1f} us", flush=True)
        for dq_tiling in TILINGS[d]:
            t = timed(dq_launch(q, k, v, do, lse, delta, dq, h, kv, d, causal, window, dtype, scale, dq_tiling))
            # The preprocess without the accumulator's zeroing: estimated as its bytes' share.
            read = 2 * o.numel() * o.element_size()
            pre_est = times["preprocess"] * read / (read + accum.numel() * 4)
            total = pre_est + times["bwd no-dq"] + t + times["dsinks"] + (times["postprocess"] if plan.finish_dkv else 0)
            print(f"  dq kernel {dq_tiling}: {t:.1f} us; bwd no-dq {times['bwd no-dq']:.1f}, preprocess "
                  f"without zeroing ~{pre_est:.1f}: ~{total:.1f} us ({package / total:.2f}x the package)", flush=True)
    print("done")


if __name__ == "__main__":
    main()
