"""The compile cache: passing compile-check results, one small JSON file each, in a directory
outside the project, keyed by everything that determines a result. A rebuild of unchanged kernels
compiles nothing.

The key covers the code a job's kernel compiles from (reached_code: its factory and the module
code the factory reads, without comments and docstrings; a tiling table only the launcher reads is
not part of it), the job (factory, arguments, tiling), the check's own rules (the shared-memory
limit, CHECK_VERSION) and the toolchain (tilelang, nvcc, target). Only passes are stored: a
failure compiles again, so its error is shown. A missing, unreadable or corrupt entry is a miss; a
cache that cannot be written is used read-only after one warning, never a failed build. The KEEP
most recently used entries stay.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable

from opgen.cache import cache_dir, read_entry, touch, trim, write_entry
from opgen.compile import TARGET, CompileResult
from opgen.plan import SM90_SMEM_LIMIT, CompileJob
from opgen.render import bare_tree, kernel_code

# Bump when compile_one's verdict changes meaning (what it reads from a kernel, what it refuses):
# entries written under the old rules then miss.
CHECK_VERSION = 1
# Entries kept (the least recently used go first; ~300 bytes each): every kernel of every spec
# here is ~370, so this holds well over a hundred edits of each.
KEEP = 65536


@dataclass(frozen=True)
class Toolchain:
    """What a compile-check result depends on besides the kernel itself. A package manifest
    records it (`compiled_with`) beside a passing check."""

    tilelang: str
    nvcc: str
    target: str

    def record(self) -> dict[str, str]:
        return asdict(self)


@lru_cache(maxsize=1)
def toolchain() -> Toolchain:
    """The toolchain of this process's compile checks (computed once per build: nvcc runs)."""
    try:
        tilelang = metadata.version("tilelang")
    except metadata.PackageNotFoundError:
        tilelang = "not installed"
    return Toolchain(tilelang, nvcc_version(), TARGET)


def nvcc_version() -> str:
    """The version and build of the nvcc TileLang runs ($CUDA_HOME/bin/nvcc, else nvcc on PATH):
    "13.0.88 cuda_13.0.r13.0/compiler.36424714_0"; the whole `nvcc --version` output, on one
    line, when it has another form."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc = str(Path(home) / "bin" / "nvcc") if home else shutil.which("nvcc")
    if not nvcc:
        return "not found"
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.SubprocessError):
        return "not found"
    release, build = re.search(r"\bV(\d\S*)", text), re.search(r"^Build (\S+)", text, re.MULTILINE)
    if release and build:
        return f"{release.group(1)} {build.group(1)}"
    return " ".join(text.split()) or "not found"


# The check's own rules: a result under other rules is not this check's.
CHECK_RULES = [CHECK_VERSION, SM90_SMEM_LIMIT]


def compiled_part(job: CompileJob) -> list:
    """What of a job compiles: factory, arguments and tiling (the label only names it)."""
    return [job.factory, list(job.args), job.tiling]


def digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()


def jobs_digest(jobs: Iterable[CompileJob]) -> str:
    """A digest of the kernel instances a check compiles and of the check's own rules."""
    return digest({"check": CHECK_RULES, "jobs": [compiled_part(job) for job in jobs]})


def check_record(tools: Toolchain, jobs: Iterable[CompileJob]) -> dict[str, str]:
    """What a package's manifest records beside a passing compile check (`compiled_with`): the
    toolchain and the digest of the jobs checked. A build takes the record for a pass only where
    both match: a new job over an unchanged kernels.py (a new bench shape) is compiled."""
    return {**tools.record(), "jobs": jobs_digest(jobs)}


def job_key(kernels_py: str, job: CompileJob, tools: Toolchain) -> str:
    """The cache key of one job of a rendered kernels.py."""
    return digest({
        "check": CHECK_RULES,
        "code": hashlib.sha256(reached_code(kernels_py, job.factory).encode("utf-8")).hexdigest(),
        "job": compiled_part(job),
        "tools": tools.record(),
    })


# --- what a job compiles from: its factory and the module code it reaches -------------------------

# What a top-level statement that defines no name (an import, a call) binds: every job reaches it.
EVERY_JOB = frozenset({"*"})


@lru_cache(maxsize=32)  # a build asks once per compile job, with the same few texts
def _statements(kernels_py: str) -> tuple[tuple[frozenset, frozenset, str], ...] | None:
    """kernels.py's top-level statements as (names each binds, names it reads, its code), comments
    and docstrings left out; a statement that binds nothing (an import, a top-level call, anything
    but a plain definition or assignment) binds EVERY_JOB: every job reaches it. None when the text
    does not parse."""
    tree = bare_tree(kernels_py)
    if tree is None:
        return None
    parts = []
    for node in tree.body:
        reads = frozenset(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds = frozenset([node.name])
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and all(
                isinstance(t, ast.Name) for t in _targets(node)):
            binds = frozenset(t.id for t in _targets(node))
        else:
            binds = EVERY_JOB
        parts.append((binds, reads - binds, ast.unparse(node)))
    return tuple(parts)


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.expr]:
    return node.targets if isinstance(node, ast.Assign) else [node.target]


def reached_code(kernels_py: str, factory: str) -> str:
    """The code of kernels.py that factory's kernels compile from: the statements that define it
    and what it reads, transitively, plus every statement that defines no name (imports). A table
    that only the launcher reads (a tuned tiling table) is not part of it, so retuning one entry
    compiles only the jobs that entry adds. kernel_code(kernels_py) when it does not parse or has
    no top-level factory of that name."""
    parts = _statements(kernels_py)
    if parts is None or not any(factory in binds for binds, _, _ in parts):
        return kernel_code(kernels_py)
    wanted, reached = {factory}, set()
    for binds, reads, _ in parts:
        if binds is EVERY_JOB:
            wanted |= reads
    while True:
        new = {i for i, (binds, _, _) in enumerate(parts)
               if i not in reached and (binds is EVERY_JOB or binds & wanted)}
        if not new:
            break
        reached |= new
        for i in new:
            wanted |= parts[i][1]
    return "\n".join(code for i, (_, _, code) in enumerate(parts) if i in reached)


class ResultCache:
    """Passing results under <cache dir>/compile/<key>.json."""

    def __init__(self, root: Path | None = None, warn: Callable[[str], None] = print):
        self.directory = (root or cache_dir()) / "compile"
        self._warn = warn
        self._writable = True

    def get(self, key: str, spec: str, label: str) -> CompileResult | None:
        """The stored pass of key as a result of (spec, label), or None (a miss)."""
        data = read_entry(self.directory, key)
        try:
            if data is None or data["ok"] is not True:
                return None
            result = CompileResult(spec, label, True, float(data["seconds"]),
                                   int(data["smem_bytes"]), int(data["threads"]), source="cache")
        except (ValueError, TypeError, KeyError):
            return None
        touch(self.directory, key)
        return result

    def put(self, key: str, result: CompileResult, tools: Toolchain) -> None:
        """Store a passing result (failures are not stored); atomically, so a reader never sees
        half an entry."""
        if not result.ok or not self._writable:
            return
        data = {"label": result.label, "ok": True, "seconds": round(result.seconds, 3),
                "smem_bytes": result.smem_bytes, "threads": result.threads,
                "versions": tools.record()}
        try:
            write_entry(self.directory, key, data)
        except OSError as exc:
            self._writable = False
            self._warn(f"warning: the compile cache {self.directory} cannot be written "
                       f"({exc.strerror or exc}); results of this build are not cached")
            return
        trim(self.directory, KEEP)
