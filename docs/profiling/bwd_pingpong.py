"""A backward whose two consumer warpgroups take turns at the tensor cores: right, and not faster
(GPU run 178, H100), so no package uses it. Its template form, a bwd tiling `pingpong` with its
rule, tune space and lowered tests, is patches/bwd-pingpong.patch (render copies with it:
render_copies.sh); bwd_variants_probe.py's `pingpong` variants time this file's kernel.

Run 178 (copies of attention and gqa with every 128-key backward entry on it; 60 of 60
test_matches_reference passed: odd lengths, D64 and D128, causal and full, MHA and GQA in_block),
ms bwd through the public function, two rounds in one process (shipped / ping-pong):
MHA fp16 B4 H16 S4096 D128 full 3.210, 3.126 / 3.211, 3.267; causal 1.747, 1.709 / 1.812, 1.823;
D64 full 1.851, 1.850 / 1.862, 1.870; D64 causal 0.974, 1.017 / 1.022, 1.012; GQA bf16 B2 32/8
D128 causal 1.746, 1.742 / 1.758, 1.757; full 3.070, 3.131 / 3.429, 3.402. Level to 4% slower,
GQA full 10% slower (in_block: the group's heads walked by one block, its dQ partial summed and
added per head). Not profiled: whatever the turns win on the tensor cores, the partial dQ
tile's hand-off (warpgroup 1 waits for warpgroup 0's store, then loads, adds and stores 64
values a thread) and the wait for each turn give back. Run 205 (H100): dq_sum="bulk" (each
partial added as it is) and turns=False (the warpgroups not taking turns: coupled by the dQ
hand-off only, or with "bulk" by nothing) are right and 0-14% slower than the shipped backward
too (MHA D128 full 2.980 ms shipped; 3.292 bulk, 3.308 no turns, 3.331 both).

The shipped backward runs its two consumer warpgroups in step: both issue a GEMM, both wait for
it, both compute P and dS while the tensor cores idle (run 159: tensor busy 48.7% of the D128
full backward). Here each warpgroup owns 64 of the block's 128 keys and is a backward of its own
over the same query blocks: its S^T and dP^T (SS), its dV (P from registers), dK (dS^T from
shared memory) and a partial dQ over its own keys (dS K_w, 64 registers a thread at D128, where
the shipped kernel splits dQ's columns between the warpgroups and so needs both halves of dS in
shared memory before either can issue it). Nothing couples the warpgroups but the sum of the two
partial dQ tiles, so they take turns through named barriers as the ping-pong forward does: two
turns a step each (S^T, dP^T; then dV, dK, dQ), one warpgroup's P and dS while the other's GEMMs
run.

dQ: warpgroup 0 stores its partial into a shared fp32 tile, warpgroup 1 adds its own, and a
writer warp of the producer warpgroup adds the tile into the accumulator by bulk reduce-adds
(the bulk_dq layout: the package's postprocess with bulk_dq reads it). A loader warp brings q,
dO, lse and Delta by TMA into `num_stages` stages; K and V once.

dq_sum="bulk": each warpgroup's partial goes to a tile of its own, which the writer adds into
the accumulator as it is (twice the bulk adds, no hand-off between the warpgroups).

Signature, grid, reductions and the accumulator as the package's bwd with bulk_dq; block_m must
be 128 (two warpgroups of 64 keys), threads 256.
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T
from tilelang.layout import make_swizzled_layout

from generated.attention.kernels import (ACCUM, DQ_TILE, LOG2E, _dq_layout, _swizzled, _indexers, _input,
                                         _needs_mask, _shape, _visibility, dkv_buffer, launch_block,
                                         launch_grid, padded_dim, runtime_dims)

# Named barriers: 1 + w is warpgroup w's turn (the other arrives on it), 3 the hand-off of the
# partial dQ tile from warpgroup 0 to warpgroup 1, 4 + w a warpgroup's own dS stores.
DQ_HALF = 3


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def bwd_pingpong(heads, kv_heads, dim, causal, window, layout, dtype, softmax_scale, dk_reduction,
                 dv_reduction, block_m, block_n, threads, num_stages, blocks_per_sm=1, bulk_dq=True,
                 descending=False, dq_sum="smem", turns=True):
    assert block_m == 128 and threads == 256, "two consumer warpgroups of 64 keys each"
    half = block_m // 2
    batch, seq_len = runtime_dims()
    scale = softmax_scale * LOG2E
    groups = heads // kv_heads
    in_block = dk_reduction == "in_block"
    q_shape = _shape(layout, batch, heads, seq_len, dim)
    kv_shape = _shape(layout, batch, kv_heads, seq_len, dim)
    dq_shape = _shape(layout, batch, heads, padded_dim(), dim)
    dk_shape, dk_dtype = dkv_buffer(layout, dk_reduction, batch, heads, kv_heads, seq_len, dim, dtype)
    dv_shape, dv_dtype = dkv_buffer(layout, dv_reduction, batch, heads, kv_heads, seq_len, dim, dtype)
    rows, elem, index = _indexers(layout)
    visible = _visibility(seq_len, causal, window)
    needs_mask = _needs_mask(seq_len, causal, window)
    grid = launch_grid(causal, T.ceildiv(seq_len, block_m), kv_heads if in_block else heads)
    dq_rows = dq_shape[1 if layout == "bshd" else 2]

    def query_range(by):
        n_blocks = T.ceildiv(seq_len, block_n)
        loop_start = T.floordiv(by * block_m, block_n) if causal else 0
        loop_end = T.min(T.ceildiv((by + 1) * block_m + window - 1, block_n), n_blocks) if window else n_blocks
        return loop_start, loop_end

    def step_at(step, bx, loop_start, loop_end):
        """(query head, query block) of a step, as the shipped kernel walks them."""
        h = bx * groups + step % groups if in_block else bx
        query_step = step // groups if in_block else step
        k = loop_end - 1 - query_step if descending else loop_start + query_step
        return h, k

    @T.macro
    def pass_turn(w, turn, last_turn):
        # Warpgroup 1 let warpgroup 0 go first once: it passes no turn after its last.
        if turns:
            if w == 0 or turn < last_turn:
                T.named_barrier_arrive(2 - w, threads)

    @T.macro
    def take_turn(w):
        if turns:
            T.sync_threads(1 + w, threads)

    @T.macro
    def consumer(w, dK, dV, K_shared, V_shared, q_s, do_s, lse_s, delta_s, ds_s,
                 dq_s, kv_ready, data_ready, data_free, dq_full, dq_empty, bx, by, bz, loop_start,
                 loop_end, n):
        T.set_max_nreg(240, 1)
        key_first = by * block_m + w * half
        s_acc = T.alloc_fragment([half, block_n], ACCUM)
        dp_acc = T.alloc_fragment([half, block_n], ACCUM)
        p_cast = T.alloc_fragment([half, block_n], dtype)
        ds_cast = T.alloc_fragment([half, block_n], dtype)
        dv = T.alloc_fragment([half, dim], ACCUM)
        dk = T.alloc_fragment([half, dim], ACCUM)
        dq = T.alloc_fragment([block_n, dim], ACCUM)
        T.fill(dv, 0)
        T.fill(dk, 0)
        if turns and w == 1:
            T.named_barrier_arrive(1, threads)  # warpgroup 0 goes first
        T.mbarrier_wait_parity(kv_ready, 0)
        for step in T.serial(n):
            stage = step % num_stages
            h, k = step_at(step, bx, loop_start, loop_end)
            # Turn 1: the scores and dP^T.
            take_turn(w)
            T.mbarrier_wait_parity(data_ready[stage], (step // num_stages) % 2)
            T.wgmma_gemm(K_shared[w, :, :], q_s[stage, :, :], s_acc, transpose_B=True,
                         policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
            T.wgmma_gemm(V_shared[w, :, :], do_s[stage, :, :], dp_acc, transpose_B=True,
                         policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
            pass_turn(w, 2 * step, 2 * n - 1)
            T.wait_wgmma(0)
            for i, j in T.Parallel(half, block_n):
                s_acc[i, j] = T.exp2(s_acc[i, j] * scale - lse_s[stage, j])
            if needs_mask(k * block_n, block_n, key_first, half):
                for i, j in T.Parallel(half, block_n):
                    s_acc[i, j] = T.if_then_else(visible(k * block_n + j, key_first + i), s_acc[i, j], 0)
            T.copy(s_acc, p_cast)
            for i, j in T.Parallel(half, block_n):
                ds_cast[i, j] = s_acc[i, j] * (dp_acc[i, j] - delta_s[stage, j])
            T.copy(ds_cast, ds_s[w, :, :])
            # This warpgroup's dS stores visible to its WGMMAs (the async proxy) below.
            T.fence_proxy_async()
            T.sync_threads(4 + w, 128)
            # Turn 2: dV += P dO, dK += dS^T q, dQ_w = dS K_w.
            take_turn(w)
            T.wgmma_gemm(p_cast, do_s[stage, :, :], dv, policy=T.GemmWarpPolicy.FullRow)
            T.wgmma_gemm(ds_s[w, :, :], q_s[stage, :, :], dk, policy=T.GemmWarpPolicy.FullRow)
            T.wgmma_gemm(ds_s[w, :, :], K_shared[w, :, :], dq, transpose_A=True,
                         policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
            pass_turn(w, 2 * step + 1, 2 * n - 1)
            T.wait_wgmma(0)
            T.mbarrier_arrive(data_free[stage])
            if dq_sum == "bulk":
                T.mbarrier_wait_parity(dq_empty[w], (step % 2) ^ 1)
                T.copy(dq, dq_s[w, :, :])
                T.fence_proxy_async()
                T.mbarrier_arrive(dq_full[w])
            elif w == 0:
                # The tile free once the writer's last bulk adds have read it.
                T.mbarrier_wait_parity(dq_empty[0], (step % 2) ^ 1)
                T.copy(dq, dq_s[0, :, :])
                T.named_barrier_arrive(DQ_HALF, threads)
            else:
                T.sync_threads(DQ_HALF, threads)
                for i, j in T.Parallel(block_n, dim):
                    dq_s[0, i, j] = dq_s[0, i, j] + dq[i, j]
                T.fence_proxy_async()
                T.mbarrier_arrive(dq_full[0])
        for i, j in T.Parallel(half, dim):
            dk[i, j] *= softmax_scale  # the scale dS left out
        first = by * block_m + w * half
        if dv_reduction == "atomic":
            for i, j in T.Parallel(half, dim):
                if first + i < seq_len:
                    T.atomic_add(elem(dV, bz, bx // groups, first + i, j), dv[i, j])
                    T.atomic_add(elem(dK, bz, bx // groups, first + i, j), dk[i, j])
        elif dv_reduction == "split":
            for i, j in T.Parallel(half, dim):
                if first + i < seq_len:
                    T.buffer_store(dV, dv[i, j], index((bx % groups) * batch + bz, bx // groups, first + i, j))
                    T.buffer_store(dK, dk[i, j], index((bx % groups) * batch + bz, bx // groups, first + i, j))
        else:  # direct or in_block: bx is the KV head
            for i, j in T.Parallel(half, dim):
                if first + i < seq_len:
                    T.buffer_store(dV, T.cast(dv[i, j], dtype), index(bz, bx, first + i, j))
                    T.buffer_store(dK, T.cast(dk[i, j], dtype), index(bz, bx, first + i, j))

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
        with T.Kernel(grid[0], grid[1], batch, threads=threads + 128) as (launch_x, launch_y, bz):
            by, bx = launch_block(causal, launch_x, launch_y)
            K_shared = T.alloc_shared([2, half, dim], dtype)
            V_shared = T.alloc_shared([2, half, dim], dtype)
            q_s = T.alloc_shared([num_stages, block_n, dim], dtype)
            do_s = T.alloc_shared([num_stages, block_n, dim], dtype)
            lse_s = T.alloc_shared([num_stages, block_n], ACCUM)
            delta_s = T.alloc_shared([num_stages, block_n], ACCUM)
            ds_s = T.alloc_shared([2, half, block_n], dtype)
            tiles = 2 if dq_sum == "bulk" else 1
            dq_s = T.alloc_shared([tiles, block_n, dim], ACCUM)
            layouts = {dQ: _dq_layout(layout, dQ, True)}
            layouts[dq_s] = T.Layout(dq_s.shape, lambda w, i, j: [w, i, _swizzled(i, j)])
            layouts.update({buf: make_swizzled_layout(buf) for buf in (K_shared, V_shared, q_s, do_s, ds_s)})
            T.annotate_layout(layouts)
            kv_ready = T.alloc_barrier(32)
            data_ready = T.alloc_barrier([32] * num_stages)
            data_free = T.alloc_barrier([threads] * num_stages)
            dq_full = T.alloc_barrier([128] * tiles)
            dq_empty = T.alloc_barrier([1] * tiles)
            loop_start, loop_end = query_range(by)
            span = loop_end - loop_start
            n = span * groups if in_block else span
            kv_head = bx if in_block else bx // groups
            tx = T.get_thread_binding()
            if tx >= threads:
                T.set_max_nreg(24, 0)
            if tx >= threads and tx < threads + 32:  # the loader warp
                for w in T.serial(2):
                    T.tma_copy(rows(K, bz, kv_head, by * block_m + w * half, half), K_shared[w, :, :], barrier=kv_ready)
                    T.tma_copy(rows(V, bz, kv_head, by * block_m + w * half, half), V_shared[w, :, :], barrier=kv_ready)
                T.mbarrier_arrive(kv_ready)
                for step in T.serial(n):
                    stage = step % num_stages
                    h, k = step_at(step, bx, loop_start, loop_end)
                    T.mbarrier_wait_parity(data_free[stage], ((step // num_stages) % 2) ^ 1)
                    T.tma_copy(rows(Q, bz, h, k * block_n, block_n), q_s[stage, :, :], barrier=data_ready[stage])
                    T.tma_copy(rows(dO, bz, h, k * block_n, block_n), do_s[stage, :, :], barrier=data_ready[stage])
                    T.tma_copy(lse[bz, h, k * block_n : (k + 1) * block_n], lse_s[stage, :], barrier=data_ready[stage])
                    T.tma_copy(Delta[bz, h, k * block_n : (k + 1) * block_n], delta_s[stage, :], barrier=data_ready[stage])
                    T.mbarrier_arrive(data_ready[stage])
            if tx >= threads + 32 and tx < threads + 64:  # the dQ writer warp
                for step in T.serial(n):
                    h, k = step_at(step, bx, loop_start, loop_end)
                    for w in T.unroll(tiles):
                        T.mbarrier_wait_parity(dq_full[w], step % 2)
                        if tx == threads + 32:
                            for t in T.serial(block_n // DQ_TILE):
                                # Tiles past the accumulator's padded rows hold no query.
                                if k * block_n + t * DQ_TILE < dq_rows:
                                    T.call_extern(
                                        "handle", "tl::tma_store_add",
                                        T.address_of(dq_s[w, t * DQ_TILE, 0]),
                                        T.address_of(elem(dQ, bz, h, k * block_n + t * DQ_TILE, 0)),
                                        DQ_TILE * dim * 4)
                            T.tma_store_arrive()
                    if tx == threads + 32:
                        if tiles == 2:
                            T.tma_store_wait(1)
                            T.mbarrier_arrive(dq_empty[0])
                            T.tma_store_wait(0)
                            T.mbarrier_arrive(dq_empty[1])
                        else:
                            T.tma_store_wait(0)
                            T.mbarrier_arrive(dq_empty[0])
                if tx == threads + 32:
                    T.tma_store_wait(0, read=False)
            with T.ws(0):
                consumer(0, dK, dV, K_shared, V_shared, q_s, do_s, lse_s, delta_s, ds_s,
                         dq_s, kv_ready, data_ready, data_free, dq_full, dq_empty, bx, by, bz, loop_start,
                         loop_end, n)
            with T.ws(1):
                consumer(1, dK, dV, K_shared, V_shared, q_s, do_s, lse_s, delta_s, ds_s,
                         dq_s, kv_ready, data_ready, data_free, dq_full, dq_empty, bx, by, bz, loop_start,
                         loop_end, n)

    return bwd
