"""CPU compile check: every kernel instance of a plan, lowered by TileLang and compiled by nvcc
for sm_90a, in parallel processes. No GPU needed; nothing is mocked.

The build's check (compile_all without keep_cache) lowers each kernel as its @tilelang.jit
factory would, then runs nvcc on several kernels' CUDA in one translation unit: nvcc spends
seconds (3-5 s on 2 cores) on TileLang's headers, paid once per batch instead of once per kernel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures import process as _process_pools
from dataclasses import dataclass, replace
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
    # "compiled", or "identical" (another job of this check has the same kernel: its result), or
    # where an earlier check's result came from: "cache", "manifest" or "tilelang cache"
    source: str = "compiled"

    @property
    def cached(self) -> bool:
        """Known from an earlier check, not compiled in this one."""
        return self.source not in ("compiled", "identical")


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
        smem, threads = _resources(kernel.artifact.device_mod)
    except Exception as exc:  # report every failing kernel, keep compiling the rest
        return CompileResult(spec, job.label, False, time.perf_counter() - start,
                             error=_error_text(exc))
    return _verdict(spec, job.label, time.perf_counter() - start, smem, threads)


def _error_text(exc: Exception) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return "\n".join(text[-12:])


def _verdict(spec: str, label: str, seconds: float, smem: int, threads: int) -> CompileResult:
    """The result of a kernel that compiled: it still fails over the sm_90 shared-memory limit."""
    if smem > SM90_SMEM_LIMIT:
        return CompileResult(spec, label, False, seconds, smem, threads,
                             f"uses {smem} bytes of shared memory, over the sm_90 limit "
                             f"{SM90_SMEM_LIMIT}; it would fail at launch")
    return CompileResult(spec, label, True, seconds, smem, threads)


def _resources(device_mod) -> tuple[int, int]:
    smem = threads = 0
    for func in device_mod.functions.values():
        attrs = func.attrs or {}
        if "dyn_shared_memory_buf" in attrs:
            smem = max(smem, int(attrs["dyn_shared_memory_buf"]))
        extent = attrs.get("thread_extent", {}) if attrs else {}
        if "threadIdx.x" in extent:
            threads = max(threads, int(extent["threadIdx.x"]))
    return smem, threads


# --- The build's check: kernels lowered one by one, compiled by nvcc in batches -----------------

# Most kernels per batch (one worker task). Up to 12 kernels share one nvcc run, so its header
# parsing costs well under 0.5 s a kernel, while a batch stays short (about 1.5 min of attention
# backward kernels on one core) for the workers to finish together; compile_all makes batches
# smaller when there would otherwise be fewer batches than workers.
BATCH_SIZE = 12

# A kernel's declaration and definition, as TileLang's CUDA codegen writes them (at column 0).
_KERNEL = re.compile(r'^extern "C" __global__ void (?:__launch_bounds__\([^)\n]*\) )?(\w+)\(', re.M)


@dataclass
class _Lowered:
    """A kernel lowered without nvcc, with what nvcc needs to compile it as TileLang would."""

    index: int  # in its batch
    spec: str
    label: str
    source: str
    target: object  # the tvm Target
    pass_configs: dict
    smem: int
    threads: int
    seconds: float
    error: str = ""  # nvcc's, for the kernel alone


def check_batch(items: list[tuple[str, str, CompileJob]]) -> list[CompileResult]:
    """compile_one's results for (spec, kernels.py path, job) items, with fewer nvcc runs: each
    kernel is lowered as its factory lowers it, then the kernels whose sources share a preamble
    and whose nvcc options agree are compiled by nvcc in one translation unit. When that fails,
    each of them is compiled alone: an error belongs to its kernel and reads as nvcc reports it
    for that kernel alone."""
    from tilelang.env import env

    if env.is_cache_enabled():  # TileLang's binary cache would stand in for nvcc
        raise RuntimeError("check_batch runs with TileLang's caches disabled")
    results: list[CompileResult | None] = [None] * len(items)
    lowered: list[_Lowered] = []
    for i, (spec, path, job) in enumerate(items):
        start = time.perf_counter()
        try:
            done = _lower(getattr(_load(path), job.factory), job)
            if done is None:  # not built by TileLang's nvcc callback: left to the JIT itself
                results[i] = compile_one(spec, path, job)
                continue
            artifact, pass_configs = done
            smem, threads = _resources(artifact.device_mod)
        except Exception as exc:  # as in compile_one: report it, check the rest
            results[i] = CompileResult(spec, job.label, False, time.perf_counter() - start,
                                       error=_error_text(exc))
            continue
        lowered.append(_Lowered(i, spec, job.label, artifact.kernel_source, artifact.target,
                                pass_configs, smem, threads, time.perf_counter() - start))
    for group in _nvcc_groups(lowered):
        _compile_group(group)
    for k in lowered:
        results[k.index] = (CompileResult(k.spec, k.label, False, k.seconds, error=k.error)
                            if k.error else _verdict(k.spec, k.label, k.seconds, k.smem, k.threads))
    return results


def _lower(factory, job: CompileJob):
    """(artifact, pass configs) of the job's kernel, lowered as calling the factory lowers it but
    without nvcc: what JITImpl.compile, tilelang.jit.compile, the kernel cache's `cached` and
    JITKernel do in tilelang 0.1.15 (their diagnostics instruments aside), with device compile
    off. None when the JIT would not build the device code with TileLang's CUDA callback."""
    from tilelang import tvm
    from tilelang.backend.module import create_backend_context
    from tilelang.engine.lower import lower_with_context
    from tilelang.env import env
    from tilelang.jit.abi import prepare_tvm_ffi_callee_allocated_outputs
    from tilelang.transform import PassConfigKey
    from tilelang.transform.pass_config import normalize_pass_configs

    func = factory.get_tir(*job.args, **job.tiling)
    out_idx, pass_configs, flags = factory.out_idx, factory.pass_configs, factory.compile_flags
    # tilelang.jit.compile: settings the PrimFunc carries itself.
    attrs = func.attrs
    if attrs and "tilelang_out_idx" in attrs:
        if out_idx is not None:
            raise ValueError("Out index conflict: out_idx is specified and prim_func have "
                             "returned `T.empty` tensors")
        out_idx = list(attrs["tilelang_out_idx"])
    if attrs and "tilelang_pass_configs" in attrs:
        pass_configs = {**dict(attrs["tilelang_pass_configs"]), **(pass_configs or {})}
    if attrs and "tilelang_compile_flags" in attrs:
        extra = [flags] if isinstance(flags, str) else list(flags or [])
        flags = [*attrs["tilelang_compile_flags"], *extra]
    # cached(): the target and execution backend, from the environment unless the factory sets them.
    context = create_backend_context(
        env.get_default_target() if factory.target is None else factory.target, factory.target_host,
        env.get_default_execution_backend() if factory.execution_backend is None
        else factory.execution_backend)
    backend = context.execution_backend
    if context.module.name != "cuda" or not backend.enable_device_compile:
        return None
    # JITKernel: normalized pass configs, the out_idx ABI, compile flags as a pass config.
    pass_configs = normalize_pass_configs(pass_configs)
    if backend.name == "tvm_ffi":
        func, out_idx = prepare_tvm_ffi_callee_allocated_outputs(
            func, out_idx, supports_callee_allocated_outputs=backend.supports_callee_allocated_outputs)
    flags = [flags] if isinstance(flags, str) else flags
    if flags is not None:
        configured = pass_configs.get(PassConfigKey.TL_DEVICE_COMPILE_FLAGS)
        configured = ([] if configured is None else [configured] if isinstance(configured, str)
                      else list(configured))
        pass_configs[PassConfigKey.TL_DEVICE_COMPILE_FLAGS] = [*configured, *flags]
    with tvm.transform.PassContext(opt_level=3, config=pass_configs), context.target:
        artifact = lower_with_context(func, context, enable_host_codegen=backend.enable_host_codegen,
                                      enable_device_compile=False)
    return artifact, pass_configs


