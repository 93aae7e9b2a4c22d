"""The CPU side of static_vs_symbolic.py: the shipped attention fwd and bwd kernels (batch and
seq_len symbolic) against the same kernels compiled for one bench shape, by what ptxas makes of
them: registers, spills and SASS instructions (all, and those of the kind that cost in the main
loop: integer address arithmetic, predicates/branches, and the tensor-core and memory ones that
both must have). A kernel whose symbolic dims cost code shows it here; whether that code costs
time is the GPU run's answer.

    python docs/profiling/static_vs_symbolic_sass.py     # ~1 min on 2 cores
"""
import collections
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind":"cuda","arch":"sm_90a"}')
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from concurrent.futures import ThreadPoolExecutor

import tilelang

from ptxas_check import nvcc_cubin
from static_vs_symbolic import CASES, A, bench_calls, static_jobs

# The CPU machine's CUDA has no cuobjdump; triton's wheel carries one.
CUOBJDUMP = shutil.which("cuobjdump") or os.path.join(
    sysconfig.get_paths()["purelib"], "triton/backends/nvidia/bin/cuobjdump")

KINDS = {
    "wgmma": r"^HGMMA|^WGMMA",
    "global/tma memory": r"^(LDG|STG|RED|ATOM|UTMA|UBLKCP|UTMALDG|UTMASTG|UTMAREDG)",
    "shared memory": r"^(LDS|STS|LDSM|STSM)",
    "integer arithmetic": r"^(IMAD|IADD3|LEA|SHF|LOP3|IABS|IMNMX|VIMNMX|ISETP|SEL|I2F|F2I|IMUL)",
    "branch/barrier": r"^(BRA|BAR|SYNCS|BSSY|BSYNC|WARPSYNC|EXIT)",
}


def sass(kernel):
    """(registers, spill bytes, {opcode: count}) of a compiled kernel's CUDA, by nvcc and cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin, text = nvcc_cubin(kernel, tmp, "k")
        dump = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    ops = collections.Counter(m.group(1).split(".")[0]
                              for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", dump))
    return (max(map(int, re.findall(r"Used (\d+) registers", text))),
            sum(map(int, re.findall(r"(\d+) bytes spill stores", text))), ops)


def kind_counts(ops):
    """SASS instructions of each of KINDS in {opcode: count}, in KINDS' order."""
    return [sum(n for o, n in ops.items() if re.match(pattern, o)) for pattern in KINDS.values()]


def main():
    jobs = []
    for b, h, s, d, causal in CASES:
        calls = bench_calls(h, d, causal)
        static = static_jobs(calls, b, s)
        for phase in ("fwd", "bwd"):
            f, args, tiling = calls[phase]
            _, static_prim = static[A.kernel_key(f, args, tiling)]
            jobs.append(((b, h, s, d, causal, phase), f.get_tir(*args, **tiling), static_prim, f))

    def build(job):
        case, sym, sta, f = job
        compiled = [tilelang.compile(p, out_idx=f.out_idx, target=f.target, pass_configs=f.pass_configs)
                    for p in (sym, sta)]
        return case, [sass(k) for k in compiled]

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(build, jobs))
    print("| B | H | S | D | causal | kernel | registers sym / static | spills | SASS instructions sym / static | "
          + " | ".join(f"{k} sym / static" for k in KINDS) + " |")
    print("|" + "---|" * (9 + len(KINDS)))
    for case, ((reg0, sp0, ops0), (reg1, sp1, ops1)) in results:
        kinds = [f"{n0} / {n1}" for n0, n1 in zip(kind_counts(ops0), kind_counts(ops1))]
        print(f"| {' | '.join(map(str, case))} | {reg0} / {reg1} | {sp0} / {sp1} | "
              f"{sum(ops0.values())} / {sum(ops1.values())} | " + " | ".join(kinds) + " |", flush=True)


if __name__ == "__main__":
    main()
