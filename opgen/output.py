"""Writing generated packages and diffing them (`opgen check`).

What a write guarantees:
- Ownership: a package is replaced only by the spec its manifest names (or with force), and a
  directory opgen did not write is never replaced without force.
- Interrupt safety: the new tree is built in a staging directory beside the package and swapped in
  with one atomic exchange of the two directories, so at every instant `<out>/<name>/` is the
  whole old package or the whole new one. Entries `<out>/.<name>.*` a killed build leaves
  behind are removed by the next write of that package and reported by `check`.
The output root (`generated/`, or any directory `--out` names, in this repository or another) is
only ever touched in these entries and in the lock on the directory itself.
- Concurrency: writers of one output directory take an exclusive lock on it (readers a shared one),
  so two builds at once run their swaps one after the other.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import difflib
import errno
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from opgen.compile_cache import jobs_digest
from opgen.errors import OpgenError
from opgen.manifest import MANIFEST, Manifest, ManifestError, parse_manifest, sha256
from opgen.render import OUT_ROOT, SPEC_FILE, Generated, kernel_code

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; concurrent builds are not serialized there
    fcntl = None

# Never part of a package, never reported: caches that running the generated tests creates.
IGNORED = {"__pycache__", ".pytest_cache"}
# Files of the output root a repository may keep beside the packages (__init__.py: a model repo
# that vendors packages into a directory of its own package).
ROOT_FILES_ALLOWED = {".gitignore", ".gitattributes", "__init__.py"}


class OwnershipError(OpgenError):
    """A build would replace a package that another spec (or no spec) wrote."""


@dataclass(frozen=True)
class WriteResult:
    written: int
    unchanged: int


def write(gen: Generated, root: Path, *, compile_checked: bool = False,
          compiled_with: dict[str, str] | None = None, force: bool = False) -> WriteResult:
    """Make root/<gen.out_root>/<name>/ hold exactly gen.files.

    compile_checked: the kernels of gen passed the compile check in this build, with the toolchain
    compiled_with. Without it the manifest keeps an earlier build's check when kernels.py is
    unchanged. Unchanged files are not touched (their mtimes stay).
    """
    out_root = root / gen.out_root
    out_root.mkdir(parents=True, exist_ok=True)
    target = root / gen.out_dir
    with _locked(out_root, exclusive=True):
        _recover(out_root, gen.name)
        current = read_tree(target)
        problem = _owner_problem(gen, target, current)
        if problem and not force:
            raise OwnershipError(problem)
        if not compile_checked:
            earlier = earlier_compile_check(current, gen)
            compile_checked = earlier is not None
            compiled_with = earlier.compiled_with if earlier else None
        files = {name: text.encode("utf-8") for name, text in
                 gen.with_compile_checked(compile_checked, compiled_with).files.items()}
        written = sum(1 for name, data in files.items() if current.get(name) != data)
        stale = set(current) - set(files)
        if not written and not stale:
            return WriteResult(0, len(files))
        staging = Path(tempfile.mkdtemp(prefix=f".{gen.name}.staging-", dir=out_root))
        try:
            for name, data in files.items():
                dest = staging / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                if current.get(name) == data:
                    shutil.copy2(target / name, dest)  # keeps the mtime of an unchanged file
                else:
                    dest.write_bytes(data)
            _swap_in(staging, target)
        finally:
            # After the swap the staging path holds the old tree (or nothing); before it, a
            # partial new one. Either way it goes; if this is interrupted, the next write cleans.
            shutil.rmtree(staging, ignore_errors=True)
    return WriteResult(written, len(files) - written)


def ownership_problem(gen: Generated, root: Path) -> str | None:
    """Why writing gen would replace something it does not own, or None."""
    target = root / gen.out_dir
    return _owner_problem(gen, target, read_tree(target))


def _owner_problem(gen: Generated, target: Path, current: dict[str, bytes]) -> str | None:
    """ownership_problem of a package directory already read (current: its files)."""
    shown = gen.out_dir.as_posix()
    if target.exists() and not target.is_dir():
        return (f"{gen.spec_path}: name: {shown} exists and is not a directory; move it away, "
                "or pass --force to replace it")
    if not current:
        return None
    if MANIFEST not in current:
        return (f"{gen.spec_path}: name: {shown}/ exists and was not written by opgen (it has no "
                f"{MANIFEST}); move it away, or pass --force to replace it")
    try:
        owner = parse_manifest(current[MANIFEST]).spec
    except ManifestError as exc:
        return (f"{gen.spec_path}: name: {shown}/{MANIFEST} is corrupt ({exc}), so the spec that "
                "owns the package is unknown; pass --force to replace it")
    if owner != gen.spec_path:
        return (f"{gen.spec_path}: name: {shown}/ was built from {owner}; building "
                f"{gen.spec_path} (name = \"{gen.name}\") would replace it. Give one of the two "
                f"specs another name, or pass --force if {gen.spec_path} now owns the package "
                f"(for example after moving {owner})")
    return None


def earlier_compile_check(current: dict[str, bytes], gen: Generated) -> Manifest | None:
    """The manifest of an earlier build whose compile check still holds: kernels.py as that build
    wrote it (no hand edit), its code the same as gen's (kernel_code: the header, which names the
    spec and its hash, comments and docstrings are no part of what compiled; the compile cache
    ignores them too), and the same jobs checked (a new bench shape is a kernel instance no check
    has compiled)."""
    manifest = _parse_or_none(current.get(MANIFEST))
    kernels = gen.files.get("kernels.py")
    on_disk = current.get("kernels.py")
    if (manifest and manifest.compile_checked and kernels is not None and on_disk is not None
            and manifest.files.get("kernels.py") == sha256(on_disk)
            and kernel_code(on_disk.decode("utf-8", "replace")) == kernel_code(kernels)
            and (manifest.compiled_with or {}).get("jobs") == jobs_digest(gen.plan.compile_jobs)):
        return manifest
    return None


def recorded_compile_check(gen: Generated, root: Path) -> dict[str, str] | None:
    """What the package on disk under root records beside a compile check that still holds for
    gen (earlier_compile_check): the toolchain and the jobs' digest (check_record); or None."""
    target = root / gen.out_dir
    current = {name: data for name in (MANIFEST, "kernels.py")
               if (data := _read_or_none(target / name)) is not None}
    earlier = earlier_compile_check(current, gen)
    return earlier.compiled_with if earlier else None


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


