"""A prototype of the attention backward's dQ postprocess with 16-byte loads and stores (not used
by the packages).

The package's postprocess walks dQ in its logical order: each thread reads single floats from
the fp32 accumulator, which the bwd kernel's atomics lay out in its GEMM fragments' 8x8 order
(`_dq_layout`), so a warp's 4-byte loads touch half of each 32-byte sector, and it writes one
2-byte element a thread. Run 205 (H100): 91 us at MHA B4 H16 S4096 D128 against cuDNN's
`convert_dq_to_16bits` 73.5 us, ~2.1 TB/s of the 2.9 a copy moves.

Here each thread takes 8 consecutive columns of one row at a time: in the fragment order those
are two runs of 4 floats (columns d, d+2, d+4, d+6 and d+1, d+3, d+5, d+7), two 16-byte loads;
it interleaves them, scales, casts and stores the 8 as one 16-byte store. Consecutive threads take
consecutive rows of an 8-row group, then the next 8 columns, so a warp reads 1 KB in one run.
Direct dK/dV (the postprocess casts dQ only), the non-bulk layout, bshd.
"""
import os
import sys

sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T

from generated.attention.kernels import ACCUM, _dq_layout, _indexers, _shape, padded_dim, runtime_dims


# Without TileLang's safe-memory pass: it guards each load against the accumulator's symbolic
# padded rows (a row < seq_len is always within them), and a guarded load is not vectorized.
@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_DISABLE_SAFE_MEMORY_ACCESS: True})
def postprocess_vec(heads, dim, dtype, softmax_scale, block_m, threads):
    batch, seq_len = runtime_dims()
    layout = "bshd"
    shape = _shape(layout, batch, heads, seq_len, dim)
    dq_shape = _shape(layout, batch, heads, padded_dim(), dim)
    _, elem, index = _indexers(layout)
    groups8 = dim // 8
    items = block_m * groups8  # (row, 8 columns) a block
    assert items % threads == 0

    @T.prim_func
    def bwd_postprocess(dQ: T.Tensor(dq_shape, ACCUM), dQ_out: T.Tensor(shape, dtype)):
        with T.Kernel(T.ceildiv(seq_len, block_m), heads, batch, threads=threads) as (bx, by, bz):
            T.annotate_layout({dQ: _dq_layout(layout, dQ, False)})
            tx = T.get_thread_binding()
            raw = T.alloc_local([8], ACCUM)  # the two runs as they lie: column 2v + p at 4p + v
            vals = T.alloc_local([8], ACCUM)  # in column order
            for it in T.unroll(items // threads):
                q = it * threads + tx
                # Row within an 8-row group fastest, then the 8-column group, then the row group.
                row = bx * block_m + (q // (8 * groups8)) * 8 + q % 8
                col = (q // 8) % groups8 * 8
                if row < seq_len:
                    for p in T.unroll(2):
                        for v in T.vectorized(4):
                            raw[4 * p + v] = elem(dQ, bz, by, row, col + 2 * v + p)
                    for t in T.unroll(8):
                        vals[t] = raw[4 * (t % 2) + t // 2]
                    for t in T.vectorized(8):
                        dQ_out[bz, row, by, col + t] = T.cast(vals[t] * softmax_scale, dtype)

    return bwd_postprocess
