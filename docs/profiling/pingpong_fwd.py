"""A forward whose two consumer warpgroups take turns at the tensor cores (a probe, not used by
any package): while one warpgroup runs its softmax, the other's GEMMs run.

The shipped forward (generated/attention, overlap=True) splits each 128-row query block over two
consumer warpgroups that TileLang's warp-specialization pass schedules together: both issue their
GEMMs at the same time and both do their softmax at the same time, so the tensor pipe idles
through the softmax unless one warpgroup's own PV GEMM covers it (run 154: the causal forward's
tensor pipe 56% busy, the full one's 66%). Here the warp specialization is written out: one
producer warp loads Q once and K, V per key block by TMA into two stages; consumer warpgroup w
owns query rows 64 w .. 64 w + 63 and, before it issues a key block's GEMMs, waits on named
barrier 1 + w, which the other warpgroup arrives at once it has issued its own. So the GEMMs of
the two alternate and each softmax overlaps the other's GEMMs. Within a warpgroup, block k's
scores GEMM and block k - 1's PV GEMM are issued together, and the softmax of block k runs
while PV is in flight (the shipped overlap).

Scope of the probe: MHA and GQA, layout bshd, full or causal, no window or sinks, block 128 x
128, two K/V stages, D64 or D128. O and lse are the shipped forward's (lse in the log2 domain
over padded_rows rows), so the shipped backward can take them.

    python docs/profiling/pingpong_fwd.py lower      # CPU: lower and nvcc-compile for sm_90a
    python docs/profiling/pingpong_fwd.py            # GPU: check against the shipped forward
                                                     # and time both (MHA fp16 B4 H16 S4096 D128,
                                                     # full and causal; GQA bf16 B2 32/8)
"""
import os
import sys

os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind":"cuda","arch":"sm_90a"}')
sys.path.insert(0, os.getcwd())
import tilelang
import tilelang.language as T
from tilelang.layout import make_swizzled_layout

from generated.attention.kernels import ACCUM, LOG2E, NEG_INIT, launch_block, launch_grid, padded_dim, runtime_dims

HALF = 64  # query rows of one consumer warpgroup
BLOCK_M = 2 * HALF
BLOCK_N = 128
STAGES = 2
CONSUMERS = 256  # threads of the two consumer warpgroups; the producer warpgroup follows
PASS_CONFIGS = {
    tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
    # Every shared-memory hand-off below is ordered by mbarriers or named barriers.
    tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True,
}


