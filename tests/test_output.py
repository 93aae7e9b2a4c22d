"""Writing packages: ownership, interrupts at any moment, SIGKILL, concurrent builds; and what
`opgen check` reports (corrupt manifests, line endings, strays, leftovers, the compile flag)."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

from opgen import output
from opgen.compile_cache import check_record, toolchain
from opgen.manifest import MANIFEST, parse_manifest
from opgen.output import leftovers, read_tree, write
from opgen.render import generate, without_header


def retile(spec: Path) -> None:
    """Change the fwd tiling of a spec made by rmsnorm_spec: kernels.py changes."""
    text = spec.read_text(encoding="utf-8")
    assert "[tiling.fwd]\nblock_rows = 1\n" in text
    spec.write_text(text.replace("[tiling.fwd]\nblock_rows = 1\n", "[tiling.fwd]\nblock_rows = 2\n"),
                    encoding="utf-8")


def rmsnorm_spec(project: Path, name: str = "norm", path: str = "specs/norm.toml") -> Path:
    text = (REPO_ROOT / "specs/rmsnorm.toml").read_text(encoding="utf-8")
    text = text.replace('name = "rmsnorm"', f'name = "{name}"')
    spec = project / path
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(text, encoding="utf-8")
    return spec


def passed_check(gen) -> dict:
    """write()'s arguments for a package whose kernels passed the compile check, as a build
    records it."""
    return {"compile_checked": True,
            "compiled_with": check_record(toolchain(), gen.plan.compile_jobs)}


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """Two renderings of one package (old and new tiling), rendered once for the module."""
    project = tmp_path_factory.mktemp("versions")
    cwd = os.getcwd()
    os.chdir(project)
    try:
        spec = Path("specs/norm.toml")
        rmsnorm_spec(project)
        old = generate(spec)
        retile(spec)
        new = generate(spec)
    finally:
        os.chdir(cwd)
    assert old.files["kernels.py"] != new.files["kernels.py"]
    return old, new


def as_bytes(gen) -> dict[str, bytes]:
    return {name: text.encode("utf-8") for name, text in gen.files.items()}


def package(root: Path) -> dict[str, bytes]:
    return read_tree(root / "generated" / "norm")


# --- interrupts ---------------------------------------------------------------------------------

TRACED = {output.__file__, shutil.__file__}


def write_interrupted_at(n: int, gen, root: Path) -> bool:
    """write(gen, root) with a KeyboardInterrupt raised at its n-th traced line (in opgen's
    output module and in shutil); False when the write has fewer lines than n."""
    seen = 0

    def local(frame, event, arg):
        nonlocal seen
        if event == "line":
            seen += 1
            if seen == n:
                raise KeyboardInterrupt
        return local

    def hook(frame, event, arg):
        # Not inside the lock: an exception injected into its own release would leave this
        # process holding it (a real process ends with its locks; see output._locked).
        if frame.f_code is output._locked.__wrapped__.__code__:
            return None
        return local if frame.f_code.co_filename in TRACED else None

    sys.settrace(hook)
    try:
        write(gen, root)
    except BaseException:
        # Usually the KeyboardInterrupt; library code caught mid-cleanup may turn it into
        # another error (shutil.rmtree closing a descriptor twice): the tree must hold all the same.
        if seen < n:
            raise
        return True
    finally:
        sys.settrace(None)
    return seen >= n


@pytest.mark.parametrize("exchange", [True, False], ids=["atomic-exchange", "two-renames"])
def test_an_interrupt_anywhere_in_write_loses_nothing(tmp_path, versions, monkeypatch, exchange):
    """A KeyboardInterrupt at every single line write() runs: the package stays present and whole
    (old or new), and the next write leaves no leftovers. Without an atomic exchange the two
    renames can be split by an exception that is not a signal: the next write restores the old
    tree then."""
    if not exchange:
        monkeypatch.setattr(output, "_exchange", lambda a, b: False)
    old, new = versions
    whole = (as_bytes(old), as_bytes(new))
    n = 0
    while True:
        n += 1
        root = tmp_path / str(n)
        write(old, root)
        if not write_interrupted_at(n, new, root):
            break
        if exchange:
            assert package(root) in whole, f"interrupt at line {n}: package not whole"
        write(new, root)
        assert package(root) == whole[1]
        assert leftovers(root / "generated") == [], n
        shutil.rmtree(root)
    assert n > 30, "the trace saw too few lines to mean anything"


CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from types import SimpleNamespace
    from opgen.output import write
    from opgen.plan import SourceInfo
    from opgen.render import Generated
    root, *trees = sys.argv[1:]
    gens = []
    for tree in trees:
        data = json.loads(Path(tree).read_text())
        plan = SimpleNamespace(source=SourceInfo(*data["source"]))
        gens.append(Generated("norm", data["spec"], plan, data["files"]))
    print("ready", flush=True)
    i = 0
    while True:
        write(gens[i % 2], Path(root))
        i += 1
""")


