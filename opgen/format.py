"""The format step: black's output for each rendered file. Formatting is most of a render's time
and a pure function of the text (and black's version and mode), so its output is kept: in this
process, and in the cache directory (<cache dir>/black/), so that a rebuild in a new process
(`opgen build` with nothing changed, `opgen check`) formats nothing it formatted before. An entry
that is missing, corrupt or unwritable is formatted again, silently: the output is the same. The
KEEP most recently used entries stay."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

import black

from opgen.cache import cache_dir, read_entry, touch, trim, write_entry

BLACK_MODE = black.Mode(line_length=100)
# Entries kept (the least recently used go first): a spec edit gives each of its files a new
# header, so new entries; at ~16 KB an entry this is ~64 MB.
KEEP = 4096


@lru_cache(maxsize=256)  # a process that renders a spec again (`opgen tune`, opgen's own tests)
def formatted(text: str) -> str:
    """black's output for a rendered file."""
    key = hashlib.sha256(
        json.dumps([black.__version__, repr(BLACK_MODE), text]).encode("utf-8")
    ).hexdigest()
    directory = cache_dir() / "black"
    entry = read_entry(directory, key) or {}
    kept = entry.get("text")
    # The output's own hash is kept beside it: a damaged entry is formatted again, never used.
    if isinstance(kept, str) and entry.get("sha256") == _sha256(kept):
        touch(directory, key)
        return kept
    out = black.format_str(text, mode=BLACK_MODE)
    try:
        write_entry(directory, key, {"text": out, "sha256": _sha256(out)})
    except OSError:
        return out  # a cache that cannot be written: the next process formats again
    trim(directory, KEEP)
    return out


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
