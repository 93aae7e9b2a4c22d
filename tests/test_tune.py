"""`opgen tune` on the CPU: [[tiling.tuned]] in the spec and the plan, the candidates, the pure
selection from (fake) timings, the text edit of the spec, and `--dry-run` end to end (the real
compile check). Timing itself needs a GPU."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from opgen import tune
from opgen.families import attention_tune as AT
from opgen.errors import SpecError
from opgen.families import FAMILIES
from opgen.families.attention import PHASE_TILING, tiling_problems
from opgen.render import generate, load_plan
from opgen.spec import SpecSource, read_spec, validate
import tomllib

ATTENTION = FAMILIES["attention"].spec
TUNED_SPEC = REPO_ROOT / "tests/specs/attention_tuned.toml"


def scaffold_text(name: str = "attention") -> str:
    """What `opgen new NAME` writes without its [[tiling.tuned]] entries: the spec a first tune
    starts from."""
    from opgen.cli import scaffolds
    from opgen.render import environment

    family, preset = scaffolds()[name]
    return environment().get_template(family.scaffold_template).render(
        name=name, preset={**preset, "tuned": None})


# An attention spec without a [[tiling.tuned]] table (specs/attention.toml has one).
SPEC_TEXT = scaffold_text()


def spec_of(text: str):
    return validate(ATTENTION, SpecSource("specs/x.toml", "", tomllib.loads(text), text))


def shipped(name: str = "attention"):
    return validate(ATTENTION, read_spec(REPO_ROOT / f"specs/{name}.toml"))


def test_tuned_table_parses_and_plans():
    plan, _ = load_plan(TUNED_SPEC)
    # Keyed (head_dim, causal, max_window): 0, no max_window, serves every window.
    assert plan.tuned["fwd"] == {
        (64, False, 0): {"block_m": 128, "block_n": 128, "threads": 256, "num_stages": 2,
                         "overlap": True},
        (128, True, 0): {"block_m": 64, "block_n": 32, "threads": 128, "num_stages": 2,
                         "blocks_per_sm": 2},
    }
    assert list(plan.tuned["bwd"]) == [(64, False, 0)]
    assert plan.tiling_for("fwd", 128, False) == plan.kernels["fwd"].tiling
    assert plan.tiling_for("bwd", 64, False)["block_m"] == 64
    # The compile check builds every variant with the tiling it launches with.
    fwd_jobs = {(j.args[2], j.args[3]): j.tiling for j in plan.compile_jobs
                if j.factory == "attention_tuned_fwd" and not j.tiling.get("pair_blocks")}
    assert fwd_jobs[64, False]["block_n"] == 128 and fwd_jobs[64, True] == plan.kernels["fwd"].tiling


def test_package_without_a_table_prints_none(tmp_path):
    path = tmp_path / "attention.toml"
    path.write_text(SPEC_TEXT)
    plan, _ = load_plan(path)
    assert plan.tuned == {} and plan.tiling_exprs["fwd"] == "FWD_TILING"
    files = generate(path).files
    assert "FWD_TILINGS" not in files["kernels.py"] + files["autograd.py"]


def test_variant_calls_pick_the_tuned_tiling(tmp_path, monkeypatch):
    files = generate(TUNED_SPEC).files
    assert "FWD_TILINGS = {" in files["kernels.py"]
    package = tmp_path / "attention_tuned"
    package.mkdir()
    for name, text in files.items():
        (package / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    autograd = importlib.import_module("attention_tuned.autograd")
    try:
        def calls(dim, causal):
            return autograd.variant_calls(4, 4, dim, causal, 0, "bshd", "float16", 0.1,
                                          "direct", "direct")

        assert calls(64, False)["fwd"][2] == {"block_m": 128, "block_n": 128, "threads": 256,
                                              "num_stages": 2, "overlap": True}
        assert calls(64, False)["bwd"][2]["block_m"] == 64
        assert calls(64, True)["fwd"][2] is autograd.FWD_TILING
        assert calls(128, True)["fwd"][2]["block_n"] == 32
        assert calls(128, True)["bwd"][2] is autograd.BWD_TILING
        # The postprocess reads dQ in the layout of the bwd kernel that wrote it.
        assert calls(64, False)["bwd"][2]["bulk_dq"] is True
        assert calls(64, False)["postprocess"][2] == {**autograd.POSTPROCESS_TILING, "bulk_dq": True}
        assert calls(128, True)["postprocess"][2] is autograd.POSTPROCESS_TILING
    finally:
        for name in [m for m in sys.modules if m.startswith("attention_tuned")]:
            del sys.modules[name]


def test_digest_of_a_spec_without_a_table_is_unchanged():
    # The empty table is no part of the hash: specs without it keep their packages' headers.
    assert "tuned" not in spec_of(SPEC_TEXT).model_dump()["tiling"]


BASE = 'name = "x"\nfamily = "attention"\n'


@pytest.mark.parametrize("entry, field, words", [
    ("head_dim = 96\ncausal = false\nfwd = { block_m = 128, block_n = 64, threads = 256, num_stages = 1 }",
     "tiling.tuned.0.head_dim", "must be one of attention.head_dims"),
    ("head_dim = 128\ncausal = true\nbwd = { block_m = 128, block_n = 128, threads = 256, num_stages = 3 }",
     "tiling.tuned.0.bwd", "shared memory at head_dim 128"),
    ("head_dim = 64\ncausal = true\nfwd = { block_m = 64, block_n = 64, threads = 256, num_stages = 1 }",
     "tiling.tuned.0.fwd", "has no TileLang layout"),
    ("head_dim = 64\ncausal = true", "tiling.tuned.0", "give fwd, bwd or both"),
    # 192 query rows are three warpgroups' (384 threads) in the forward, no power of two elsewhere.
    ("head_dim = 64\ncausal = true\nfwd = { block_m = 192, block_n = 128, threads = 256, num_stages = 2 }",
     "tiling.tuned.0.fwd", "use block_m = 64 * threads / 128 (= 128)"),
    ("head_dim = 64\ncausal = true\nfwd = { block_m = 96, block_n = 128, threads = 384, num_stages = 2 }",
     "tiling.tuned.0.fwd.block_m", "must be a power of two >= 16 or a multiple of 64"),
    ("head_dim = 64\ncausal = true\nbwd = { block_m = 192, block_n = 64, threads = 384, num_stages = 1 }",
     "tiling.tuned.0.bwd.block_m", "must be a power of two >= 16"),
    ("head_dim = 64\ncausal = true\n"
     "fwd = { block_m = 64, block_n = 64, threads = 128, num_stages = 1, overlap = true }",
     "tiling.tuned.0.fwd.overlap", "needs threads = 256"),
    ("head_dim = 64\ncausal = true\n"
     "bwd = { block_m = 64, block_n = 64, threads = 128, num_stages = 1, overlap = true }",
     "tiling.tuned.0.bwd.overlap", "unknown key"),
])
def test_bad_tuned_entries(entry, field, words):
    with pytest.raises(SpecError) as info:
        spec_of(BASE + "[[tiling.tuned]]\n" + entry + "\n")
    assert any(f == field and words in m for f, m in info.value.problems), info.value.problems


# attention_sink's scaffold (sliding windows, test windows 16 and 700) with entries for d64 causal
# calls at windows up to 128 and up to 1024, besides one for every d64 causal call.
SHORT = "{ block_m = 64, block_n = 64, threads = 128, num_stages = 2, blocks_per_sm = 2 }"
MEDIUM = "{ block_m = 128, block_n = 64, threads = 256, num_stages = 2 }"
WINDOWED_TEXT = scaffold_text("attention_sink") + f"""
[[tiling.tuned]]
head_dim = 64
causal = true
fwd = {{ block_m = 128, block_n = 128, threads = 256, num_stages = 2, overlap = true }}
bwd = {{ block_m = 128, block_n = 128, threads = 256, num_stages = 2 }}

