"""Shared fixtures for opgen's own tests (CPU only).

opgen shows paths relative to the working directory and the CLI reads specs/ and writes generated/
relative to it, so every test that renders or runs the CLI first chdirs: to the repository root
(`repo_root`) or to an empty temporary project (`project`).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner
import textwrap
from opgen import __version__
from opgen.errors import SpecError
from opgen.families import Family
from opgen.plan import SourceInfo
from opgen.render import load_plan
from opgen.spec import read_spec, validate

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests"

def import_generated(package: str, module: str):
    """generated.<package>.<module> of the committed tree (imports torch and tilelang only)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    return importlib.import_module(f"generated.{package}.{module}")


# Golden trees are generated packages (with their own test_*.py); they are data here, not tests.
collect_ignore_glob = ["golden/*"]

# Rich wraps console output at the terminal's width when there is one: a wide, colourless console
# keeps test output independent of the terminal that runs the tests. (Without a terminal opgen
# fixes the width itself; see test_invalid_specs.py::test_errors_are_not_wrapped.)
CLI_ENV = {"COLUMNS": "1000", "NO_COLOR": "1"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite the golden trees (tests/golden/, generated/ of the shipped specs) and "
        "tests/invalid_specs/*.expected from opgen's current output",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "compile: runs the real TileLang lowering and nvcc for sm_90a on the CPU (slow; "
        "deselect with -m 'not compile')",
    )
    # test_compile.py shares one expensive module fixture (a process pool of real compiles); its
    # tests carry xdist_group("compile") so that `-n N` runs them on one worker, not the fixture
    # on every worker. "loadgroup" distributes every other test exactly like xdist's "load".
    if getattr(config.option, "dist", None) == "load":
        config.option.dist = "loadgroup"
    # A worker reads the mode before conftests load; the controller passes it on (below).
    if getattr(config, "workerinput", {}).get("opgen_loadgroup"):
        config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent without pytest-xdist
def pytest_configure_node(node) -> None:
    node.workerinput["opgen_loadgroup"] = node.config.getoption("dist") == "loadgroup"


@pytest.fixture(autouse=True)
def compile_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty compile cache of the test's own (OPGEN_CACHE_DIR, inherited by `opgen` processes
    the test starts): no test sees the user's cache or another test's results."""
    path = tmp_path_factory.mktemp("opgen-cache")
    monkeypatch.setenv("OPGEN_CACHE_DIR", str(path))
    return path


@pytest.fixture
def forward_calls(monkeypatch: pytest.MonkeyPatch):
    """record(package) -> the list of the arguments of each later call of that package's forward
    custom op (the op still runs): what the public function hands the op."""

    def record(package: str) -> list[tuple]:
        autograd = import_generated(package, "autograd")
        calls, op = [], autograd.forward_op
        monkeypatch.setattr(autograd, "forward_op", lambda *args: calls.append(args) or op(*args))
        return calls

    return record


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.fixture
def repo_root(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test with the repository root as working directory (shipped specs, golden paths)."""
    monkeypatch.chdir(REPO_ROOT)
    return REPO_ROOT


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run the test inside an empty project directory: specs/ and generated/ resolve there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def cli():
    """Invoke the `opgen` Typer app in process; returns click's Result (stdout/stderr apart)."""
    from opgen.cli import app

    runner = CliRunner(env=CLI_ENV)

    def invoke(*args: str, catch_exceptions: bool = True):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=catch_exceptions)

    return invoke


def opgen_command() -> list[str]:
    """The installed console script (beside this interpreter first: no pyenv shim), or the
    same entry point run by this interpreter."""
    beside = Path(sys.executable).with_name("opgen")
    exe = str(beside) if beside.is_file() else shutil.which("opgen")
    if exe:
        return [exe]
    return [sys.executable, "-c", "from opgen.cli import app; app()"]


@pytest.fixture
def run_opgen():
    """Run `opgen` as a user does: its own process and cwd, stdin closed, output captured.

    wide=False leaves the console width to Rich (no COLUMNS), as in a CI log or a pipe; a short
    timeout (seconds) turns a hang into a failure soon.
    """

    def run(*args: str, cwd: Path, wide: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in {"COLUMNS", "LINES"}}
        env.update(CLI_ENV if wide else {"NO_COLOR": "1"})
        return subprocess.run(
            [*opgen_command(), *map(str, args)],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


def old_cache_entries(directory: Path, count: int) -> list[Path]:
    """count entries in a cache directory (made here), used long ago, the first least recently."""
    directory.mkdir(parents=True)
    paths = [directory / f"{i:064x}.json" for i in range(count)]
    for i, path in enumerate(paths):
        path.write_text("{}")
        os.utime(path, (1000 + i, 1000 + i))
    return paths


# --- spec helpers shared by the family test modules ------------------------------------------------


def write_spec(project: Path, text: str, name: str = "x") -> Path:
    """Write specs/<name>.toml in a project; returns its path."""
    path = project / "specs" / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def plan_from(family: Family, project: Path, text: str):
    """Validate a spec with a family's model and plan it, as `opgen build` would."""
    spec = validate(family.spec, read_spec(write_spec(project, text)))
    return family.plan(spec, SourceInfo("specs/x.toml", "0" * 64, __version__))


def spec_problems(project: Path, text: str) -> list[tuple[str, str]]:
    """The problems load_plan reports for a spec, as (field path, message)."""
    with pytest.raises(SpecError) as info:
        load_plan(write_spec(project, text))
    return info.value.problems


def assert_last_block_finishes(source, counted, guard):
    """After the count, the last block (last[0] == 1) fences again, then casts each sum into dw
    with plain loads and zeroes it with plain stores (no atomic load or store of the sums: those
    go one at a time), inside `guard`, and resets the count."""
    acquire = source.index("if (((int*)last)[0] == 1) {\n    __threadfence();", counted)
    tail = source[acquire:]
    assert "AtomicLoad" not in source and "AtomicStore((&(dW[" not in source, source
    # (An fp32 dw is a plain copy: no cast.)
    cast = re.search(r"dW_out\[(.+?)\] = (?:\(\((?:half_t|bfloat16_t)\)dW\[\1\]\)|dW\[\1\]);\s*"
                     r"dW\[\1\] = 0x0p\+0f", tail)
    assert cast and guard in tail[:cast.start()], tail
    assert "AtomicStore((&(Done[0])), 0" in tail[cast.end():], tail
