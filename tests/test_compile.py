"""The compile check for real: TileLang lowers each kernel and nvcc compiles it for sm_90a, on the
CPU. Nothing is mocked. Slow (tens of seconds); deselect with `-m "not compile"`."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from opgen.compile import compile_all
from opgen.families.attention import BwdTiling, FwdTiling, smem_bytes
from opgen.families.attention_launch import paired_tiling
from opgen.output import write
from opgen.plan import SM90_SMEM_LIMIT, CompileJob
from opgen.render import generate
from opgen.spec import GemmTiling

from conftest import REPO_ROOT, TESTS_DIR, opgen_command

pytestmark = [pytest.mark.compile, pytest.mark.xdist_group("compile")]

# One layout, one dtype, one head dim: the 6 kernels of one (layout, dtype, head_dim) combination.
SMALL = """\
name = "small"
family = "attention"
dtypes = ["float16"]

[attention]
layouts = ["bshd"]
head_dims = [64]

[bench]
shapes = [{ batch = 1, heads = 4, seq_len = 1024, head_dim = 64, causal = false }]
"""

# The same with GQA: the bwd kernel's grouped modes (fp32 dK/dV partials or atomics) must fit the
# same shared-memory estimate.
SMALL_GQA = (
    SMALL.replace('name = "small"', 'name = "small_gqa"').replace(
        "head_dims = [64]", 'head_dims = [64]\ngqa = true\n\n[grads.dk]\nreduction = "split"'
    )
    + "\n[test]\nshapes = [{ batch = 1, heads = 8, kv_heads = 2, seq_len = 1000 }]\n"
)

# fwd tiles of 2 * (128*64 + 2*4*256*64) = 278528 bytes at head_dim 64: over the 227 KB of sm_90.
BIG_FWD = {"block_n": 256, "num_stages": 4}

# Valid for the spec (256 rows over 4 warpgroups), but the bwd's [block_n, head_dim] dQ GEMM of
# 16 x 64 has no partition over 16 warps: TileLang fails while lowering.
UNLOWERABLE_BWD = "\n[tiling.bwd]\nblock_m = 256\nblock_n = 16\nthreads = 512\n"

# Warp specialization (num_stages >= 1) adds a 128-thread TMA producer warpgroup.
PRODUCER_THREADS = 128


def _default_sigint() -> None:
    """In the build's child before exec: SIGINT as a terminal delivers it. An ignored SIGINT is
    inherited, and Python then leaves it ignored (POSIX's rule for background jobs); a pytest-xdist
    worker was seen running with one, which made the build deaf to the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_build(tmp_path: Path):
    """`opgen build` of an attention spec with many kernels, as a user starts it; returns once
    its compile workers run, with the build process and those workers."""
    import psutil

    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/small.toml").write_text(SMALL.replace('dtypes = ["float16"]',
                                                             'dtypes = ["float16", "bfloat16"]'))
    build = subprocess.Popen([*opgen_command(), "build", "-j", "2", "specs/small.toml"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=_default_sigint)
    def is_worker(child):
        try:
            return "spawn_main" in " ".join(child.cmdline())
        except (psutil.ZombieProcess, psutil.NoSuchProcess):  # a short-lived helper (nvcc --version)
            return False

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = [c for c in psutil.Process(build.pid).children() if is_worker(c)]
        if len(workers) == 2:
            time.sleep(3)  # into the kernels: workers import TileLang, then lower and run nvcc
            return build, workers
        time.sleep(0.2)
    build.kill()
    pytest.fail("the build started no compile workers")


def _gone_within(processes, seconds: float) -> list[int]:
    """The pids of processes still running after `seconds`."""
    import psutil

    deadline = time.monotonic() + seconds
    alive = processes
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.1)
    return [p.pid for p in alive]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_the_compile_check_stops_at_once(tmp_path, signum):
    """Ctrl-C (or SIGTERM) while kernels compile: the build exits 130 within seconds, stops its
    workers, writes nothing and leaves no scratch directory."""
    build, workers = _start_build(tmp_path)
    started = time.monotonic()
    build.send_signal(signum)
    try:
        _, stderr = build.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        build.kill()  # else it runs on, into the next test's scratch directories
        build.communicate()
        raise
    assert time.monotonic() - started < 5, "the build took too long to stop"
    assert build.returncode == 130, stderr
    assert "interrupted during the compile check; nothing was written" in stderr
    assert "Traceback" not in stderr
    assert _gone_within(workers, 5) == []
    assert not (tmp_path / "generated").exists()
    assert not list(Path(tempfile.gettempdir()).glob(f"opgen-compile-{build.pid}-*"))


