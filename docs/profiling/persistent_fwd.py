"""A persistent attention forward with hand-written warp specialization (prototype, not in the
template): one block per SM walks its (query block, head, batch) tiles, longest first when causal,
and its producer warpgroup loads the next tile's Q and first K/V blocks while the consumers finish
this tile's softmax and write O. Why: at D64 causal the package's forward launches 15.5 blocks
per SM, one at a time (a 384-thread block of 168 registers fills the register file), and each
pays its prologue and epilogue exposed; cuDNN's persistent forward is 1.28x faster there (run 92,
ncu). TileLang's automatic pipelining cannot express this: a copy of Q made only at a tile's first
key step is lowered to plain loads by the consumer threads (checked on the CPU), so the producer
and the barriers are written out here with T.ws, T.tma_copy and mbarriers.

Layout bshd, O and lse as the package's forward writes them (lse: log2 domain of the scaled
scores, [batch, heads, padded rows]).

    persistent_fwd(batch, heads, kv_heads, seq_len, dim, causal, dtype, block_m=128, block_n=128,
                   stages=2, sms=132, overlap=False, window=0, sinks=False, stage_o=False)

overlap=True: each key step issues this block's scores and the previous block's PV product as
async WGMMA together (the package's `overlap = true` schedule); else GEMM, softmax, GEMM.
block_m: 64 query rows per consumer warpgroup (128: two, 192: three), beside one producer
warpgroup.

stage_o: O goes to global memory through shared memory (a TMA store of whole rows) instead of
from registers. window: the sliding window (causal; 0: none); sinks: one logit per query head joins each row's
softmax denominator (the package's attention_sink). It returns the prim_func; compile it with
tilelang.compile(func, out_idx=None) and call it with (q, k, v, sinks, o, lse,
section_pairs(batch, heads, kv_heads, seq_len, dim)) (sinks: fp32 [heads], read only with
sinks=True). batch=None and
seq_len=None build it for every batch and length (symbolic dims, as the package's kernels).
`python docs/profiling/persistent_fwd.py` lowers and compiles it for sm_90a on the CPU
(DYNAMIC=1, OVERLAP=1 for those variants; the CUDA goes to $OUT_CU).
"""
import os

import tilelang
import tilelang.language as T

LOG2E = 1.4426950408889634


