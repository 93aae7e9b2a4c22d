"""The `opgen` command end to end, in an empty temporary project (the test's working directory)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import CLI_ENV, REPO_ROOT

from opgen.manifest import parse_manifest

PACKAGE_FILES = [
    "__init__.py",
    "autograd.py",
    "bench_{name}.py",
    "hf.py",
    "kernels.py",
    "modules.py",
    "opgen-manifest.json",
    "spec.toml",
    "reference.py",
    "test_{name}.py",
]


FILE_COUNT = str(len(PACKAGE_FILES))  # as the build table prints it


def package_files(name: str) -> list[str]:
    return sorted(f.format(name=name) for f in PACKAGE_FILES)


def tree(directory: Path) -> list[str]:
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


def mtimes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


def build_row(stdout: str, spec: str) -> list[str]:
    """The summary table's row of one spec: spec, written, unchanged, passed, cached, seconds."""
    rows = [line.split() for line in stdout.splitlines() if line.split()[:1] == [spec]]
    assert len(rows) == 1, stdout
    return rows[0]


@pytest.fixture(scope="module")
def foo_built(tmp_path_factory) -> Path:
    """specs/foo.toml (the scaffold) and generated/foo/, built once for the module."""
    from opgen.cli import app

    root = tmp_path_factory.mktemp("foo_built")
    runner = CliRunner(env=CLI_ENV)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert runner.invoke(app, ["new", "attention", "--name", "foo"]).exit_code == 0
        result = runner.invoke(app, ["build", "--no-compile"])
        assert result.exit_code == 0, result.output
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def foo(project, foo_built):
    """A fresh copy of the built foo project as the working directory."""
    for part in ("specs", "generated"):
        shutil.copytree(foo_built / part, project / part)
    return project


def check(cli, *args):
    return cli("check", *args)


# --- list, version --------------------------------------------------------------------------------


def test_list(project, cli):
    result = cli("list")
    assert result.exit_code == 0
    assert "attention" in result.stdout.split()
    assert "flash attention" in result.stdout


def test_help_lists_each_command_on_one_line(cli):
    """`opgen --help` lists each command beside its docstring's first paragraph, on one line on a
    wide terminal: no break where the docstring's lines break."""
    import inspect

    from opgen.cli import app

    result = cli("--help")
    assert result.exit_code == 0
    for command in app.registered_commands:
        name = command.name or command.callback.__name__
        first = " ".join(inspect.cleandoc(command.callback.__doc__).split("\n\n")[0].split())
        rows = [line for line in result.stdout.splitlines() if line.split()[1:2] == [name]]
        assert len(rows) == 1 and first in rows[0], (name, rows)


def test_version(cli):
    from opgen import __version__

    result = cli("--version")
    assert result.exit_code == 0
    assert result.stdout == f"opgen {__version__}\n"


# --- new ------------------------------------------------------------------------------------------


def test_new_writes_the_scaffold(project, cli):
    result = cli("new", "attention")
    assert result.exit_code == 0, result.output
    assert "wrote specs/attention.toml" in result.stdout
    assert tree(project) == ["specs/attention.toml"]


SHIPPED = sorted(p.stem for p in (REPO_ROOT / "specs").glob("*.toml"))


def tuned_span(lines: list[str]) -> tuple[int, int] | None:
    """(first, past the last) line of the one run of [[tiling.tuned]] tables `opgen tune` writes,
    with the comment above them, or None without tables."""
    tuned = [i for i, line in enumerate(lines) if line.startswith("[[tiling.tuned]]")]
    if not tuned:
        return None
    start, end = tuned[0], tuned[-1] + 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    while end < len(lines) and lines[end].strip() and not lines[end].startswith(("[", "#")):
        end += 1
    return start, end


def without_tuned_tables(text: str) -> str:
    """text without its [[tiling.tuned]] tables (tuned_span), and the blank line before them: what
    a tune adds to a spec without tables."""
    lines = text.splitlines(keepends=True)
    span = tuned_span(lines)
    if span is None:
        return text
    start, end = span
    if start > 0 and not lines[start - 1].strip():
        start -= 1
    return "".join(lines[:start] + lines[end:])