def _split(source: str) -> tuple[str, str] | None:
    """(preamble, kernels) of a lowered CUDA source: the text before its first kernel, and the
    rest. None unless the rest holds nothing at top level but __global__ kernels, and no
    preprocessor directive but #pragma: another kernel placed after it then sees nothing of it
    but kernel names, which _batch_source renames apart."""
    first = _KERNEL.search(source)
    if first is None:
        return None
    kernels = source[first.start():]
    for line in kernels.splitlines():
        directive = line.lstrip().startswith("#") and not line.lstrip().startswith("#pragma")
        top_level = line[:1] not in ("", " ", "\t")  # the codegen indents what is nested
        if directive or (top_level and line != "}" and not _KERNEL.match(line)):
            return None
    return source[:first.start()], kernels


def _nvcc_groups(kernels: list[_Lowered]) -> list[list[_Lowered]]:
    """The kernels by what nvcc sees besides their kernels: the same preamble, byte for byte, and
    the same pass configs (nvcc's options) and target. One that _split refuses is alone."""
    groups: dict[tuple[str, str, str], list[_Lowered]] = {}
    alone = []
    for k in kernels:
        split = _split(k.source)
        if split is None:
            alone.append([k])
            continue
        options = json.dumps(k.pass_configs, sort_keys=True, default=repr)
        groups.setdefault((split[0], str(k.target), options), []).append(k)
    return [*groups.values(), *alone]


