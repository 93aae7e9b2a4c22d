"""CPU compile check: every kernel instance of a plan, lowered by TileLang and compiled by nvcc
for sm_90a, in parallel processes. No GPU needed; nothing is mocked."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Callable, Iterable, Iterator

from opgen.plan import SM90_SMEM_LIMIT, CompileJob

# Hopper kernels must be built for sm_90a: for plain sm_90, TileLang emits no wgmma or setmaxnreg.
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
    source: str = "compiled"  # or where a known pass came from: "cache" or "manifest"

    @property
    def cached(self) -> bool:
        """Known from an earlier check, not compiled in this one."""
        return self.source != "compiled"


def _init_worker(parent: int, keep_cache: bool = False) -> None:
    # The parent stops the workers itself on Ctrl-C (at once, see compile_all); a worker that
    # took the terminal's SIGINT too would print a traceback and linger.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(parent)
    os.environ["TILELANG_DEFAULT_TARGET"] = TARGET
    import logging

    import tilelang

    if not keep_cache:
        tilelang.disable_cache()  # a check compiles for real, every time
    logging.getLogger("tilelang").setLevel(logging.WARNING)
    logging.getLogger("TileLang").setLevel(logging.WARNING)


def _die_with(parent: int) -> None:
    """End this worker when the build that started it ends, even by SIGKILL (no cleanup runs
    there to stop the pool)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
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
        if kernel.artifact is None:  # loaded from TileLang's disk cache (keep_cache): built before
            return CompileResult(spec, job.label, True, time.perf_counter() - start,
                                 source="tilelang cache")
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
    keep_cache: bool = False,
) -> list[CompileResult]:
    """Compile (spec, kernels.py path, job) triples in a process pool; results in input order.
    keep_cache: read and fill TileLang's disk cache (`opgen tune`: the GPU run then loads the
    kernels the check built instead of compiling them again, one by one).

    On KeyboardInterrupt the workers are killed at once (a kernel compile takes seconds to
    finish) and the interrupt propagates.
    """
    work = list(work)
    workers = max(1, min(workers or os.cpu_count() or 1, len(work) or 1))
    results: dict[int, CompileResult] = {}
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                               initargs=(os.getpid(), keep_cache))
    try:
        futures = {pool.submit(compile_one, spec, str(path), job): i for i, (spec, path, job) in enumerate(work)}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if on_done:
                on_done(result)
    except BaseException:
        _kill_workers(pool)
        raise
    pool.shutdown(wait=True)
    return [results[i] for i in range(len(work))]


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    processes = list((pool._processes or {}).values())  # no public way to reach them
    for process in processes:
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join(timeout=5)
    # The pool's manager thread sees the dead workers and closes its pipes. Wait for it here:
    # left running, the interpreter's exit joins it, and CPython 3.11's exit hook can write to a
    # pipe the thread is closing (an OSError traceback) or wait on it for good.
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(timeout=5)


SCRATCH_PREFIX = "opgen-compile-"


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary directory for the kernels being checked, named after this process so that a
    later build can remove the one a killed build left behind."""
    _remove_orphaned_scratch()
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _remove_orphaned_scratch() -> None:
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = path.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True