[[tiling.tuned]]
head_dim = 64
causal = true
max_window = 1024
fwd = {MEDIUM}

[[tiling.tuned]]
head_dim = 64
causal = true
max_window = 128
fwd = {SHORT}
bwd = {SHORT}
"""


def test_untuned_keys_are_those_no_entry_serves():
    """The keys `opgen build` notes as running the base tiling: no entry of their own and none
    that serves them (a causal entry without max_window serves every window); a key whose entry
    sets one phase was tuned."""
    windowed = spec_of(WINDOWED_TEXT)
    assert AT.TUNER.untuned(windowed) == [(64, False, 0), (128, False, 0), (128, True, 0),
                                          (128, True, 1024)]
    assert AT.TUNER.untuned(validate(ATTENTION, read_spec(TUNED_SPEC))) == [(64, True, 0),
                                                                             (128, False, 0)]
    assert AT.TUNER.untuned(shipped("attention_sink")) == []


def test_a_window_entry_serves_the_windows_up_to_its_max_window(tmp_path):
    path = tmp_path / "attention_sink.toml"
    path.write_text(WINDOWED_TEXT)
    plan, _ = load_plan(path)
    short, medium = (tomllib.loads(f"t = {t}")["t"] for t in (SHORT, MEDIUM))
    every_window = plan.tuned["fwd"][64, True, 0]
    # The narrowest entry whose max_window is at least the call's window; unwindowed calls, and
    # windows past every max_window, take the entry without one.
    for window, fwd in ((None, every_window), (1, short), (128, short), (129, medium),
                        (1024, medium), (1025, every_window)):
        assert plan.tiling_for("fwd", 64, True, window) == fwd, window
    assert plan.tiling_for("bwd", 64, True, 16) == short
    assert plan.tiling_for("bwd", 64, True, 700) == plan.tuned["bwd"][64, True, 0]
    assert plan.tiling_for("fwd", 128, True, 16) == plan.kernels["fwd"].tiling  # no d128 entry
    # The compile check builds the test windows' kernels (16 and 700) with the tilings they
    # launch with, and the package's variant_calls picks the same by the same rule.
    jobs = {(j.args[2], j.args[4]): j.tiling for j in plan.compile_jobs
            if j.factory == "attention_sink_fwd" and j.args[3] and not j.tiling.get("pair_blocks")}
    assert jobs[64, 16] == short and jobs[64, 700] == medium and jobs[64, 0] == every_window
    files = generate(path).files
    assert plan.tuned_tiling_code in files["kernels.py"]
    package = tmp_path / "windowed" / "attention_sink"
    package.mkdir(parents=True)
    for name, text in files.items():
        (package / name).write_text(text)
    sys.path.insert(0, str(package.parent))
    try:
        autograd = importlib.import_module("attention_sink.autograd")
        for window in (0, 16, 128, 700, 2048):
            calls = autograd.variant_calls(8, 2, 64, True, window, "bshd", "bfloat16", 0.125,
                                           "in_block", "in_block")
            assert calls["fwd"][2] == plan.tiling_for("fwd", 64, True, window), window
            assert calls["bwd"][2] == plan.tiling_for("bwd", 64, True, window), window
    finally:
        sys.path.remove(str(package.parent))
        for name in [m for m in sys.modules if m.startswith("attention_sink")]:
            del sys.modules[name]


@pytest.mark.parametrize("entry, field, words", [
    ("head_dim = 64\ncausal = false\nmax_window = 128\nfwd = " + SHORT,
     "tiling.tuned.0.max_window", "needs attention.sliding_window = true and causal = true"),
    ("head_dim = 64\ncausal = true\nmax_window = 8\nfwd = " + SHORT,
     "tiling.tuned.0.max_window", "list a test window of at most 8 in test.windows"),
    ("head_dim = 64\ncausal = true\nmax_window = 0\nfwd = " + SHORT,
     "tiling.tuned.0.max_window", "must be greater than or equal to 1"),
])
def test_bad_window_entries(entry, field, words):
    with pytest.raises(SpecError) as info:
        spec_of(scaffold_text("attention_sink") + "\n[[tiling.tuned]]\n" + entry + "\n")
    assert any(f == field and words in m for f, m in info.value.problems), info.value.problems
    with pytest.raises(SpecError) as info:
        spec_of(WINDOWED_TEXT + "\n[[tiling.tuned]]\nhead_dim = 64\ncausal = true\n"
                "max_window = 128\nfwd = " + MEDIUM + "\n")
    assert ("tiling.tuned.3", "repeats head_dim = 64, causal = true, max_window = 128: one entry "
            "per (head_dim, causal, max_window)") in info.value.problems


def test_a_sliding_window_spec_tunes_each_bench_window(tmp_path, run_opgen):
    """attention_sink's bench shapes have windows 1024 (d128) and 128 (d64): each is a variant
    of its own, timed at its bench shape with its window; --windows picks some."""
    spec = spec_of(WINDOWED_TEXT)
    assert AT.TUNER.keys(spec) == [(64, False, 0), (64, True, 0), (64, True, 128),
                                   (128, False, 0), (128, True, 0), (128, True, 1024)]
    assert AT.tune_shape(spec, 64, 128) == {"batch": 1, "heads": 64, "kv_heads": 8, "seq_len": 4096}
    # The current tiling of a window's variant is what its calls launch now: its own entry,
    # else the entry for every window (there is no d128 window entry).
    assert AT.TUNER.current(spec, (64, True, 128), "fwd") == tomllib.loads(f"t = {SHORT}")["t"]
    assert AT.TUNER.current(spec, (128, True, 1024), "fwd") == AT.TUNER.current(
        spec, (128, True, 0), "fwd")
    found = tune.candidates(spec, ["fwd"], max_candidates=1, subset={"max_window": {128, 1024}})
    assert [c.key for c in found] == [(64, True, 128), (128, True, 1024)]
    assert found[0].label.startswith("fwd d64 causal window<=128 64x64")
    # A window's calls run the ping-pong forward of a ping-pong tiling too: every variant times it.
    every = tune.candidates(spec, ["fwd"])
    assert {c.key[2] for c in every if c.tiling_dict.get("pingpong")} == {0, 128, 1024}
    # A winner at a window is written with its max_window; the others without one.
    job = tune.compile_job(spec, load_plan(REPO_ROOT / "specs/attention_sink.toml")[0], found[1])
    assert job.args[:5] == (32, 8, 128, True, 1024)
    winner = tune.as_candidate(AT.TUNER, (128, True, 1024), "fwd", tomllib.loads(f"t = {MEDIUM}")["t"])
    text = tune.write_tuned(WINDOWED_TEXT, AT.TUNER, tune.merged_entries(spec, {winner.variant: winner}),
                            tune.stamps_of([winner], H200))
    assert text.count("max_window = ") == 3 and "max_window = 0" not in text
    assert [(e.head_dim, e.causal, e.max_window) for e in spec_of(text).tiling.tuned] == [
        (64, True, None), (64, True, 128), (64, True, 1024), (128, True, 1024)]
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/a.toml").write_text(WINDOWED_TEXT)
    result = run_opgen("tune", "specs/a.toml", "--windows", "64", "--dry-run", cwd=tmp_path)
    assert result.returncode == 2
    assert ("--windows: a comma-separated list of the bench shapes' windows (0: none) "
            "[0, 128, 1024] (got \"64\")") in result.stderr, result.stderr


def test_candidates_pass_the_rules_current_tiling_first():
    spec = spec_of(SPEC_TEXT)
    found = tune.candidates(spec)
    assert found, "no candidate"
    for c in found:
        assert not tiling_problems(c.phase, PHASE_TILING[c.phase](**c.tiling_dict), (c.key[0],))
    # The overlapped forward is a candidate only where its rule allows it (two warpgroups,
    # pipelined), never in the backward; the plain loop's tiling has no overlap key at all.
    overlapped = [c for c in found if c.tiling_dict.get("overlap")]
    assert overlapped and all(c.phase == "fwd" and c.tiling_dict["threads"] == 256
                              and c.tiling_dict["num_stages"] >= 1 for c in overlapped)
    assert all("overlap" not in c.tiling_dict for c in found if c not in overlapped)
    assert {c.label.endswith(" overlap") for c in found} == {True, False}
    # So is the ping-pong forward: 128 query rows on two warpgroups, pipelined, not overlap too.
    pingpong = [c for c in found if c.tiling_dict.get("pingpong")]
    assert pingpong and all(
        c.phase == "fwd" and (c.tiling_dict["block_m"], c.tiling_dict["threads"]) == (128, 256)
        and c.tiling_dict["num_stages"] >= 1 and "overlap" not in c.tiling_dict
        and c.label.endswith(" pingpong") for c in pingpong)
    # The backward also tries dQ by bulk reduce-adds; the forward has no such key.
    bulk = [c for c in found if c.tiling_dict.get("bulk_dq")]
    assert bulk and all(c.phase == "bwd" and " bulk-dq" in c.label for c in bulk)
    assert any(c.phase == "bwd" and "bulk_dq" not in c.tiling_dict for c in found)
    # Causal backwards also walk their query blocks from the last one down; without a causal
    # mask the order changes nothing and is not timed.
    down = [c for c in found if c.tiling_dict.get("descending")]
    assert down and all(c.phase == "bwd" and c.key[1] and c.label.endswith(" descending")
                        for c in down)
    assert any(c.phase == "bwd" and c.key[1] and "descending" not in c.tiling_dict for c in found)
    first = {}
    for c in found:
        first.setdefault(c.variant, c)
    assert first[64, False, 0, "fwd"].tiling_dict == spec.tiling.fwd.model_dump()
    assert first[128, True, 0, "bwd"].tiling_dict == spec.tiling.bwd.model_dump()
    assert len(found) == len(set(found))
    # The forward alone tries three consumer warpgroups of 64 query rows.
    assert {(c.phase, c.tiling_dict["threads"]) for c in found
            if c.tiling_dict["block_m"] == 192} >= {("fwd", 384)}
    assert all(c.phase == "fwd" for c in found if c.tiling_dict["block_m"] == 192)
    limited = tune.candidates(spec, ["fwd"], max_candidates=2)
    assert len(limited) == 2 * 2 * 2  # 2 head dims x causal or not x 2
    assert {c.phase for c in limited} == {"fwd"}


def test_one_warpgroup_over_more_than_64_rows_is_timed_only_as_the_spec_s_own_tiling():
    """The search space leaves out 128 threads over 128 or 192 rows (1.38-2.85x slower than the
    winner at every variant tuned on the H200), though the rules accept them: a spec whose own
    tiling is one still has it timed, first."""
    def one_warpgroup_over_64_rows(c):
        return c.tiling_dict["threads"] == 128 and c.tiling_dict["block_m"] > 64

    spec = spec_of(SPEC_TEXT)
    found = tune.candidates(spec)
    assert not any(one_warpgroup_over_64_rows(c) for c in found)
    assert not tiling_problems("fwd", PHASE_TILING["fwd"](block_m=128, block_n=64, threads=128,
                                                          num_stages=1), (64,))
    assert any(c.tiling_dict["threads"] == 128 and c.tiling_dict["block_m"] == 64 for c in found)
    head, fwd_table = SPEC_TEXT.split("[tiling.fwd]", 1)
    own = spec_of(head + "[tiling.fwd]" + fwd_table.replace("threads = 256", "threads = 128", 1))
    assert own.tiling.fwd.threads == 128 and own.tiling.fwd.block_m > 64
    first = {}
    for c in tune.candidates(own, ["fwd"]):
        first.setdefault(c.variant, c)
    assert all(one_warpgroup_over_64_rows(c) for c in first.values())


def test_a_cut_off_run_keeps_the_variants_it_timed_in_full():
    """A tune interrupted while timing (Ctrl-C, a time limit) writes the winners of the variants
    each candidate of which has a result (a wrong or failed one counts), and no other."""
    def cand(dim, causal, block_n):
        return tune.as_candidate(AT.TUNER, (dim, causal, 0), "fwd", {"block_m": 128, "block_n": block_n,
                                                        "threads": 256, "num_stages": 1})

    a, b = cand(64, False, 64), cand(64, False, 128)
    c, d = cand(64, True, 64), cand(64, True, 128)
    e = cand(128, False, 64)
    times = {a: 1.0, b: None, c: 2.0}  # d's timing was cut off; e never started
    assert tune.timed_variants([a, b, c, d, e], times) == {(64, False, 0, "fwd")}
    complete = tune.timed_variants([a, b, c, d, e], times)
    assert tune.pick_winners([x for x in (a, b, c, d, e) if x.variant in complete], times) == {
        (64, False, 0, "fwd"): a}


def test_candidates_of_chosen_head_dims():
    spec = spec_of(SPEC_TEXT)
    found = tune.candidates(spec, ["fwd"], subset={"head_dim": {64}})
    assert found and {c.key[0] for c in found} == {64}
    assert found == [c for c in tune.candidates(spec, ["fwd"]) if c.key[0] == 64]


def test_tune_rejects_head_dims_the_spec_lacks(tmp_path, run_opgen):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/attention.toml").write_text(SPEC_TEXT)
    result = run_opgen("tune", "specs/attention.toml", "--head-dims", "64,96", cwd=tmp_path)
    assert result.returncode == 2
    assert "--head-dims: a comma-separated list of the spec's head dims [64, 128] (got \"64,96\")" \
        in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_pick_winners_from_fake_timings():
    def cand(dim, causal, phase, block_n):
        return tune.as_candidate(AT.TUNER, (dim, causal, 0), phase, {"block_m": 128, "block_n": block_n,
                                                        "threads": 256, "num_stages": 1})

    a, b, c = cand(64, False, "fwd", 32), cand(64, False, "fwd", 64), cand(64, False, "fwd", 128)
    d, e = cand(64, True, "fwd", 32), cand(64, True, "fwd", 64)
    f = cand(128, False, "bwd", 32)
    times = {a: 2.0, b: 1.5, c: None,  # c was wrong: dropped even if it would be fastest
             d: 1.0, e: 1.0,  # a tie: the earlier (the spec's current tiling first) wins
             f: None}  # no working candidate: no winner, the variant keeps its tiling
    winners = tune.pick_winners([a, b, c, d, e, f], times)
    assert winners == {(64, False, 0, "fwd"): b, (64, True, 0, "fwd"): d}
    assert tune.winner_lines([a, b, c, d, e, f], times) == [
        "fastest: fwd d64 full 128x64 threads=256 stages=1 (1.500 ms; the spec's 2.000 ms: 1.33x)",
        "fastest: fwd d64 causal 128x32 threads=256 stages=1 (1.000 ms; the spec's tiling already)"]


def test_a_gain_under_min_speedup_keeps_the_spec_tiling():
    """A fastest that beats the spec's current tiling by less than --min-speedup is noise: the
    variant gets no winner (its entry stays as it was), and the line says why."""
    def cand(dim, block_n):
        return tune.as_candidate(AT.TUNER, (dim, False, 0), "fwd", {"block_m": 128, "block_n": block_n,
                                                       "threads": 256, "num_stages": 1})

    a, b = cand(64, 64), cand(64, 128)  # a is the spec's current tiling (first)
    c, d = cand(128, 64), cand(128, 128)
    times = {a: 1.00, b: 0.98, c: 1.00, d: 0.90}
    assert tune.pick_winners([a, b, c, d], times) == {(64, False, 0, "fwd"): b, (128, False, 0, "fwd"): d}
    assert tune.pick_winners([a, b, c, d], times, 1.03) == {(128, False, 0, "fwd"): d}
    assert tune.winner_lines([a, b, c, d], times, 1.03) == [
        "fastest: fwd d64 full 128x128 threads=256 stages=1 (0.980 ms; the spec's 1.000 ms: 1.02x, "
        "under --min-speedup 1.03: the spec keeps its tiling)",
        "fastest: fwd d128 full 128x128 threads=256 stages=1 (0.900 ms; the spec's 1.000 ms: 1.11x)"]


WINNERS = {
    (64, False, 0): {"fwd": {"block_m": 128, "block_n": 128, "threads": 256, "num_stages": 2}},
    (128, True, 0): {"fwd": {"block_m": 64, "block_n": 64, "threads": 128, "num_stages": 2},
                  "bwd": {"block_m": 64, "block_n": 32, "threads": 128, "num_stages": 1}},
}
H200 = "on NVIDIA H200, 2026-12-05"
COMMENT = f"# tuned by opgen tune {H200}"


def stamped(entries, where=H200):
    """Stamps saying that every phase of entries was tuned `where`."""
    return {(key, phase): where for key, phases in entries.items() for phase in phases}


def test_writer_keeps_every_line_and_is_idempotent():
    once = tune.write_tuned(SPEC_TEXT, AT.TUNER, WINNERS, stamped(WINNERS))
    twice = tune.write_tuned(once, AT.TUNER, WINNERS, stamped(WINNERS))
    assert twice == once
    # One marker per entry.
    assert once.count("[[tiling.tuned]]") == 2 and once.count(COMMENT + "\n[[tiling.tuned]]") == 2
    # Only lines added: every original line (comments too) is there, in order.
    added = [line for line in tune.unified_diff(SPEC_TEXT, once, "s").splitlines()
             if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    assert all(line.startswith("+") for line in added)
    # After the last [tiling.*] table, before the [test] section's comment.
    assert once.index("[[tiling.tuned]]") > once.index("[tiling.dsinks]")
    assert once.index(COMMENT) < once.index("# Generated tests")
    spec = spec_of(once)
    assert [(e.head_dim, e.causal) for e in spec.tiling.tuned] == [(64, False), (128, True)]
    assert spec.tiling.tuned[1].bwd.threads == 128
    # Written again with nothing tuned now, every entry keeps its marker.
    assert tune.write_tuned(once, AT.TUNER, WINNERS, {}) == once


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "specs").glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_tuned_tables_read_back_as_written(path):
    """A shipped spec's [[tiling.tuned]] table, written again with nothing tuned, is unchanged:
    every marker parses (a hand-written note goes on a line of its own, above the marker), so a
    later `opgen tune` keeps every entry's comments and markers in place."""
    source = read_spec(path)
    family = FAMILIES[source.data["family"]]
    tuner = family.tuner()
    if tuner is None or "tuned" not in source.data.get("tiling", {}):
        pytest.skip(f"{path.name} has no tuned table")
    spec = validate(family.spec, source)
    assert tune.write_tuned(source.text, tuner, tuner.entries(spec), {}) == source.text