def tuned_tables(text: str) -> str:
    """The [[tiling.tuned]] tables of text with the comments above them (tuned_span), as a
    scaffold's "tuned" template holds them."""
    lines = text.splitlines(keepends=True)
    start, end = tuned_span(lines)
    return "".join(lines[start:end])


@pytest.mark.parametrize("name", SHIPPED)
def test_new_scaffold_is_the_shipped_spec(project, cli, name, update_golden):
    """The shipped specs are the scaffolds: `opgen new NAME` writes specs/NAME.toml byte for byte,
    its [[tiling.tuned]] tables included, so that a new package starts on the tilings measured
    fastest. After `opgen tune specs/NAME.toml`, --update-golden carries its tables into the
    scaffold's "tuned" template."""
    from opgen.cli import scaffolds

    shipped = (REPO_ROOT / f"specs/{name}.toml").read_text(encoding="utf-8")
    tuned = scaffolds()[name][1].get("tuned")
    if update_golden and tuned:
        (REPO_ROOT / "templates" / tuned).write_text(tuned_tables(shipped), encoding="utf-8")
    result = cli("new", name)
    assert result.exit_code == 0, result.output
    written = (project / f"specs/{name}.toml").read_text(encoding="utf-8")
    hint = (f"rerun with --update-golden if specs/{name}.toml's [[tiling.tuned]] tables are new"
            if tuned else "")
    assert written == shipped, hint
    assert ("[[tiling.tuned]]" in shipped) == bool(tuned)


def test_a_new_package_runs_the_shipped_tuned_tilings(foo):
    """A package built from a scaffold picks its tilings from the scaffold's [[tiling.tuned]]
    entries: the same tables as the shipped package's kernels.py (the base tiling alone, a
    128 x 64 forward without a pipeline at D128, is far slower)."""
    def tables(path: Path) -> list[str]:
        text = path.read_text(encoding="utf-8")
        return [text[text.index(f"{name} = {{"):].split("\n}\n")[0]
                for name in ("FWD_TILINGS", "BWD_TILINGS")]

    ours = tables(foo / "generated/foo/kernels.py")
    assert ours == tables(REPO_ROOT / "generated/attention/kernels.py")
    assert "(128, True, 0)" in ours[0] and '"pingpong": True' in ours[0]


def test_without_tuned_tables_leaves_a_scaffold():
    """The helper above gives back the text `opgen tune` started from."""
    from opgen import tune
    from opgen.families.attention_tune import TUNER

    entries = {(64, False, 0): {"fwd": {"block_m": 128, "block_n": 128, "threads": 256, "num_stages": 2}},
               (128, True, 0): {"fwd": {"block_m": 128, "block_n": 64, "threads": 256, "num_stages": 1}}}
    attention = (REPO_ROOT / "tests/specs/attention_recompute.toml").read_text()
    tuned = tune.write_tuned(attention, TUNER, entries,
                             {((64, False, 0), "fwd"): "on NVIDIA H200, 2026-12-05",
                              ((128, True, 0), "fwd"): "on NVIDIA H100, 2026-12-04"})
    assert tuned != attention and without_tuned_tables(tuned) == attention


def test_list_shows_the_scaffolds(project, cli):
    result = cli("list")
    assert result.exit_code == 0
    words = result.stdout.split()
    assert all(name in words for name in SHIPPED)


def test_new_does_not_overwrite(project, cli):
    assert cli("new", "attention").exit_code == 0
    spec = project / "specs/attention.toml"
    spec.write_text(spec.read_text() + "# my edit\n")
    before = (spec.read_bytes(), spec.stat().st_mtime_ns)
    result = cli("new", "attention")
    assert result.exit_code == 2
    assert result.stderr.startswith("specs/attention.toml: already exists; not overwriting it")
    assert (spec.read_bytes(), spec.stat().st_mtime_ns) == before


