"""`opgen tune` for rmsnorm on the CPU: [[tiling.tuned]] per channel count in the spec, the plan
and the package (the tiling a call at each C runs with), the candidates and the spec edit, and
`--dry-run` end to end (the real compile check). Timing itself needs a GPU."""

from __future__ import annotations

import importlib
import sys

import pytest
import tomllib

from conftest import REPO_ROOT
from opgen import tune
from opgen.errors import SpecError
from opgen.families import FAMILIES
from opgen.families import rmsnorm_tune as RT
from opgen.families.rmsnorm import PHASE_TILING, shared_bytes
from opgen.render import generate, load_plan
from opgen.spec import SpecSource, read_spec, validate

RMSNORM = FAMILIES["rmsnorm"].spec
TUNED_SPEC = REPO_ROOT / "tests/specs/rmsnorm_tuned.toml"
SHIPPED_TEXT = (REPO_ROOT / "specs/rmsnorm.toml").read_text()
# The shipped spec without its [[tiling.tuned]] table: one tiling for every C.
UNTUNED_TEXT = tune.write_tuned(SHIPPED_TEXT, RT.TUNER, {}, {})
H200 = "on NVIDIA H200, 2026-12-05"


def spec_of(text: str):
    return validate(RMSNORM, SpecSource("specs/x.toml", "", tomllib.loads(text), text))


def test_tuned_table_plans_tilings_test_shapes_and_jobs_per_channel_count():
    plan, _ = load_plan(TUNED_SPEC)
    assert plan.tuned == {
        "fwd": {1024: {"block_rows": 2, "block_channels": 512, "threads": 128}},
        "bwd": {1024: {"block_rows": 64, "block_channels": 512, "threads": 128},
                4096: {"block_rows": 64, "block_channels": 1024, "threads": 256},
                8192: {"block_rows": 32, "block_channels": 1024, "threads": 256, "row_stages": 3}},
    }
    assert plan.tiling_for("bwd", 4096)["block_rows"] == 64
    assert plan.tiling_for("fwd", 4096) == plan.kernels["fwd"].tiling
    assert plan.tiling_exprs == {"fwd": "FWD_TILINGS.get(cols, FWD_TILING)",
                                 "bwd": "BWD_TILINGS.get(cols, BWD_TILING)"}
    # A test shape per tuned C (none in the spec's own): 129 rows, a tail at every block_rows.
    assert [c.shape for c in plan.test_cases][-2:] == [(129, 1024), (129, 4096)]
    # Every job at a tuned C is built with the tiling it launches with there, and each tuned C
    # is compiled with every saved and reduction choice the tests run.
    at = {}
    for job in plan.compile_jobs:
        at.setdefault((job.factory.rsplit("_", 1)[1], job.args[0]), []).append(job)
    for (phase, channels), jobs in at.items():
        assert all(j.tiling == plan.tiling_for(phase, channels) for j in jobs), (phase, channels)
    assert {(j.args[4], j.args[5]) for j in at["bwd", 4096]} == {
        (True, "atomic"), (True, "split"), (False, "atomic"), (False, "split")}


def test_a_spec_without_a_table_keeps_its_hash_and_package(tmp_path):
    assert "tuned" not in spec_of(UNTUNED_TEXT).model_dump()["tiling"]
    (tmp_path / "rmsnorm.toml").write_text(UNTUNED_TEXT)
    files = generate(tmp_path / "rmsnorm.toml").files
    assert "TILINGS" not in files["kernels.py"] + files["autograd.py"]


