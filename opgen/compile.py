"""CPU compile check: every kernel instance of a plan, lowered by TileLang and compiled by nvcc
for sm_90a, in parallel processes. No GPU needed; nothing is mocked."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterable

from opgen.plan import SM90_SMEM_LIMIT, CompileJob

# Hopper kernels must be built for sm_90a: plain sm_90 drops wgmma and setmaxnreg (TILELANG.md).
TARGET = '{"kind": "cuda", "arch": "sm_90a"}'


@dataclass(frozen=True)
class CompileResult:
    spec: str
    label: str
    ok: bool
    seconds: float
    smem_bytes: int = 0
    threads: int = 0
    error: str = ""


def _init_worker() -> None:
    os.environ["TILELANG_DEFAULT_TARGET"] = TARGET
    import logging

    import tilelang

    tilelang.disable_cache()  # a check compiles for real, every time
    logging.getLogger("tilelang").setLevel(logging.WARNING)
    logging.getLogger("TileLang").setLevel(logging.WARNING)


_modules: dict[str, object] = {}


def _load(kernels_path: str):
    if kernels_path not in _modules:
        name = f"_opgen_check_{len(_modules)}"
        spec = importlib.util.spec_from_file_location(name, kernels_path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _modules[kernels_path] = module
    return _modules[kernels_path]


def compile_one(spec: str, kernels_path: str, job: CompileJob) -> CompileResult:
    start = time.perf_counter()
    try:
        module = _load(kernels_path)
        kernel = getattr(module, job.factory)(*job.args, **job.tiling)
        smem, threads = _resources(kernel)
    except Exception as exc:  # report every failing kernel, keep compiling the rest
        text = f"{type(exc).__name__}: {exc}".strip().splitlines()
        return CompileResult(spec, job.label, False, time.perf_counter() - start,
                             error="\n".join(text[-12:]))
    seconds = time.perf_counter() - start
    if smem > SM90_SMEM_LIMIT:
        return CompileResult(spec, job.label, False, seconds, smem, threads,
                             f"uses {smem} bytes of shared memory, over the sm_90 limit "
                             f"{SM90_SMEM_LIMIT}; it would fail at launch")
    return CompileResult(spec, job.label, True, seconds, smem, threads)


def _resources(kernel) -> tuple[int, int]:
    smem = threads = 0
    for func in kernel.artifact.device_mod.functions.values():
        attrs = func.attrs or {}
        if "dyn_shared_memory_buf" in attrs:
            smem = max(smem, int(attrs["dyn_shared_memory_buf"]))
        extent = attrs.get("thread_extent", {}) if attrs else {}
        if "threadIdx.x" in extent:
            threads = max(threads, int(extent["threadIdx.x"]))
    return smem, threads


def compile_all(
    work: Iterable[tuple[str, Path, CompileJob]],
    workers: int | None = None,
    on_done: Callable[[CompileResult], None] | None = None,
) -> list[CompileResult]:
    """Compile (spec, kernels.py path, job) triples in a process pool; results in input order."""
    work = list(work)
    workers = max(1, min(workers or os.cpu_count() or 1, len(work) or 1))
    results: dict[int, CompileResult] = {}
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker) as pool:
        futures = {pool.submit(compile_one, spec, str(path), job): i for i, (spec, path, job) in enumerate(work)}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if on_done:
                on_done(result)
    return [results[i] for i in range(len(work))]
