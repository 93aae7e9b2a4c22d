"""ptxas's verdict on a kernel's WGMMA pipeline, on the CPU: lower the kernel for sm_90a, compile
its CUDA with `nvcc --ptxas-options=--verbose`, print registers, spills and ptxas's C7xxx notes
(C7517: a warpgroup.wait injected, so an async WGMMA meant to stay in flight is waited for;
C7512: WGMMAs serialized for lack of registers). An overlapped schedule is worth timing on the
GPU only when it compiles without them.

    python docs/profiling/ptxas_check.py            # bwd_schedules.bwd_overlap and the package's bwd
    python docs/profiling/ptxas_check.py packages   # every fwd/bwd kernel the attention packages ship
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ.setdefault("TILELANG_DEFAULT_TARGET", '{"kind":"cuda","arch":"sm_90a"}')
sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tilelang

TILELANG = os.path.dirname(tilelang.__file__)


def nvcc_cubin(kernel, directory, name):
    """Compile a TileLang kernel's CUDA to directory/name.cu.cubin for sm_90a as TileLang does;
    (the cubin's path, nvcc's output with ptxas's verbose report)."""
    path = os.path.join(directory, f"{name}.cu")
    with open(path, "w") as f:
        f.write(kernel.get_kernel_source())
    out = subprocess.run(
        ["nvcc", "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", "-o", path + ".cubin",
         "--ptxas-options=--verbose", "-std=c++17", "-DNDEBUG", "--use_fast_math",
         "-I" + os.path.join(TILELANG, "src"), "-I" + os.path.join(TILELANG, "3rdparty/cutlass/include"), path],
        capture_output=True, text=True)
    text = out.stdout + out.stderr
    if out.returncode:
        raise RuntimeError(text[-4000:])
    return path + ".cubin", text


def ptxas_notes(kernel, name):
    """(registers, spill bytes, C7xxx lines) of a compiled TileLang kernel's CUDA."""
    with tempfile.TemporaryDirectory() as tmp:
        _, text = nvcc_cubin(kernel, tmp, name)
    return (re.findall(r"Used (\d+) registers", text), re.findall(r"(\d+) bytes spill stores", text),
            [line.split(": ", 1)[1] for line in text.splitlines() if re.search(r"\(C75\d\d\)", line)])


def shipped_kernels():
    """Each fwd and bwd compile job of the attention-family specs, at their first dtype and
    layout (the others differ in types and indexing, not in the pipeline)."""
    from pathlib import Path

    from opgen.compile import _load
    from opgen.render import load_plan

    for name in ("attention", "gqa", "attention_sink"):
        plan, _ = load_plan(Path(f"specs/{name}.toml"))
        module = _load(f"generated/{name}/kernels.py")
        first, seen = None, set()
        for job in plan.compile_jobs:
            phase = job.factory[len(name) + 1:]
            if phase not in ("fwd", "bwd"):
                continue
            kind = (job.args[5], job.args[6])  # layout, dtype
            first = first or kind
            # One window length stands for all (the pipeline is the same).
            pipeline = (phase, job.args[2:4], bool(job.args[4]), job.args[8:], tuple(job.tiling.items()))
            if kind == first and pipeline not in seen:
                seen.add(pipeline)
                yield f"{name} {job.label}", getattr(module, job.factory)(*job.args, **job.tiling)


if __name__ == "__main__" and sys.argv[1:] == ["packages"]:
    for label, kernel in shipped_kernels():
        regs, spills, notes = ptxas_notes(kernel, "kernel")
        print(f"{label}: registers {regs} spill {spills} {notes or ''}", flush=True)
elif __name__ == "__main__":
    import bwd_schedules as S
    from generated.attention import kernels as K

    # (heads, kv_heads, dim, causal, window, reduction, block_n, num_stages); block_m 128, 256 threads
    CASES = [(16, 16, 128, False, 0, "direct", 64, 2), (16, 16, 128, True, 0, "direct", 64, 2),
             (32, 8, 128, True, 0, "split", 64, 2), (32, 8, 128, True, 0, "in_block", 64, 2),
             (64, 8, 64, True, 128, "atomic", 64, 2), (16, 16, 64, False, 0, "direct", 64, 1),
             (16, 16, 64, True, 0, "direct", 128, 1)]
    for h, kv, d, causal, window, red, block_n, stages in CASES:
        args = (h, kv, d, causal, window, "bshd", "bfloat16", d ** -0.5, red, red, 128, block_n, 256, stages)
        for name, factory in (("overlap", S.bwd_overlap), ("package", K.attention_bwd)):
            if red != "direct" and name == "package":
                continue  # attention's bwd takes MHA reductions; the point is the overlap
            regs, spills, notes = ptxas_notes(factory(*args), name)
            print(f"{name:8s} H{h}/{kv} D{d} {'causal' if causal else 'full'}{f' window {window}' if window else ''} "
                  f"{red} 128x{block_n} s{stages}: registers {regs} spill {spills} {notes or 'no C75xx note'}",
                  flush=True)