def test_new_with_name_and_out(project, cli):
    result = cli("new", "attention", "--name", "foo", "--out", "specs/foo.toml")
    assert result.exit_code == 0, result.output
    text = (project / "specs/foo.toml").read_text()
    assert 'name = "foo"' in text
    assert "generated/foo/" in text and "generated/attention" not in text
    assert tree(project) == ["specs/foo.toml"]


def test_new_name_sets_the_default_path(project, cli):
    assert cli("new", "attention", "--name", "bar").exit_code == 0
    assert tree(project) == ["specs/bar.toml"]


def test_new_out_elsewhere(project, cli):
    result = cli("new", "attention", "--name", "baz", "--out", "ops/baz.toml")
    assert result.exit_code == 0, result.output
    assert "wrote ops/baz.toml" in result.stdout
    assert tree(project) == ["ops/baz.toml"]


@pytest.mark.parametrize("out, fragment", [
    ("README.md/x.toml", "README.md/x.toml: cannot write it: README.md is a file, not a directory"),
    ("/proc/nope/x.toml", "/proc/nope/x.toml: cannot write it (No such file or directory)"),
    ("a" * 300 + "/x.toml", "cannot write it (File name too long)"),
])
def test_new_out_that_cannot_be_written(project, cli, out, fragment):
    """An --out path opgen cannot write is one line on stderr, exit 2, no traceback."""
    (project / "README.md").write_text("readme\n")
    result = cli("new", "attention", "--out", out)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert fragment in result.stderr and len(result.stderr.splitlines()) == 1
    assert tree(project) == ["README.md"]


@pytest.mark.parametrize("name", ["My-Op", "my-op", "Foo", "__foo", "../evil", "2x", "a b"])
def test_new_bad_name(project, cli, name):
    result = cli("new", "attention", "--name", name)
    assert result.exit_code == 2, result.output
    assert "--name" in result.stderr
    assert tree(project) == []


@pytest.mark.parametrize("name", ["class", "caf\u00e9", ""])
def test_new_rejects_every_name_the_spec_rejects(project, cli, name):
    result = cli("new", "attention", "--name", name)
    assert result.exit_code == 2, result.output
    assert tree(project) == []


def test_new_unknown_scaffold(project, cli):
    result = cli("new", "convolution")
    assert result.exit_code == 2
    assert '"convolution"' in result.stderr and "attention" in result.stderr
    assert tree(project) == []


# --- build ----------------------------------------------------------------------------------------


def test_build_writes_the_packages(project, cli):
    assert cli("new", "attention", "--name", "foo").exit_code == 0
    assert cli("new", "attention", "--name", "bar").exit_code == 0
    specs = sorted(str(p) for p in Path("specs").glob("*.toml"))
    result = cli("build", "--no-compile", *specs)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (project / "generated").iterdir()) == ["bar", "foo"]
    for name in ("foo", "bar"):
        assert tree(project / "generated" / name) == package_files(name)
        assert build_row(result.stdout, f"specs/{name}.toml") == [
            f"specs/{name}.toml",
            FILE_COUNT,
            "0",
            "-",
            "-",
            "-",
        ]
    assert result.stderr == ""


def test_build_notes_the_variants_no_tuned_entry_serves(project, cli):
    """A head dim added to a scaffold has no [[tiling.tuned]] entry: the build says its calls run
    the base tiling and names the tune that would pick theirs (the head dim alone). The shipped
    specs have no such variant."""
    from opgen.cli import untuned_note
    from opgen.families import FAMILIES
    from opgen.spec import read_spec, validate

    assert cli("new", "attention", "--name", "foo").exit_code == 0
    spec = project / "specs/foo.toml"
    spec.write_text(spec.read_text().replace("head_dims = [64, 128]", "head_dims = [64, 96, 128]"))
    result = cli("build", "--no-compile")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        "note: specs/foo.toml: no [[tiling.tuned]] entry serves d96 full, d96 causal; those calls "
        "run the base tiling. On a Hopper GPU, `opgen tune specs/foo.toml --head-dims 96` times "
        "the candidates and writes the fastest.")
    for path in sorted((REPO_ROOT / "specs").glob("*.toml")):
        source = read_spec(path)
        spec = validate(FAMILIES[source.data["family"]].spec, source)
        assert untuned_note(str(path), spec) is None