def start_writer(tmp_path: Path, root: Path, versions) -> subprocess.Popen:
    trees = []
    for i, gen in enumerate(versions):
        path = tmp_path / f"tree{i}.json"
        source = gen.plan.source
        path.write_text(json.dumps({
            "spec": gen.spec_path, "files": gen.files,
            "source": [source.spec_path, source.spec_sha256, source.opgen_version],
        }))
        trees.append(str(path))
    writer = subprocess.Popen([sys.executable, "-c", CHILD, str(root), *trees],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "ready\n", writer.stderr.read()
    return writer


def test_sigkill_during_writes_loses_nothing(tmp_path, versions):
    """SIGKILL a process that rewrites the package in a loop, at random moments: the package is
    always present and whole, and the next write removes what the killed one left."""
    whole = (as_bytes(versions[0]), as_bytes(versions[1]))
    rng = random.Random(0)
    for attempt in range(12):
        root = tmp_path / f"r{attempt}"
        writer = start_writer(tmp_path, root, versions)
        time.sleep(rng.uniform(0.05, 0.4))
        writer.kill()
        writer.wait()
        assert package(root) in whole, f"attempt {attempt}: package not whole"
        write(versions[0], root)
        assert package(root) == whole[0] and leftovers(root / "generated") == []


def test_concurrent_builds_of_one_package(tmp_path, versions):
    """Four processes rewriting one package at once: no errors, the package always whole."""
    root = tmp_path / "root"
    writers = [start_writer(tmp_path, root, versions) for _ in range(4)]
    whole = (as_bytes(versions[0]), as_bytes(versions[1]))
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        with output._locked(root / "generated", exclusive=False):
            assert package(root) in whole
        time.sleep(0.01)
    for writer in writers:
        assert writer.poll() is None, writer.stderr.read()  # still running: nothing raised
        writer.kill()
        writer.wait()


def test_recover_restores_a_package_caught_between_two_renames(tmp_path, versions):
    """Where the system has no atomic exchange, a SIGKILL between the renames leaves only
    `.norm.old`: the next write puts it back before anything else."""
    old, _ = versions
    root = tmp_path
    write(old, root)
    out_root = root / "generated"
    os.replace(out_root / "norm", out_root / ".norm.old")
    (out_root / ".norm.staging-x1y2").mkdir()
    assert [p.name for p in leftovers(out_root)] == [".norm.old", ".norm.staging-x1y2"]
    assert write(old, root).written == 0  # the restored package is already up to date
    assert package(root) == as_bytes(old)
    assert leftovers(out_root) == []


# --- ownership ----------------------------------------------------------------------------------


def test_a_spec_cannot_replace_another_specs_package(project, cli):
    """rmsnorm's spec renamed to `matmul` must not overwrite the matmul package."""
    shutil.copytree(REPO_ROOT / "specs", project / "specs")
    assert cli("build", "--no-compile", "specs/matmul.toml").exit_code == 0
    before = read_tree(project / "generated/matmul")
    rmsnorm_spec(project, name="matmul", path="x/rms_as_matmul.toml")

    result = cli("build", "--no-compile", "x/rms_as_matmul.toml")
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "specs/matmul.toml" in result.stderr and "x/rms_as_matmul.toml" in result.stderr
    assert "--force" in result.stderr
    assert read_tree(project / "generated/matmul") == before

    result = cli("build", "--no-compile", "--force", "x/rms_as_matmul.toml")
    assert result.exit_code == 0, result.output
    manifest = parse_manifest((project / "generated/matmul" / MANIFEST).read_bytes())
    assert manifest.spec == "x/rms_as_matmul.toml"
    # The same spec path owns it now: a rebuild needs no --force.
    assert cli("build", "--no-compile", "x/rms_as_matmul.toml").exit_code == 0


def test_a_directory_opgen_did_not_write_is_not_replaced(project, cli):
    rmsnorm_spec(project)
    handmade = project / "generated/norm"
    handmade.mkdir(parents=True)
    (handmade / "mine.py").write_text("precious = 1\n")
    result = cli("build", "--no-compile", "specs/norm.toml")
    assert result.exit_code == 2
    assert "generated/norm/ exists and was not written by opgen" in result.stderr
    assert read_tree(handmade) == {"mine.py": b"precious = 1\n"}
    assert cli("build", "--no-compile", "--force", "specs/norm.toml").exit_code == 0
    assert "mine.py" not in read_tree(handmade)


def test_a_corrupt_manifest_blocks_the_build_until_forced(project, cli):
    rmsnorm_spec(project)
    assert cli("build", "--no-compile").exit_code == 0
    (project / "generated/norm" / MANIFEST).write_text('{"files": [1, 2]}')
    result = cli("build", "--no-compile")
    assert result.exit_code == 2
    assert "generated/norm/opgen-manifest.json is corrupt" in result.stderr
    assert cli("build", "--no-compile", "--force").exit_code == 0
    assert cli("check").exit_code == 0


# --- check --------------------------------------------------------------------------------------


@pytest.fixture
def built(project, cli):
    rmsnorm_spec(project)
    result = cli("build", "--no-compile")
    assert result.exit_code == 0, result.output
    assert cli("check").exit_code == 0
    return project


@pytest.mark.parametrize("text, fragment", [
    ('{"files": [1, 2]}', "not written by opgen (generator null)"),
    ('{"generator": "opgen 0.1.0", "spec": "specs/norm.toml", "spec_sha256": "0", "files": [1, 2]}',
     "'files' must map file names to hashes (got [1, 2])"),
    ("[1, 2]", "not a JSON object"),
    ("{not json", "not valid JSON"),
    ('{"generator": "sqlc 1.0", "files": {}}', 'not written by opgen (generator "sqlc 1.0")'),
])
def test_check_reports_a_corrupt_or_foreign_manifest(built, cli, text, fragment):
    (built / "generated/norm" / MANIFEST).write_text(text)
    result = cli("check")
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"generated/norm/{MANIFEST}: corrupt ({fragment}" in result.stdout, result.stdout


def test_check_compares_bytes_crlf_is_a_hand_edit(built, cli):
    path = built / "generated/norm/reference.py"
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    result = cli("check")
    assert result.exit_code == 1
    assert "generated/norm/reference.py: hand-edited" in result.stdout
    assert "only the line endings differ: CRLF on disk" in result.stdout
    result = cli("build", "--no-compile")
    assert result.exit_code == 0
    assert b"\r\n" not in path.read_bytes()
    assert cli("check").exit_code == 0


def test_check_reports_strays_and_unmanaged_directories(built, cli):
    (built / "generated/handmade").mkdir()
    (built / "generated/handmade/__init__.py").write_text("")
    (built / "generated/NOTES.md").write_text("notes\n")
    (built / "generated/.gitignore").write_text("__pycache__/\n")  # allowed beside packages
    (built / "generated/__pycache__").mkdir()
    result = cli("check")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith("generated/NOTES.md: extra (a stray file") for line in lines)
    assert any(line.startswith("generated/handmade/: extra (not written by opgen") for line in lines)
    assert not any(".gitignore" in line or "__pycache__" in line for line in lines)


