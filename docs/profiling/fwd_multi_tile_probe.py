"""Probe: the sliding-window forward of generated/attention_sink with several query heads of one
KV group per block, one after another (an outer serial loop around the key loop), so a block's
prologue (Q and first K/V loads) and epilogue (O and lse stores) of one head overlap the next
head's loads instead of each short block paying them alone. At window 128 a block of 128 queries
runs only two key steps and the kernel is latency-bound (ncu, run 62: one 384-thread block per SM,
168 registers, 64% of cycles with no eligible warp).

`python docs/profiling/fwd_multi_tile_probe.py` on the GPU: correctness against the committed
kernel, then kernel TF/s at the gpt-oss shape; without a GPU (TILELANG_DEFAULT_TARGET set) it
only lowers and compiles the kernels."""
import os, sys, time
sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T
from generated.attention_sink import kernels as K

LOG2E, ACCUM, NEG_INIT = K.LOG2E, K.ACCUM, K.NEG_INIT


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})
def fwd_multi(heads, kv_heads, dim, window, dtype, softmax_scale, block_m, block_n, threads, num_stages, per_block):
    batch, seq_len = K.runtime_dims()
    scale = softmax_scale * LOG2E
    groups = heads // kv_heads
    q_shape = K._shape("bshd", batch, heads, seq_len, dim)
    kv_shape = K._shape("bshd", batch, kv_heads, seq_len, dim)
    rows, _ = K._indexers("bshd")
    visible = K._visibility(seq_len, True, window)
    needs_mask = K._needs_mask(seq_len, True, window)

    @T.prim_func
    def fwd(
        Q: K._input(q_shape, dtype, "q"),
        Kt: K._input(kv_shape, dtype, "k"),
        V: K._input(kv_shape, dtype, "v"),
        Sinks: T.Tensor([heads], ACCUM),
        O: T.Tensor(q_shape, dtype),
        lse: T.Tensor([batch, heads, K.padded_dim()], ACCUM),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_m), heads // per_block, batch, threads=threads) as (bx, by, bz):
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
            loop_end = T.min(T.ceildiv((bx + 1) * block_m, block_n), T.ceildiv(seq_len, block_n))
            loop_start = T.max(T.floordiv(bx * block_m - window + 1, block_n), 0)
            n = loop_end - loop_start
            # One pipeline over every (head, key block) step of this block's heads: the loads of
            # the next head's first key block run during this head's epilogue.
            for step in T.Pipelined(per_block * n, num_stages=num_stages):
                h = by * per_block + step // n
                k = loop_start + step % n
                T.copy(rows(Q, bz, h, bx * block_m, block_m), Q_shared)
                T.copy(rows(Kt, bz, h // groups, k * block_n, block_n), K_shared)
                if step % n == 0:
                    T.fill(acc_o, 0)
                    T.fill(row_denom, 0)
                    T.fill(row_max, NEG_INIT)
                if needs_mask(bx * block_m, block_m, k * block_n, block_n):
                    for i, j in T.Parallel(block_m, block_n):
                        acc_s[i, j] = T.if_then_else(visible(bx * block_m + i, k * block_n + j), 0, -T.infinity(ACCUM))
                else:
                    T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(rows(V, bz, h // groups, k * block_n, block_n), V_shared)
                T.copy(row_max, row_max_prev)
                T.reduce_max(acc_s, row_max, dim=1, clear=False)
                for i in T.Parallel(block_m):
                    row_max[i] = T.max(row_max[i], row_max_prev[i])
                for i in T.Parallel(block_m):
                    row_rescale[i] = T.exp2((row_max_prev[i] - row_max[i]) * scale)
                for i, j in T.Parallel(block_m, dim):
                    acc_o[i, j] *= row_rescale[i]
                for i, j in T.Parallel(block_m, block_n):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - row_max[i] * scale)
                T.copy(acc_s, acc_s_cast)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
                T.reduce_sum(acc_s, row_sum, dim=1)
                for i in T.Parallel(block_m):
                    row_denom[i] = row_denom[i] * row_rescale[i] + row_sum[i]
                if step % n == n - 1:
                    for i in T.Parallel(block_m):
                        row_denom[i] += T.exp2(Sinks[h] * LOG2E - row_max[i] * scale)
                    for i, j in T.Parallel(block_m, dim):
                        acc_o[i, j] /= row_denom[i]
                    T.copy(acc_o, rows(O, bz, h, bx * block_m, block_m))
                    for i in T.Parallel(block_m):
                        row_denom[i] = T.log2(row_denom[i]) + row_max[i] * scale
                    T.copy(row_denom, lse[bz, h, bx * block_m : (bx + 1) * block_m])

    return fwd


# block_m, block_n, threads, num_stages, per_block
CONFIGS = {
    "128x64 s2 x2": (128, 64, 256, 2, 2),
    "128x64 s2 x4": (128, 64, 256, 2, 4),
    "128x64 s2 x8": (128, 64, 256, 2, 8),
    "128x128 s2 x2": (128, 128, 256, 2, 2),
    "128x128 s2 x4": (128, 128, 256, 2, 4),
    "128x128 s2 x8": (128, 128, 256, 2, 8),
    "128x128 s1 x4": (128, 128, 256, 1, 4),
    "128x64 s2 x1": (128, 64, 256, 2, 1),
}
if os.environ.get("CONFIGS"):
    CONFIGS = {k: v for k, v in CONFIGS.items() if k in os.environ["CONFIGS"].split(",")}
SHAPES = [(1, 64, 8, 4096, 64, 128), (1, 64, 8, 16384, 64, 128), (2, 32, 8, 4096, 128, 128), (1, 64, 8, 4096, 64, 512)]
ODD = [(1, 64, 8, 1000, 64, 128), (2, 16, 2, 333, 64, 128), (1, 32, 8, 777, 128, 128), (1, 16, 2, 77, 64, 100)]
DT = "bfloat16"

if __name__ == "__main__":
    from concurrent.futures import ThreadPoolExecutor
    T0 = time.perf_counter()
    variants = sorted({(h, kv, d, w) for _, h, kv, _, d, w in SHAPES + ODD})
    jobs = {(name, *v): (v[0], v[1], v[2], v[3], DT, v[2] ** -0.5, *tiling)
            for name, tiling in CONFIGS.items() for v in variants}

    def build(args):
        try:
            return fwd_multi(*args)
        except Exception as exc:
            return f"{type(exc).__name__}: {str(exc).splitlines()[-1][:300]}"

    with ThreadPoolExecutor(16) as pool:
        built = dict(zip(jobs, pool.map(build, jobs.values())))
    print(f"built {len(built)} kernels in {time.perf_counter() - T0:.0f} s", flush=True)
    for key, k in built.items():
        if isinstance(k, str):
            print("BUILD FAILED", key, k)
    import torch
    if not torch.cuda.is_available():
        sys.exit(0)
    from generated.attention_sink import autograd as A
    from generated.attention_sink import bench_attention_sink as B

    def committed(h, kv, d, w):
        return A.launcher(A.variant_calls(h, kv, d, True, w, "bshd", DT, d ** -0.5, *A.reductions(h, kv))["fwd"])

    def inputs(b, h, kv, s, d, seed=0):
        g = torch.Generator(device="cuda").manual_seed(seed)
        q, k, v = (torch.randn(b, s, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for n in (h, kv, kv))
        return q, k, v, torch.randn(h, device="cuda", generator=g)

    def launch(entry, q, k, v, sinks):
        b, s, h, d = q.shape
        o = torch.empty_like(q)
        lse = torch.empty(b, h, (s + 7) // 8 * 8, device="cuda")
        entry(q, k, v, sinks, o, lse)
        return o, lse

    bad = 0
    for b, h, kv, s, d, w in ODD + SHAPES[:1]:
        q, k, v, sinks = inputs(b, h, kv, s, d, 1)
        ref_o, ref_lse = launch(committed(h, kv, d, w), q, k, v, sinks)
        for name in CONFIGS:
            entry = built[(name, h, kv, d, w)]
            if isinstance(entry, str):
                continue
            o, lse = launch(entry, q, k, v, sinks)
            torch.cuda.synchronize()
            do = (o.float() - ref_o.float()).abs().max().item()
            dl = (lse[..., :s] - ref_lse[..., :s]).abs().max().item()
            ok = do < 2e-2 and dl < 1e-3 and torch.isfinite(o).all().item()
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {name:16s} B{b} H{h}/{kv} S{s} D{d} window {w}: O {do:.2e} lse {dl:.2e}", flush=True)
    print("all correct" if not bad else f"{bad} WRONG")
    print("| case | committed | " + " | ".join(CONFIGS) + " |")
    print("|---" * (2 + len(CONFIGS)) + "|")
    for b, h, kv, s, d, w in SHAPES:
        q, k, v, sinks = inputs(b, h, kv, s, d)
        flops = 4 * b * h * d * sum(min(i + 1, w) for i in range(s))
        row = []
        for entry in [committed(h, kv, d, w)] + [built[(n, h, kv, d, w)] for n in CONFIGS]:
            if isinstance(entry, str):
                row.append("failed"); continue
            o = torch.empty_like(q); lse = torch.empty(b, h, (s + 7) // 8 * 8, device="cuda")
            ms = B.stream_ms(lambda: entry(q, k, v, sinks, o, lse))
            row.append(f"{flops / ms / 1e9:.1f}")
        print(f"| B{b} H{h}/{kv} S{s} D{d} window {w} | " + " | ".join(row) + " |", flush=True)
    print(f"done in {time.perf_counter() - T0:.0f} s")
