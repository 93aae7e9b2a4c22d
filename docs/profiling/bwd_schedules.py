"""Attention backward schedules to measure on the GPU (not used by any package yet).

bwd_overlap has the shipped backward's signature, grid, dK/dV reductions (in_block too) and
math; it issues the two score-side GEMMs of a query block together as async WGMMA (K q^T -> P's
logits, V dO^T -> dP), computes P while the second is in flight, issues dV += P dO, computes dS
while that one runs, then dK += dS q; the dQ GEMM stays synchronous. Everything after the loads
is one statement.

Runs 36 and 42: +3-5% at a given tiling, but dK wrong (max error 0.39-0.53) at GQA B2 32/8 S333
D128 full, split dK/dV, 128x64 on 256 threads, every other odd shape right. Found in the CUDA
(session 22): the warp-specialization pass released q's and dO's pipeline stage to the TMA
producer right after the statement that issues the last async GEMM reading each (dK's, dV's), not
after the wait, so the producer could load step + 2's q into the buffer dK was still reading.
A read of both after the final wait now places the release there. Run 103: dK and dV right
since, dQ still wrong (max diff 1.2-3.2), and slower than the package's backward. Session 23,
CPU: ptxas (`--verbose`, sm_90a, D128 128x64) warns "(C7517) warpgroup.wait is injected ... to
allow use of registers defined by GMMA": it serializes a WGMMA that the schedule meant to leave
in flight (near the clear of an accumulator at the dO stage's barrier), so the overlap is undone
in the SASS; the shipped backward compiles without the warning.
Session 24, CPU: the injected wait came from the clears. TileLang emits T.clear(dsT) as moves
from one zero register, placed after the dO stage's barrier, so after the K q^T WGMMA is in
flight; ptxas then waits for that WGMMA before the moves. Clearing by the WGMMA itself
(clear_accum=True: the first k-step's scale-d is 0, no moves) removes the warning at D128
128x64 (MHA full and causal; GQA split, in_block; D64 128x64 atomic with a window), and C7512
(serialized for lack of registers) at D128 causal with it. D64 at 128x128 still spills (48 bytes)
and serializes: its score tiles (64 registers each) leave no room; 128x64 fits. Not yet run on the
GPU (no machine lent in session 24): `VARIANTS="overlap,overlap@128x64s2,overlap@128x64s1"
python docs/profiling/bwd_variants_probe.py`. Also a suspect for the wrong dQ: TileLang orders
the dS tile's shared-memory stores before the dQ WGMMA by a barrier, then a proxy fence in each
thread, so one warpgroup's WGMMA may read the other's stores before its fence; harmless in the
shipped backward (dK's GEMM done by then, not in flight), fenced before the barrier here.
"""
import os, sys

sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T
from generated.attention.kernels import (LOG2E, ACCUM, runtime_dims, padded_dim, _shape, _input,
                                         _indexers, _visibility, _needs_mask, dkv_buffer,
                                         _dq_layout)


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def bwd_overlap(heads, kv_heads, dim, causal, window, layout, dtype, softmax_scale, dk_reduction,
                dv_reduction, block_m, block_n, threads, num_stages):
    batch, seq_len = runtime_dims()
    scale = softmax_scale * LOG2E
    groups = heads // kv_heads
    in_block = dk_reduction == "in_block"
    q_shape = _shape(layout, batch, heads, seq_len, dim)
    kv_shape = _shape(layout, batch, kv_heads, seq_len, dim)
    dq_shape = _shape(layout, batch, heads, padded_dim(), dim)
    dk_shape, dk_dtype = dkv_buffer(layout, dk_reduction, batch, heads, kv_heads, seq_len, dim, dtype)
    dv_shape, dv_dtype = dkv_buffer(layout, dv_reduction, batch, heads, kv_heads, seq_len, dim, dtype)
    rows, elem, _ = _indexers(layout)
    visible = _visibility(seq_len, causal, window)
    needs_mask = _needs_mask(seq_len, causal, window)
    regs_s = block_m * block_n // threads
    regs_kv = block_m * dim // threads

    @T.macro
    def store_dkv(acc, staging, out, reduction, bx, by, bz):
        if reduction == "atomic":
            for i, j in T.Parallel(block_m, dim):
                if by * block_m + i < seq_len:
                    T.atomic_add(elem(out, bz, bx // groups, by * block_m + i, j), acc[i, j])
        elif reduction == "split":
            T.copy(acc, rows(out, (bx % groups) * batch + bz, bx // groups, by * block_m, block_m))
        else:  # direct or in_block: bx is the KV head
            T.copy(acc, staging)
            T.copy(staging, rows(out, bz, bx, by * block_m, block_m))

    @T.prim_func
    def bwd(
        Q: _input(q_shape, dtype, "q"),
        K: _input(kv_shape, dtype, "k"),
        V: _input(kv_shape, dtype, "v"),
        dO: T.Tensor(q_shape, dtype),
        lse: T.Tensor([batch, heads, padded_dim()], ACCUM),
        Delta: T.Tensor([batch, heads, padded_dim()], ACCUM),
        dQ: T.Tensor(dq_shape, ACCUM),
        dK: T.Tensor(dk_shape, dk_dtype),
        dV: T.Tensor(dv_shape, dv_dtype),
    ):
        # The shipped kernel's grid: key blocks fastest; in_block: one block per KV head.
        with T.Kernel(T.ceildiv(seq_len, block_m), kv_heads if in_block else heads, batch, threads=threads) as (
                by, bx, bz):
            K_shared = T.alloc_shared([block_m, dim], dtype)
            V_shared = T.alloc_shared([block_m, dim], dtype)
            q = T.alloc_shared([block_n, dim], dtype)
            do = T.alloc_shared([block_n, dim], dtype)
            dsT_shared = T.alloc_shared([block_m, block_n], dtype)
            keep = T.alloc_local([1], dtype)
            qkT = T.alloc_fragment([block_m, block_n], ACCUM)
            dsT = T.alloc_fragment([block_m, block_n], ACCUM)
            qkT_cast = T.alloc_fragment([block_m, block_n], dtype)
            dsT_cast = T.alloc_fragment([block_m, block_n], dtype)
            dv = T.alloc_fragment([block_m, dim], ACCUM)
            dk = T.alloc_fragment([block_m, dim], ACCUM)
            dq = T.alloc_fragment([block_n, dim], ACCUM)
            dv_shared = T.alloc_shared([block_m, dim], dtype)
            dk_shared = T.alloc_shared([block_m, dim], dtype)
            lse_shared = T.alloc_shared([block_n], ACCUM)
            delta = T.alloc_shared([block_n], ACCUM)

            T.annotate_layout({dQ: _dq_layout(layout, dQ)})
            kv_head = bx if in_block else bx // groups
            T.copy(rows(K, bz, kv_head, by * block_m, block_m), K_shared)
            T.copy(rows(V, bz, kv_head, by * block_m, block_m), V_shared)
            T.clear(dv)
            T.clear(dk)
            n_blocks = T.ceildiv(seq_len, block_n)
            loop_start = T.floordiv(by * block_m, block_n) if causal else 0
            loop_end = (
                T.min(T.ceildiv((by + 1) * block_m + window - 1, block_n), n_blocks)
                if window
                else n_blocks
            )
            span = loop_end - loop_start
            for step in T.Pipelined(span * groups if in_block else span, num_stages=num_stages):
                h = bx * groups + step % groups if in_block else bx
                k = loop_start + (step // groups if in_block else step)
                T.copy(rows(Q, bz, h, k * block_n, block_n), q)
                T.copy(rows(dO, bz, h, k * block_n, block_n), do)
                T.copy(lse[bz, h, k * block_n : (k + 1) * block_n], lse_shared)
                T.copy(Delta[bz, h, k * block_n : (k + 1) * block_n], delta)
                # One statement (see the module docstring). Always true, but not provably so:
                # a provable condition is simplified away and the statements released one by one.
                if seq_len > 0:
                    T.wgmma_gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
                    T.wgmma_gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
                    T.wait_wgmma(1)
                    T.warpgroup_fence_operand(qkT, num_regs=regs_s)
                    for i, j in T.Parallel(block_m, block_n):
                        qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                    if needs_mask(k * block_n, block_n, by * block_m, block_m):
                        for i, j in T.Parallel(block_m, block_n):
                            qkT[i, j] = T.if_then_else(
                                visible(k * block_n + j, by * block_m + i), qkT[i, j], 0
                            )
                    T.copy(qkT, qkT_cast)
                    T.wgmma_gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)
                    T.wait_wgmma(1)
                    T.warpgroup_fence_operand(dsT, num_regs=regs_s)
                    for i, j in T.Parallel(block_m, block_n):
                        dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j]) * softmax_scale
                    T.wgmma_gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(dsT_cast, dsT_shared)
                    # Each thread's dS stores made visible to the async proxy before the barrier
                    # that orders them with both warpgroups' dQ WGMMA (TileLang fences after it).
                    T.fence_proxy_async()
                    T.clear(dq)
                    T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
                    T.wait_wgmma(0)
                    # The async dV and dK accumulators are final only after the wait: fenced, so
                    # that no read of them (the epilogue's stores) is scheduled before it.
                    T.warpgroup_fence_operand(dv, num_regs=regs_kv)
                    T.warpgroup_fence_operand(dk, num_regs=regs_kv)
                    # A read of q and dO after the wait: the warp-specialization pass releases a
                    # stage to the producer after the last statement that reads it, and the async
                    # dK (q) and dV (dO) GEMMs read them until the wait. Without it the producer
                    # could load step + 2's q over the one dK still reads (runs 36 and 42: dK
                    # wrong at GQA S333).
                    keep[0] = q[0, 0] + do[0, 0]
                    if k * block_n + block_n <= seq_len:
                        for i, j in T.Parallel(block_n, dim):
                            T.atomic_add(elem(dQ, bz, h, k * block_n + i, j), dq[i, j])
                    else:
                        for i, j in T.Parallel(block_n, dim):
                            if k * block_n + i < seq_len:
                                T.atomic_add(elem(dQ, bz, h, k * block_n + i, j), dq[i, j])
            store_dkv(dv, dv_shared, dV, dv_reduction, bx, by, bz)
            store_dkv(dk, dk_shared, dK, dk_reduction, bx, by, bz)

    return bwd