# --- the swap and its recovery ----------------------------------------------------------------------

def _swap_in(staging: Path, target: Path) -> None:
    """Put staging where target is, in one step when the system allows it."""
    if not target.exists():
        os.replace(staging, target)
        return
    if _exchange(staging, target):
        return
    # No atomic exchange here: two renames, with SIGINT/SIGTERM held back in between so that an
    # interrupt cannot fall between them; a SIGKILL there is repaired by _recover().
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    with _signals_deferred():
        os.replace(target, old)
        os.replace(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def _recover(out_root: Path, name: str) -> None:
    """Undo what an interrupted write of package `name` left (called with the lock held)."""
    target, old = out_root / name, out_root / f".{name}.old"
    if not target.exists() and old.is_dir():
        os.replace(old, target)  # killed between the two renames: the old tree is whole
    for path in leftovers(out_root, name):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def leftovers(out_root: Path, name: str | None = None) -> list[Path]:
    """Staging or old trees of interrupted writes: `.<name>.*` beside the packages."""
    if not out_root.is_dir():
        return []
    found = []
    for path in sorted(out_root.iterdir()):
        parts = path.name.split(".")
        if len(parts) >= 3 and parts[0] == "" and parts[1].isidentifier() and (
            name is None or parts[1] == name
        ):
            found.append(path)
    return found


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
_renameat2 = None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    global _renameat2
    if _renameat2 is None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _renameat2 = getattr(libc, "renameat2", False)
    if not _renameat2:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False  # the file system cannot exchange
    raise OSError(code, os.strerror(code), str(a), None, str(b))


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    held = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


LOCK_WAIT_S = 120


@contextlib.contextmanager
def _locked(directory: Path, exclusive: bool) -> Iterator[None]:
    """An advisory lock on the output directory itself: no lock file to commit or clean up.

    Polled rather than blocking, so Ctrl-C works while waiting and a lock that is never released
    (a holder stuck, or an interrupt that skipped the release in a process that lives on) gives
    an error instead of a hang. A process that ends releases its locks.
    """
    if fcntl is None or not directory.is_dir():
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, mode)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OpgenError(f"{directory}: another opgen process has held its lock for "
                                     f"{LOCK_WAIT_S} s; wait for it or end it") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


# --- reading and diffing ----------------------------------------------------------------------------

def read_tree(directory: Path) -> dict[str, bytes]:
    """The files of a package as bytes (line endings and encodings are compared, not translated)."""
    if not directory.is_dir():
        return {}
    files = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_file() and not IGNORED.intersection(rel.parts) and path.suffix != ".pyc":
            files[rel.as_posix()] = path.read_bytes()
    return files


def _parse_or_none(raw: bytes | None) -> Manifest | None:
    if raw is None:
        return None
    try:
        return parse_manifest(raw)
    except ManifestError:
        return None


@dataclass(frozen=True)
class Drift:
    path: str  # relative to the project root
    kind: str  # one of DRIFT_REASONS
    diff: str = ""
    detail: str = ""  # replaces the kind's standard reason where the case needs its own words

    def message(self, spec_path: str = "") -> str:
        reason = self.detail or DRIFT_REASONS[self.kind].format(spec=spec_path or "its spec")
        return f"{self.path}: {self.kind} ({reason})"


DRIFT_REASONS = {
    "stale": "the spec or opgen changed since the last build of {spec}",
    "hand-edited": "edited by hand since opgen wrote it",
    "missing": "not on disk",
    "extra": "not generated by the spec",
    "corrupt": "the manifest is not one opgen wrote",
    "leftover": "left by an interrupted build; the next `opgen build` of the package removes it",
    "not compile-checked": "built with --no-compile; run `opgen build` without it",
}