def test_check_reports_leftovers_and_build_removes_them(built, cli):
    (built / "generated/.norm.staging-k3j4h5").mkdir()
    (built / "generated/.norm.old").mkdir()
    (built / "generated/.gone.old").mkdir()  # of a package whose spec no longer exists
    result = cli("check")
    assert result.exit_code == 1
    for name in (".norm.staging-k3j4h5", ".norm.old", ".gone.old"):
        assert f"generated/{name}: leftover (left by an interrupted build" in result.stdout
    assert cli("check", "specs/norm.toml").exit_code == 1  # the package's own leftovers
    assert cli("build", "--no-compile").exit_code == 0
    assert sorted(p.name for p in (built / "generated").iterdir()) == [".gone.old", "norm"]


def test_check_require_compiled(built, cli, versions):
    """A --no-compile build passes `check` but not `check --require-compiled`; a compiled build
    passes both, and a later --no-compile build of unchanged kernels keeps the flag."""
    result = cli("check", "--require-compiled")
    assert result.exit_code == 1
    assert "generated/norm/: not compile-checked (built with --no-compile" in result.stdout

    gen = generate(Path("specs/norm.toml"))
    write(gen, built, **passed_check(gen))
    assert cli("check", "--require-compiled").exit_code == 0
    assert cli("build", "--no-compile").exit_code == 0
    assert cli("check", "--require-compiled").exit_code == 0
    retile(built / "specs/norm.toml")  # kernels change: the old check no longer holds
    assert cli("build", "--no-compile").exit_code == 0
    assert cli("check").exit_code == 0
    assert cli("check", "--require-compiled").exit_code == 1


