"""A prototype rmsnorm backward whose rows arrive by asynchronous copies (not used by the
package): the shipped backward loads each row's x and dy with plain loads inside its first pass,
one row at a time per block, so at most one or two rows per SM are in flight (run 40: 52-65% of
the copy bandwidth, latency-bound; 62-73% at the tilings of run 42). Here the block's rows are
a pipeline: row s + 1's x and dy are copied into shared memory (TMA or cp.async, as TileLang
lowers a T.copy in a T.Pipelined loop) while row s is reduced and written. The math is the
package's: dot = sum(w * dy * x), dx = rstd * (w * dy - x * rstd^2 * dot / C), the block's dw
sums in shared memory, one atomic add per channel at the end.

Same signature and buffers as the package's rmsnorm_bwd with save_rstd and atomic dw, plus
num_stages; two builds of it (below). Both compile for sm_90a on the CPU (`python
docs/profiling/rmsnorm_bwd_pipelined.py`); not yet run (next_gpu_run.sh)."""
import os
import sys

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilelang
import tilelang.language as T

from rmsnorm_bwd_rows import ACCUM, weight_and_dw_macros


def pipelined_bwd(cols, dtype, w_dtype, eps, block_rows, block_channels, threads, num_stages=2):
    rows = T.dynamic("rows")
    shape = [rows, cols]
    chunks = -(-cols // block_channels)
    width = chunks * block_channels
    inv_cols = 1.0 / cols
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
            x_row = T.alloc_shared([1, cols], dtype)
            dy_row = T.alloc_shared([1, cols], dtype)
            w = T.alloc_shared([width], ACCUM)
            dw_sums = T.alloc_shared([width], ACCUM)
            dots = T.alloc_fragment([1, block_channels], ACCUM)
            dot = T.alloc_fragment([1], ACCUM)
            load_w(W, w, dw_sums)
            for s in T.Pipelined(T.min(block_rows, rows - bx * block_rows), num_stages=num_stages):
                r = bx * block_rows + s
                T.copy(X[r : r + 1, 0:cols], x_row)
                T.copy(dY[r : r + 1, 0:cols], dy_row)
                T.clear(dots)
                for k in T.serial(chunks):
                    for i, j in T.Parallel(1, block_channels):
                        c = k * block_channels + j
                        if c < cols:
                            dots[i, j] += w[c] * T.cast(dy_row[0, c], ACCUM) * T.cast(x_row[0, c], ACCUM)
                T.reduce_sum(dots, dot, dim=1)
                for k in T.serial(chunks):
                    for i, j in T.Parallel(1, block_channels):
                        c = k * block_channels + j
                        if c < cols:
                            rstd = Rstd[r]
                            x = T.cast(x_row[0, c], ACCUM)
                            dy = T.cast(dy_row[0, c], ACCUM)
                            dX[r, c] = T.cast(rstd * (w[c] * dy - x * (rstd * rstd * dot[0] * inv_cols)), dtype)
                            dw_sums[c] += dy * x * rstd
            add_dw(dW, dw_sums)

    return bwd


FAST_MATH = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}
# TileLang warp-specializes the pipeline: a producer warpgroup issues one bulk copy per row and
# tensor, and the consumers get 240 registers each, so one block fills an SM's register file.
rmsnorm_bwd_pipelined = tilelang.jit(pass_configs=FAST_MATH)(pipelined_bwd)
# Without warp specialization every thread copies (cp.async) and computes, at the registers it
# needs: several blocks per SM, each with num_stages rows in flight (small C wants this). It
# lowers at num_stages=2 only (3: "Downcast from tirx.Sub to ir.IntImm failed").
rmsnorm_bwd_pipelined_shared = tilelang.jit(pass_configs={
    **FAST_MATH, tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True,
    tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True})(pipelined_bwd)


if __name__ == "__main__":  # compile one for sm_90a and keep its CUDA (a CPU check)
    cols = int(os.environ.get("COLS", 8192))
    for factory in (rmsnorm_bwd_pipelined, rmsnorm_bwd_pipelined_shared):
        source = factory(cols, "bfloat16", "bfloat16", 1e-6, 16, 1024, 256, 2).get_kernel_source()
        open(f"/tmp/rmsnorm_bwd_pipelined_{source.count('cp_async') > 0}_{cols}.cu", "w").write(source)
        print(f"compiled: {source.count('tma_load')} TMA loads, {source.count('cp_async')} cp.async, "
              f"{source.count('reg_alloc')} register reallocations in the CUDA")
