"""Golden rendering: each spec renders to exactly the committed tree, byte for byte.

generated/attention/ is the shipped package; tests/golden/ holds packages rendered from the
specs in tests/specs/ that exercise non-default choices. After an intended change to opgen or its
templates, `pytest tests/test_golden.py --update-golden` rewrites them (then review the diff).
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import REPO_ROOT

from opgen import TILELANG_VERSION, __version__
from opgen.manifest import parse_manifest
from opgen.compile_cache import check_record, toolchain
from opgen.output import earlier_compile_check, read_tree
from opgen.render import MANIFEST, Generated, generate, load_plan

# Every shipped spec against its committed package, then the test-only specs.
SHIPPED = [
    (f"specs/{p.name}", f"generated/{p.stem}") for p in sorted((REPO_ROOT / "specs").glob("*.toml"))
]
GOLDEN = SHIPPED + [
    ("tests/specs/attention_recompute.toml", "tests/golden/attention_recompute"),
    ("tests/specs/attention_tuned.toml", "tests/golden/attention_tuned"),
    ("tests/specs/rmsnorm_tuned.toml", "tests/golden/rmsnorm_tuned"),
    ("tests/specs/swiglu_fused.toml", "tests/golden/swiglu_fused"),
]
assert ("specs/attention.toml", "generated/attention") in GOLDEN
IDS = [Path(spec).stem for spec, _ in GOLDEN]
IGNORED = {"__pycache__", ".pytest_cache"}

# One xdist worker for the module: `rendered` (every golden spec rendered and black-formatted,
# seconds each) is made once, not once on each worker.
pytestmark = pytest.mark.xdist_group("golden")


def rewrite_tree(directory: Path, files: dict[str, str]) -> None:
    """Make directory hold exactly files; unchanged files are left alone."""
    for name in set(read_tree(directory)) - set(files):
        (directory / name).unlink()
    for name, text in files.items():
        path = directory / name
        data = text.encode("utf-8")
        if not path.is_file() or path.read_bytes() != data:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def short_diff(name: str, old: bytes, new: bytes, limit: int = 40) -> str:
    lines = list(
        difflib.unified_diff(
            old.decode("utf-8", "replace").splitlines(),
            new.decode("utf-8", "replace").splitlines(),
            f"{name} (golden)",
            f"{name} (rendered)",
            lineterm="",
            n=1,
        )
    )
    more = [f"... ({len(lines) - limit} more lines)"] if len(lines) > limit else []
    return "\n".join(lines[:limit] + more)


@pytest.fixture(scope="module")
def generated() -> dict[str, Generated]:
    """Every golden spec rendered once, from the repository root (paths in headers are relative)."""
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        return {spec: generate(Path(spec)) for spec, _ in GOLDEN}
    finally:
        os.chdir(cwd)


@pytest.fixture(scope="module")
def rendered(generated) -> dict[str, dict[str, str]]:
    return {spec: gen.files for spec, gen in generated.items()}


def with_compile_flag_of(golden_dir: Path, gen: Generated) -> dict[str, str]:
    """gen's files with the compile record of the package on disk where it still holds, as
    `opgen build --no-compile` keeps it (earlier_compile_check): rendering alone does not know
    what the last build's compile check found."""
    earlier = earlier_compile_check(read_tree(golden_dir), gen)
    return gen.with_compile_checked(earlier is not None,
                                    earlier.compiled_with if earlier else None).files


def spec_digest_of(spec: str) -> str:
    """The hash headers and manifests carry: of the validated spec, not of the file's bytes."""
    return load_plan(REPO_ROOT / spec)[0].source.spec_sha256


@pytest.mark.parametrize("spec, golden", GOLDEN, ids=IDS)
def test_golden_tree(generated, spec, golden, update_golden):
    golden_dir = REPO_ROOT / golden
    files = with_compile_flag_of(golden_dir, generated[spec])
    if update_golden:
        rewrite_tree(golden_dir, files)
    on_disk = read_tree(golden_dir)
    expected = {name: text.encode("utf-8") for name, text in files.items()}
    hint = f"rerun with --update-golden (or `opgen build {spec}`) if the change is intended"
    assert sorted(on_disk) == sorted(expected), f"missing or extra files in {golden}/; {hint}"
    changed = [name for name in expected if on_disk[name] != expected[name]]
    assert not changed, f"{golden}/ differs from {spec} in {changed}; {hint}\n" + "\n".join(
        short_diff(f"{golden}/{name}", on_disk[name], expected[name]) for name in changed
    )


@pytest.mark.parametrize("spec, golden", SHIPPED, ids=[Path(s).stem for s, _ in SHIPPED])
def test_shipped_packages_were_compile_checked(spec, golden):
    """The committed packages come from a build that compiled every kernel (not --no-compile)."""
    manifest = parse_manifest((REPO_ROOT / golden / MANIFEST).read_bytes())
    assert manifest.compile_checked, f"{golden}/ was built with --no-compile; run `opgen build {spec}`"


@pytest.mark.parametrize("spec, golden", GOLDEN, ids=IDS)
def test_build_is_deterministic(repo_root, rendered, spec, golden):
    assert generate(Path(spec)).files == rendered[spec]


