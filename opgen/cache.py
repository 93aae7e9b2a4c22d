"""Where opgen keeps what it can work out again (compile-check results, black's output), and how
an entry is stored: one small JSON file per key, written atomically, so a reader never sees half
an entry and any entry may be deleted at any time (trim() deletes the least recently used)."""

from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path


def cache_dir() -> Path:
    """$OPGEN_CACHE_DIR, else $XDG_CACHE_HOME/opgen, else ~/.cache/opgen."""
    if os.environ.get("OPGEN_CACHE_DIR"):
        return Path(os.environ["OPGEN_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"  # XDG: absolute only
    return base / "opgen"


def read_entry(directory: Path, key: str) -> dict | None:
    """The entry stored under key, or None: missing, unreadable, not JSON, or not this key's."""
    try:
        data = json.loads((directory / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("key") == key else None


def write_entry(directory: Path, key: str, data: dict) -> None:
    """Store data (with its key) under key, atomically; OSError when the cache cannot be written."""
    tmp = None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump({**data, "key": key}, file, sort_keys=True)
        os.replace(tmp, directory / f"{key}.json")
        tmp = None
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def touch(directory: Path, key: str) -> None:
    """Mark key's entry as just used (its mtime), for trim()."""
    try:
        os.utime(directory / f"{key}.json")
    except OSError:
        pass


@lru_cache(maxsize=None)  # once per process and directory: a build writes dozens of entries
def trim(directory: Path, keep: int) -> None:
    """Delete the least recently used entries (by mtime: written or touched) beyond keep, down to
    three quarters of it, so that trimming is rare; entries that vanish meanwhile are skipped.
    Done the first time a process asks."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return
    entries = [e for e in entries if e.name.endswith(".json")]
    if len(entries) <= keep:
        return
    used = {}
    for entry in entries:
        try:
            used[entry.path] = entry.stat().st_mtime
        except OSError:
            pass
    for path in sorted(used, key=used.get)[: len(used) - keep * 3 // 4]:
        Path(path).unlink(missing_ok=True)