def test_writer_replaces_an_earlier_table():
    once = tune.write_tuned(SPEC_TEXT, AT.TUNER, WINNERS, stamped(WINNERS))
    later = {(64, True, 0): WINNERS[64, False, 0]}
    h100 = stamped(later, "on NVIDIA H100, 2027-01-01")
    again = tune.write_tuned(once, AT.TUNER, later, h100)
    assert COMMENT not in again and again.count("[[tiling.tuned]]") == 1
    assert "# tuned by opgen tune on NVIDIA H100, 2027-01-01\n[[tiling.tuned]]" in again
    assert again == tune.write_tuned(SPEC_TEXT, AT.TUNER, later, h100)
    assert tune.write_tuned(once, AT.TUNER, {}, {}) == SPEC_TEXT


def test_a_partial_tune_stamps_only_what_it_tuned():
    """A run that tunes one phase of one key on another GPU says so above that entry alone: the
    other entries, and the entry's other phase, keep the GPU and date they were tuned on."""
    once = tune.write_tuned(SPEC_TEXT, AT.TUNER, WINNERS, stamped(WINNERS))
    fwd = tune.as_candidate(AT.TUNER, (128, True, 0), "fwd", {"block_m": 128, "block_n": 32,
                                                             "threads": 256, "num_stages": 1})
    entries = tune.merged_entries(spec_of(once), {fwd.variant: fwd})
    text = tune.write_tuned(once, AT.TUNER, entries, tune.stamps_of([fwd], "on NVIDIA H100, 2027-01-01"))
    assert text.count("[[tiling.tuned]]") == 2
    above = text.split("[[tiling.tuned]]")  # above[i] ends with entry i's comments
    assert above[0].endswith(COMMENT + "\n")  # d64 full: untouched
    assert above[1].endswith("# tuned by opgen tune: fwd on NVIDIA H100, 2027-01-01; "
                             "bwd on NVIDIA H200, 2026-12-05\n")
    assert tune.write_tuned(text, AT.TUNER, entries, {}) == text
    # A phase written by hand beside a tuned one: the marker names only the tuned one.
    hand_fwd = dict(entries)
    hand_fwd[128, True, 0] = {**entries[128, True, 0], "fwd": {"block_m": 64, "block_n": 64,
                                                                "threads": 128, "num_stages": 1}}
    bwd_only = tune.write_tuned(SPEC_TEXT, AT.TUNER, hand_fwd, {((128, True, 0), "bwd"): H200,
                                                                ((64, False, 0), "fwd"): H200})
    assert "# tuned by opgen tune: bwd on NVIDIA H200, 2026-12-05\n[[tiling.tuned]]\nhead_dim = 128" in bwd_only
    assert tune.write_tuned(bwd_only, AT.TUNER, hand_fwd, {}) == bwd_only
    # Both phases tuned again in one run: one clause again.
    both = tune.write_tuned(text, AT.TUNER, entries, stamped({(128, True, 0): entries[128, True, 0]}))
    assert both.count(COMMENT + "\n[[tiling.tuned]]") == 2


