"""Compile sweep behind opgen.families.attention.warpgroup_rows_fit: which block_m x block_n x
threads of the attention fwd and bwd kernels TileLang 0.1.15 lowers for sm_90a (CPU only, real
lowering and nvcc). Run from the repository root: python docs/compile-sweeps/attention_rows_threads.py
Output: one line per kernel instance, "ok", "layout" (layout inference conflict) or the error."""

import itertools
from pathlib import Path

from opgen.compile import compile_all
from opgen.plan import CompileJob

KERNELS = Path("generated/attention/kernels.py")


def fwd_args(dim):
    return (1, 2, 2, 333, dim, True, 0, "bshd", "float16")


def bwd_args(dim):
    return (*fwd_args(dim), "direct", "direct")


def jobs():
    for bm, bn, th in itertools.product([32, 64, 128, 256], [32, 64, 128], [128, 256, 512]):
        yield CompileJob("attention_fwd", fwd_args(64), dict(block_m=bm, block_n=bn, threads=th, num_stages=1),
                         f"fwd {bm} {bn} {th}")
    for bm, bn, th in itertools.product([32, 64, 128, 256], [16, 32, 64], [128, 256, 512]):
        yield CompileJob("attention_bwd", bwd_args(64), dict(block_m=bm, block_n=bn, threads=th, num_stages=2),
                         f"bwd {bm} {bn} {th}")


def main():
    work = [(None, KERNELS, job) for job in jobs()]
    for (_, _, job), r in zip(work, compile_all(work, workers=2)):
        kind = "ok" if r.ok else ("layout" if "Layout infer conflict" in r.error else r.error.splitlines()[0][:90])
        print(job.label, kind, r.smem_bytes, flush=True)


if __name__ == "__main__":
    main()
