"""A corpus of invalid specs and the exact errors opgen prints for them.

Each tests/invalid_specs/NAME.toml is copied to specs/NAME.toml of an empty project and built with
`opgen build --no-compile specs/NAME.toml` (the CLI in the test's process: a process of its own
per case cost half a second each, mostly Python's start); NAME.expected holds the whole stderr: one
`specs/NAME.toml: field.path: message` line per problem. Exit code 2, no traceback, nothing
written. The installed `opgen`, in a process of its own, builds the whole corpus at once and must
print every case's .expected in turn (test_the_whole_corpus_in_one_process), and the other tests
here run it as a user does too. `pytest --update-golden` rewrites the .expected files from
opgen's output.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from conftest import TESTS_DIR

CORPUS = TESTS_DIR / "invalid_specs"

# opgen/cli.py prints through rich Consoles of a fixed width (160 columns when the stream is not a
# terminal), which wrap a long problem over several lines. The .expected files of these cases
# hold the intended one-line-per-problem output (recorded on a wide console); --update-golden
# leaves them alone. Strict: once the wrapping is fixed they pass, and the marks must go.
CASES = [
    pytest.param(path, id=path.stem)
    for path in sorted(CORPUS.glob("*.toml"))
]
PATHS = [p.values[0] for p in CASES]


def _project_with(tmp_path: Path, case: Path) -> Path:
    (tmp_path / "specs").mkdir()
    shutil.copyfile(case, tmp_path / "specs" / case.name)
    return tmp_path


def test_corpus_is_complete(update_golden):
    assert len(PATHS) >= 15
    if update_golden:
        return
    missing = [c.name for c in PATHS if not c.with_suffix(".expected").is_file()]
    assert not missing, f"no .expected for {missing}; run pytest --update-golden"
    orphans = [e.name for e in CORPUS.glob("*.expected") if not e.with_suffix(".toml").is_file()]
    assert not orphans, f".expected files without a spec: {orphans}"


@pytest.mark.parametrize("case", CASES)
def test_invalid_spec(case, tmp_path, monkeypatch, cli, update_golden):
    project = _project_with(tmp_path, case)
    monkeypatch.chdir(project)
    spec = f"specs/{case.name}"
    # An exception other than the CLI's own exit propagates (and fails the test) with its traceback.
    result = cli("build", "--no-compile", spec, catch_exceptions=False)

    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.exit_code == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert sorted(p.name for p in project.iterdir()) == ["specs"], "nothing may be written"

    expected_file = case.with_suffix(".expected")
    if update_golden:
        expected_file.write_text(result.stderr, encoding="utf-8")
    expected = expected_file.read_text(encoding="utf-8")
    assert result.stderr == expected
    # One problem a line, each naming the file first.
    lines = expected.splitlines()
    assert lines and all(line.startswith(f"{spec}: ") for line in lines), expected


def test_all_files_are_reported_at_once(tmp_path, run_opgen):
    """Several bad specs in one build: every file's problems, in the order given."""
    names = ["name_dash", "tolerance_out_of_range", "unknown_top_level_key"]
    (tmp_path / "specs").mkdir()
    for name in names:
        shutil.copyfile(CORPUS / f"{name}.toml", tmp_path / "specs" / f"{name}.toml")
    result = run_opgen("build", "--no-compile", *[f"specs/{n}.toml" for n in names], cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "".join(
        (CORPUS / f"{name}.expected").read_text(encoding="utf-8") for name in names
    )
    assert not (tmp_path / "generated").exists()


def test_the_whole_corpus_in_one_process(tmp_path, run_opgen):
    """`opgen build --no-compile` of every case at once, as a user runs it (its own process, stdin
    closed, output to pipes): exit code 2, no traceback, nothing on stdout, nothing written, and
    each case's .expected in the order given, byte for byte."""
    (tmp_path / "specs").mkdir()
    for case in PATHS:
        shutil.copyfile(case, tmp_path / "specs" / case.name)
    result = run_opgen("build", "--no-compile", *[f"specs/{c.name}" for c in PATHS], cwd=tmp_path)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    assert result.stderr == "".join(
        c.with_suffix(".expected").read_text(encoding="utf-8") for c in PATHS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["specs"], "nothing may be written"


def test_one_bad_spec_stops_the_whole_build(tmp_path, run_opgen):
    """A good spec next to a bad one is not written either: a build is all or nothing."""
    (tmp_path / "specs").mkdir()
    shutil.copyfile(CORPUS / "name_dash.toml", tmp_path / "specs" / "bad.toml")
    (tmp_path / "specs" / "good.toml").write_text('name = "good"\nfamily = "attention"\n')
    result = run_opgen("build", "--no-compile", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("specs/bad.toml: name: ")
    assert not (tmp_path / "generated").exists()


def test_duplicate_names_are_rejected(tmp_path, run_opgen):
    (tmp_path / "specs").mkdir()
    for stem in ("a", "b"):
        (tmp_path / "specs" / f"{stem}.toml").write_text('name = "same"\nfamily = "attention"\n')
    result = run_opgen("build", "--no-compile", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "specs/b.toml: name: 'same' is also the name in specs/a.toml; each spec needs its own name\n"
    )
    assert not (tmp_path / "generated").exists()


def test_missing_spec_file(tmp_path, run_opgen):
    result = run_opgen("build", "--no-compile", "specs/nope.toml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "specs/nope.toml: cannot read file (No such file or directory)\n"
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_fifo_is_refused_without_reading_it(tmp_path, run_opgen):
    """A FIFO with no writer: opening it to read would wait for one forever."""
    (tmp_path / "specs").mkdir()
    os.mkfifo(tmp_path / "specs" / "pipe.toml")
    result = run_opgen("build", "--no-compile", "specs/pipe.toml", cwd=tmp_path, timeout=30)
    assert result.returncode == 2
    assert result.stderr == "specs/pipe.toml: not a regular file (a FIFO)\n"
    assert not (tmp_path / "generated").exists()


def test_directory_and_device_are_refused(tmp_path, run_opgen):
    (tmp_path / "specs" / "dir.toml").mkdir(parents=True)
    result = run_opgen("build", "--no-compile", "specs/dir.toml", cwd=tmp_path, timeout=30)
    assert (result.returncode, result.stderr) == (
        2, "specs/dir.toml: not a regular file (a directory)\n")
    if Path("/dev/zero").exists():
        result = run_opgen("build", "--no-compile", "/dev/zero", cwd=tmp_path, timeout=30)
        assert (result.returncode, result.stderr) == (
            2, "/dev/zero: not a regular file (a character device)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["specs"]


def test_debug_shows_the_traceback(tmp_path, run_opgen):
    project = _project_with(tmp_path, CORPUS / "unknown_top_level_key.toml")
    result = run_opgen(
        "--debug", "build", "--no-compile", "specs/unknown_top_level_key.toml", cwd=project
    )
    assert result.returncode != 0
    assert "Traceback" in result.stderr
    assert "OpgenError" in result.stderr
    assert "colour" in result.stderr
    assert not (project / "generated").exists()


def test_errors_are_not_wrapped(tmp_path, run_opgen):
    """A problem is one line whatever the console (a pipe or a CI log has no width)."""
    case = CORPUS / "smem_over_limit.toml"
    project = _project_with(tmp_path, case)
    result = run_opgen("build", "--no-compile", f"specs/{case.name}", cwd=project, wide=False)
    assert result.returncode == 2
    assert result.stderr == case.with_suffix(".expected").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "text",
    ['name = "x"\nfamily = ["attention"]\n', 'name = "x"\n[family]\nname = "attention"\n'],
    ids=["family-list", "family-table"],
)
def test_family_of_the_wrong_type(tmp_path, run_opgen, text):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "x.toml").write_text(text)
    result = run_opgen("build", "--no-compile", "specs/x.toml", cwd=tmp_path)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    assert result.stderr.startswith("specs/x.toml: family: must be one of attention")