def test_output_does_not_depend_on_hash_seed(rendered):
    """Set iteration order changes with PYTHONHASHSEED; the rendered files must not."""
    spec = "specs/attention.toml"
    code = (
        "import sys; from pathlib import Path; from opgen.render import generate; "
        "sys.stdout.write(generate(Path(sys.argv[1])).files[sys.argv[2]])"
    )
    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code, spec, MANIFEST],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out == rendered[spec][MANIFEST], f"PYTHONHASHSEED={seed}"


@pytest.mark.parametrize("spec, golden", GOLDEN, ids=IDS)
def test_expected_files(repo_root, rendered, spec, golden):
    op = Path(golden).name
    family = load_plan(Path(spec))[1]
    assert sorted(rendered[spec]) == sorted(
        [
            *family.extra_outputs,
            "__init__.py",
            "autograd.py",
            "modules.py",
            "kernels.py",
            "reference.py",
            f"test_{op}.py",
            f"bench_{op}.py",
            "spec.toml",
            MANIFEST,
        ]
    )


@pytest.mark.parametrize("spec, golden", GOLDEN, ids=IDS)
def test_headers(repo_root, rendered, spec, golden):
    digest = spec_digest_of(spec)
    header = (
        f"# @generated by opgen {__version__} for tilelang {TILELANG_VERSION} from {spec} "
        f"(sha256:{digest[:16]}). DO NOT EDIT.\n"
    )
    for name, text in rendered[spec].items():
        if name in (MANIFEST, "spec.toml"):
            continue
        assert text.startswith(header), f"{name}: {text.splitlines()[0]!r}"


@pytest.mark.parametrize("spec, golden", GOLDEN, ids=IDS)
def test_python_files_are_standalone(rendered, spec, golden):
    """A generated package imports torch and tilelang, never opgen, and parses."""
    opgen_import = re.compile(r"^\s*(import\s+opgen\b|from\s+opgen\b)", re.MULTILINE)
    for name, text in rendered[spec].items():
        if not name.endswith(".py"):
            continue
        assert not opgen_import.search(text), f"{name} imports opgen"
        ast.parse(text, filename=name)


@pytest.mark.parametrize("spec, golden", GOLDEN, ids=IDS)
def test_no_machine_specific_text(rendered, spec, golden):
    for name, text in rendered[spec].items():
        assert str(REPO_ROOT) not in text, f"{name} holds an absolute path"
        assert "\r" not in text and text.endswith("\n"), name


@pytest.mark.parametrize("spec, golden", GOLDEN, ids=IDS)
def test_manifest(rendered, spec, golden):
    files = rendered[spec]
    data = json.loads(files[MANIFEST])
    assert data["generator"] == f"opgen {__version__}"
    assert data["spec"] == spec
    assert data["compile_checked"] is False  # rendering alone; a build records its check
    assert data["spec_sha256"] == spec_digest_of(spec)
    assert data["files"] == {
        name: hashlib.sha256(text.encode("utf-8")).hexdigest()
        for name, text in sorted(files.items())
        if name != MANIFEST
    }


def test_tilelang_version_is_the_pinned_one():
    """The version headers and packages name is the one opgen's own install pins and runs."""
    import tilelang

    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"tilelang=={TILELANG_VERSION}"' in pyproject
    assert tilelang.__version__.split("+")[0] == TILELANG_VERSION


@pytest.mark.parametrize("installed, fails", [("0.1.99", False), ("0.2.0", True), ("1.1.15", True)])
def test_package_import_checks_the_tilelang_version(installed, fails):
    """__init__.py names TILELANG_VERSION and refuses another major.minor at import."""
    code = (
        "import tilelang; tilelang.__version__ = %r\n"
        "try:\n    import generated.rmsnorm as p\nexcept ImportError as exc:\n    print('E', exc)\n"
        "else:\n    print('OK', p.TILELANG_VERSION)\n" % installed
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                         text=True, check=True).stdout.strip().splitlines()[-1]
    if fails:
        assert out == (f"E generated.rmsnorm was generated for tilelang {TILELANG_VERSION}, but "
                       f"tilelang {installed} is installed: install tilelang=={TILELANG_VERSION}, "
                       "or rebuild the package from its spec.toml with an opgen made for the "
                       "installed tilelang")
    else:
        assert out == f"OK {TILELANG_VERSION}"



def test_update_keeps_a_compile_record_only_for_the_kernels_it_checked(generated, tmp_path):
    """--update-golden keeps a package's compile record as `opgen build --no-compile` does: not
    where the record is of other kernels than the kernels.py beside it, even when that kernels.py
    is what the spec renders now (a merge that took one side's manifest and merged kernels.py)."""
    gen = generated["specs/scaled_silu.toml"]
    record = check_record(toolchain(), gen.plan.compile_jobs)
    rewrite_tree(tmp_path, gen.with_compile_checked(True, record).files)
    assert parse_manifest(with_compile_flag_of(tmp_path, gen)[MANIFEST].encode()).compile_checked
    # The manifest of a build of other kernels (its kernels.py hash is theirs) beside this one.
    other = replace(gen, files={**gen.files, "kernels.py": gen.files["kernels.py"] + "# other\n"})
    (tmp_path / MANIFEST).write_text(other.with_compile_checked(True, record).files[MANIFEST])
    kept = parse_manifest(with_compile_flag_of(tmp_path, gen)[MANIFEST].encode())
    assert not kept.compile_checked and kept.compiled_with is None