def test_sigkill_during_the_compile_check_leaves_nothing_running(tmp_path):
    """SIGKILL runs no cleanup: the workers end with their parent, and the next compile check
    removes the scratch directory the killed build left."""
    from opgen.compile import scratch_dir

    build, workers = _start_build(tmp_path)
    build.kill()
    build.wait()
    assert _gone_within(workers, 5) == []
    left = list(Path(tempfile.gettempdir()).glob(f"opgen-compile-{build.pid}-*"))
    assert left, "expected the killed build's scratch directory"
    with scratch_dir():
        pass
    assert not any(path.exists() for path in left)


def test_build_that_fails_the_compile_check_writes_nothing(tmp_path, run_opgen):
    """A tiling the spec accepts but TileLang cannot lower (a 16-row dQ GEMM over 16 warps in the
    bwd) fails the build with one message per kernel and error, and leaves the last good package."""
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/small.toml").write_text(SMALL)
    assert run_opgen("build", "specs/small.toml", "--no-compile", cwd=tmp_path).returncode == 0
    before = {p: p.read_bytes() for p in (tmp_path / "generated").rglob("*") if p.is_file()}
    (tmp_path / "specs/small.toml").write_text(SMALL + UNLOWERABLE_BWD)
    result = run_opgen("build", "specs/small.toml", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "specs/small.toml: kernel small_bwd failed the compile check in 2 variant(s)" in result.stderr
    assert "No valid warp partition" in result.stderr
    assert result.stderr.rstrip().endswith(
        "2 kernel(s) failed the compile check; nothing written for specs/small.toml"
    )
    assert "0 (compile failed)" in result.stdout
    after = {p: p.read_bytes() for p in (tmp_path / "generated").rglob("*") if p.is_file()}
    assert after == before
    # Only passes are cached: the failing kernels compile again and show their error again.
    again = run_opgen("build", "specs/small.toml", cwd=tmp_path)
    assert again.returncode == 1
    assert "7 kernel(s) checked: 2 compiled, 5 from the compile cache" in again.stdout, again.stdout
    assert "No valid warp partition" in again.stderr


def _build(root: Path, name: str, text: str):
    """Write specs/<name>.toml, render it and write generated/<name>/ (no compile)."""
    (root / "specs").mkdir(exist_ok=True)
    (root / f"specs/{name}.toml").write_text(text)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        gen = generate(Path(f"specs/{name}.toml"))
        write(gen, root)
    finally:
        os.chdir(cwd)
    return root / gen.out_dir / "kernels.py", gen


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """generated/small/ of a temporary project, and its Generated (plan included)."""
    return _build(tmp_path_factory.mktemp("compile"), "small", SMALL)


@pytest.fixture(scope="module")
def compiled(small):
    """One fwd and one bwd job of the plan, two broken jobs, one whose tiles overflow shared
    memory (the spec would refuse it; the compile check must catch it too) and a grouped (GQA,
    split dK) bwd job, in one process pool."""
    kernels, gen = small
    gqa_kernels, gqa = _build(kernels.parents[2], "small_gqa", SMALL_GQA)
    grouped = next(
        j
        for j in gqa.plan.compile_jobs
        if j.factory == "small_gqa_bwd" and "split" in j.args and "atomic" not in j.args
    )
    jobs = gen.plan.compile_jobs
    fwd = next(j for j in jobs if j.factory == gen.plan.kernels["fwd"].factory)
    bwd = next(j for j in jobs if j.factory == gen.plan.kernels["bwd"].factory)
    bogus = CompileJob("no_such_factory", (), {}, "bogus factory")
    short = dataclasses.replace(fwd, args=fwd.args[:2], label="too few arguments")
    big = dataclasses.replace(
        fwd, tiling={**fwd.tiling, **BIG_FWD}, label="fwd over the smem limit"
    )
    work = [(gen.spec_path, kernels, job) for job in (fwd, bogus, bwd, short, big)]
    work.append((gqa.spec_path, gqa_kernels, grouped))
    # (seq_len is symbolic in the attention kernels: one bwd kernel serves aligned and tail lengths,
    # so there is no separate aligned-length instance to check.)
    seen = []
    results = compile_all(work, workers=2, on_done=seen.append)
    keys = ("fwd", "bogus", "bwd", "short", "big", "grouped")
    return gen, dict(zip(keys, results, strict=True)), seen


def test_results_come_back_in_input_order(compiled):
    gen, results, seen = compiled
    labels = [r.label for r in results.values()]
    assert labels[1:4:2] == ["bogus factory", "too few arguments"]
    assert sorted(r.label for r in seen) == sorted(labels), "on_done sees every result"
    assert [r.spec for r in results.values()] == [gen.spec_path] * 5 + ["specs/small_gqa.toml"]


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_kernel_compiles(compiled, phase):
    gen, results, _ = compiled
    result = results[phase]
    assert result.ok, result.error
    assert result.error == ""
    assert result.seconds > 0


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_smem_estimate_is_a_tight_upper_bound(compiled, phase):
    gen, results, _ = compiled
    estimate = gen.plan.smem[phase][64]
    assert estimate - 2048 <= results[phase].smem_bytes <= estimate


def test_paired_forward_estimate():
    """The paired causal forward holds Q per stage and O in a tile of its own: at D128, 128x128
    tiles over 2 stages the compile check measured 224 KB (229376 bytes); over 3 stages it would
    not fit, while the unpaired forward of that tiling does."""
    two = GemmTiling(block_m=128, block_n=128, threads=256, num_stages=2)
    assert smem_bytes("fwd", two, 128, paired=True) == 229376 <= SM90_SMEM_LIMIT
    three = GemmTiling(block_m=128, block_n=128, threads=256, num_stages=3)
    assert smem_bytes("fwd", three, 128) <= SM90_SMEM_LIMIT < smem_bytes("fwd", three, 128, paired=True)


def test_the_paired_forward_keeps_its_key_blocks_at_128_rows():
    """A forward of 192-row key blocks fits (224 KB at D128) while its paired kernel, holding Q per
    stage, would not (288 KB): the paired tiling caps block_n, and the estimate counts the cap."""
    wide = FwdTiling(block_m=128, block_n=192, threads=256, num_stages=2, pingpong=True)
    two = GemmTiling(block_m=128, block_n=128, threads=256, num_stages=2)
    assert smem_bytes("fwd", wide, 128) == 229376
    assert smem_bytes("fwd", wide, 128, paired=True) == smem_bytes("fwd", two, 128, paired=True)
    tiling = {"block_m": 128, "block_n": 192, "threads": 256, "num_stages": 2, "pingpong": True}
    assert paired_tiling(tiling) == {"block_m": 128, "block_n": 128, "threads": 256,
                                     "num_stages": 2, "pair_blocks": True}
    narrow = {**tiling, "block_n": 64}
    assert paired_tiling(narrow)["block_n"] == 64


def test_bulk_dq_estimate_counts_the_staged_tile():
    """bulk_dq's fp32 dQ stage of [block_n, head_dim] is counted in the backward's shared memory."""
    plain = BwdTiling(block_m=64, block_n=64, threads=128, num_stages=2)
    bulk = plain.model_copy(update={"bulk_dq": True})
    assert smem_bytes("bwd", bulk, 64) - smem_bytes("bwd", plain, 64) == 4 * 64 * 64


@pytest.mark.parametrize("phase", ["fwd", "bwd"])
def test_threads_include_the_producer_warpgroup(compiled, phase):
    gen, results, _ = compiled
    tiling = gen.plan.kernels[phase].tiling
    assert tiling["num_stages"] >= 1
    assert results[phase].threads == tiling["threads"] + PRODUCER_THREADS


def test_unknown_factory_is_reported_not_raised(compiled):
    _, results, _ = compiled
    result = results["bogus"]
    assert not result.ok
    assert "no_such_factory" in result.error
    assert result.error.startswith("AttributeError: ")
    assert (result.smem_bytes, result.threads) == (0, 0)


def test_wrong_arguments_are_reported_not_raised(compiled):
    _, results, _ = compiled
    result = results["short"]
    assert not result.ok
    assert result.error.startswith("TypeError: ")
    assert "missing" in result.error


def test_no_work():
    assert compile_all([]) == []


def test_smem_over_the_limit_fails_the_check(compiled):
    gen, results, _ = compiled
    result = results["big"]
    assert not result.ok
    tiling = GemmTiling(**{**gen.plan.kernels["fwd"].tiling, **BIG_FWD})
    assert result.smem_bytes == 278528 <= smem_bytes("fwd", tiling, 64)
    assert result.smem_bytes > SM90_SMEM_LIMIT
    assert result.error == (
        f"uses 278528 bytes of shared memory, over the sm_90 limit {SM90_SMEM_LIMIT}; "
        "it would fail at launch"
    )


def test_grouped_bwd_compiles_within_the_estimate(compiled):
    gen, results, _ = compiled
    result = results["grouped"]
    assert result.ok, result.error
    assert "split" in result.label
    assert result.smem_bytes <= gen.plan.smem["bwd"][64]  # same tiles as small: same estimate
    assert result.threads == gen.plan.kernels["bwd"].tiling["threads"] + PRODUCER_THREADS


GOLDEN_SPECS = sorted((TESTS_DIR / "specs").glob("*.toml"))


@pytest.fixture(scope="module")
def golden_trees_compiled():
    """Every golden spec rendered (from the repository root, as `opgen build` renders it) and
    every compile job of every golden tree's kernels.py checked, in one process pool: one pool
    start (each worker imports TileLang) instead of one per tree. {spec stem: (Generated, the
    tree's kernels.py, its results)}."""
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        gens = {spec.stem: generate(spec.relative_to(REPO_ROOT)) for spec in GOLDEN_SPECS}
    finally:
        os.chdir(cwd)
    work, owner = [], []
    for stem, gen in gens.items():
        kernels = TESTS_DIR / "golden" / stem / "kernels.py"
        work += [(gen.spec_path, kernels, job) for job in gen.plan.compile_jobs]
        owner += [stem] * len(gen.plan.compile_jobs)
    results = compile_all(work, workers=2)
    return {stem: (gen, TESTS_DIR / "golden" / stem / "kernels.py",
                   [r for r, o in zip(results, owner, strict=True) if o == stem])
            for stem, gen in gens.items()}


# Their own xdist group (beside "compile"): the pool above, shared by the three trees, runs on one
# worker while test_compile's other tests may run on the other one.
@pytest.mark.xdist_group("golden_trees")
@pytest.mark.parametrize("spec", GOLDEN_SPECS, ids=lambda p: p.stem)
def test_golden_trees_compile(spec, golden_trees_compiled):
    """Every kernel of every golden tree compiles, as `opgen build` checks the shipped specs: the
    golden trees are generated code too, and their tests run on the GPU."""
    gen, kernels, results = golden_trees_compiled[spec.stem]
    assert kernels.read_text() == gen.files["kernels.py"], "golden tree out of date"
    assert [r.spec for r in results] == [gen.spec_path] * len(results)
    assert [r.label for r in results] == [job.label for job in gen.plan.compile_jobs]
    failed = [f"{r.label}: {r.error}" for r in results if not r.ok]
    assert not failed, "\n".join(failed)
    assert len(results) == len(gen.plan.compile_jobs) > 0