def test_each_call_takes_the_tiling_of_its_channel_count(tmp_path, monkeypatch):
    """The package's lookup, on the CPU: the split dw buffer has one partial row per block of
    block_rows rows, 64 at a tuned C, the base tiling's 16 elsewhere."""
    import torch

    files = generate(TUNED_SPEC).files
    package = tmp_path / "rmsnorm_tuned"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    autograd = importlib.import_module("rmsnorm_tuned.autograd")
    try:
        rows = 1000
        assert autograd.alloc_dw(torch.empty(rows, 4096), "split").shape == (-(-rows // 64), 4096)
        assert autograd.alloc_dw(torch.empty(rows, 1024), "split").shape == (-(-rows // 64), 1024)
        assert autograd.alloc_dw(torch.empty(rows, 77), "split").shape == (-(-rows // 16), 77)
        assert autograd.alloc_dw(torch.empty(rows, 8192), "split").shape == (-(-rows // 32), 8192)
        assert autograd.FWD_TILINGS[1024]["block_rows"] == 2
    finally:
        for name in [m for m in sys.modules if m.startswith("rmsnorm_tuned")]:
            del sys.modules[name]


BASE = 'name = "x"\nfamily = "rmsnorm"\n'


@pytest.mark.parametrize("entry, field, words", [
    ("channels = 32768\nbwd = { block_rows = 16, block_channels = 1024, threads = 256 }",
     "tiling.tuned.0.channels", "must be at most rmsnorm.max_channels (16384)"),
    ("channels = 4096", "tiling.tuned.0", "give fwd, bwd or both"),
    ("channels = 4096\nbwd = { block_rows = 16, block_channels = 4096, threads = 32 }",
     "tiling.tuned.0.bwd.block_channels", "block_channels must be at most 64 x threads"),
    ("channels = 16384\nfwd = { block_rows = 8, block_channels = 1024, threads = 256 }",
     "tiling.tuned.0.fwd", "over the sm_90 limit"),
    ("channels = 4096\nbwd = { block_rows = 24, block_channels = 1024, threads = 256 }",
     "tiling.tuned.0.bwd.block_rows", "power of two"),
    ("channels = 4096\nbwd = { block_rows = 16, block_channels = 1024, threads = 256, row_stages = 4 }",
     "tiling.tuned.0.bwd.row_stages", "must be one of 2, 3 (got 4)"),
    ("channels = 4096\nfwd = { block_rows = 1, block_channels = 1024, threads = 128, row_stages = 3 }",
     "tiling.tuned.0.fwd.row_stages", "unknown key"),
])
def test_bad_tuned_entries(entry, field, words):
    with pytest.raises(SpecError) as info:
        spec_of(BASE + "[[tiling.tuned]]\n" + entry + "\n")
    assert any(f == field and words in m for f, m in info.value.problems), info.value.problems


def test_one_entry_per_channel_count():
    entry = "[[tiling.tuned]]\nchannels = 1024\nbwd = { block_rows = 16, block_channels = 1024, threads = 256 }\n"
    with pytest.raises(SpecError) as info:
        spec_of(BASE + entry + entry)
    assert ("tiling.tuned.1", "repeats channels = 1024: one entry per channel count") \
        in info.value.problems


def test_candidates_pass_the_rules_per_bench_channel_count_current_tiling_first():
    spec = spec_of(UNTUNED_TEXT)
    found = tune.candidates(spec)
    assert [k for k in dict.fromkeys(c.key for c in found)] == [(4096,), (8192,), (1024,)]
    for c in found:
        tiling = PHASE_TILING[c.phase](**c.tiling_dict)
        assert not RT.TUNER.problems(spec, c.key, c.phase, c.tiling_dict)
        assert shared_bytes(c.phase, tiling.model_dump(), c.key[0], 2) <= 227 * 1024
    first = {}
    for c in found:
        first.setdefault(c.variant, c)
    assert first[4096, "bwd"].tiling_dict == spec.tiling.bwd.model_dump()
    assert first[1024, "fwd"].tiling_dict == spec.tiling.fwd.model_dump()
    assert first[4096, "bwd"].label == "bwd C=4096 16x1024 threads=256"
    # Two or three rows copied ahead: the default (2) is left out of the tiling, as in the spec.
    assert {c.tiling_dict.get("row_stages") for c in found if c.phase == "bwd"} == {None, 3}
    assert any(c.label.endswith(" row_stages=3") for c in found)
    # Run 110's best backward tilings are among the candidates.
    for channels, best in ((4096, (64, 1024, 256)), (8192, (32, 1024, 256)), (1024, (64, 512, 128))):
        assert any(c.key == (channels,) and c.phase == "bwd" and tuple(c.tiling_dict.values()) == best
                   for c in found)
    assert len(found) == len(set(found))
    only = tune.candidates(spec, ["bwd"], max_candidates=3, subset={"channels": {1024}})
    assert [c.variant for c in only] == [(1024, "bwd")] * 3


def test_a_tuned_entry_is_the_current_tiling_of_its_channel_count():
    spec = spec_of(TUNED_SPEC.read_text())
    (first, *_) = tune.candidates(spec, ["bwd"], subset={"channels": {4096}})
    assert first.tiling_dict == {"block_rows": 64, "block_channels": 1024, "threads": 256}


def test_writer_writes_channel_entries_the_spec_reads_back():
    spec = spec_of(UNTUNED_TEXT)
    winners = {}
    for c in tune.candidates(spec):
        if c.tiling_dict.get("block_rows") == 64 and c.phase == "bwd" and c.key == (1024,):
            winners.setdefault(c.variant, c)
    entries = tune.merged_entries(spec, winners)
    text = tune.write_tuned(UNTUNED_TEXT, RT.TUNER, entries, tune.stamps_of(winners.values(), H200))
    assert "[[tiling.tuned]]\nchannels = 1024\nbwd = { block_rows = 64, block_channels = 512" in text
    tuned = spec_of(text)
    assert [e.channels for e in tuned.tiling.tuned] == [1024] and tuned.tiling.tuned[0].fwd is None
    assert tune.write_tuned(text, RT.TUNER, entries, tune.stamps_of(winners.values(), H200)) == text
    assert f"# tuned by opgen tune {H200}\n[[tiling.tuned]]\nchannels = 1024" in text
    # A later run that tunes the forward keeps the backward entry.
    fwd = tune.as_candidate(RT.TUNER, (1024,), "fwd", {"block_rows": 2, "block_channels": 512,
                                                       "threads": 128})
    merged = tune.merged_entries(tuned, {fwd.variant: fwd})
    assert set(merged[1024,]) == {"fwd", "bwd"}


def test_tune_options_belong_to_their_family(tmp_path, run_opgen):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/r.toml").write_text(SHIPPED_TEXT)
    result = run_opgen("tune", "specs/r.toml", "--head-dims", "64", cwd=tmp_path)
    assert result.returncode == 2
    assert "--head-dims: not an option of the rmsnorm family's tuning (it takes --channels)" \
        in result.stderr, result.stderr
    result = run_opgen("tune", "specs/r.toml", "--channels", "4096,77", cwd=tmp_path)
    assert result.returncode == 2
    assert ("--channels: a comma-separated list of the bench shapes' channel counts "
            "[4096, 8192, 1024] (got \"4096,77\")") in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.compile
@pytest.mark.xdist_group("compile")
def test_tune_dry_run_compiles_the_candidates_of_a_channel_count(tmp_path, run_opgen):
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs/rmsnorm.toml"
    spec.write_text(SHIPPED_TEXT)
    result = run_opgen("tune", "specs/rmsnorm.toml", "--dry-run", "--channels", "1024",
                       "--max-candidates", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 candidate(s) pass the spec's rules" in result.stdout
    assert "4 of 4 compile" in result.stdout
    assert "timing them needs a GPU (--dry-run): nothing written" in result.stdout
    assert spec.read_text() == SHIPPED_TEXT


def test_compile_job_is_the_kernel_the_timing_launches(tmp_path):
    """The compile check builds each candidate with the factory arguments the package's
    run_forward / run_backward launch it with at its C (bench dtype, the spec's saved rstd and
    dw reduction), so the GPU timing loads the checked kernels from TileLang's cache. The saved
    rstd is the public function's choice at the bench shape (saved.rstd = "auto": by its size)."""
    import torch

    spec, gen = validate(RMSNORM, read_spec(REPO_ROOT / "specs/rmsnorm.toml")), \
        generate(REPO_ROOT / "specs/rmsnorm.toml")
    with tune.imported_package(gen.files, spec.name, tmp_path) as autograd:
        for c in tune.candidates(spec, max_candidates=1):
            job = tune.compile_job(spec, gen.plan, c)
            x = torch.empty(RT.bench_rows(spec, c.key[0]), c.key[0], device="meta")
            args = (c.key[0], "bfloat16", "bfloat16", autograd.EPS, autograd.save_rstd_for(x))
            expected = args if c.phase == "fwd" else (*args, autograd.DW_REDUCTION)
            assert job.args == expected and job.tiling == c.tiling_dict, c.label
            assert job.factory == f"rmsnorm_{c.phase}"


def test_run_off_times_the_current_tiling_and_the_finalists_again_in_turn():
    """After a key's first pass, the current tiling and the fastest few others are timed again,
    round after round in turn, each keeping its best: a drift between minutes cannot pick the
    winner. The rest, and wrong or failed candidates (no time), are not timed again."""
    spec = spec_of(UNTUNED_TEXT)
    first, b, c, d, e, wrong = tune.candidates(spec, ["bwd"], max_candidates=6, subset={"channels": {1024}})
    times = {first: 1.00, b: 0.97, c: 1.10, d: 0.99, e: 1.30, wrong: None}
    later = {first: iter([0.96, 0.95, 0.97]), b: iter([0.99, 0.98, 0.99]),
             c: iter([1.2, 1.2, 1.2]), d: iter([0.90, 1.0, 1.0])}
    order = []

    def retime(candidate):
        order.append(candidate)
        return next(later[candidate])

    retimed = tune.run_off([first, b, c, d, e, wrong], times, retime, finalists=3, rounds=3)
    assert retimed == [first, b, d, c]
    assert order == [first, b, d, c] * 3
    assert times == {first: 0.95, b: 0.97, c: 1.10, d: 0.90, e: 1.30, wrong: None}
    assert tune.pick_winners([first, b, c, d, e, wrong], times) == {(1024, "bwd"): d}


def test_time_by_key_checks_times_and_runs_off_with_the_package_restored(monkeypatch):
    """time_by_key on the CPU with a stand-in package: each candidate's output is checked against
    the reference before it is timed (a wrong one gets no time), every candidate launches with its
    own tiling, the run-off's best is reported with a note, and the package's tiling constants are
    as they were afterwards. The stand-in bench's stream_ms gives made-up times per tiling."""
    import types

    import torch

    spec, plan = spec_of(UNTUNED_TEXT), load_plan(REPO_ROOT / "specs/rmsnorm.toml")[0]
    first, b, c = tune.candidates(spec, ["bwd"], max_candidates=3, subset={"channels": {4096}})
    autograd = types.SimpleNamespace(__package__="standin", BWD_TILING={"base": 1},
                                     BWD_TILINGS={4096: {"tuned": 1}}, PLANS={"stale": 1})
    planned = []
    queue = {tuple(first.tiling_dict.items()): [1.00, 0.95, 0.96, 0.97],
             tuple(c.tiling_dict.items()): [0.98, 0.99, 0.99, 0.99]}

    def stream_ms(call):
        planned.append((dict(autograd.BWD_TILING), dict(autograd.BWD_TILINGS), len(autograd.PLANS)))
        return queue[tuple(autograd.BWD_TILING.items())].pop(0)

    monkeypatch.setitem(sys.modules, "standin.bench_rmsnorm", types.SimpleNamespace(stream_ms=stream_ms))
    ref = torch.ones(3)

    def call():
        # b's tiling gives a wrong dx.
        return (ref * 2 if autograd.BWD_TILING == b.tiling_dict else ref.clone(),)

    reports = []
    times = tune.time_by_key(spec, plan, autograd, [first, b, c],
                             lambda cand, ms, note: reports.append((cand, ms, note)), {},
                             lambda key: {"bwd": (call, ("dx",), (ref,))})
    assert times == {first: 0.95, b: None, c: 0.98}
    assert [t for t, tuned, plans in planned] == [first.tiling_dict, c.tiling_dict] + \
        [first.tiling_dict, c.tiling_dict] * 3
    assert all(tuned == {} and plans == 0 for _, tuned, plans in planned)
    assert reports[1][:2] == (b, None) and reports[1][2].startswith("wrong: dx max error 1")
    assert reports[-2:] == [(first, 0.95, "run-off, best of 4"), (c, 0.98, "run-off, best of 4")]
    assert autograd.BWD_TILING == {"base": 1} and autograd.BWD_TILINGS == {4096: {"tuned": 1}}
    assert autograd.PLANS == {}


def test_each_key_s_inputs_are_made_with_the_package_s_own_tilings(monkeypatch):
    """A key's calls (its inputs, a backward's saved forward outputs) are made with the package
    as shipped, not with the tiling the previous key's run-off left set (an H100 tune run:
    a d64 window's 3-blocks-an-SM forward, left set, failed to build at the next key's d128)."""
    import types

    import torch

    spec, plan = spec_of(UNTUNED_TEXT), load_plan(REPO_ROOT / "specs/rmsnorm.toml")[0]
    found = tune.candidates(spec, ["bwd"], max_candidates=2, subset={"channels": {1024, 4096}})
    assert len({c.key for c in found}) == 2
    autograd = types.SimpleNamespace(__package__="standin", BWD_TILING={"base": 1},
                                     BWD_TILINGS={4096: {"tuned": 1}}, PLANS={})
    monkeypatch.setitem(sys.modules, "standin.bench_rmsnorm",
                        types.SimpleNamespace(stream_ms=lambda call: 1.0))
    ref, made_at = torch.ones(3), []

    def calls_at(key):
        made_at.append((dict(autograd.BWD_TILING), dict(autograd.BWD_TILINGS)))
        return {"bwd": (lambda: (ref.clone(),), ("dx",), (ref,))}

    tune.time_by_key(spec, plan, autograd, found, lambda *report: None, {}, calls_at)
    assert made_at == [({"base": 1}, {4096: {"tuned": 1}})] * 2
