"""Attention forward schedules measured in GPU run 31 (docs/gpu-runs.md), not used by any package.

fwd_fa3 overlaps by hand: the QK^T GEMM of block s and the PV GEMM of block s - 1 are issued as
async WGMMA, the softmax of block s runs while PV is in flight (one step more than blocks; step 0
has no PV, the last no scores). Its waits sit in one statement with both GEMMs, so the
warp-specialization pass releases K and V to the TMA producer only after them. Run 31: +2-4% over
the shipped loop at 128x128 at D128, -5% at D64. (TileLang 0.1.15's manual order/stage on
T.Pipelined cannot express this: with num_stages >= 1 the warp-specialization pass builds the
consumer loop itself and ignores them, the CUDA being that of the plain loop; without num_stages
the manual pipeline rejects repeated orders.)

pingpong=True adds turns between the two consumer warpgroups (named barriers PING and PONG): one
issues its GEMMs while the other runs its softmax, so the tensor cores see one warpgroup's GEMMs
at a time and the other's exp2 work fills the gaps; threads must be 256. Built for sm_90a on the
CPU machine; not yet run."""
import os, sys
sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T
from generated.attention.kernels import (LOG2E, ACCUM, NEG_INIT, runtime_dims, padded_dim, _shape,
                                         _input, _indexers, _visibility, _needs_mask)

# Named barrier ids of the turns (TileLang's own code uses 0-3).
PING, PONG = 10, 11


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def fwd_fa3(heads, kv_heads, dim, causal, window, layout, dtype, softmax_scale, block_m, block_n,
            threads, num_stages, pingpong=False):
    """See the module docstring."""
    batch, seq_len = runtime_dims()
    scale = softmax_scale * LOG2E
    groups = heads // kv_heads
    q_shape = _shape(layout, batch, heads, seq_len, dim)
    kv_shape = _shape(layout, batch, kv_heads, seq_len, dim)
    rows, _ = _indexers(layout)
    visible = _visibility(seq_len, causal, window)
    needs_mask = _needs_mask(seq_len, causal, window)
    regs_s = block_m * block_n // threads
    regs_o = block_m * dim // threads

    @T.macro
    def init_scores(acc_s, bx, kb):
        if needs_mask(bx * block_m, block_m, kb * block_n, block_n):
            for i, j in T.Parallel(block_m, block_n):
                acc_s[i, j] = T.if_then_else(
                    visible(bx * block_m + i, kb * block_n + j), 0, -T.infinity(ACCUM)
                )
        else:
            T.clear(acc_s)

    @T.macro
    def softmax(acc_s, row_max, row_max_prev, row_rescale, row_sum, row_denom):
        T.copy(row_max, row_max_prev)
        T.reduce_max(acc_s, row_max, dim=1, clear=False)
        for i in T.Parallel(block_m):
            row_max[i] = T.max(row_max[i], row_max_prev[i])
        for i in T.Parallel(block_m):
            row_rescale[i] = T.exp2((row_max_prev[i] - row_max[i]) * scale)
        for i, j in T.Parallel(block_m, block_n):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - row_max[i] * scale)
        T.reduce_sum(acc_s, row_sum, dim=1)
        for i in T.Parallel(block_m):
            row_denom[i] = row_denom[i] * row_rescale[i] + row_sum[i]

    @T.macro
    def my_turn(wg):
        if pingpong:
            if wg == 0:
                T.sync_threads(PING, 256)
            else:
                T.sync_threads(PONG, 256)

    @T.macro
    def their_turn(wg):
        if pingpong:
            if wg == 0:
                T.named_barrier_arrive(PONG, 256)
            else:
                T.named_barrier_arrive(PING, 256)

    @T.prim_func
    def fwd(
        Q: _input(q_shape, dtype, "q"),
        K: _input(kv_shape, dtype, "k"),
        V: _input(kv_shape, dtype, "v"),
        O: T.Tensor(q_shape, dtype),
        lse: T.Tensor([batch, heads, padded_dim()], ACCUM),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_m), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_m, dim], dtype)
            K_shared = T.alloc_shared([block_n, dim], dtype)
            V_shared = T.alloc_shared([block_n, dim], dtype)
            acc_s = T.alloc_fragment([block_m, block_n], ACCUM)
            acc_s_cast = T.alloc_fragment([block_m, block_n], dtype)
            acc_o = T.alloc_fragment([block_m, dim], ACCUM)
            row_max = T.alloc_fragment([block_m], ACCUM)
            row_max_prev = T.alloc_fragment([block_m], ACCUM)
            row_rescale = T.alloc_fragment([block_m], ACCUM)
            row_sum = T.alloc_fragment([block_m], ACCUM)
            row_denom = T.alloc_fragment([block_m], ACCUM)

            T.copy(rows(Q, bz, by, bx * block_m, block_m), Q_shared)
            T.fill(acc_o, 0)
            T.fill(row_denom, 0)
            T.fill(row_max, NEG_INIT)
            n_blocks = T.ceildiv(seq_len, block_n)
            loop_end = (
                T.min(T.ceildiv((bx + 1) * block_m, block_n), n_blocks) if causal else n_blocks
            )
            loop_start = T.max(T.floordiv(bx * block_m - window + 1, block_n), 0) if window else 0
            n = loop_end - loop_start
            # Inside the loop the thread index is the consumer's own (the producer warpgroup's
            # threads come first in the block).
            wg = T.get_thread_binding() // 128
            # Step s issues the scores of key block s and the PV product of block s - 1; one
            # step more than blocks (step 0 has no PV, step n no scores).
            for step in T.Pipelined(n + 1, num_stages=num_stages):
                kq = T.min(loop_start + step, loop_end - 1)
                kv = T.max(loop_start + step - 1, loop_start)
                T.copy(rows(K, bz, by // groups, kq * block_n, block_n), K_shared)
                T.copy(rows(V, bz, by // groups, kv * block_n, block_n), V_shared)
                # One statement, so that K and V are released to the loads only after the
                # waits below (the GEMMs run asynchronously).
                if step < n:
                    init_scores(acc_s, bx, kq)
                    if pingpong:
                        if step == 0:
                            if wg == 1:
                                T.named_barrier_arrive(PING, 256)  # warpgroup 0 issues first
                    my_turn(wg)
                    T.wgmma_gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    if step > 0:
                        T.wgmma_gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
                    their_turn(wg)
                    if step > 0:
                        T.wait_wgmma(1)
                    else:
                        T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_s, num_regs=regs_s)
                    softmax(acc_s, row_max, row_max_prev, row_rescale, row_sum, row_denom)
                    T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_o, num_regs=regs_o)
                    for i, j in T.Parallel(block_m, dim):
                        acc_o[i, j] *= row_rescale[i]
                    T.copy(acc_s, acc_s_cast)
                else:
                    my_turn(wg)
                    T.wgmma_gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
                    if pingpong:
                        if wg == 0:
                            their_turn(wg)  # warpgroup 1 takes the last turn; nobody after it
                    T.wait_wgmma(0)
                    T.warpgroup_fence_operand(acc_o, num_regs=regs_o)
            for i, j in T.Parallel(block_m, dim):
                acc_o[i, j] /= row_denom[i]
            T.copy(acc_o, rows(O, bz, by, bx * block_m, block_m))
            for i in T.Parallel(block_m):
                row_denom[i] = T.log2(row_denom[i]) + row_max[i] * scale
            T.copy(row_denom, lse[bz, by, bx * block_m : (bx + 1) * block_m])

    return fwd
