"""Ablations of a shipped attention backward, for timing only (their dQ is wrong by design): how
much of the backward's time its dQ path costs. Each is the package's own kernels.py with one part
of the bwd kernel's loop cut out, loaded as a module of its own:

- no-dq-atomics: the dQ GEMM kept, its per-element fp32 atomics skipped (guarded by a condition
  on a loaded lse value that never holds, so neither the GEMM nor the atomics are dead code to
  the compiler; a condition on dQ's own values breaks TileLang's layout inference). If the backward gets much
  faster, the atomics (their instructions, or L2's reduction throughput: 32 KB a step per block
  at D128 128x64) bound it, and a staged bulk reduce of dQ is worth building.
- no-dq: dS's shared-memory store, the dQ GEMM and the atomics all cut: the whole dQ path.

    from bwd_ablations import ablated_kernels
    K = ablated_kernels("attention", "no-dq-atomics")   # K.attention_bwd: the ablated factory
"""
import importlib.util
import os
import sys
import tempfile

ATOMICS = """\
                if k * block_n + block_n <= seq_len:
                    for i, j in T.Parallel(block_n, dim):
                        T.atomic_add(elem(dQ, bz, h, k * block_n + i, j), dq[i, j])
                else:
                    for i, j in T.Parallel(block_n, dim):
                        if k * block_n + i < seq_len:
                            T.atomic_add(elem(dQ, bz, h, k * block_n + i, j), dq[i, j])
"""
NEVER = """\
                if lse_shared[0] == 1234567.0:  # never: the dQ GEMM stays, its atomics are skipped
                    for i, j in T.Parallel(block_n, dim):
                        T.atomic_add(elem(dQ, bz, h, k * block_n + i, j), dq[i, j])
"""
DQ_PATH = """\
                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
"""
ABLATIONS = {
    "no-dq-atomics": [(ATOMICS, NEVER)],
    "no-dq": [(ATOMICS, ""), (DQ_PATH, "")],
}


def ablated_source(package, ablation):
    path = os.path.join(os.getcwd(), "generated", package, "kernels.py")
    with open(path) as f:
        source = f.read()
    for old, new in ABLATIONS[ablation]:
        if source.count(old) != 1:
            raise RuntimeError(f"{path}: the bwd loop's text changed; update bwd_ablations.py")
        source = source.replace(old, new)
    return source


# TileLang parses each kernel function from its source file: the ablated modules live in files.
FOLDER = tempfile.mkdtemp(prefix="bwd_ablations_")


def ablated_kernels(package, ablation):
    """generated/<package>/kernels.py with the ablation applied, as a module of its own."""
    name = f"ablated_{package}_{ablation.replace('-', '_')}"
    if name not in sys.modules:
        path = os.path.join(FOLDER, name + ".py")
        with open(path, "w") as f:
            f.write(ablated_source(package, ablation))
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]