def test_build_notes_an_untuned_channel_count(project, cli):
    """rmsnorm's entries are per channel count: a bench shape at a new one gets the note, with
    the tune of that count alone; a count whose entry sets one phase was tuned (the other phase
    kept the base tiling) and gets none."""
    assert cli("new", "rmsnorm", "--name", "norm").exit_code == 0
    spec = project / "specs/norm.toml"
    spec.write_text(spec.read_text().replace("{ rows = 4096, channels = 8192 },",
                                             "{ rows = 4096, channels = 8192 },\n"
                                             "    { rows = 4096, channels = 2048 },"))
    result = cli("build", "--no-compile")
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stdout.splitlines() if line.startswith("note:")]
    assert notes == ["note: specs/norm.toml: no [[tiling.tuned]] entry serves C=2048; those calls "
                     "run the base tiling. On a Hopper GPU, `opgen tune specs/norm.toml "
                     "--channels 2048` times the candidates and writes the fastest."]


def test_build_twice_changes_nothing(foo, cli):
    package = foo / "generated/foo"
    before = mtimes(package)
    contents = {p.name: p.read_bytes() for p in package.iterdir()}
    result = cli("build", "--no-compile", "specs/foo.toml")
    assert result.exit_code == 0, result.output
    assert build_row(result.stdout, "specs/foo.toml") == ["specs/foo.toml", "0", FILE_COUNT, "-", "-", "-"]
    assert mtimes(package) == before
    assert {p.name: p.read_bytes() for p in package.iterdir()} == contents
    assert sorted(p.name for p in (foo / "generated").iterdir()) == ["foo"], "no staging dirs left"


def test_rebuild_writes_only_what_changed(foo, cli):
    package = foo / "generated/foo"
    (package / "reference.py").write_text("# clobbered\n")
    before = mtimes(package)
    result = cli("build", "--no-compile")
    assert result.exit_code == 0, result.output
    assert build_row(result.stdout, "specs/foo.toml") == ["specs/foo.toml", "1", str(len(PACKAGE_FILES) - 1), "-", "-", "-"]
    after = mtimes(package)
    assert sorted(name for name in after if after[name] != before[name]) == ["reference.py"]
    assert sorted(p.name for p in (foo / "generated").iterdir()) == ["foo"], "no staging dirs left"


def test_spec_change_rewrites_every_header(foo, cli):
    """The spec hash is in every file's header: a spec edit rewrites the whole package."""
    edit_fwd_block_n(foo / "specs/foo.toml")
    result = cli("build", "--no-compile")
    assert result.exit_code == 0, result.output
    assert build_row(result.stdout, "specs/foo.toml") == ["specs/foo.toml", FILE_COUNT, "0", "-", "-", "-"]
    kernels = (foo / "generated/foo/kernels.py").read_text()
    assert re.search(r'^FWD_TILING = \{[^}]*"block_n": 32\b', kernels, re.MULTILINE)


def test_build_of_a_bad_spec_leaves_generated_alone(foo, cli):
    package = foo / "generated/foo"
    before = mtimes(package)
    (foo / "specs/foo.toml").write_text('name = "foo"\nfamily = "attention"\ncolour = 1\n')
    result = cli("build", "--no-compile")
    assert result.exit_code == 2
    assert result.stderr.startswith("specs/foo.toml: colour: unknown key")
    assert mtimes(package) == before


def test_build_the_same_spec_named_twice(foo, cli):
    result = cli("build", "--no-compile", "specs/foo.toml", "./specs/foo.toml")
    assert result.exit_code == 0, result.output


def test_build_without_specs(project, cli):
    result = cli("build", "--no-compile")
    assert result.exit_code == 2
    assert "no spec given and none found in specs/*.toml" in result.stderr


# --- check ----------------------------------------------------------------------------------------


def edit_fwd_block_n(spec: Path) -> None:
    text = spec.read_text()
    fwd = text.index("[tiling.fwd]")
    at = text.index("block_n = 64", fwd)
    assert at < text.index("[tiling.bwd]")
    spec.write_text(text[:at] + "block_n = 32" + text[at + len("block_n = 64") :])