def test_a_header_only_change_of_kernels_keeps_the_compile_record(built, cli, versions):
    """A spec edit that changes only the headers (the spec hash) keeps kernels.py's code: a
    --no-compile build keeps the record of its compile check, as the compile cache would."""
    gen = generate(Path("specs/norm.toml"))
    write(gen, built, **passed_check(gen))
    kernels = built / "generated/norm/kernels.py"
    code_before = without_header(kernels.read_text())
    spec = built / "specs/norm.toml"
    assert "warmup_ms = 25" in spec.read_text()
    spec.write_text(spec.read_text().replace("warmup_ms = 25", "warmup_ms = 7"))
    assert cli("build", "--no-compile").exit_code == 0
    assert without_header(kernels.read_text()) == code_before
    assert kernels.read_text() != code_before
    assert cli("check", "--require-compiled").exit_code == 0


def test_write_into_any_output_root(tmp_path, project):
    """Ownership, staging and the lock work the same in a directory outside the project."""
    rmsnorm_spec(project)
    out_root = tmp_path / "elsewhere" / "ops"
    gen = generate(Path("specs/norm.toml"), out_root=out_root)
    assert gen.out_dir == out_root / "norm"
    assert write(gen, project).written == len(gen.files)
    (out_root / ".norm.staging-abc").mkdir()  # left by a killed build
    assert write(gen, project).written == 0
    assert leftovers(out_root) == []
    other = rmsnorm_spec(project, path="specs/other.toml")
    with pytest.raises(output.OwnershipError):
        write(generate(other, out_root=out_root), project)
    assert read_tree(out_root / "norm")["spec.toml"] == (project / "specs/norm.toml").read_bytes()

