"""Which guards TileLang's safe-memory pass adds to a package's backward kernels: every bwd compile
job of the given specs lowered (CPU, sm_90a) with the pass and without it
(`tl.disable_safe_memory_legalize`, whatever the factory's own pass configs say), and the guard
lines that only the lowering with the pass has, by job and (deduplicated) over all jobs:

    python docs/profiling/safe_memory_audit.py [-j 2] specs/attention.toml specs/gqa.toml ...

A guard the pass adds is one the template does not write; the backward may drop the pass only
where each of those is implied by a guard of the template's own (session 37: the dQ atomics' row
guard, `<= (padded_rows - 1) >> 3`, which the full-block branch's `k * block_n + block_n <= seq_len`
and the tail's per-row `< seq_len` imply, since seq_len <= padded_rows)."""
import argparse
import os
import re
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, os.getcwd())
TARGET = {"kind": "cuda", "arch": "sm_90a"}
KEY = "tl.disable_safe_memory_legalize"


def lower(kernels_path, job, disable):
    import tilelang
    from tvm import transform
    from tvm.target import Target

    from opgen.compile import _load  # the compile check's loader: each kernels.py once a process

    factory = getattr(_load(kernels_path), job.factory)
    # Set both ways: the bwd factory turns the pass off itself since session 38, and the default
    # lowering must run it for the comparison to mean anything.
    config = {**(factory.pass_configs or {}), KEY: disable}
    func = factory.get_tir(*job.args, **job.tiling)
    with transform.PassContext(opt_level=3, config=config), Target(TARGET):
        source = tilelang.lower(func, target=TARGET).kernel_source
    return source[source.index("__launch_bounds__"):]


def guards(source):
    """The if-conditions of a kernel's source, one entry per occurrence."""
    return Counter(m.group(1) for m in re.finditer(r"if \((.*)\) \{", source))


def audit(item):
    kernels_path, job = item
    default = guards(lower(kernels_path, job, False))
    disabled = guards(lower(kernels_path, job, True))
    return job.label, default - disabled, disabled - default


def main():
    from opgen.render import generate

    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="+")
    parser.add_argument("-j", type=int, default=2)
    parser.add_argument("--phase", default="_bwd")
    options = parser.parse_args()
    work = []
    for spec in options.specs:
        generated = generate(Path(spec))
        kernels = str(Path("generated") / Path(spec).stem / "kernels.py")
        work += [(kernels, job) for job in generated.plan.compile_jobs
                 if job.factory.endswith(options.phase)]
    print(f"{len(work)} jobs", flush=True)
    removed_all = Counter()
    with ProcessPoolExecutor(options.j) as pool:
        for label, removed, added in pool.map(audit, work):
            shapes = Counter(re.sub(r"\b\d+\b", "N", g) for g in removed.elements())
            removed_all.update(set(shapes))
            print(f"{label}: {sum(removed.values())} guard(s) only with the pass"
                  + (f", {sum(added.values())} only without" if added else ""), flush=True)
            for g, n in shapes.items():
                print(f"    {n} x {g}", flush=True)
    print("\nguards the pass adds, over all jobs (jobs with each):")
    for g, n in removed_all.most_common():
        print(f"  {n:4d}  {g}")


if __name__ == "__main__":
    main()