def test_check_in_sync(foo, cli):
    result = check(cli)
    assert result.exit_code == 0, result.output
    assert result.stdout == "generated/ matches 1 spec(s)\n"
    assert check(cli, "specs/foo.toml").exit_code == 0


def test_check_ignores_bytecode(foo, cli):
    cache = foo / "generated/foo/__pycache__"
    cache.mkdir()
    (cache / "kernels.cpython-311.pyc").write_bytes(b"\0")
    assert check(cli).exit_code == 0


def test_check_stale_after_spec_edit(foo, cli):
    edit_fwd_block_n(foo / "specs/foo.toml")
    result = check(cli)
    assert result.exit_code == 1
    assert "generated/foo/kernels.py: stale" in result.stdout
    assert "generated/foo/opgen-manifest.json: stale" in result.stdout
    assert "hand-edited" not in result.stdout
    assert "-    block_n=64" in result.stdout or "block_n" in result.stdout, "shows the diff"
    assert "out of step" in result.stderr
    assert cli("build", "--no-compile").exit_code == 0
    assert check(cli).exit_code == 0


def test_comment_and_whitespace_edits_leave_the_package_as_it_is(foo, cli):
    """Headers and the manifest hash the validated spec, not the file: a comment, blank lines or
    indentation change no generated file; only the package's copy of the spec follows."""
    spec = foo / "specs/foo.toml"
    package = foo / "generated/foo"
    before = {p.name: p.read_bytes() for p in package.iterdir()}
    text = spec.read_text()
    spec.write_text("# a new comment\n\n" + text.replace("\n[", "\n\n  [") + "\n# the end\n")
    result = check(cli)
    assert result.exit_code == 1
    assert sorted(re.findall(r"^(\S+): stale", result.stdout, re.MULTILINE)) == [
        "generated/foo/opgen-manifest.json", "generated/foo/spec.toml"]
    result = cli("build", "--no-compile")
    assert result.exit_code == 0, result.output
    after = {p.name: p.read_bytes() for p in package.iterdir()}
    assert after["spec.toml"] == spec.read_bytes()
    assert sorted(n for n in after if after[n] != before[n]) == ["opgen-manifest.json", "spec.toml"]
    assert parse_manifest(after["opgen-manifest.json"]).spec_sha256 == parse_manifest(
        before["opgen-manifest.json"]).spec_sha256
    assert check(cli).exit_code == 0
    edit_fwd_block_n(spec)
    assert check(cli).exit_code == 1


def test_check_hand_edited(foo, cli):
    kernels = foo / "generated/foo/kernels.py"
    kernels.write_text(kernels.read_text().replace("\n\n\n", "\n\n\n# tuned by hand\n", 1))
    result = check(cli)
    assert result.exit_code == 1
    assert "generated/foo/kernels.py: hand-edited" in result.stdout
    assert "+# tuned by hand" not in result.stdout and "-# tuned by hand" in result.stdout
    assert "stale" not in result.stdout


def test_check_hand_edit_and_spec_change(foo, cli):
    """A file edited by hand is reported as such even when the spec changed as well."""
    kernels = foo / "generated/foo/kernels.py"
    kernels.write_text(kernels.read_text() + "# tuned by hand\n")
    edit_fwd_block_n(foo / "specs/foo.toml")
    result = check(cli)
    assert result.exit_code == 1
    assert "generated/foo/kernels.py: hand-edited" in result.stdout
    assert "generated/foo/opgen-manifest.json: stale" in result.stdout


def test_check_missing(foo, cli):
    (foo / "generated/foo/reference.py").unlink()
    result = check(cli)
    assert result.exit_code == 1
    assert "generated/foo/reference.py: missing" in result.stdout


def test_check_extra(foo, cli):
    (foo / "generated/foo/notes.txt").write_text("mine\n")
    result = check(cli)
    assert result.exit_code == 1
    assert "generated/foo/notes.txt: extra" in result.stdout