def _batch_source(sources: list[str]) -> tuple[str, list[str]]:
    """One translation unit of sources with the same preamble: the preamble, then each source's
    kernels, each kernel's name in its declaration and definition suffixed with the source's
    position (extern "C" names must differ). With the new names, in order."""
    preamble, parts, names = None, [], {}
    for i, source in enumerate(sources):
        head, kernels = _split(source)
        if preamble not in (None, head):
            raise ValueError("sources with different preambles")
        preamble = head

        def rename(match: re.Match, i=i) -> str:
            name = names.setdefault((i, match.group(1)), f"{match.group(1)}_opgen{i}")
            return match.group(0)[:match.start(1) - match.start(0)] + name + "("

        parts.append(_KERNEL.sub(rename, kernels))
    return preamble + "\n".join(parts), list(names.values())


def _compile_group(group: list[_Lowered]) -> None:
    """nvcc on the group's kernels, at once when there are several; each kernel alone when that
    fails (or a kernel is missing from the binary). Each gets its share of the time."""
    if len(group) > 1:
        code, names = _batch_source([k.source for k in group])
        start = time.perf_counter()
        try:
            binary = _nvcc(code, group[0].target, group[0].pass_configs)
            # TARGET has one arch: a cubin, whose symbol table names every kernel
            passed = all(f"{name}\0".encode() in binary for name in names)
        except Exception:  # compiled alone below, for each kernel's own error
            passed = False
        share = (time.perf_counter() - start) / len(group)
        for k in group:
            k.seconds += share
        if passed:
            return
    for k in group:
        start = time.perf_counter()
        try:
            _nvcc(k.source, k.target, k.pass_configs)
        except Exception as exc:
            k.error = _error_text(exc)
        k.seconds += time.perf_counter() - start


def _nvcc(code: str, target, pass_configs: dict) -> bytes:
    """The cubin of CUDA source, from TileLang's own nvcc callback, given what TileLang's CUDA
    codegen gives it: the target and the current pass context's config."""
    from tilelang import tvm
    from tilelang.cuda.backend import tilelang_callback_cuda_compile

    with tvm.transform.PassContext(opt_level=3, config=pass_configs), target:
        return tilelang_callback_cuda_compile(code, target, tvm.transform.PassContext.current().config)


