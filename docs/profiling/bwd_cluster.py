"""A backward whose key blocks pair up in clusters of two to add half as many dQ tiles (not used
by any package; not yet run on a GPU; time it with bwd_variants_probe.py's `cluster` variant,
which runs it where it applies: the MHA cases).

dQ's accumulation is about the whole D128 backward's gap to cuDNN (run 136: without its atomics
the backward takes 0.70-0.87x the time) and bulk reduce-adds did not shrink it (fewer
instructions, as many bytes reduced in L2). Here key blocks 2c and 2c + 1 of a head form a
cluster and walk the same query blocks in step: rank 1 sends its dQ tile into rank 0's shared
memory by an SM-to-SM bulk copy, rank 0 adds it to its own and its writer warp adds the sum into
the accumulator (the bulk_dq layout), so L2 reduces one tile per pair of key blocks. The math of a step is the shipped
kernel's (both consumer warpgroups on 64 keys each, dQ's columns split between them); a loader
warp brings K and V once and q, dO, lse and Delta per step by TMA.

Causal: rank 1's keys start block_m / block_n query blocks later, so rank 0 adds its first
tiles alone; the grid runs heads fastest (launch_grid's causal order) with the pair along the
key-block axis. No window, no descending walk, no in_block dK/dV; block_m 128 on 256 consumer
threads; the key-block count padded to even: a rank-1 block past the last key walks no query
block (causal) or sends zero tiles (full).
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T
from tilelang.layout import make_swizzled_layout

from generated.attention.kernels import (ACCUM, DQ_TILE, LOG2E, _dq_layout, _indexers, _input, _needs_mask,
                                         _shape, _swizzled, _visibility, dkv_buffer, launch_block,
                                         launch_grid, padded_dim, runtime_dims)

CONSUMERS = 1  # named barrier of the 256 consumer threads


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
                            tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True})
def bwd_cluster(heads, kv_heads, dim, causal, window, layout, dtype, softmax_scale, dk_reduction,
                dv_reduction, block_m, block_n, threads, num_stages, blocks_per_sm=1, bulk_dq=True,
                descending=False):
    assert not window and not descending and block_m == 128 and threads == 256 and dk_reduction != "in_block"
    batch, seq_len = runtime_dims()
    scale = softmax_scale * LOG2E
    groups = heads // kv_heads
    q_shape = _shape(layout, batch, heads, seq_len, dim)
    kv_shape = _shape(layout, batch, kv_heads, seq_len, dim)
    dq_shape = _shape(layout, batch, heads, padded_dim(), dim)
    dk_shape, dk_dtype = dkv_buffer(layout, dk_reduction, batch, heads, kv_heads, seq_len, dim, dtype)
    dv_shape, dv_dtype = dkv_buffer(layout, dv_reduction, batch, heads, kv_heads, seq_len, dim, dtype)
    rows, elem, index = _indexers(layout)
    visible = _visibility(seq_len, causal, window)
    needs_mask = _needs_mask(seq_len, causal, window)
    dq_rows = dq_shape[1 if layout == "bshd" else 2]
    tile_bytes = block_n * dim * 4

    @T.macro
    def store_keys(acc, out, reduction, bx, bz, first):
        for i, j in T.Parallel(block_m, dim):
            if first + i < seq_len:
                if reduction == "atomic":
                    T.atomic_add(elem(out, bz, bx // groups, first + i, j), acc[i, j])
                elif reduction == "split":
                    T.buffer_store(out, acc[i, j], index((bx % groups) * batch + bz, bx // groups, first + i, j))
                else:
                    T.buffer_store(out, T.cast(acc[i, j], dtype), index(bz, bx, first + i, j))

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
        T.annotate_pass_configs({tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True})
        grid = launch_grid(causal, T.ceildiv(seq_len, 2 * block_m) * 2, heads)
        with T.Kernel(grid[0], grid[1], batch, threads=threads + 128,
                      cluster_dims=(1, 2, 1) if causal else (2, 1, 1)) as (launch_x, launch_y, bz):
            by, bx = launch_block(causal, launch_x, launch_y)
            rank = T.block_rank_in_cluster()
            K_shared = T.alloc_shared([block_m, dim], dtype)
            V_shared = T.alloc_shared([block_m, dim], dtype)
            q_s = T.alloc_shared([num_stages, block_n, dim], dtype)
            do_s = T.alloc_shared([num_stages, block_n, dim], dtype)
            lse_s = T.alloc_shared([num_stages, block_n], ACCUM)
            delta_s = T.alloc_shared([num_stages, block_n], ACCUM)
            dsT_shared = T.alloc_shared([block_m, block_n], dtype)
            dq_s = T.alloc_shared([block_n, dim], ACCUM)
            dq_recv = T.alloc_shared([block_n, dim], ACCUM)
            T.annotate_layout({
                dQ: _dq_layout(layout, dQ, True),
                dq_s: T.Layout(dq_s.shape, lambda i, j: [i, _swizzled(i, j)]),
                dq_recv: T.Layout(dq_recv.shape, lambda i, j: [i, _swizzled(i, j)]),
                **{b: make_swizzled_layout(b) for b in (K_shared, V_shared, q_s, do_s, dsT_shared)},
            })
            kv_ready = T.alloc_barrier(32)
            data_ready = T.alloc_barrier([32] * num_stages)
            data_free = T.alloc_barrier([threads] * num_stages)
            dq_full = T.alloc_barrier(threads)
            dq_empty = T.alloc_barrier(1)
            recv_full = T.alloc_barrier(1)  # rank 0: rank 1's tile arrived (its copy's arrival)
            recv_empty = T.alloc_barrier(1)  # rank 1: rank 0 has added its last tile
            # Query blocks [start, n); rank 1's start `lead` blocks after rank 0's (causal), so
            # rank 0 adds its first `lead` tiles alone.
            lead = block_m // block_n if causal else 0
            start = T.floordiv(by * block_m, block_n) if causal else 0
            n = T.ceildiv(seq_len, block_n)
            kv_head = bx // groups
            tx = T.get_thread_binding()
            T.cluster_sync()  # every barrier of both blocks set up before either touches the other's
            if tx >= threads:
                T.set_max_nreg(24, 0)
            if tx >= threads and tx < threads + 32:  # the loader
                T.tma_copy(rows(K, bz, kv_head, by * block_m, block_m), K_shared, barrier=kv_ready)
                T.tma_copy(rows(V, bz, kv_head, by * block_m, block_m), V_shared, barrier=kv_ready)
                T.mbarrier_arrive(kv_ready)
                for step in T.serial(n - start):
                    stage, k = step % num_stages, start + step
                    T.mbarrier_wait_parity(data_free[stage], ((step // num_stages) % 2) ^ 1)
                    T.tma_copy(rows(Q, bz, bx, k * block_n, block_n), q_s[stage, :, :], barrier=data_ready[stage])
                    T.tma_copy(rows(dO, bz, bx, k * block_n, block_n), do_s[stage, :, :], barrier=data_ready[stage])
                    T.tma_copy(lse[bz, bx, k * block_n : (k + 1) * block_n], lse_s[stage, :], barrier=data_ready[stage])
                    T.tma_copy(Delta[bz, bx, k * block_n : (k + 1) * block_n], delta_s[stage, :],
                               barrier=data_ready[stage])
                    T.mbarrier_arrive(data_ready[stage])
            if tx >= threads + 32 and tx < threads + 64:  # rank 0's dQ writer
                if rank == 0:
                    for step in T.serial(n - start):
                        k = start + step
                        T.mbarrier_wait_parity(dq_full, step % 2)
                        if tx == threads + 32:
                            for t in T.serial(block_n // DQ_TILE):
                                if k * block_n + t * DQ_TILE < dq_rows:
                                    T.call_extern(
                                        "handle", "tl::tma_store_add",
                                        T.address_of(dq_s[t * DQ_TILE, 0]),
                                        T.address_of(elem(dQ, bz, bx, k * block_n + t * DQ_TILE, 0)),
                                        DQ_TILE * dim * 4)
                            T.tma_store_arrive()
                            T.tma_store_wait(0)
                            T.mbarrier_arrive(dq_empty)
                    if tx == threads + 32:
                        T.tma_store_wait(0, read=False)
            with T.ws(0, 1):
                T.set_max_nreg(240, 1)
                qkT = T.alloc_fragment([block_m, block_n], ACCUM)
                dsT = T.alloc_fragment([block_m, block_n], ACCUM)
                qkT_cast = T.alloc_fragment([block_m, block_n], dtype)
                dsT_cast = T.alloc_fragment([block_m, block_n], dtype)
                dv = T.alloc_fragment([block_m, dim], ACCUM)
                dk = T.alloc_fragment([block_m, dim], ACCUM)
                dq = T.alloc_fragment([block_n, dim], ACCUM)
                T.fill(dv, 0)
                T.fill(dk, 0)
                T.mbarrier_wait_parity(kv_ready, 0)
                for step in T.serial(n - start):
                    stage, k = step % num_stages, start + step
                    T.mbarrier_wait_parity(data_ready[stage], (step // num_stages) % 2)
                    T.gemm(K_shared, q_s[stage, :, :], qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow,
                           clear_accum=True)
                    for i, j in T.Parallel(block_m, block_n):
                        qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_s[stage, j])
                    if needs_mask(k * block_n, block_n, by * block_m, block_m):
                        for i, j in T.Parallel(block_m, block_n):
                            qkT[i, j] = T.if_then_else(visible(k * block_n + j, by * block_m + i), qkT[i, j], 0)
                    T.gemm(V_shared, do_s[stage, :, :], dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow,
                           clear_accum=True)
                    T.copy(qkT, qkT_cast)
                    T.gemm(qkT_cast, do_s[stage, :, :], dv, policy=T.GemmWarpPolicy.FullRow)
                    for i, j in T.Parallel(block_m, block_n):
                        dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta_s[stage, j])
                    T.gemm(dsT_cast, q_s[stage, :, :], dk, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(dsT_cast, dsT_shared)
                    T.fence_proxy_async()
                    T.sync_threads(CONSUMERS, threads)
                    T.gemm(dsT_shared, K_shared, dq, transpose_A=True, clear_accum=True)
                    T.mbarrier_arrive(data_free[stage])
                    if rank == 1:
                        # dq_s is free once rank 0 has added the last tile sent from it.
                        T.mbarrier_wait_parity(recv_empty, (step % 2) ^ 1)
                        T.copy(dq, dq_s)
                        T.fence_proxy_async()
                        T.sync_threads(CONSUMERS, threads)
                        if tx == 0:
                            T.copy_cluster(dq_s, dq_recv, dst_block=0, remote_barrier=recv_full[0])
                    else:
                        T.mbarrier_wait_parity(dq_empty, (step % 2) ^ 1)
                        if step < lead:
                            T.copy(dq, dq_s)
                            T.fence_proxy_async()
                        else:
                            T.mbarrier_wait_parity(recv_full, (step - lead) % 2)
                            for i, j in T.Parallel(block_n, dim):
                                dq_s[i, j] = dq[i, j] + dq_recv[i, j]
                            T.fence_proxy_async()
                            T.sync_threads(CONSUMERS, threads)
                            if tx == 0:
                                T.ptx_arrive_cluster_barrier(recv_empty[0], 1)
                        T.mbarrier_arrive(dq_full)
                for i, j in T.Parallel(block_m, dim):
                    dk[i, j] *= softmax_scale
                store_keys(dv, dV, dv_reduction, bx, bz, by * block_m)
                store_keys(dk, dK, dk_reduction, bx, bz, by * block_m)
            T.cluster_sync()  # neither block leaves while the other may still reach its memory

    return bwd