def test_build_repairs_every_drift(foo, cli):
    package = foo / "generated/foo"
    (package / "notes.txt").write_text("mine\n")
    (package / "reference.py").unlink()
    (package / "kernels.py").write_text("# gone\n")
    assert check(cli).exit_code == 1
    result = cli("build", "--no-compile")
    assert result.exit_code == 0, result.output
    assert tree(package) == package_files("foo")
    assert check(cli).exit_code == 0


def test_check_orphan_package(foo, cli):
    assert cli("new", "attention", "--name", "bar").exit_code == 0
    assert cli("build", "--no-compile").exit_code == 0
    (foo / "specs/bar.toml").unlink()
    result = check(cli)
    assert result.exit_code == 1
    assert "generated/bar/: extra" in result.stdout
    assert "generated/foo" not in result.stdout
    # Checking named specs only looks at their own packages.
    assert check(cli, "specs/foo.toml").exit_code == 0


def test_check_never_writes(foo, cli):
    edit_fwd_block_n(foo / "specs/foo.toml")
    before = mtimes(foo / "generated/foo")
    assert check(cli).exit_code == 1
    assert mtimes(foo / "generated/foo") == before


def test_check_bad_spec(foo, cli):
    (foo / "specs/foo.toml").write_text('name = "foo"\nfamily = "attention"\ndtypes = ["float8"]\n')
    result = check(cli)
    assert result.exit_code == 2
    assert (
        result.stderr
        == "specs/foo.toml: dtypes.0: must be one of float16, bfloat16 (got \"float8\")\n"
    )


# --- explain --------------------------------------------------------------------------------------


def test_explain(foo, cli):
    result = cli("explain", "specs/foo.toml")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("specs/foo.toml: attention 'foo'\n")
    for factory in ("foo_fwd", "foo_bwd_preprocess", "foo_bwd", "foo_bwd_postprocess"):
        assert factory in result.stdout.split()


def test_explain_shape(foo, cli):
    shape = "batch=2,heads=8,seq_len=1024,head_dim=64,causal=1,dtype=bfloat16"
    result = cli("explain", "specs/foo.toml", "--shape", shape)
    assert result.exit_code == 0, result.output
    assert "batch=2 heads=8" in result.stdout and "seq_len=1024" in result.stdout


@pytest.mark.parametrize(
    "shape, fragment",
    [
        ("batch=2", "missing"),
        ("batch=x,heads=1,seq_len=64,head_dim=64", "batch must be an integer"),
        ("colour=1", "expected key=value"),
    ],
)
def test_explain_bad_shape(foo, cli, shape, fragment):
    result = cli("explain", "specs/foo.toml", "--shape", shape)
    assert result.exit_code == 2
    assert result.stderr.startswith("--shape: ") and fragment in result.stderr


@pytest.mark.parametrize(
    "shape",
    [
        "batch=1,heads=0,seq_len=128,head_dim=64",
        "batch=1,heads=4,seq_len=128,head_dim=64,dtype=float8",
    ],
)
def test_explain_rejects_impossible_shapes(foo, cli, shape):
    result = cli("explain", "specs/foo.toml", "--shape", shape)
    assert result.exit_code == 2, result.output


# --- vendoring: --out, the package's own spec.toml --------------------------------------------------


def vendored(foo, cli) -> Path:
    """foo built into vendor/ops/ (a directory of another repository, say) and specs/ gone: only
    the package is at hand."""
    result = cli("build", "--no-compile", "specs/foo.toml", "--out", "vendor/ops")
    assert result.exit_code == 0, result.output
    shutil.rmtree(foo / "specs")
    shutil.rmtree(foo / "generated")
    return foo / "vendor/ops/foo"


def test_build_out_writes_dir_name(foo, cli):
    spec = (foo / "specs/foo.toml").read_bytes()
    package = vendored(foo, cli)
    assert tree(package) == package_files("foo")
    assert (package / "spec.toml").read_bytes() == spec
    header = (package / "kernels.py").read_text().splitlines()[0]
    assert " from specs/foo.toml (sha256:" in header
    assert parse_manifest((package / "opgen-manifest.json").read_bytes()).spec == "specs/foo.toml"
    result = check(cli, "--out", "vendor/ops")
    assert result.exit_code == 0, result.output
    assert result.stdout == "vendor/ops/ matches 1 spec(s)\n"