def _batches(work: list[tuple[str, Path, CompileJob]], workers: int) -> list[list[int]]:
    """Indices of work in batches of at most BATCH_SIZE, never fewer batches than workers when
    there are as many kernels. A batch holds jobs of one factory of one kernels.py: their sources
    most likely share a preamble (one nvcc run); a larger group is split evenly."""
    size = max(1, min(BATCH_SIZE, -(-len(work) // workers)))
    groups: dict[tuple[str, str], list[int]] = {}
    for i, (_, path, job) in enumerate(work):
        groups.setdefault((str(path), job.factory), []).append(i)
    batches = []
    for indices in groups.values():
        count = -(-len(indices) // size)
        batches += [indices[len(indices) * b // count:len(indices) * (b + 1) // count]
                    for b in range(count)]
    return batches


def _maybe_same(work: list[tuple[str, Path, CompileJob]]) -> set[int]:
    """Indices of jobs whose arguments and tiling some job of another kernels.py shares: only
    those can build the same kernel as another (packages of one family, such as a GQA package and
    a sinks package with the sinks off, build many of the same backward kernels)."""
    keys = [(repr(job.args), repr(job.tiling)) for _, _, job in work]
    files: dict[tuple[str, str], set[str]] = {}
    for key, (_, path, _) in zip(keys, work):
        files.setdefault(key, set()).add(str(path))
    return {i for i, key in enumerate(keys) if len(files[key]) > 1}


def _same_kernels(work: list[tuple[str, Path, CompileJob]], indices: list[int]) -> dict[int, int]:
    """{job: an earlier job with the same kernel} among indices: the same TIR (structurally equal,
    kernel name aside) built with the same JIT settings, so the same lowering, CUDA and verdict.
    A job whose TIR cannot be built here is left to its own check, which reports the error."""
    if not indices:  # nothing to compare: no TileLang import (seconds) in the build's own process
        return {}
    from tilelang import tvm

    same_as: dict[int, int] = {}
    seen: dict[tuple[int, str], list[tuple[int, object]]] = {}
    for i in indices:
        _, path, job = work[i]
        try:
            factory = getattr(_load(str(path)), job.factory)
            func = factory.get_tir(*job.args, **job.tiling).without_attr("global_symbol")
        except Exception:
            continue
        settings = repr((factory.out_idx, factory.pass_configs, factory.compile_flags,
                         factory.target, factory.target_host, factory.execution_backend))
        known = seen.setdefault((tvm.ir.structural_hash(func), settings), [])
        original = next((j for j, other in known if tvm.ir.structural_equal(func, other)), None)
        if original is None:
            known.append((i, func))
        else:
            same_as[i] = original
    return same_as


def _compile_single(spec: str, kernels_path: str, job: CompileJob) -> list[CompileResult]:
    return [compile_one(spec, kernels_path, job)]


def compile_all(
    work: Iterable[tuple[str, Path, CompileJob]],
    workers: int | None = None,
    on_done: Callable[[CompileResult], None] | None = None,
    keep_cache: bool = False,
) -> list[CompileResult]:
    """Compile (spec, kernels.py path, job) triples in a process pool; results in input order.
    keep_cache: read and fill TileLang's disk cache (`opgen tune`: the GPU run then loads the
    kernels the check built instead of compiling them again, one by one); each kernel is then
    built by its factory, alone. Without it, kernels are checked in batches (check_batch).

    On KeyboardInterrupt the workers are killed at once (a kernel compile takes seconds to
    finish) and the interrupt propagates.
    """
    work = list(work)
    workers = max(1, min(workers or os.cpu_count() or 1, len(work) or 1))
    results: dict[int, CompileResult] = {}
    same_as: dict[int, int] = {}  # a job -> the job whose kernel (and so result) it shares
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                               initargs=(os.getpid(), keep_cache))
    try:
        if keep_cache:  # each kernel built whole by its factory, into TileLang's cache
            futures = {pool.submit(_compile_single, spec, str(path), job): [i]
                       for i, (spec, path, job) in enumerate(work)}
        else:
            # Jobs that cannot share a kernel with another go to the workers at once; the rest
            # once the kernels they build are known, each distinct kernel once.
            maybe_same = _maybe_same(work)
            futures = {}

            def submit(indices: list[int]) -> None:
                part = [work[i] for i in indices]
                for batch in _batches(part, workers):
                    futures[pool.submit(check_batch, [(part[b][0], str(part[b][1]), part[b][2])
                                                      for b in batch])] = [indices[b] for b in batch]

            submit([i for i in range(len(work)) if i not in maybe_same])
            same_as = _same_kernels(work, sorted(maybe_same))
            submit([i for i in sorted(maybe_same) if i not in same_as])
        copies: dict[int, list[int]] = {}
        for copy, original in same_as.items():
            copies.setdefault(original, []).append(copy)
        for future in as_completed(futures):
            for i, result in zip(futures[future], future.result(), strict=True):
                for j in [i, *copies.get(i, ())]:
                    results[j] = result if j == i else replace(
                        result, spec=work[j][0], label=work[j][2].label, seconds=0.0,
                        source="identical")
                    if on_done:
                        on_done(results[j])
    except BaseException:
        _kill_workers(pool)
        raise
    pool.shutdown(wait=True)
    return [results[i] for i in range(len(work))]


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    processes = list((pool._processes or {}).values())  # no public way to reach them
    for process in processes:
        process.kill()
    try:
        pool.shutdown(wait=False, cancel_futures=True)
    except OSError:  # its wakeup pipe, closed by the manager thread as it saw the workers die
        pass
    for process in processes:
        process.join(timeout=5)
    # The pool's manager thread sees the dead workers and closes its pipes. Wait for it here,
    # then take its pipe out of the interpreter's exit hook, which writes to every pool's pipe
    # without a lock (CPython 3.11): on a pipe the thread closes meanwhile, an OSError traceback.
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(timeout=5)
        _process_pools._threads_wakeups.pop(manager, None)


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