def diff(gen: Generated, root: Path, max_lines: int = 20,
         require_compiled: bool = False) -> list[Drift]:
    """How root/<gen.out_root>/<name>/ differs from what the spec renders to, file by file."""
    out_root = root / gen.out_root
    with _locked(out_root, exclusive=False):
        on_disk = read_tree(root / gen.out_dir)
        found_leftovers = leftovers(out_root, gen.name)
    drifts = [Drift((gen.out_root / p.name).as_posix(), "leftover") for p in found_leftovers]
    manifest = None
    if MANIFEST in on_disk:
        try:
            manifest = parse_manifest(on_disk[MANIFEST])
        except ManifestError as exc:
            drifts.append(Drift((gen.out_dir / MANIFEST).as_posix(), "corrupt",
                                detail=f"{exc}; `opgen build --force` rewrites it"))
    recorded = manifest.files if manifest else {}
    # The compile flag and its toolchain are what the last build found, not something the spec
    # determines: the expected manifest carries them as on disk, and only require_compiled asks.
    checked = manifest.compile_checked if manifest else False
    compiled_with = manifest.compiled_with if manifest else None
    expected = {name: text.encode("utf-8")
                for name, text in gen.with_compile_checked(checked, compiled_with).files.items()}
    for name in sorted(set(on_disk) | set(expected)):
        shown = (gen.out_dir / name).as_posix()
        if name not in on_disk:
            drifts.append(Drift(shown, "missing"))
        elif name not in expected:
            drifts.append(Drift(shown, "extra"))
        elif on_disk[name] != expected[name]:
            if name == MANIFEST and manifest is None:
                continue  # reported as corrupt above
            # The manifest says what opgen last wrote: a file that no longer matches it was
            # edited by hand; one that still does is merely stale (spec or opgen changed).
            edited = name != MANIFEST and recorded.get(name) != sha256(on_disk[name])
            drifts.append(Drift(shown, "hand-edited" if edited else "stale",
                                _short_diff(shown, gen.spec_path, on_disk[name], expected[name],
                                            max_lines)))
    copy = on_disk.get(SPEC_FILE)
    if (copy is not None and copy == expected.get(SPEC_FILE) and SPEC_FILE in recorded
            and recorded[SPEC_FILE] != sha256(copy)):
        # Checked from the package's own spec.toml: it renders to itself, but is not the spec the
        # package was built from (the manifest has that one's hash).
        drifts.append(Drift((gen.out_dir / SPEC_FILE).as_posix(), "hand-edited", detail=(
            "differs from the spec the package was built from; rebuild the package from it "
            f"(`opgen build {(gen.out_dir / SPEC_FILE).as_posix()} --out "
            f"{gen.out_root.as_posix()}`) or undo the edit")))
    if require_compiled and manifest and not manifest.compile_checked:
        drifts.append(Drift(f"{gen.out_dir.as_posix()}/", "not compile-checked"))
    return drifts


def _short_diff(shown: str, spec_path: str, old: bytes, new: bytes, max_lines: int) -> str:
    old_text, new_text = old.decode("utf-8", "replace"), new.decode("utf-8", "replace")
    if old_text.splitlines() == new_text.splitlines():
        crlf = b"\r\n" in old
        return f"  (only the line endings differ{': CRLF on disk' if crlf else ''})"
    lines = list(difflib.unified_diff(
        old_text.splitlines(), new_text.splitlines(),
        f"{shown} (on disk)", f"{shown} (from {spec_path})", lineterm="", n=1,
    ))
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
    return "\n".join(lines)


def project_drifts(root: Path, known: set[str], shown_root: Path = OUT_ROOT) -> list[Drift]:
    """Everything in the output root (shown_root, below root) that no spec checked accounts for:
    packages whose spec is gone, directories opgen did not write, stray files, leftovers of
    interrupted builds."""
    out_root = root / shown_root
    where = f"{shown_root.as_posix()}/"
    if not out_root.is_dir():
        return []
    with _locked(out_root, exclusive=False):
        entries = sorted(out_root.iterdir())
        found_leftovers = set(leftovers(out_root))
    drifts = []
    for path in entries:
        shown = (shown_root / path.name).as_posix()
        if path.name in IGNORED or path.name in ROOT_FILES_ALLOWED:
            continue
        if path in found_leftovers:
            if path.name.split(".")[1] not in known:  # known packages report their own
                drifts.append(Drift(shown, "leftover"))
        elif not path.is_dir():
            drifts.append(Drift(shown, "extra", detail=f"a stray file: {where} holds only "
                                "packages; move it elsewhere"))
        elif path.name not in known:
            if (path / MANIFEST).is_file():
                why = "no spec checked builds it; delete it or restore its spec"
            else:
                why = (f"not written by opgen (no {MANIFEST}); {where} holds only generated "
                       "packages: move it elsewhere")
            drifts.append(Drift(f"{shown}/", "extra", detail=why))
    return drifts
