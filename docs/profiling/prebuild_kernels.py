"""Compile every kernel variant of the named packages into TileLang's disk cache, one process per
core, before their tests run on the GPU machine: each distinct kernel is built once, instead of
by every pytest worker that reaches it first (15 workers building the same variants at once).

    TILELANG_DEFAULT_TARGET='{"kind": "cuda", "arch": "sm_90a"}' \\
        python docs/profiling/prebuild_kernels.py attention gqa attention_tuned

The test processes must run with the same TILELANG_DEFAULT_TARGET: TileLang's cache key holds the
target, and the build's workers compile for sm_90a (on the CPU machine: a later factory call
with that target loads the kernel in 0.13 s instead of compiling it in 5.1 s). A package is
generated/<name>/, built from specs/<name>.toml or, for a golden tree copied there,
tests/specs/<name>.toml, or for a copy, generated/<name>/spec.toml; its variants are the compile
jobs of `opgen build`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from opgen.compile import compile_all
from opgen.render import generate


def spec_of(name: str) -> Path:
    # A copy of a package (an A/B's baseline, generated/<name>/ holding its own spec.toml) is built
    # from the spec it was rendered from: its compile jobs are the same, its kernels.py its own.
    for spec in (Path("specs") / f"{name}.toml", Path("tests/specs") / f"{name}.toml",
                 Path("generated") / name / "spec.toml"):
        if spec.exists():
            return spec
    raise SystemExit(f"no spec for {name} in specs/, tests/specs/ or generated/{name}/")


def main(names: list[str]) -> None:
    work = []
    for name in names:
        gen = generate(spec_of(name))
        work += [(gen.spec_path, Path("generated") / name / "kernels.py", job)
                 for job in gen.plan.compile_jobs]
    started = time.monotonic()
    results = compile_all(work, workers=os.cpu_count(), keep_cache=True)
    failed = [f"{r.spec} {r.label}: {r.error.splitlines()[-1] if r.error else '?'}"
              for r in results if not r.ok]
    print(f"prebuilt {len(results) - len(failed)} of {len(results)} kernel(s) "
          f"({sum(r.cached for r in results)} already in TileLang's cache) "
          f"in {time.monotonic() - started:.0f} s", *failed, sep="\n")


if __name__ == "__main__":
    main(sys.argv[1:])