def section_pairs(batch, heads, kv_heads, seq_len, dim):
    """How many (batch, head) pairs a section of tiles holds: the most, dividing batch * heads,
    whose K and V fit in 16 MB (a third of L2), so the ~132 tiles in flight share their keys
    there. (Query-block-major over all pairs, at B4 H16 S4096 D64 the tiles in flight would read
    64 MB of K and V, more than L2.) A host-side rule: the kernel takes it as an argument."""
    pairs = heads * batch
    kv_bytes = seq_len * dim * 2 * 2  # K and V of one KV head, 2-byte elements
    budget = max(1, (16 << 20) * (heads // kv_heads) // kv_bytes)
    return max(d for d in range(1, pairs + 1) if pairs % d == 0 and d <= budget)


def persistent_fwd(batch, heads, kv_heads, seq_len, dim, causal, dtype, block_m=128, block_n=128,
                   stages=2, sms=132, overlap=False, window=0, sinks=False, stage_o=False):
    accum = "float"
    groups = heads // kv_heads
    scale = dim ** -0.5 * LOG2E
    if batch is None:  # symbolic batch and length, as the package's kernels take them
        batch, seq_len, padded = T.dynamic("batch"), T.dynamic("seq_len"), T.dynamic("padded_rows")
    else:
        padded = (seq_len + 7) // 8 * 8
    n_query = T.ceildiv(seq_len, block_m)
    n_key = T.ceildiv(seq_len, block_n)
    tiles = n_query * heads * batch
    grid = T.min(sms, tiles)
    # One consumer warpgroup per 64 query rows (two at 128 rows, three at 192), and the
    # registers the producer's 24 leave them: 240 for two, 160 for three (64512 per SM).
    assert block_m % 64 == 0 and block_m <= 192
    consumers = block_m // 64 * 128
    consumer_registers = 240 if consumers <= 256 else 160

    assert not window or causal, "a sliding window is causal"

    def key_blocks(qb):
        """Key blocks [start, end) some query of query block qb sees: the others are skipped
        (past its last query when causal, before its first query's window)."""
        end = T.min(T.ceildiv((qb + 1) * block_m, block_n), n_key) if causal else n_key
        start = T.max(T.floordiv(qb * block_m - window + 1, block_n), 0) if window else 0
        return start, end

    def visible(q_idx, k_idx):
        condition = k_idx < seq_len
        if causal:
            condition = T.And(condition, q_idx >= k_idx)
        if window:
            condition = T.And(condition, q_idx - k_idx < window)
        return condition

    def needs_mask(qb, kb):
        """Whether a query of block qb misses a key of block kb: the causal diagonal, the
        window's edge, the sequence's end. Only such tiles pay for the per-element mask."""
        condition = (kb + 1) * block_n > seq_len
        if causal:
            condition = T.Or(condition, (kb + 1) * block_n > qb * block_m)
        if window:
            condition = T.Or(condition, (qb + 1) * block_m - 1 - kb * block_n >= window)
        return condition

    def decode(t, section):
        """(query block, head, batch) of tile t, in sections of `section` (batch, head) pairs
        (section_pairs): section by section, and in a section query block by query block, the
        longest first when causal, so that each section's last tiles, and the grid's, are its
        shortest."""
        in_section = t % (section * n_query)
        rank = in_section // section
        pair = t // (section * n_query) * section + in_section % section
        return (n_query - 1 - rank if causal else rank), pair % heads, pair // heads

    score_regs = block_m * block_n // consumers
    out_regs = block_m * dim // consumers

    @T.macro
    def init_scores(acc_s, qb, kb):
        """-inf where the query does not see the key, else 0; the score GEMM adds to it."""
        if needs_mask(qb, kb):
            for r, c in T.Parallel(block_m, block_n):
                acc_s[r, c] = T.if_then_else(visible(qb * block_m + r, kb * block_n + c), 0,
                                             -T.infinity(accum))
        else:
            T.clear(acc_s)

    @T.macro
    def softmax(acc_s, row_max, row_max_prev, row_rescale, row_sum, row_denom):
        """acc_s to probabilities against the running row max; the denominators rescaled and
        summed; row_rescale is the factor O must be scaled by."""
        T.copy(row_max, row_max_prev)
        T.reduce_max(acc_s, row_max, dim=1, clear=False)
        for r in T.Parallel(block_m):
            # (prev - max) * scale: a finite start minus a max stays finite (no inf - inf).
            row_rescale[r] = T.exp2((row_max_prev[r] - row_max[r]) * scale)
        for r, c in T.Parallel(block_m, block_n):
            acc_s[r, c] = T.exp2(acc_s[r, c] * scale - row_max[r] * scale)
        T.reduce_sum(acc_s, row_sum, dim=1)
        for r in T.Parallel(block_m):
            row_denom[r] = row_denom[r] * row_rescale[r] + row_sum[r]

    @T.prim_func
    def fwd(
        Q: T.Tensor([batch, seq_len, heads, dim], dtype),
        K: T.Tensor([batch, seq_len, kv_heads, dim], dtype),
        V: T.Tensor([batch, seq_len, kv_heads, dim], dtype),
        Sinks: T.Tensor([heads], accum),  # read only with sinks=True
        O: T.Tensor([batch, seq_len, heads, dim], dtype),
        lse: T.Tensor([batch, heads, padded], accum),
        section: T.int32,
    ):
        with T.Kernel(grid, threads=128 + consumers) as bid:
            Q_shared = T.alloc_shared([2, block_m, dim], dtype)
            K_shared = T.alloc_shared([stages, block_n, dim], dtype)
            V_shared = T.alloc_shared([stages, block_n, dim], dtype)
            if stage_o:
                O_shared = T.alloc_shared([block_m, dim], dtype)
            acc_s = T.alloc_fragment([block_m, block_n], accum)
            acc_p = T.alloc_fragment([block_m, block_n], dtype)
            acc_o = T.alloc_fragment([block_m, dim], accum)
            row_max = T.alloc_fragment([block_m], accum)
            row_max_prev = T.alloc_fragment([block_m], accum)
            row_rescale = T.alloc_fragment([block_m], accum)
            row_sum = T.alloc_fragment([block_m], accum)
            row_denom = T.alloc_fragment([block_m], accum)
            # full: every producer thread arrived after the elected one set the expected bytes
            # (T.tma_copy sets them, it does not arrive) and the bytes landed; empty: every
            # consumer thread is done reading the buffer. K and V have rings of their own: the
            # overlapped schedule reads K of block j next to V of block j - 1.
            q_full = T.alloc_barrier([128, 128])
            q_empty = T.alloc_barrier([consumers, consumers])
            k_full = T.alloc_barrier([128] * stages)
            v_full = T.alloc_barrier([128] * stages)
            k_empty = T.alloc_barrier([consumers] * stages)
            v_empty = T.alloc_barrier([consumers] * stages)
            my_tiles = T.ceildiv(tiles - bid, grid)
            tx = T.get_thread_binding()

            # One if/else, not two T.ws blocks: TileLang puts a block-wide sync between those,
            # and the producer, blocked on a buffer the consumers have not freed, never reaches it.
            if tx < 128:
                T.dec_max_nreg(24)
                step = T.alloc_var("int32", init=0)
                for i in T.serial(my_tiles):
                    qb, h, b = decode(bid + i * grid, section)
                    T.barrier_wait(q_empty[i % 2], ((i // 2) & 1) ^ 1)
                    T.tma_copy(Q[b, qb * block_m:(qb + 1) * block_m, h, :], Q_shared[i % 2, :, :],
                               barrier=q_full[i % 2])
                    T.barrier_arrive(q_full[i % 2])
                    start, end = key_blocks(qb)
                    for j in T.serial(end - start):
                        kb = start + j
                        s = step % stages
                        phase = ((step // stages) & 1) ^ 1
                        T.barrier_wait(k_empty[s], phase)
                        T.tma_copy(K[b, kb * block_n:(kb + 1) * block_n, h // groups, :],
                                   K_shared[s, :, :], barrier=k_full[s])
                        T.barrier_arrive(k_full[s])
                        T.barrier_wait(v_empty[s], phase)
                        T.tma_copy(V[b, kb * block_n:(kb + 1) * block_n, h // groups, :],
                                   V_shared[s, :, :], barrier=v_full[s])
                        T.barrier_arrive(v_full[s])
                        step += 1
            else:
                T.inc_max_nreg(consumer_registers)
                # K blocks and V blocks consumed so far, over all tiles: ring slot and phase.
                k_step = T.alloc_var("int32", init=0)
                v_step = T.alloc_var("int32", init=0)
                for i in T.serial(my_tiles):
                    qb, h, b = decode(bid + i * grid, section)
                    start, end = key_blocks(qb)
                    n = end - start
                    T.fill(acc_o, 0)
                    T.fill(row_denom, 0)
                    T.fill(row_max, -1e30)
                    T.barrier_wait(q_full[i % 2], (i // 2) & 1)
                    if overlap:
                        # Step j issues the scores of key block j and the PV product of block
                        # j - 1 together: the tensor cores run PV during this block's softmax.
                        T.clear(acc_p)
                        for j in T.serial(n + 1):
                            if j < n:
                                ks = k_step % stages
                                init_scores(acc_s, qb, start + j)
                                T.barrier_wait(k_full[ks], (k_step // stages) & 1)
                                T.wgmma_gemm(Q_shared[i % 2, :, :], K_shared[ks, :, :], acc_s,
                                             transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                                if j > 0:
                                    vs = v_step % stages
                                    T.barrier_wait(v_full[vs], (v_step // stages) & 1)
                                    T.wgmma_gemm(acc_p, V_shared[vs, :, :], acc_o,
                                                 policy=T.GemmWarpPolicy.FullRow)
                                    T.wait_wgmma(1)  # the scores; PV may still run
                                else:
                                    T.wait_wgmma(0)
                                T.warpgroup_fence_operand(acc_s, num_regs=score_regs)
                                T.barrier_arrive(k_empty[ks])
                                k_step += 1
                                softmax(acc_s, row_max, row_max_prev, row_rescale, row_sum,
                                        row_denom)
                                T.wait_wgmma(0)
                                T.warpgroup_fence_operand(acc_o, num_regs=out_regs)
                                if j > 0:
                                    T.barrier_arrive(v_empty[v_step % stages])
                                    v_step += 1
                                # O holds blocks up to j - 1: rescaled to this block's max.
                                for r, c in T.Parallel(block_m, dim):
                                    acc_o[r, c] *= row_rescale[r]
                                T.copy(acc_s, acc_p)
                            else:
                                vs = v_step % stages
                                T.barrier_wait(v_full[vs], (v_step // stages) & 1)
                                T.wgmma_gemm(acc_p, V_shared[vs, :, :], acc_o,
                                             policy=T.GemmWarpPolicy.FullRow)
                                T.wait_wgmma(0)
                                T.warpgroup_fence_operand(acc_o, num_regs=out_regs)
                                T.barrier_arrive(v_empty[vs])
                                v_step += 1
                    else:
                        for j in T.serial(n):
                            s = k_step % stages
                            init_scores(acc_s, qb, start + j)
                            T.barrier_wait(k_full[s], (k_step // stages) & 1)
                            T.gemm(Q_shared[i % 2, :, :], K_shared[s, :, :], acc_s,
                                   transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                            T.barrier_arrive(k_empty[s])
                            softmax(acc_s, row_max, row_max_prev, row_rescale, row_sum, row_denom)
                            for r, c in T.Parallel(block_m, dim):
                                acc_o[r, c] *= row_rescale[r]
                            T.copy(acc_s, acc_p)
                            T.barrier_wait(v_full[s], (k_step // stages) & 1)
                            T.gemm(acc_p, V_shared[s, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                            T.barrier_arrive(v_empty[s])
                            k_step += 1
                    T.barrier_arrive(q_empty[i % 2])
                    if sinks:  # the sink joins the denominator (and lse), adds nothing to O
                        for r in T.Parallel(block_m):
                            row_denom[r] += T.exp2(Sinks[h] * LOG2E - row_max[r] * scale)
                    for r, c in T.Parallel(block_m, dim):
                        acc_o[r, c] /= row_denom[r]
                    if stage_o:  # through shared memory, stored by TMA in whole rows
                        T.copy(acc_o, O_shared)
                        T.copy(O_shared, O[b, qb * block_m:(qb + 1) * block_m, h, :])
                    else:
                        T.copy(acc_o, O[b, qb * block_m:(qb + 1) * block_m, h, :])
                    for r in T.Parallel(block_m):
                        lse[b, h, qb * block_m + r] = T.log2(row_denom[r]) + row_max[r] * scale

    return fwd


if __name__ == "__main__":
    os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind": "cuda", "arch": "sm_90a"}')
    dynamic = os.environ.get("DYNAMIC") == "1"
    args = dict(batch=None if dynamic else 4, heads=16, kv_heads=16,
                seq_len=None if dynamic else 4096, dim=64, causal=True, dtype="float16",
                overlap=os.environ.get("OVERLAP") == "1", stage_o=os.environ.get("STAGE_O") == "1")
    kernel = tilelang.compile(persistent_fwd(**args), out_idx=None)
    source = kernel.get_kernel_source()
    out = os.environ.get("OUT_CU", "/tmp/persistent_fwd.cu")
    open(out, "w").write(source)
    print(f"lowered and compiled ({len(source)} chars of CUDA in {out})")