def test_a_vendored_package_s_example_imports_it_from_there(foo, cli):
    """The docstring example of a package built with --out imports it by that path (a dotted
    module path of the output root), and runs from the project root; an output root that is no
    module path (outside the working directory: absolute) leaves the bare package name."""
    package = vendored(foo, cli)
    init = (package / "__init__.py").read_text()
    assert ">>> from vendor.ops.foo import foo" in init
    assert "generated." not in init
    for part in ("vendor", "vendor/ops"):
        (foo / part / "__init__.py").touch()
    run = ("import doctest, vendor.ops.foo as m; r = doctest.testmod(m); "
           "print(r.attempted, r.failed)")
    result = subprocess.run([sys.executable, "-c", run], cwd=foo, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    attempted, failed = map(int, result.stdout.split()[-2:])
    assert attempted > 0 and failed == 0, result.stdout
    elsewhere = foo.parent / f"{foo.name}-elsewhere"  # outside the working directory: absolute
    result = cli("build", "--no-compile", "vendor/ops/foo/spec.toml", "--out", str(elsewhere))
    assert result.exit_code == 0, result.output
    assert ">>> from foo import foo" in (elsewhere / "foo/__init__.py").read_text()


def test_rebuild_from_the_package_spec_is_byte_for_byte(foo, cli):
    """A package rebuilt from its own spec.toml is the package: same headers, same manifest (it
    still names the spec it was first built from), and its owner does not refuse the build."""
    package = vendored(foo, cli)
    before = {p.name: p.read_bytes() for p in package.iterdir()}
    result = cli("build", "--no-compile", "vendor/ops/foo/spec.toml", "--out", "vendor/ops")
    assert result.exit_code == 0, result.output
    assert build_row(result.stdout, "specs/foo.toml")[1:3] == ["0", FILE_COUNT]
    assert {p.name: p.read_bytes() for p in package.iterdir()} == before
    edit_fwd_block_n(package / "spec.toml")  # an edit of the copy, rebuilt from the copy
    result = cli("build", "--no-compile", "vendor/ops/foo/spec.toml", "--out", "vendor/ops")
    assert result.exit_code == 0, result.output
    assert "block_n" in (package / "kernels.py").read_text()
    assert check(cli, "--out", "vendor/ops").exit_code == 0
    # Any other path is another spec: the package is not its to replace.
    shutil.copy(package / "spec.toml", foo / "copy.toml")
    result = cli("build", "--no-compile", "copy.toml", "--out", "vendor/ops")
    assert result.exit_code == 2
    assert "vendor/ops/foo/ was built from specs/foo.toml" in result.stderr


def test_check_reports_a_package_spec_that_is_not_the_one_it_was_built_from(foo, cli):
    package = vendored(foo, cli)
    with (package / "spec.toml").open("a") as file:
        file.write("# edited\n")
    result = check(cli, "--out", "vendor/ops")
    assert result.exit_code == 1
    assert ("vendor/ops/foo/spec.toml: hand-edited (differs from the spec the package was built "
            "from; rebuild the package from it (`opgen build vendor/ops/foo/spec.toml --out "
            "vendor/ops`) or undo the edit)") in result.stdout


def test_check_against_the_spec_reports_the_package_spec(foo, cli):
    assert cli("build", "--no-compile", "--out", "vendor").exit_code == 0
    with (foo / "specs/foo.toml").open("a") as file:
        file.write("# a comment\n")
    result = check(cli, "--out", "vendor")
    assert result.exit_code == 1
    assert "vendor/foo/spec.toml: stale" in result.stdout
    assert "vendor/foo/kernels.py" not in result.stdout


def test_out_that_is_a_file(foo, cli):
    (foo / "afile").write_text("")
    result = cli("build", "--no-compile", "--out", "afile")
    assert result.exit_code == 2
    assert "--out: afile is not a directory" in result.stderr


# --- test, bench ----------------------------------------------------------------------------------


def test_generated_tests_skip_without_cuda(foo, run_opgen):
    """`opgen test` runs the package's pytest file; on a CPU machine the GPU tests skip, saying why,
    and the run exits 1: no GPU test ran. --allow-skip accepts that."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the generated tests would really run")
    result = run_opgen("test", "foo", "-q", "-rs", "-p", "no:cacheprovider", cwd=foo)
    assert result.returncode == 1, result.stdout + result.stderr
    assert " skipped" in result.stdout and "failed" not in result.stdout
    assert "needs a CUDA GPU" in result.stdout
    assert "opgen test: no GPU test ran" in result.stdout and "--allow-skip" in result.stdout
    allowed = run_opgen("test", "foo", "--allow-skip", "-q", "-p", "no:cacheprovider", cwd=foo)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert " skipped" in allowed.stdout and "no GPU test ran" not in allowed.stdout


def test_generated_tests_that_fail_still_fail_without_cuda(foo, run_opgen):
    """The no-GPU rule only turns a passing run into a failing one: a failing CPU test keeps
    pytest's own exit status and report."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    test_file = foo / "generated" / "foo" / "test_foo.py"
    test_file.write_text(test_file.read_text() + "\n\ndef test_broken():\n    assert False\n")
    result = run_opgen("test", "foo", "-q", "-p", "no:cacheprovider", cwd=foo)
    assert result.returncode == 1 and "1 failed" in result.stdout, result.stdout


def test_bench_without_cuda_says_so_in_one_line(foo, run_opgen):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the bench would really run")
    result = run_opgen("bench", "foo", cwd=foo)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "bench_foo: needs a CUDA GPU (torch.cuda.is_available() is False); nothing was timed"
    ), result.stderr


