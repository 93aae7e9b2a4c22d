"""The format step: black's output, kept in the cache directory so that a new process (a rebuild
with nothing changed) formats nothing it formatted before."""

from __future__ import annotations

import hashlib
import json
import os

import black
import pytest

from opgen import format as format_step
from opgen.cache import trim
from opgen.format import BLACK_MODE, formatted

from conftest import old_cache_entries

RENDERED = "def f( x ):\n  return {'a':x}\n"


@pytest.fixture(autouse=True)
def new_process():
    """formatted() as a new process sees it: nothing kept in memory, no trim done yet."""
    formatted.cache_clear()
    trim.cache_clear()
    yield
    formatted.cache_clear()
    trim.cache_clear()


def entries(cache):
    return sorted((cache / "black").glob("*.json"))


def test_output_is_blacks_and_is_kept(compile_cache):
    out = formatted(RENDERED)
    assert out == black.format_str(RENDERED, mode=BLACK_MODE) == 'def f(x):\n    return {"a": x}\n'
    [entry] = entries(compile_cache)
    assert json.loads(entry.read_text())["text"] == out


def test_a_new_process_reads_the_kept_output(compile_cache):
    formatted(RENDERED)
    [entry] = entries(compile_cache)
    # Another text under the same key (with its hash): what a new process returns is the entry's.
    data = json.loads(entry.read_text())
    entry.write_text(json.dumps({**data, "text": "kept\n",
                                 "sha256": hashlib.sha256(b"kept\n").hexdigest()}))
    formatted.cache_clear()
    assert formatted(RENDERED) == "kept\n"


@pytest.mark.parametrize("damage", [
    lambda data: "{not json",
    lambda data: "",
    lambda data: json.dumps({**data, "key": "other"}),
    lambda data: json.dumps([data]),
    lambda data: json.dumps({**data, "text": data["text"].replace("return", "retur")}),
    lambda data: json.dumps({k: v for k, v in data.items() if k != "sha256"}),
], ids=["corrupt", "empty", "another key", "not an object", "text changed", "no hash"])
def test_a_damaged_entry_is_formatted_again_and_replaced(compile_cache, damage):
    formatted(RENDERED)
    [entry] = entries(compile_cache)
    entry.write_text(damage(json.loads(entry.read_text())))
    formatted.cache_clear()
    assert formatted(RENDERED) == 'def f(x):\n    return {"a": x}\n'
    assert json.loads(entry.read_text())["text"] == 'def f(x):\n    return {"a": x}\n'


def test_an_unwritable_cache_formats_all_the_same(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(tmp_path / "file/cache"))  # a directory under a file
    assert formatted(RENDERED) == 'def f(x):\n    return {"a": x}\n'
    formatted.cache_clear()
    assert formatted(RENDERED) == 'def f(x):\n    return {"a": x}\n'


def test_black_rejects_what_it_cannot_parse(compile_cache):
    with pytest.raises(black.InvalidInput):
        formatted("def f(:\n")
    assert not entries(compile_cache)


def test_the_least_recently_used_entries_go_past_keep(compile_cache, monkeypatch):
    """Past KEEP entries, a process's first write deletes the least recently used (by mtime:
    written or read) down to three quarters of KEEP; an entry read is marked used."""
    monkeypatch.setattr(format_step, "KEEP", 8)
    old = old_cache_entries(compile_cache / "black", 10)
    formatted(RENDERED)
    kept = entries(compile_cache)
    assert len(kept) == 6
    assert set(old[5:]) < set(kept)  # the new entry and the five most recent old ones
    [new] = set(kept) - set(old)
    os.utime(new, (500, 500))
    formatted.cache_clear()
    assert formatted(RENDERED) == 'def f(x):\n    return {"a": x}\n'
    assert new.stat().st_mtime > 10**9  # read: marked used now