def test_comments_above_an_entry_move_with_it_and_a_hand_entry_gets_no_marker():
    once = tune.write_tuned(SPEC_TEXT, AT.TUNER, WINNERS, stamped(WINNERS))
    # A reader's note above the d128 entry, and an entry written by hand (d64 causal, no marker).
    note = "# d128 causal: 64x64 keeps two blocks an SM\n"
    hand = ("[[tiling.tuned]]\nhead_dim = 64\ncausal = true\n"
            "fwd = { block_m = 64, block_n = 64, threads = 128, num_stages = 1 }\n\n")
    at = once.index(COMMENT + "\n[[tiling.tuned]]\nhead_dim = 128")
    edited = once[:at] + hand + note + once[at:]
    assert [(e.head_dim, e.causal) for e in spec_of(edited).tiling.tuned] == [
        (64, False), (64, True), (128, True)]
    # Tune d64 full again: the note stays above the d128 entry, the hand entry stays unmarked.
    d64 = tune.as_candidate(AT.TUNER, (64, False, 0), "fwd", {"block_m": 64, "block_n": 128,
                                                             "threads": 128, "num_stages": 2})
    entries = tune.merged_entries(spec_of(edited), {d64.variant: d64})
    text = tune.write_tuned(edited, AT.TUNER, entries, tune.stamps_of([d64], "on NVIDIA H100, 2027-01-01"))
    assert note + COMMENT + "\n[[tiling.tuned]]\nhead_dim = 128" in text
    assert "\n\n" + hand in text
    assert text.count("# tuned by opgen tune") == 2 and text.count(note) == 1
    assert tune.write_tuned(text, AT.TUNER, entries, {}) == text
    # The table removed: its comments go with it.
    assert tune.write_tuned(text, AT.TUNER, {}, {}) == SPEC_TEXT