@tilelang.jit(pass_configs=PASS_CONFIGS)
def fwd_pingpong(heads, kv_heads, dim, causal, dtype, softmax_scale):
    batch, seq_len = runtime_dims()
    scale = softmax_scale * LOG2E
    groups = heads // kv_heads
    q_shape = [batch, seq_len, heads, dim]
    kv_shape = [batch, seq_len, kv_heads, dim]
    grid = launch_grid(causal, T.ceildiv(seq_len, BLOCK_M), heads)

    @T.macro
    def softmax_step(acc_s, row_max, row_max_prev, row_rescale, row_sum, row_denom,
                     q_first, k, masked):
        """Block k's scores -> P (in acc_s), the running max and the rescale of the rows'
        earlier sums and outputs (row_rescale, applied to O by the caller)."""
        if masked:
            for i, j in T.Parallel(HALF, BLOCK_N):
                key = k * BLOCK_N + j
                seen = key < seq_len and (not causal or key <= q_first + i)
                acc_s[i, j] = T.if_then_else(seen, acc_s[i, j], -T.infinity(ACCUM))
        T.copy(row_max, row_max_prev)
        T.reduce_max(acc_s, row_max, dim=1, clear=False)
        for i in T.Parallel(HALF):
            row_rescale[i] = T.exp2((row_max_prev[i] - row_max[i]) * scale)
        for i, j in T.Parallel(HALF, BLOCK_N):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - row_max[i] * scale)
        T.reduce_sum(acc_s, row_sum, dim=1)
        for i in T.Parallel(HALF):
            row_denom[i] = row_denom[i] * row_rescale[i] + row_sum[i]

    @T.macro
    def pass_turn(w, other, k, n_blocks):
        """The other warpgroup's turn at the tensor cores. Warpgroup 0 waits n_blocks times and
        warpgroup 1 let it go first once, so warpgroup 1 passes no turn after its last block's
        GEMMs (a named barrier left with arrivals nobody waits for)."""
        if w == 0:
            T.named_barrier_arrive(other, CONSUMERS)
        elif k < n_blocks - 1:
            T.named_barrier_arrive(other, CONSUMERS)

    @T.macro
    def consumer(w, Q_shared, K_shared, V_shared, k_ready, k_free, v_ready, v_free, q_ready,
                 O, lse, bx, h, bz, n_blocks):
        T.set_max_nreg(240, 1)
        mine, other = 1 + w, 2 - w  # named barriers: wait on mine, arrive at the other's
        q_first = bx * BLOCK_M + w * HALF
        acc_s = T.alloc_fragment([HALF, BLOCK_N], ACCUM)
        acc_s_cast = T.alloc_fragment([HALF, BLOCK_N], dtype)
        acc_o = T.alloc_fragment([HALF, dim], ACCUM)
        row_max = T.alloc_fragment([HALF], ACCUM)
        row_max_prev = T.alloc_fragment([HALF], ACCUM)
        row_rescale = T.alloc_fragment([HALF], ACCUM)
        row_sum = T.alloc_fragment([HALF], ACCUM)
        row_denom = T.alloc_fragment([HALF], ACCUM)
        T.fill(acc_o, 0)
        T.fill(row_denom, 0)
        T.fill(row_max, NEG_INIT)
        if w == 1:
            T.named_barrier_arrive(1, CONSUMERS)  # warpgroup 0 goes first
        T.mbarrier_wait_parity(q_ready, 0)
        # Key block 0: its scores alone.
        T.sync_threads(mine, CONSUMERS)
        T.mbarrier_wait_parity(k_ready[0], 0)
        T.wgmma_gemm(Q_shared[w, :, :], K_shared[0, :, :], acc_s, transpose_B=True,
                     policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
        pass_turn(w, other, 0, n_blocks)
        T.wait_wgmma(0)
        T.mbarrier_arrive(k_free[0])
        softmax_step(acc_s, row_max, row_max_prev, row_rescale, row_sum, row_denom, q_first, 0,
                     n_blocks == 1)
        T.copy(acc_s, acc_s_cast)
        # Key block k's scores with block k - 1's PV in flight.
        for k in T.serial(1, n_blocks):
            stage, last = k % STAGES, (k - 1) % STAGES
            # O rescaled before any GEMM is issued: a register a WGMMA reads, written between
            # two WGMMA issues, makes ptxas serialize them (C7513).
            for i, j in T.Parallel(HALF, dim):
                acc_o[i, j] *= row_rescale[i]
            T.sync_threads(mine, CONSUMERS)
            T.mbarrier_wait_parity(k_ready[stage], (k // STAGES) % 2)
            # Both tiles waited for before either GEMM is issued: a barrier's wait loop between
            # the two issues serializes them too (C7513).
            T.mbarrier_wait_parity(v_ready[last], ((k - 1) // STAGES) % 2)
            T.wgmma_gemm(Q_shared[w, :, :], K_shared[stage, :, :], acc_s, transpose_B=True,
                         policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
            T.wgmma_gemm(acc_s_cast, V_shared[last, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
            pass_turn(w, other, k, n_blocks)
            T.wait_wgmma(1)  # the scores; PV may still run
            T.mbarrier_arrive(k_free[stage])
            softmax_step(acc_s, row_max, row_max_prev, row_rescale, row_sum, row_denom, q_first,
                         k, k == n_blocks - 1)
            T.wait_wgmma(0)
            T.mbarrier_arrive(v_free[last])
            # P's cast only now: the registers it writes are the PV GEMM's operand until then.
            T.copy(acc_s, acc_s_cast)
        # The last block's PV.
        last = (n_blocks - 1) % STAGES
        for i, j in T.Parallel(HALF, dim):
            acc_o[i, j] *= row_rescale[i]
        T.mbarrier_wait_parity(v_ready[last], ((n_blocks - 1) // STAGES) % 2)
        T.wgmma_gemm(acc_s_cast, V_shared[last, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
        T.wait_wgmma(0)
        T.mbarrier_arrive(v_free[last])
        for i, j in T.Parallel(HALF, dim):
            acc_o[i, j] /= row_denom[i]
        T.copy(acc_o, O[bz, q_first : q_first + HALF, h, :])
        for i in T.Parallel(HALF):
            lse[bz, h, q_first + i] = T.log2(row_denom[i]) + row_max[i] * scale

    @T.prim_func
    def fwd(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        O: T.Tensor(q_shape, dtype),
        lse: T.Tensor([batch, heads, padded_dim()], ACCUM),
    ):
        with T.Kernel(grid[0], grid[1], batch, threads=CONSUMERS + 128) as (launch_x, launch_y, bz):
            launch_q, h = launch_block(causal, launch_x, launch_y)
            # Causal: the longest query blocks (the last ones) launch first.
            bx = T.ceildiv(seq_len, BLOCK_M) - 1 - launch_q if causal else launch_q
            Q_shared = T.alloc_shared([2, HALF, dim], dtype)
            K_shared = T.alloc_shared([STAGES, BLOCK_N, dim], dtype)
            V_shared = T.alloc_shared([STAGES, BLOCK_N, dim], dtype)
            T.annotate_layout({
                Q_shared: make_swizzled_layout(Q_shared),
                K_shared: make_swizzled_layout(K_shared),
                V_shared: make_swizzled_layout(V_shared),
            })
            q_ready = T.alloc_barrier(32)
            k_ready = T.alloc_barrier([32] * STAGES)
            v_ready = T.alloc_barrier([32] * STAGES)
            k_free = T.alloc_barrier([CONSUMERS] * STAGES)
            v_free = T.alloc_barrier([CONSUMERS] * STAGES)
            all_blocks = T.ceildiv(seq_len, BLOCK_N)
            n_blocks = T.min(bx + 1, all_blocks) if causal else all_blocks
            kv_head = h // groups
            tx = T.get_thread_binding()
            if tx >= CONSUMERS:
                T.set_max_nreg(24, 0)
            if tx >= CONSUMERS and tx < CONSUMERS + 32:  # one producer warp
                for w in T.serial(2):
                    T.tma_copy(Q[bz, bx * BLOCK_M + w * HALF : bx * BLOCK_M + (w + 1) * HALF, h, :],
                               Q_shared[w, :, :], barrier=q_ready)
                T.mbarrier_arrive(q_ready)
                for k in T.serial(n_blocks):
                    stage = k % STAGES
                    T.mbarrier_wait_parity(k_free[stage], ((k // STAGES) % 2) ^ 1)
                    T.tma_copy(K[bz, k * BLOCK_N : (k + 1) * BLOCK_N, kv_head, :], K_shared[stage, :, :],
                               barrier=k_ready[stage])
                    T.mbarrier_arrive(k_ready[stage])
                    T.mbarrier_wait_parity(v_free[stage], ((k // STAGES) % 2) ^ 1)
                    T.tma_copy(V[bz, k * BLOCK_N : (k + 1) * BLOCK_N, kv_head, :], V_shared[stage, :, :],
                               barrier=v_ready[stage])
                    T.mbarrier_arrive(v_ready[stage])
            with T.ws(0):
                consumer(0, Q_shared, K_shared, V_shared, k_ready, k_free, v_ready, v_free, q_ready,
                         O, lse, bx, h, bz, n_blocks)
            with T.ws(1):
                consumer(1, Q_shared, K_shared, V_shared, k_ready, k_free, v_ready, v_free, q_ready,
                         O, lse, bx, h, bz, n_blocks)

    return fwd


CASES = [  # (name, batch, heads, kv_heads, seq_len, dim, causal, dtype)
    ("MHA fp16 D128 full", 4, 16, 16, 4096, 128, False, "float16"),
    ("MHA fp16 D128 causal", 4, 16, 16, 4096, 128, True, "float16"),
    ("GQA bf16 D128 causal", 2, 32, 8, 4096, 128, True, "bfloat16"),
    ("GQA bf16 D128 full", 2, 32, 8, 4096, 128, False, "bfloat16"),
    ("MHA fp16 D64 full", 8, 16, 16, 2048, 64, False, "float16"),
]


def lower_all():
    """Lower every case's kernel for sm_90a and compile its CUDA with nvcc (CPU)."""
    import subprocess
    import tempfile

    from tvm import transform
    from tvm.target import Target

    target = {"kind": "cuda", "arch": "sm_90a"}
    for name, _, heads, kv_heads, _, dim, causal, dtype in CASES:
        func = fwd_pingpong.get_tir(heads, kv_heads, dim, causal, dtype, dim ** -0.5)
        with transform.PassContext(opt_level=3, config=fwd_pingpong.pass_configs), Target(target):
            source = tilelang.lower(func, target=target).kernel_source
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.cu")
            with open(path, "w") as f:
                f.write(source)
            root = os.path.dirname(tilelang.__file__)
            includes = [f"-I{root}/src", f"-I{root}/3rdparty/cutlass/include"]
            result = subprocess.run(
                ["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", "-o",
                 os.path.join(tmp, "k.cubin"), "--ptxas-options=--verbose", "-std=c++17",
                 "-DNDEBUG", "--use_fast_math", *includes, path],
                capture_output=True, text=True)
        text = result.stdout + result.stderr
        notes = [line for line in text.splitlines() if "registers" in line or "C75" in line]
        print(f"{name}: nvcc rc={result.returncode}", *notes[-3:], sep="\n  ")
        if result.returncode:
            print(text[-3000:])


def check_and_time():
    """On the GPU: O and lse against the shipped forward, then both timed in turn."""
    import importlib

    import torch
    import triton.testing

    for name, b, h, kv, s, d, causal, dtype in CASES:
        package = "attention" if h == kv else "gqa"  # each with its own tuned tilings
        shipped = importlib.import_module(f"generated.{package}.kernels")
        torch.manual_seed(0)
        tdtype = getattr(torch, dtype)
        q = torch.randn(b, s, h, d, device="cuda", dtype=tdtype)
        k, v = (torch.randn(b, s, kv, d, device="cuda", dtype=tdtype) for _ in range(2))
        padded = shipped.padded_rows(s)
        scale = d ** -0.5
        ours = fwd_pingpong(h, kv, d, causal, dtype, scale)
        tiling = shipped.tuned_tiling(shipped.FWD_TILINGS, shipped.FWD_TILING, d, causal, 0)
        theirs = getattr(shipped, f"{package}_fwd")(h, kv, d, causal, 0, "bshd", dtype, scale, **tiling)
        kernels = {"pingpong": ours, "shipped": theirs}
        outputs = {label: (torch.empty_like(q), torch.empty(b, h, padded, device="cuda", dtype=torch.float32))
                   for label in kernels}
        for label, kernel in kernels.items():
            kernel(q, k, v, *outputs[label])
        times = {label: [] for label in kernels}
        for _ in range(3):  # rounds taken in turn
            for label, kernel in kernels.items():
                times[label].append(triton.testing.do_bench(
                    lambda: kernel(q, k, v, *outputs[label]), warmup=50, rep=200))
        (o, lse), (o_ref, lse_ref) = outputs["pingpong"], outputs["shipped"]
        o_err = (o.float() - o_ref.float()).abs().max().item()
        lse_err = (lse[:, :, :s] - lse_ref[:, :, :s]).abs().max().item()
        pairs = s * s * (0.5 if causal else 1.0)
        tf = lambda ms: 4 * b * h * d * pairs / ms / 1e9
        rows = ", ".join(f"{label} " + " / ".join(f"{t:.3f}" for t in ms) + f" ({tf(min(ms)):.0f} TF/s)"
                         for label, ms in times.items())
        print(f"{name}: max O diff {o_err:.2e}, lse diff {lse_err:.2e}; ms {rows}")


if __name__ == "__main__":
    lower_all() if sys.argv[1:] == ["lower"] else check_and_time()