def test_generated_tests_of_a_vendored_package_skip_without_cuda(foo, cli, run_opgen):
    """`opgen test NAME --out DIR` runs DIR/NAME's tests, DIR anywhere (here inside a package)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the generated tests would really run")
    vendored(foo, cli)
    for init in ("vendor/__init__.py", "vendor/ops/__init__.py"):
        (foo / init).write_text("")
    result = run_opgen("test", "foo", "--out", "vendor/ops", "--allow-skip", "-q", "-rs", "-p",
                       "no:cacheprovider", cwd=foo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " skipped" in result.stdout and "needs a CUDA GPU" in result.stdout
    assert check(cli, "--out", "vendor/ops").exit_code == 0, "__init__.py of DIR is allowed"


@pytest.mark.parametrize("command", ["test", "bench"])
def test_run_commands_need_a_built_package(project, cli, command):
    result = cli(command, "nope")
    assert result.exit_code == 2
    assert "generated/nope/ does not exist; run `opgen build` first" in result.stderr
    result = cli(command, "nope", "--out", "vendor")
    assert result.exit_code == 2
    assert "vendor/nope/ does not exist; run `opgen build` first" in result.stderr


def test_compile_failure_message_groups_variants_and_hints_at_layout_conflicts():
    from opgen.cli import CompileFailure

    labels = tuple(f"bwd bshd float16 d64 v{i}" for i in range(5))
    conflict = CompileFailure("specs/a.toml", "a_bwd", "tiling.bwd",
                              "InternalError: Layout infer conflict between x and y\n  loop ...", labels)
    text = conflict.message()
    assert text.startswith("specs/a.toml: kernel a_bwd failed the compile check in 5 variant(s) "
                           "(bwd bshd float16 d64 v0, bwd bshd float16 d64 v1, "
                           "bwd bshd float16 d64 v2, and 2 more):\n  InternalError: Layout infer")
    assert text.endswith("hint: the tile sizes and threads of tiling.bwd do not fit one another in "
                         "TileLang's layout inference (for example 64 rows over 256 threads); "
                         "change tiling.bwd.threads or its block sizes")
    other = CompileFailure("specs/a.toml", "a_fwd", "tiling.fwd", "TypeError: boom", labels[:1])
    assert other.message() == ("specs/a.toml: kernel a_fwd failed the compile check in 1 variant(s) "
                               "(bwd bshd float16 d64 v0):\n  TypeError: boom")