def test_writer_writes_an_overlapped_winner_as_toml():
    # A candidate's tiling holds overlap as a Python bool; the spec needs TOML's `true`.
    overlapped = tune.as_candidate(AT.TUNER, (128, True, 0), "fwd", {"block_m": 128, "block_n": 128,
                                                        "threads": 256, "num_stages": 2,
                                                        "overlap": True})
    spec = spec_of(SPEC_TEXT)
    text = tune.write_tuned(SPEC_TEXT, AT.TUNER, tune.merged_entries(spec, {overlapped.variant: overlapped}),
                            tune.stamps_of([overlapped], H200))
    assert "num_stages = 2, overlap = true }" in text and "True" not in text
    assert spec_of(text).tiling.tuned[0].fwd.overlap is True


def test_merged_entries_keep_phases_not_tuned():
    spec = spec_of(tune.write_tuned(SPEC_TEXT, AT.TUNER, WINNERS, stamped(WINNERS)))
    new_fwd = tune.as_candidate(AT.TUNER, (128, True, 0), "fwd", {"block_m": 128, "block_n": 32, "threads": 256,
                                                     "num_stages": 1})
    entries = tune.merged_entries(spec, {new_fwd.variant: new_fwd})
    assert entries[128, True, 0]["fwd"]["block_n"] == 32
    assert entries[128, True, 0]["bwd"] == WINNERS[128, True, 0]["bwd"]
    assert entries[64, False, 0] == WINNERS[64, False, 0]


