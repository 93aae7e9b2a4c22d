"""A prototype rmsnorm backward with `rows_in_flight` rows per step (not used by the package):
the shipped one walks its block's rows one at a time, a block-wide reduction per row, which run
40 found latency-bound (52-65% of the copy bandwidth; 0.48 waves at 4096 rows). Here each step
loads a [rows_in_flight, block_channels] chunk, so several rows' loads and reductions are in
flight at once; dw's per-block sums take the chunk's column sums (a reduction over its rows).
Same signature and buffers as the package's rmsnorm_bwd plus rows_in_flight (block_rows a
multiple of it); atomic dw, saved rstd only. Run 42: correct, but slower than the best plain
tiling at every shape (1983-2900 GB/s vs 2629-3121), so the package keeps its backward."""
import os
import sys

sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T

ACCUM = "float32"


def weight_and_dw_macros(cols, block_channels):
    """The backward prototypes' first and last loops: w (fp32, 0 past cols) into shared memory
    with the block's dw sums cleared, and the block's one atomic add of its sums per channel."""
    chunks = -(-cols // block_channels)

    @T.macro
    def load_w(W, w, dw_sums):
        for k in T.serial(chunks):
            for j in T.Parallel(block_channels):
                c = k * block_channels + j
                w[c] = T.if_then_else(c < cols, T.cast(W[c], ACCUM), 0)
                dw_sums[c] = 0

    @T.macro
    def add_dw(dW, dw_sums):
        for k in T.serial(chunks):
            for j in T.Parallel(block_channels):
                c = k * block_channels + j
                if c < cols:
                    T.atomic_add(dW[c], dw_sums[c])

    return load_w, add_dw


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def rmsnorm_bwd_rows(cols, dtype, w_dtype, eps, block_rows, block_channels, threads, rows_in_flight):
    rows = T.dynamic("rows")
    shape = [rows, cols]
    chunks = -(-cols // block_channels)
    width = chunks * block_channels
    inv_cols = 1.0 / cols
    group = rows_in_flight
    load_w, add_dw = weight_and_dw_macros(cols, block_channels)

    @T.prim_func
    def bwd(
        X: T.Tensor(shape, dtype),
        Rstd: T.Tensor([rows], ACCUM),
        W: T.Tensor([cols], w_dtype),
        dY: T.Tensor(shape, dtype),
        dX: T.Tensor(shape, dtype),
        dW: T.Tensor([cols], ACCUM),
    ):
        with T.Kernel(T.ceildiv(rows, block_rows), threads=threads) as bx:
            x_rows = T.alloc_shared([group, width], dtype)
            dy_rows = T.alloc_shared([group, width], dtype)
            w = T.alloc_shared([width], ACCUM)
            dw_sums = T.alloc_shared([width], ACCUM)
            dot_rows = T.alloc_shared([group], ACCUM)  # row sums read back from shared memory
            rstd_rows = T.alloc_shared([group], ACCUM)
            dots = T.alloc_fragment([group, block_channels], ACCUM)
            dot = T.alloc_fragment([group], ACCUM)
            terms = T.alloc_fragment([group, block_channels], ACCUM)
            column = T.alloc_fragment([block_channels], ACCUM)
            load_w(W, w, dw_sums)
            for g in T.serial(block_rows // group):
                r0 = bx * block_rows + g * group
                T.clear(dots)
                for k in T.serial(chunks):
                    for i, j in T.Parallel(group, block_channels):
                        r = r0 + i
                        c = k * block_channels + j
                        # Rows past `rows` and tail channels load 0: they add nothing.
                        x = T.if_then_else(T.And(r < rows, c < cols), X[r, c], T.cast(0, dtype))
                        dy = T.if_then_else(T.And(r < rows, c < cols), dY[r, c], T.cast(0, dtype))
                        x_rows[i, c] = x
                        dy_rows[i, c] = dy
                        dots[i, j] += w[c] * T.cast(dy, ACCUM) * T.cast(x, ACCUM)
                T.reduce_sum(dots, dot, dim=1)
                T.copy(dot, dot_rows)
                for i in T.Parallel(group):
                    rstd_rows[i] = T.if_then_else(r0 + i < rows, Rstd[r0 + i], 0)
                for k in T.serial(chunks):
                    for i, j in T.Parallel(group, block_channels):
                        r = r0 + i
                        c = k * block_channels + j
                        rstd = rstd_rows[i]
                        x = T.cast(x_rows[i, c], ACCUM)
                        dy = T.cast(dy_rows[i, c], ACCUM)
                        if T.And(r < rows, c < cols):
                            dX[r, c] = T.cast(
                                rstd * (w[c] * dy - x * (rstd * rstd * dot_rows[i] * inv_cols)), dtype
                            )
                        terms[i, j] = dy * x * rstd  # 0 for the rows and channels loaded as 0
                    T.reduce_sum(terms, column, dim=0)
                    for j in T.Parallel(block_channels):
                        dw_sums[k * block_channels + j] += column[j]
            add_dw(dW, dw_sums)

    return bwd
