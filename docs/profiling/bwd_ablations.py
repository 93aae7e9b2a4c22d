"""Variants of a shipped attention backward made by editing the package's own kernels.py, each
loaded as a module of its own. Ablations, for timing only (their dQ is wrong by design): how much
of the backward's time its dQ path costs.

- no-dq-atomics: the dQ GEMM kept, its per-element fp32 atomics skipped (guarded by a condition
  on a loaded lse value that never holds, so neither the GEMM nor the atomics are dead code to
  the compiler; a condition on dQ's own values breaks TileLang's layout inference). If the
  backward gets much faster, the atomics (their instructions, or L2's reduction throughput: 32 KB
  a step per block at D128 128x64) bound it.
- no-dq: dS's shared-memory store, the dQ GEMM and the atomics all cut: the whole dQ path.

(bulk-dq, once an edit here, is the bwd tiling key bulk_dq since session 32:
bwd_variants_probe.py's "bulk-dq" sets it.)

    from bwd_ablations import edited_kernels
    K = edited_kernels("attention", "no-dq-atomics")   # K.attention_bwd: the ablated factory
"""
import importlib.util
import os
import re
import sys
import tempfile

# The bwd loop's dQ atomics: both branches (the tail block's guarded one too), up to the loop's
# end. A pattern rather than the text, so the kernel's lines are not copied here.
ATOMICS = re.compile(r"^ +elif k \* block_n \+ block_n <= seq_len:\n(?:.*\n)*? +T\.atomic_add\(elem\(dQ.*\n"
                     r"(?: +else:\n(?:.*\n)*? +T\.atomic_add\(elem\(dQ.*\n)", re.M)
NEVER = """\
                else:
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


def edited_source(package, variant):
    path = os.path.join(os.getcwd(), "generated", package, "kernels.py")
    with open(path) as f:
        source = f.read()
    for old, new in ABLATIONS[variant]:
        if isinstance(old, re.Pattern):
            source, count = old.subn(lambda m: new, source)
        else:
            count = source.count(old)
            source = source.replace(old, new)
        if count != 1:
            raise RuntimeError(f"{path}: the bwd kernel's text changed; update bwd_ablations.py")
    return source


# TileLang parses each kernel function from its source file: the edited modules live in files.
FOLDER = tempfile.mkdtemp(prefix="bwd_ablations_")


def edited_kernels(package, variant):
    """generated/<package>/kernels.py with the variant's edits, as a module of its own."""
    name = f"edited_{package}_{variant.replace('-', '_')}"
    if name not in sys.modules:
        path = os.path.join(FOLDER, name + ".py")
        with open(path, "w") as f:
            f.write(edited_source(package, variant))
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]
