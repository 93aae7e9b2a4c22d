"""Writing generated packages (write-if-changed, atomically) and diffing them (`opgen check`)."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opgen.render import MANIFEST, Generated, sha256

IGNORED = {"__pycache__", ".pytest_cache"}


@dataclass(frozen=True)
class WriteResult:
    written: int
    unchanged: int


def write(gen: Generated, root: Path) -> WriteResult:
    """Make root/generated/<name>/ hold exactly gen.files.

    Unchanged files are not touched (their mtimes stay). When anything changed, the new tree is
    built in a temporary directory beside the target and swapped in with renames, so an
    interrupted build never leaves a half-written package.
    """
    target = root / gen.out_dir
    current = read_tree(target)
    written = sum(1 for name, text in gen.files.items() if current.get(name) != text)
    stale = set(current) - set(gen.files)
    if not written and not stale:
        return WriteResult(0, len(gen.files))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{gen.name}.", dir=target.parent))
    try:
        for name, text in gen.files.items():
            dest = staging / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            if current.get(name) == text:
                shutil.copy2(target / name, dest)  # keeps the mtime of an unchanged file
            else:
                dest.write_text(text, encoding="utf-8")
        old = target.with_name(f".{gen.name}.old")
        if target.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return WriteResult(written, len(gen.files) - written)


def read_tree(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    files = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if path.is_file() and not IGNORED.intersection(rel.parts) and path.suffix != ".pyc":
            files[rel.as_posix()] = path.read_text(encoding="utf-8", errors="replace")
    return files


@dataclass(frozen=True)
class Drift:
    path: str  # relative to the project root
    kind: str  # hand-edited | stale | missing | extra
    diff: str


def diff(gen: Generated, root: Path, max_lines: int = 20) -> list[Drift]:
    """How root/generated/<name>/ differs from what the spec renders to, file by file."""
    target = root / gen.out_dir
    on_disk = read_tree(target)
    recorded = _recorded_hashes(on_disk.get(MANIFEST))
    drifts = []
    for name in sorted(set(on_disk) | set(gen.files)):
        shown = (gen.out_dir / name).as_posix()
        if name not in on_disk:
            drifts.append(Drift(shown, "missing", ""))
        elif name not in gen.files:
            drifts.append(Drift(shown, "extra", ""))
        elif on_disk[name] != gen.files[name]:
            # The manifest says what opgen last wrote: a file that no longer matches it was
            # edited by hand; one that still does is merely stale (spec or opgen changed).
            edited = name != MANIFEST and recorded.get(name) != sha256(on_disk[name])
            lines = list(difflib.unified_diff(
                on_disk[name].splitlines(), gen.files[name].splitlines(),
                f"{shown} (on disk)", f"{shown} (from {gen.spec_path})", lineterm="", n=1,
            ))
            if len(lines) > max_lines:
                lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
            drifts.append(Drift(shown, "hand-edited" if edited else "stale", "\n".join(lines)))
    return drifts


def _recorded_hashes(manifest_text: str | None) -> dict[str, str]:
    if not manifest_text:
        return {}
    try:
        return dict(json.loads(manifest_text).get("files", {}))
    except (ValueError, AttributeError):
        return {}