def test_tune_refuses_other_families_and_phases(tmp_path, run_opgen):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs/m.toml").write_text((REPO_ROOT / "specs/matmul.toml").read_text())
    result = run_opgen("tune", "specs/m.toml", cwd=tmp_path)
    assert result.returncode == 2 and "supports the attention and rmsnorm families" in result.stderr
    (tmp_path / "specs/a.toml").write_text(SPEC_TEXT)
    result = run_opgen("tune", "specs/a.toml", "--phases", "fwd,dsinks", cwd=tmp_path)
    assert result.returncode == 2 and "--phases" in result.stderr
    (tmp_path / "specs/bad.toml").write_text(BASE + "[[tiling.tuned]]\nhead_dim = 64\ncausal = true\n")
    result = run_opgen("tune", "specs/bad.toml", cwd=tmp_path)
    assert result.returncode == 2 and "tiling.tuned.0: give fwd, bwd or both" in result.stderr


@pytest.mark.compile
@pytest.mark.xdist_group("compile")
def test_tune_dry_run_lists_compiled_candidates(tmp_path, run_opgen):
    (tmp_path / "specs").mkdir()
    spec = tmp_path / "specs/attention.toml"
    spec.write_text(SPEC_TEXT)
    result = run_opgen("tune", "specs/attention.toml", "--dry-run", "--phases", "fwd",
                       "--max-candidates", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 candidate(s) pass the spec's rules" in result.stdout
    assert result.stdout.count("ok") == 4
    assert "timing them needs a GPU (--dry-run): nothing written" in result.stdout
    assert spec.read_text() == SPEC_TEXT


def test_candidates_are_built_before_timing_in_parallel_chunks():
    """Each candidate's compile job, as the package's (factory, args, tiling) call, goes to the
    package's parallel prebuild, `workers` calls at a time; a causal forward candidate's paired
    forward (its tiling without overlap or pingpong, key blocks of at most 128 rows, pair_blocks
    on) right after it, which its call plan
    builds too (run 94: built one by one while timing, ~14 s per causal candidate)."""
    spec = shipped()
    plan, _ = load_plan(REPO_ROOT / "specs/attention.toml")
    found = tune.candidates(spec, ("fwd", "bwd"))
    chunks = []
    package = type(sys)("fake_autograd")
    package.__dict__.update(prebuild=chunks.append, attention_fwd="fwd factory",
                            attention_bwd="bwd factory")
    AT.prebuild_candidates(spec, plan, package, found, workers=16)
    expected = []
    for c in found:
        job = tune.compile_job(spec, plan, c)
        expected.append((f"{c.phase} factory", job.args, c.tiling_dict))
        if c.phase == "fwd" and c.key[1]:
            paired = {k: v for k, v in c.tiling_dict.items() if k not in ("overlap", "pingpong")}
            paired["block_n"] = min(paired["block_n"], 128)
            expected.append(("fwd factory", job.args, {**paired, "pair_blocks": True}))
    assert any(tiling.get("pair_blocks") for _, _, tiling in expected)
    full, rest = divmod(len(expected), 16)
    assert [len(chunk) for chunk in chunks] == [16] * full + [rest] * bool(rest)
    assert [call for chunk in chunks for call in chunk] == expected


PREBUILD_SCRIPT = """
import os, sys, tempfile
from pathlib import Path
os.environ["TILELANG_DEFAULT_TARGET"] = '{"kind": "cuda", "arch": "sm_90a"}'
from opgen import tune
from opgen.families import attention_tune as AT
from opgen.families import FAMILIES
from opgen.render import generate
from opgen.spec import read_spec, validate
spec_path = Path(sys.argv[1])
spec = validate(FAMILIES["attention"].spec, read_spec(spec_path))
gen = generate(spec_path)
with tune.imported_package(gen.files, spec.name, Path(tempfile.mkdtemp())) as autograd:
    found = [c for c in tune.candidates(spec, ["fwd"]) if c.key[0] == 64 and c.key[1]][1:2]
    saved = dict(autograd.FWD_TILING)
    AT.prebuild_candidates(spec, gen.plan, autograd, found, workers=2)
    (c,) = found
    args = (16, 16, 64, True, 0, "bshd", "float16", AT.default_softmax_scale(64))
    # The candidate's forward, and the paired forward its call plan builds too.
    for tiling in (c.tiling_dict, autograd.paired_tiling(c.tiling_dict)):
        key = autograd.kernel_key(autograd.attention_fwd, args, tiling)
        assert key in autograd.KERNELS, (key, list(autograd.KERNELS))
    assert autograd.FWD_TILING == saved
# The tuned spec is validated after the timing: its name must not be taken by the package then.
validate(FAMILIES["attention"].spec, read_spec(spec_path))
print("built", c.label)
"""


@pytest.mark.compile
def test_prebuild_compiles_the_candidates_kernels_of_the_real_package(tmp_path):
    """prebuild_candidates on the rendered attention package (no GPU): a causal candidate's
    forward kernel and its paired forward are compiled for sm_90a and stored under the keys its
    timing launch looks up."""
    import subprocess

    result = subprocess.run([sys.executable, "-c", PREBUILD_SCRIPT,
                             str(REPO_ROOT / "specs/attention.toml")],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "built fwd d64 causal 64x32 threads=128 stages=1" in result.stdout


def test_compile_job_is_the_kernel_the_timing_launches(tmp_path):
    """The compile check builds each candidate with the very factory arguments and tiling the
    package's run_forward / run_backward launch it with at the tune shape (heads included): on a
    GPU the timing then loads the checked kernels from TileLang's cache instead of building them
    again (run 32 rebuilt every candidate: the check used one head)."""
    for name in ("attention", "gqa", "attention_sink"):
        path = REPO_ROOT / f"specs/{name}.toml"
        spec, gen = validate(ATTENTION, read_spec(path)), generate(path)
        with tune.imported_package(gen.files, spec.name, tmp_path / name) as autograd:
            assert f"{name}.autograd" in sys.modules
        # Unloaded: the spec, validated again after the timing, must not find its name taken
        # (run 34 wrote no tuned spec because of that).
        assert not [m for m in sys.modules if m == name or m.startswith(name + ".")]
        validate(ATTENTION, read_spec(path))
        for c in tune.candidates(spec, ("fwd", "bwd"), max_candidates=2):
            job = tune.compile_job(spec, gen.plan, c)
            dim, causal, window = c.key
            shape = AT.tune_shape(spec, dim, window)
            heads, kv_heads = shape["heads"], shape["kv_heads"]
            calls = autograd.variant_calls(heads, kv_heads, dim, causal, window,
                                           spec.attention.layouts[0], spec.bench.dtype,
                                           AT.default_softmax_scale(c.key[0]),
                                           *autograd.reductions(heads, kv_heads))
            factory, args, _ = calls[c.phase]
            assert factory is getattr(autograd, job.factory), c.label
            assert (job.args, job.tiling) == (args, c.tiling_dict), c.label


def test_gqa_head_dim_without_a_bench_shape_is_timed_grouped():
    """gqa.toml benches head_dim 128 only: its head_dim 64 is timed at a grouped default shape,
    so the backward candidates run the spec's grouped dK/dV reduction (session 9's tune timed
    them at 16/16 heads, where dK/dV are written directly)."""
    spec, plan = shipped("gqa"), load_plan(REPO_ROOT / "specs/gqa.toml")[0]
    assert AT.tune_shape(spec, 64) == AT.DEFAULT_GQA_SHAPE
    assert AT.tune_shape(spec, 128)["kv_heads"] == 8  # its bench shape
    (bwd,) = [c for c in tune.candidates(spec, ["bwd"], max_candidates=1)
              if c.key == (64, True, 0)]
    assert tune.compile_job(spec, plan, bwd).args[-2:] == ("in_block", "in_block")
    assert AT.tune_shape(shipped("attention"), 64)["kv_heads"] == 16
