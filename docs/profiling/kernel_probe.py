"""What the tiling probes share: building many kernels at once in threads (TileLang's lowering
runs mostly outside the GIL and each nvcc is a subprocess), and timing one kernel alone."""
from concurrent.futures import ThreadPoolExecutor

import tilelang
import torch


def compile_one(factory, prim, entry_point):
    """factory's kernel for prim as entry_point(compiled), or the reason it did not build."""
    try:
        return entry_point(tilelang.compile(prim, out_idx=factory.out_idx,
                                            execution_backend=factory.execution_backend,
                                            target=factory.target, pass_configs=factory.pass_configs))
    except Exception as exc:  # reported by the caller; the other tilings still run
        last = str(exc).splitlines()[-1][:160] if str(exc) else ""
        return f"{type(exc).__name__}: {last}"


def compile_all(jobs, entry_point, threads=16):
    """{key: (factory, prim_func)} -> {key: entry point or error string}."""
    with ThreadPoolExecutor(threads) as pool:
        return dict(zip(jobs, pool.map(lambda j: compile_one(*j, entry_point), jobs.values())))


def ms(fn, reps=20, batches=5):
    """Median ms per call over batches of reps back-to-back calls (CUDA events)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return sorted(times)[len(times) // 2]
